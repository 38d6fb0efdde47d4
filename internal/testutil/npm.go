package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// NPMPackages are the npm packages tests use, pinned: the official TypeScript MCP
// SDK (to prove clients built on it work) and a reference server we did not write.
var NPMPackages = []string{
	"@modelcontextprotocol/sdk@1.32.2",
	"@modelcontextprotocol/server-everything@2026.8.31",
}

// NodeModules installs NPMPackages with npm into a cache directory outside the
// repository (once; later calls reuse it) and returns the directory holding
// node_modules. The test skips when node or npm is missing.
func NodeModules(t testing.TB) string {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed: the official-SDK and npm server tests need Node.js (apt-get install nodejs npm)", tool)
		}
	}
	base := os.Getenv("MCPEXEC_TEST_NPM_DIR")
	if base == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			cache = os.TempDir()
		}
		base = filepath.Join(cache, "mcpexec-test", "npm")
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatalf("npm cache dir: %v", err)
	}
	// Packages of several test binaries may install at once: take a file lock.
	lock, err := os.OpenFile(filepath.Join(base, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatalf("npm lock: %v", err)
	}
	defer func() { _ = lock.Close() }() // closing also releases the lock
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatalf("npm lock: %v", err)
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }() // closing the file releases it anyway
	stamp := filepath.Join(base, ".installed")
	want := ""
	for _, p := range NPMPackages {
		want += p + "\n"
	}
	if got, err := os.ReadFile(stamp); err == nil && string(got) == want {
		return base
	}
	args := append([]string{"install", "--no-audit", "--no-fund", "--silent", "--prefix", base}, NPMPackages...)
	cmd := exec.Command("npm", args...)
	cmd.Dir = base
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Skipf("npm install %v failed (is the npm registry reachable?): %v: %s", NPMPackages, err, out)
	}
	if err := os.WriteFile(stamp, []byte(want), 0o644); err != nil {
		t.Fatalf("npm stamp: %v", err)
	}
	return base
}

// NodeScript copies the test package's testdata/name next to the npm
// packages (ESM resolves packages from the script's directory), removes it
// when the test ends, and returns its path.
func NodeScript(t testing.TB, name string) string {
	t.Helper()
	npm := NodeModules(t)
	script, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(npm, fmt.Sprintf("%d_%s", os.Getpid(), name))
	if err := os.WriteFile(path, script, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(path) }) // a temporary file: what is left harms no test
	return path
}
