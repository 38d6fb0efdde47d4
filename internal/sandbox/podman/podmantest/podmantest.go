// Package podmantest opens real Podman runtimes for tests outside package podman.
package podmantest

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/sandbox/podman"
	"github.com/mcpexec/mcpexec/internal/sandbox/sandboxtest"
	"github.com/mcpexec/mcpexec/internal/testutil/testenv"
)

// New starts a Runtime with its own worker id for one test; it is closed when the
// test ends. Without Podman or the image the test skips, or fails under
// MCPEXEC_REQUIRE_PODMAN=1.
func New(tb testing.TB, cfg podman.Config) *podman.Runtime {
	tb.Helper()
	if _, err := exec.LookPath("podman"); err != nil {
		testenv.SkipOrFail(tb, "podman is not installed (make deps)")
	}
	if cfg.Image == "" {
		cfg.Image = os.Getenv("MCPEXEC_IMAGE")
	}
	if cfg.URI == "" {
		cfg.URI = os.Getenv("MCPEXEC_PODMAN")
	}
	if cfg.WorkerID == "" {
		cfg.WorkerID = sandboxtest.WorkerID(tb)
	}
	if cfg.Logger == nil {
		cfg.Logger = testenv.Logger(tb)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rt, err := podman.New(ctx, cfg)
	if err != nil {
		testenv.SkipOrFail(tb, "Podman sandbox unavailable: %v", err)
	}
	tb.Cleanup(func() {
		if err := rt.Close(); err != nil {
			tb.Errorf("close podman runtime: %v", err)
		}
	})
	return rt
}
