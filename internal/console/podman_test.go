package console_test

import (
	"context"
	"errors"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman/podmantest"
)

// TestConsoleCancelPodman cancels a running job from its page and sees its
// container gone: the container's id is the one the page's timeline names
// (from the worker's spans).
func TestConsoleCancelPodman(t *testing.T) {
	rt := podmantest.New(t, podman.Config{Config: containerpool.Config{Pool: 1}})
	f := startFleet(t, rt, false)
	p := newPage(t, f.url)
	p.signIn(tokA)
	id := f.submit(t, tokA, map[string]any{"code": "import time\nprint('sleeping', flush=True)\ntime.sleep(110)", "timeout": 120})
	p.hash("#/job/" + id)
	p.until("the running job's container", `document.getElementById('cancel') !== null && /container [0-9a-f]{12}/.test(document.getElementById('timeline').textContent)`)
	container := eval[string](p, `document.getElementById('timeline').textContent.match(/container ([0-9a-f]{12})/)[1]`)
	if !containerExists(t, container) {
		t.Fatalf("the page names container %s, which does not exist", container)
	}
	p.do(chromedp.Click(chromedp.ID("cancel")))
	p.until("the cancelled job", `document.querySelector('main .bar .badge').textContent === 'cancelled'`)
	deadline := time.Now().Add(30 * time.Second)
	for containerExists(t, container) {
		if time.Now().After(deadline) {
			t.Fatalf("container %s of the cancelled job still exists after 30 s", container)
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.noErrors()
}

// containerExists asks Podman whether container id exists.
func containerExists(t *testing.T, id string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := exec.CommandContext(ctx, "podman", "container", "exists", id).Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return true
	case errors.As(err, &exit) && exit.ExitCode() == 1:
		return false
	}
	t.Fatalf("podman container exists %s: %v", id, err)
	return false
}
