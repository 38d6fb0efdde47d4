package app

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/mcpexec/mcpexec/internal/discovery"
	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

// ErrNotReady is the kind of the error a Lazy front-end answers while its
// stack is not up: the message says what is missing and how to fix it.
var ErrNotReady = errs.New(errs.Unavailable, "mcpexec is not ready to run code")

// Lazy is a front-end whose stack (broker connection or embedded broker,
// sandbox runtime, worker) starts in the background, so that the MCP surface
// answers at once: until the stack is up, calls that need it are answered
// with ErrNotReady saying why. A start that fails is retried, with a growing
// delay, until it succeeds or Close.
type Lazy struct {
	cfg    FrontendConfig
	limits jobs.Limits
	fix    func(error) string

	mu      sync.Mutex
	stack   *Stack
	lastErr error
	ready   chan struct{} // closed once stack is set
	failed  chan struct{} // closed when a start first fails
	onReady []func(*Stack)

	cancel context.CancelFunc
	done   chan struct{}
}

// Retry delays of a Lazy start that failed.
const (
	lazyFirstRetry = 2 * time.Second
	lazyMaxRetry   = 30 * time.Second
)

// StartLazily starts cfg's stack in the background and returns at once. fix,
// when set, turns a start's error into the advice appended to ErrNotReady's
// message.
func StartLazily(cfg FrontendConfig, fix func(error) string) *Lazy {
	ctx, cancel := context.WithCancel(context.Background())
	l := &Lazy{cfg: cfg, limits: cfg.Frontend.Limits, fix: fix, ready: make(chan struct{}), failed: make(chan struct{}), cancel: cancel, done: make(chan struct{})}
	if l.limits == (jobs.Limits{}) {
		l.limits = jobs.DefaultLimits()
	}
	go l.run(ctx)
	return l
}

func (l *Lazy) run(ctx context.Context) {
	defer close(l.done)
	log := l.cfg.Logger
	delay := lazyFirstRetry
	for {
		start := time.Now()
		s, err := StartFrontend(ctx, l.cfg)
		if err == nil {
			l.mu.Lock()
			l.stack, l.lastErr = s, nil
			hooks := l.onReady
			l.onReady = nil
			close(l.ready)
			l.mu.Unlock()
			if log != nil {
				attrs := []any{"start_ms", time.Since(start).Milliseconds()}
				if s.Broker != nil {
					attrs = append(attrs, "sync", s.Broker.Sync().String(), "group_sync", s.Broker.GroupSync())
				}
				log.Info("mcpexec is ready to run code", attrs...)
			}
			for _, h := range hooks {
				h(s)
			}
			return
		}
		l.mu.Lock()
		if l.lastErr == nil {
			close(l.failed)
		}
		l.lastErr = err
		l.mu.Unlock()
		if log != nil {
			log.Warn("mcpexec cannot run code yet: retrying", "err", err, "fix", l.advice(err), "retry_in", delay)
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return
		}
		delay = min(2*delay, lazyMaxRetry)
	}
}

func (l *Lazy) advice(err error) string {
	if l.fix == nil {
		return ""
	}
	return l.fix(err)
}

// Stack returns the running stack, or an ErrNotReady that says why there is
// none yet.
func (l *Lazy) Stack() (*Stack, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stack != nil {
		return l.stack, nil
	}
	if l.lastErr == nil {
		return nil, fmt.Errorf("%w: it is still starting (the sandbox runtime and the broker); try again in a few seconds", ErrNotReady)
	}
	if a := l.advice(l.lastErr); a != "" {
		return nil, fmt.Errorf("%w: %w; to fix it: %s", ErrNotReady, l.lastErr, a)
	}
	return nil, fmt.Errorf("%w: %w", ErrNotReady, l.lastErr)
}

// frontend returns the running front-end or ErrNotReady.
func (l *Lazy) frontend() (*frontend.Frontend, error) {
	s, err := l.Stack()
	if err != nil {
		return nil, err
	}
	return s.Frontend, nil
}

// StartWait is how long a call that needs the stack waits for a start in
// progress (the embedded broker and runtime take a second or two; building
// the sandbox image a minute). A start that failed is answered at once.
const StartWait = 30 * time.Second

// await returns the front-end, waiting up to StartWait (or ctx) for a start
// in progress that has not failed yet.
func (l *Lazy) await(ctx context.Context) (*frontend.Frontend, error) {
	l.mu.Lock()
	starting := l.stack == nil && l.lastErr == nil
	l.mu.Unlock()
	if starting {
		t := time.NewTimer(StartWait)
		defer t.Stop()
		select {
		case <-l.ready:
		case <-l.failed:
		case <-ctx.Done():
		case <-t.C:
		case <-l.done:
		}
	}
	return l.frontend()
}

// OnReady calls fn with the stack once it runs (at once when it does).
func (l *Lazy) OnReady(fn func(*Stack)) {
	l.mu.Lock()
	s := l.stack
	if s == nil {
		l.onReady = append(l.onReady, fn)
	}
	l.mu.Unlock()
	if s != nil {
		fn(s)
	}
}

