package sandbox_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// TestBuildProgress: a progress file written by a live process is a build
// under way with its last line; one whose process is gone is not.
func TestBuildProgress(t *testing.T) {
	image := "localhost/progress-test-" + fmt.Sprint(os.Getpid())
	path := sandbox.BuildProgressPath(image)
	t.Cleanup(func() { _ = os.Remove(path) }) // the test's own file
	if _, ok := sandbox.ReadBuildProgress(image); ok {
		t.Fatal("a build is reported without a progress file")
	}
	if err := os.WriteFile(path, fmt.Appendf(nil, "pid %d\ndebootstrap bookworm...\nI: Retrieving Packages\n", os.Getpid()), 0o644); err != nil {
		t.Fatal(err)
	}
	p, ok := sandbox.ReadBuildProgress(image)
	if !ok || p.PID != os.Getpid() || p.Last != "I: Retrieving Packages" || !strings.Contains(p.String(), "Retrieving") {
		t.Fatalf("progress %+v %v", p, ok)
	}
	if err := os.WriteFile(path, []byte("pid 999999999\nI: Retrieving Packages\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok := sandbox.ReadBuildProgress(image); ok {
		t.Fatal("a dead process's build is reported under way")
	}
}
