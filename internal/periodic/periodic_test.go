package periodic_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mcpexec/mcpexec/internal/periodic"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRun: fn runs on each tick, not at once, and Run returns when ctx ends.
func TestRun(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		periodic.Run(ctx, time.Millisecond, func() {
			if n.Add(1) == 3 {
				cancel()
			}
		})
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if got := n.Load(); got != 3 {
		t.Fatalf("fn ran %d times after the cancel at the third, want 3", got)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	periodic.Run(ctx2, time.Hour, func() { t.Error("fn ran at once") })
}
