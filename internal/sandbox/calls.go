package sandbox

// The calls a runner makes during a job: each checked against the job's
// bounds where it is received, then passed to the host on a goroutine of
// its own.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/jobclock"
	"github.com/mcpexec/mcpexec/internal/proxy"
)

// timedOut says how a job ran out of time: its limit, and the time its
// calls waited for approval, which did not count.
func timedOut(ctx context.Context, limit time.Duration) string {
	if _, paused := jobclock.From(ctx).Times(); paused >= time.Second {
		return fmt.Sprintf("timed out after %s of running (its calls also waited %s for approval, which does not count)", limit, paused.Round(time.Second))
	}
	return fmt.Sprintf("timed out after %s", limit)
}

// serveCall answers one call frame: refused at once when it breaks a bound, else
// passed to host on its own goroutine; the answer goes to out.
func serveCall(out replySink, g *callGate, host Host, f *proxy.Frame) {
	refuse := func(text string) {
		out.sendAsync(&proxy.Frame{Type: proxy.TypeReply, ID: f.ID, Error: text})
	}
	if !proxy.KnownMethod(f.Method) {
		refuse(fmt.Sprintf("%v %q", ErrUnknownMethod, errs.Clip(f.Method, 40)))
		return
	}
	if len(f.Params) > proxy.MaxRequest {
		refuse(fmt.Sprintf("call parameters of %d bytes are over the %d-byte limit", len(f.Params), proxy.MaxRequest))
		return
	}
	release, why := g.admit(len(f.Params))
	if why != "" {
		refuse(why)
		return
	}
	go func() {
		defer g.wg.Done()
		defer release()
		select {
		case <-g.opened:
		default:
			select {
			case <-g.opened:
			case <-g.ctx.Done():
				return // the job ended before its start was recorded
			}
		}
		reply := &proxy.Frame{Type: proxy.TypeReply, ID: f.ID}
		res, err := host.Call(g.ctx, f.Method, f.Params)
		if g.ctx.Err() != nil {
			return // the job is over: nobody waits for this answer
		}
		if err != nil {
			reply.Error = err.Error()
		} else {
			reply.Result = res
		}
		// The slot is free before the runner can read the answer, so a
		// runner that starts a call as each one returns never meets the
		// bound it keeps to.
		release()
		if werr := out.write(reply); werr != nil && errors.Is(werr, proxy.ErrFrameTooLarge) {
			refuse(werr.Error())
		}
	}()
}

// callGate bounds one job's calls: how many are in flight, the bytes of their
// parameters, and how many start per second.
type callGate struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	rate   *bucket
	opened chan struct{} // closed once calls may be answered

	mu       sync.Mutex // guards inFlight, bytes, stopped
	inFlight int
	bytes    int
	stopped  bool // stop began: no call is admitted (none joins wg while it waits)
}

// A gate made held answers no call until open is called: the calls it
// admits wait (their job's start is not recorded yet).
func newCallGate(ctx context.Context, held bool) *callGate {
	cctx, cancel := context.WithCancel(ctx)
	g := &callGate{ctx: cctx, cancel: cancel, rate: newBucket(CallsPerSecond, CallBurst), opened: make(chan struct{})}
	if !held {
		close(g.opened)
	}
	return g
}

// open lets the calls of a held gate through.
func (g *callGate) open() { close(g.opened) }

// admit takes a slot for a call with n bytes of parameters, or says why not.
// release frees the slot (more than once is harmless); the caller's goroutine
// then calls g.wg.Done.
func (g *callGate) admit(n int) (release func(), why string) {
	if !g.rate.take() {
		return nil, fmt.Sprintf("more than %d calls per second: slow down", CallsPerSecond)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return nil, "the job is over: no more calls"
	}
	if g.inFlight >= MaxConcurrentCalls {
		return nil, fmt.Sprintf("too many concurrent calls (limit %d): await some before starting more", MaxConcurrentCalls)
	}
	if g.bytes+n > MaxCallBytesInFlight {
		return nil, fmt.Sprintf("calls in flight carry over %d bytes: await some before starting more", MaxCallBytesInFlight)
	}
	g.inFlight++
	g.bytes += n
	g.wg.Add(1)
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			g.inFlight--
			g.bytes -= n
			g.mu.Unlock()
		})
	}, ""
}

// stop cancels the calls in flight and waits for them.
func (g *callGate) stop() {
	g.mu.Lock()
	g.stopped = true
	g.mu.Unlock()
	g.cancel()
	g.wg.Wait()
}

// bucket is a token bucket.
type bucket struct {
	rate, burst float64
	mu          sync.Mutex // guards tokens, last
	tokens      float64
	last        time.Time
}

func newBucket(rate, burst float64) *bucket {
	return &bucket{rate: rate, burst: burst, tokens: burst, last: time.Now()}
}

func (b *bucket) refillLocked(now time.Time) {
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
}

// take takes a token if there is one.
func (b *bucket) take() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked(time.Now())
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// wait takes a token, waiting for one; false when done closes first.
func (b *bucket) wait(done <-chan struct{}) bool {
	for {
		b.mu.Lock()
		b.refillLocked(time.Now())
		if b.tokens >= 1 {
			b.tokens--
			b.mu.Unlock()
			return true
		}
		need := time.Duration((1 - b.tokens) / b.rate * float64(time.Second))
		b.mu.Unlock()
		select {
		case <-time.After(need):
		case <-done:
			return false
		}
	}
}