// Ready is closed once the stack runs.
func (l *Lazy) Ready() <-chan struct{} { return l.ready }

// Close stops the start (or the stack, once it runs) and waits for it.
func (l *Lazy) Close() {
	l.cancel()
	<-l.done
	l.mu.Lock()
	s := l.stack
	l.stack = nil
	l.mu.Unlock()
	if s != nil {
		s.Close()
	}
}

// Drain lets the running front-end's jobs end (nothing while there is none).
func (l *Lazy) Drain(ctx context.Context) {
	if fe, err := l.frontend(); err == nil {
		fe.Drain(ctx)
	}
}

// Health is the front-end's health while it runs; before, an error saying
// why it does not.
func (l *Lazy) Health(ctx context.Context) error {
	fe, err := l.frontend()
	if err != nil {
		return err
	}
	return fe.Health(ctx)
}

// Handler serves build(front-end) once the stack runs; before, 503 with
// ErrNotReady's message.
func (l *Lazy) Handler(build func(*frontend.Frontend) http.Handler) http.Handler {
	var once sync.Once
	var h http.Handler
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fe, err := l.frontend()
		if err != nil {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Retry-After", "5")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = fmt.Fprintf(w, `{"error":{"code":"unavailable","message":%q}}`+"\n", err.Error()) // the client went away: nothing to do
			return
		}
		once.Do(func() { h = build(fe) })
		h.ServeHTTP(w, r)
	})
}

// IsNotReady reports whether err is a Lazy front-end's ErrNotReady.
func IsNotReady(err error) bool { return errors.Is(err, ErrNotReady) }

// The front-end that starts in the background is the callers' job service
// as the front-end it starts is: each call goes to the running front-end,
// and until there is one it answers ErrNotReady (Unavailable). Calls that
// start work (runs, submissions, the catalog) first wait for a start in
// progress (await); the others answer at once.
var _ jobs.Service = (*Lazy)(nil)

// running calls fn with the running front-end, or answers ErrNotReady.
func running[T any](l *Lazy, fn func(*frontend.Frontend) (T, error)) (T, error) {
	fe, err := l.frontend()
	if err != nil {
		var zero T
		return zero, err
	}
	return fn(fe)
}

// started is running after await: it waits for a start in progress.
func started[T any](ctx context.Context, l *Lazy, fn func(*frontend.Frontend) (T, error)) (T, error) {
	fe, err := l.await(ctx)
	if err != nil {
		var zero T
		return zero, err
	}
	return fn(fe)
}

// do is running for a call that answers only an error.
func (l *Lazy) do(fn func(*frontend.Frontend) error) error {
	fe, err := l.frontend()
	if err != nil {
		return err
	}
	return fn(fe)
}

// notReady is the outcome of submitting js while there is no front-end.
func notReady(js []*jobs.Job, err error) []jobs.Submitted {
	out := make([]jobs.Submitted, len(js))
	for i := range out {
		out[i].Err = err
	}
	return out
}

// Limits implements jobs.Service: the configured limits, known before the
// stack runs.
func (l *Lazy) Limits() jobs.Limits { return l.limits }

// LimitsFor implements jobs.Service; before the stack runs (when nothing
// can be submitted) it is Limits.
func (l *Lazy) LimitsFor(ns string) jobs.Limits {
	if fe, err := l.frontend(); err == nil {
		return fe.LimitsFor(ns)
	}
	return l.limits
}

// Run implements jobs.Service.
func (l *Lazy) Run(ctx context.Context, job *jobs.Job, progress func(jobs.Event)) (*jobs.Record, error) {
	return started(ctx, l, func(fe *frontend.Frontend) (*jobs.Record, error) { return fe.Run(ctx, job, progress) })
}

// Submit implements jobs.Service.
func (l *Lazy) Submit(ctx context.Context, job *jobs.Job) (*jobs.Record, error) {
	return started(ctx, l, func(fe *frontend.Frontend) (*jobs.Record, error) { return fe.Submit(ctx, job) })
}

// SubmitMany implements jobs.Service.
func (l *Lazy) SubmitMany(ctx context.Context, js []*jobs.Job, ns string) []jobs.Submitted {
	fe, err := l.await(ctx)
	if err != nil {
		return notReady(js, err)
	}
	return fe.SubmitMany(ctx, js, ns)
}

// SubmitWorkflow implements jobs.Service.
func (l *Lazy) SubmitWorkflow(ctx context.Context, js []*jobs.Job, ns string) []jobs.Submitted {
	fe, err := l.await(ctx)
	if err != nil {
		return notReady(js, err)
	}
	return fe.SubmitWorkflow(ctx, js, ns)
}

// Get implements jobs.Service.
func (l *Lazy) Get(ctx context.Context, ns, id string) (*jobs.Record, error) {
	return running(l, func(fe *frontend.Frontend) (*jobs.Record, error) { return fe.Get(ctx, ns, id) })
}

