// Package chromiumtest starts headless Chromium for tests that drive pages
// (the console's), through chromedp.
package chromiumtest

import (
	"context"
	"os"
	"os/exec"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/mcpexec/mcpexec/internal/testutil"
)

// Binary is where Debian's chromium package puts the browser; $MCPEXEC_CHROMIUM
// overrides it.
const Binary = "/usr/bin/chromium"

// New starts a headless Chromium with a fresh profile and returns the
// context of its first tab, for chromedp.Run. The browser is closed, and its
// goroutines end, when the test ends. Without Chromium the test skips, or
// fails under MCPEXEC_REQUIRE_PODMAN=1 (CI installs it: make deps).
func New(tb testing.TB) context.Context {
	tb.Helper()
	bin := os.Getenv("MCPEXEC_CHROMIUM")
	if bin == "" {
		bin = Binary
	}
	if _, err := exec.LookPath(bin); err != nil {
		testutil.SkipOrFail(tb, "chromium is not installed at %s (make deps, or apt-get install chromium)", bin)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(bin),
		chromedp.UserDataDir(tb.TempDir()),
		chromedp.NoSandbox, // tests run as root, where Chromium's sandbox refuses to start
		chromedp.Headless,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.Flag("mute-audio", true),
		chromedp.WindowSize(1280, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	// The first run starts the browser, which lives as long as its context:
	// never one with a timeout.
	if err := chromedp.Do(ctx); err != nil {
		cancelTab()
		cancelAlloc()
		testutil.SkipOrFail(tb, "start chromium: %v", err)
	}
	tb.Cleanup(func() {
		// Closes the browser and waits for its process and chromedp's goroutines.
		if err := chromedp.Cancel(ctx); err != nil {
			tb.Logf("close chromium: %v", err)
		}
		cancelTab()
		cancelAlloc()
	})
	return ctx
}
