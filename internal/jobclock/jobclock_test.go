package jobclock

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var errTimeUp = errors.New("time is up")

func ended(ctx context.Context, within time.Duration) bool {
	select {
	case <-ctx.Done():
		return true
	case <-time.After(within):
		return false
	}
}

// TestBudgetEnds: a clock that is never paused ends its context with the
// cause once the budget is spent.
func TestBudgetEnds(t *testing.T) {
	ctx, c, cancel := WithBudget(context.Background(), 50*time.Millisecond, errTimeUp)
	defer cancel()
	if From(ctx) != c {
		t.Fatal("the context does not carry its clock")
	}
	if !ended(ctx, 10*time.Second) {
		t.Fatal("the context did not end after its budget")
	}
	if !errors.Is(context.Cause(ctx), errTimeUp) {
		t.Fatalf("cause %v, want %v", context.Cause(ctx), errTimeUp)
	}
	if ran, _ := c.Times(); ran < 50*time.Millisecond {
		t.Fatalf("ran %s, want at least the budget", ran)
	}
}

// TestPauseStopsTheClock: while paused the budget is not spent, however long
// the pause; once resumed, what was left runs out.
func TestPauseStopsTheClock(t *testing.T) {
	ctx, c, cancel := WithBudget(context.Background(), time.Second, errTimeUp)
	defer cancel()
	resume := c.Pause()
	inner := c.Pause() // nested: both must be resumed
	if ended(ctx, 1500*time.Millisecond) {
		t.Fatalf("the context ended while the clock was paused: %v", context.Cause(ctx))
	}
	resume()
	resume() // only the first call counts
	if ended(ctx, 1500*time.Millisecond) {
		t.Fatal("the context ended while one pause still held")
	}
	ran, paused := c.Times()
	if paused < 3*time.Second || ran >= time.Second {
		t.Fatalf("ran %s, paused %s: want the pauses counted apart", ran, paused)
	}
	inner()
	if !ended(ctx, 10*time.Second) {
		t.Fatal("the context did not end after the pause")
	}
	if !errors.Is(context.Cause(ctx), errTimeUp) {
		t.Fatalf("cause %v", context.Cause(ctx))
	}
}

// TestPauseIsBounded: a clock standing still for longer than its pause
// allowance ends all the same.
func TestPauseIsBounded(t *testing.T) {
	ctx, c, cancel := WithBudget(context.Background(), time.Hour, errTimeUp)
	defer cancel()
	c.mu.Lock()
	c.maxPaused = 50 * time.Millisecond
	c.mu.Unlock()
	defer c.Pause()()
	if !ended(ctx, 10*time.Second) {
		t.Fatal("a clock paused past its allowance did not end")
	}
	if !errors.Is(context.Cause(ctx), errTimeUp) {
		t.Fatalf("cause %v", context.Cause(ctx))
	}
}

// TestNestedClocks: pausing a clock made in another's context pauses both.
func TestNestedClocks(t *testing.T) {
	outerCtx, outer, cancel := WithBudget(context.Background(), time.Second, errTimeUp)
	defer cancel()
	innerCtx, inner, cancelInner := WithBudget(outerCtx, time.Hour, errTimeUp)
	defer cancelInner()
	if From(innerCtx) != inner {
		t.Fatal("the inner context does not carry the inner clock")
	}
	resume := inner.Pause()
	if ended(innerCtx, 1500*time.Millisecond) {
		t.Fatalf("the outer clock ran while the inner one was paused: %v", context.Cause(innerCtx))
	}
	if _, paused := outer.Times(); paused < time.Second {
		t.Fatalf("outer clock paused %s", paused)
	}
	resume()
	if !ended(innerCtx, 10*time.Second) || !errors.Is(context.Cause(innerCtx), errTimeUp) {
		t.Fatalf("the outer clock's end did not end the inner context: %v", context.Cause(innerCtx))
	}
}

// TestNilClock: code that finds no clock in its context may still pause it.
func TestNilClock(t *testing.T) {
	c := From(context.Background())
	c.Pause()()
	if c.Remaining() != 0 {
		t.Fatal("a nil clock has time left")
	}
}

// TestCancelStops: cancel ends the context as cancelled and stops the timer.
func TestCancelStops(t *testing.T) {
	ctx, c, cancel := WithBudget(context.Background(), time.Hour, errTimeUp)
	cancel()
	if !errors.Is(context.Cause(ctx), context.Canceled) {
		t.Fatalf("cause %v, want cancelled", context.Cause(ctx))
	}
	if r := c.Remaining(); r <= 0 || r > time.Hour {
		t.Fatalf("remaining %s", r)
	}
}
