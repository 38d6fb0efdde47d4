// Package jobclock provides a job's clock: a time budget that runs while the
// job's code runs and stops while one of its calls waits for a person (a
// tool call parked for approval). The worker's driver bounds a job with one,
// and the front-end answering a call bounds the call with one, so neither
// side cuts a call off while it waits for a person's answer.
package jobclock

import (
	"context"
	"sync"
	"time"
)

// DefaultMaxPaused bounds how long a clock may stand still in all: a job
// whose calls wait longer than that for answers ends as if its time were up
// (each wait is bounded by its namespace's approval_timeout, at most an
// hour, but a job may ask again and again).
const DefaultMaxPaused = 2 * time.Hour

// Clock is a time budget. Its context ends, with the cause given to
// WithBudget, once the clock has run for the whole budget, or once it has
// stood still for longer than MaxPaused in all. The zero Clock is not
// usable; a nil *Clock is, and never stops.
type Clock struct {
	parent            *Clock // the clock of the context this one was made in
	budget, maxPaused time.Duration
	cancel            context.CancelCauseFunc
	cause             error

	mu          sync.Mutex // guards the fields below
	ran, paused time.Duration
	since       time.Time // when the current run or pause began
	holds       int       // Pause calls not yet resumed
	timer       *time.Timer
	gen         int // bumps on every state change: a stale timer does nothing
	done        bool
}

type clockKey struct{}

// WithBudget returns a context that ends with cause once the returned clock
// has run for budget (or stood still for longer than DefaultMaxPaused), and
// the clock, which the context carries (From finds it). Call cancel when done.
// A clock made in the context of another pauses that one too.
func WithBudget(parent context.Context, budget time.Duration, cause error) (context.Context, *Clock, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	c := &Clock{parent: From(parent), budget: budget, maxPaused: DefaultMaxPaused, cancel: cancel, cause: cause, since: time.Now()}
	c.mu.Lock()
	c.arm(budget)
	c.mu.Unlock()
	ctx = context.WithValue(ctx, clockKey{}, c)
	return ctx, c, func() {
		c.stop()
		cancel(context.Canceled)
	}
}

// From returns the clock ctx carries, or nil.
func From(ctx context.Context) *Clock {
	c, _ := ctx.Value(clockKey{}).(*Clock)
	return c
}

// Pause stops the clock until the returned function is called (it may be
// called more than once; only the first call counts). Pauses nest: the clock
// runs again when every one is resumed. The clocks it was made in pause
// with it. On a nil clock both do nothing.
func (c *Clock) Pause() (resume func()) {
	if c == nil {
		return func() {}
	}
	outer := c.parent.Pause()
	c.mu.Lock()
	if c.holds == 0 && !c.done {
		now := time.Now()
		c.ran += now.Sub(c.since)
		c.since = now
		c.arm(c.maxPaused - c.paused)
	}
	c.holds++
	c.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { c.resume(); outer() }) }
}

func (c *Clock) resume() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.holds--
	if c.holds > 0 || c.done {
		return
	}
	now := time.Now()
	c.paused += now.Sub(c.since)
	c.since = now
	c.arm(c.budget - c.ran)
}

// Remaining is how much of the budget is left (0 when none is).
func (c *Clock) Remaining() time.Duration {
	if c == nil {
		return 0
	}
	ran, _ := c.Times()
	return max(c.budget-ran, 0)
}

// Times reports how long the clock has run and how long it has stood still.
func (c *Clock) Times() (ran, paused time.Duration) {
	if c == nil {
		return 0, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ran, paused = c.ran, c.paused
	if !c.done {
		if c.holds > 0 {
			paused += time.Since(c.since)
		} else {
			ran += time.Since(c.since)
		}
	}
	return ran, paused
}

// arm sets the timer to check the clock after d. c.mu is held.
func (c *Clock) arm(d time.Duration) {
	c.gen++
	gen := c.gen
	if c.timer != nil {
		c.timer.Stop()
	}
	c.timer = time.AfterFunc(max(d, 0), func() { c.check(gen) })
}

// check ends the context if the budget (or the pause allowance) is spent,
// else sets the timer again.
func (c *Clock) check(gen int) {
	c.mu.Lock()
	if gen != c.gen || c.done {
		c.mu.Unlock()
		return
	}
	elapsed := time.Since(c.since)
	left := c.budget - c.ran - elapsed
	if c.holds > 0 {
		left = c.maxPaused - c.paused - elapsed
	}
	if left > 0 {
		c.arm(left)
		c.mu.Unlock()
		return
	}
	if c.holds > 0 {
		c.paused += elapsed
	} else {
		c.ran += elapsed
	}
	c.since = time.Now()
	c.done = true
	c.mu.Unlock()
	c.cancel(c.cause)
}

// stop stops the clock for good.
func (c *Clock) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return
	}
	now := time.Now()
	if c.holds > 0 {
		c.paused += now.Sub(c.since)
	} else {
		c.ran += now.Sub(c.since)
	}
	c.since = now
	c.done = true
	c.gen++
	if c.timer != nil {
		c.timer.Stop()
	}
}