// Wait implements jobs.Service.
func (l *Lazy) Wait(ctx context.Context, ns, id string) (*jobs.Record, error) {
	return running(l, func(fe *frontend.Frontend) (*jobs.Record, error) { return fe.Wait(ctx, ns, id) })
}

// List implements jobs.Service.
func (l *Lazy) List(ctx context.Context, ns string, f jobs.Filter) ([]*jobs.Record, string, error) {
	fe, err := l.frontend()
	if err != nil {
		return nil, "", err
	}
	return fe.List(ctx, ns, f)
}

// DeadLetters implements jobs.Service.
func (l *Lazy) DeadLetters(ctx context.Context, ns string, f jobs.Filter) ([]*jobs.Record, string, error) {
	fe, err := l.frontend()
	if err != nil {
		return nil, "", err
	}
	return fe.DeadLetters(ctx, ns, f)
}

// Cancel implements jobs.Service.
func (l *Lazy) Cancel(ctx context.Context, ns, id, reason string) error {
	return l.do(func(fe *frontend.Frontend) error { return fe.Cancel(ctx, ns, id, reason) })
}

// Follow implements jobs.Service.
func (l *Lazy) Follow(ctx context.Context, ns string, after uint64, resume bool, fn func(jobs.EventView) error) error {
	return l.do(func(fe *frontend.Frontend) error { return fe.Follow(ctx, ns, after, resume, fn) })
}

// WatchOutput implements jobs.Service.
func (l *Lazy) WatchOutput(ns, id string, fn func(stream, data string)) (func(), error) {
	return running(l, func(fe *frontend.Frontend) (func(), error) { return fe.WatchOutput(ns, id, fn) })
}

// File implements jobs.Service.
func (l *Lazy) File(ctx context.Context, ns, id, name string) (jobs.FileInfo, []byte, error) {
	fe, err := l.frontend()
	if err != nil {
		return jobs.FileInfo{}, nil, err
	}
	return fe.File(ctx, ns, id, name)
}

// Approvals implements jobs.Service.
func (l *Lazy) Approvals(ctx context.Context, ns string) ([]jobs.Approval, error) {
	return running(l, func(fe *frontend.Frontend) ([]jobs.Approval, error) { return fe.Approvals(ctx, ns) })
}

// DecideApproval implements jobs.Service.
func (l *Lazy) DecideApproval(ctx context.Context, ns, id, decision, by, reason string) (jobs.Approval, error) {
	return running(l, func(fe *frontend.Frontend) (jobs.Approval, error) {
		return fe.DecideApproval(ctx, ns, id, decision, by, reason)
	})
}

// AnswerApproval implements jobs.Service.
func (l *Lazy) AnswerApproval(ctx context.Context, ns, id string, ans jobs.ApprovalAnswer, by string) (jobs.Approval, *jobs.Grant, error) {
	fe, err := l.frontend()
	if err != nil {
		return jobs.Approval{}, nil, err
	}
	return fe.AnswerApproval(ctx, ns, id, ans, by)
}

// Grants implements jobs.Service.
func (l *Lazy) Grants(ctx context.Context, ns string) ([]jobs.Grant, error) {
	return running(l, func(fe *frontend.Frontend) ([]jobs.Grant, error) { return fe.Grants(ctx, ns) })
}

// RevokeGrant implements jobs.Service.
func (l *Lazy) RevokeGrant(ctx context.Context, ns, id string) error {
	return l.do(func(fe *frontend.Frontend) error { return fe.RevokeGrant(ctx, ns, id) })
}

// FollowApprovals implements jobs.Service.
func (l *Lazy) FollowApprovals(ctx context.Context, ns string, fn func(jobs.ApprovalEvent) error) error {
	return l.do(func(fe *frontend.Frontend) error { return fe.FollowApprovals(ctx, ns, fn) })
}

// EnabledServers implements mcpserver.ServerCatalog; it waits, as Run does,
// for a start in progress (within ctx).
func (l *Lazy) EnabledServers(ctx context.Context, ns string) ([]string, error) {
	return started(ctx, l, func(fe *frontend.Frontend) ([]string, error) { return fe.EnabledServers(ctx, ns) })
}

// FindServers implements mcpserver.ServerCatalog.
func (l *Lazy) FindServers(ctx context.Context, ns, query string, limit int) ([]discovery.CatalogEntry, error) {
	return started(ctx, l, func(fe *frontend.Frontend) ([]discovery.CatalogEntry, error) {
		return fe.FindServers(ctx, ns, query, limit)
	})
}

// EnableServer implements mcpserver.ServerCatalog.
func (l *Lazy) EnableServer(ctx context.Context, ns, name string) (discovery.CatalogEntry, error) {
	return started(ctx, l, func(fe *frontend.Frontend) (discovery.CatalogEntry, error) { return fe.EnableServer(ctx, ns, name) })
}

// DisableServer implements mcpserver.ServerCatalog.
func (l *Lazy) DisableServer(ctx context.Context, ns, name string) (bool, error) {
	return started(ctx, l, func(fe *frontend.Frontend) (bool, error) { return fe.DisableServer(ctx, ns, name) })
}
