package testutil

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// FakeRuntime is a sandbox runtime for queue and fault tests: it runs no code.
// A job whose code is "sleep DURATION" takes that long (or until its context
// ends); "block" runs until its context ends; any other code succeeds at once
// with the code as its stdout. It is never proof that sandboxing works.
type FakeRuntime struct {
	// Started receives the id of each job as it starts, when not nil (sends
	// never block: size the buffer for the test).
	Started chan string
	// Func, when set, runs each job instead of the codes above.
	Func func(ctx context.Context, job sandbox.Job) (sandbox.Result, error)
	// Langs are the languages it says it runs (sandbox.LanguageReporter);
	// empty: Python alone.
	Langs []string

	mu   sync.Mutex // guards runs
	runs int
}

var _ sandbox.Runtime = (*FakeRuntime)(nil)

// NewFakeRuntime returns a FakeRuntime whose Started channel holds buf ids.
func NewFakeRuntime(buf int) *FakeRuntime {
	return &FakeRuntime{Started: make(chan string, buf)}
}

// Run implements sandbox.Runtime.
func (r *FakeRuntime) Run(ctx context.Context, job sandbox.Job, _ sandbox.Host) (sandbox.Result, error) {
	r.mu.Lock()
	r.runs++
	r.mu.Unlock()
	if r.Started != nil {
		select {
		case r.Started <- job.ID:
		default:
		}
	}
	if r.Func != nil {
		return r.Func(ctx, job)
	}
	start := time.Now()
	var wait <-chan time.Time
	switch {
	case job.Code == "block":
	case strings.HasPrefix(job.Code, "sleep "):
		d, err := time.ParseDuration(strings.TrimPrefix(job.Code, "sleep "))
		if err != nil {
			return sandbox.Result{Status: sandbox.StatusError, ExitCode: 1, Error: err.Error()}, nil
		}
		wait = time.After(d)
	default:
		return sandbox.Result{Status: sandbox.StatusSuccess, Stdout: job.Code, Duration: time.Since(start)}, nil
	}
	select {
	case <-wait:
		return sandbox.Result{Status: sandbox.StatusSuccess, Stdout: job.Code, Duration: time.Since(start)}, nil
	case <-ctx.Done():
		return sandbox.Result{Status: sandbox.StatusError, Error: "interrupted", Duration: time.Since(start)}, ctx.Err()
	}
}

// Runs returns how many jobs Run has started.
func (r *FakeRuntime) Runs() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs
}

// Close implements sandbox.Runtime.
func (r *FakeRuntime) Close() error { return nil }

// Languages implements sandbox.LanguageReporter.
func (r *FakeRuntime) Languages() []string { return r.Langs }
