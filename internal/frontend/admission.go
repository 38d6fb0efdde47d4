package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/periodic"

	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
)

// ErrOverCap is the error of a submission that would exceed its namespace's
// caps; the submission is refused and nothing is queued.
var ErrOverCap = errs.New(errs.OverCap, "namespace job cap reached")

// ErrShuttingDown is the error of a submission to a front-end that is
// shutting down, and of a wait it gave up (see ResumableError).
var ErrShuttingDown = errs.New(errs.ShuttingDown, "the front-end is shutting down")

// ResumableError is what Run returns for a job still unfinished when the
// front-end shut down: the job goes on, and its result can be fetched by id
// from any front-end.
type ResumableError struct{ JobID string }

func (e *ResumableError) Error() string {
	return fmt.Sprintf("the front-end is shutting down; job %s goes on and its result is kept: fetch it with GET /api/jobs/%s/wait on any front-end", e.JobID, e.JobID)
}

// Is makes a ResumableError match ErrShuttingDown.
func (e *ResumableError) Is(target error) bool { return target == ErrShuttingDown }

// reconcileEvery is how often tracked jobs are looked up in the state service,
// in case an event was missed.
const reconcileEvery = 5 * time.Second

// admission tracks the unfinished jobs this front-end submitted, per
// namespace, and the front-end's shutdown.
type admission struct {
	f *Frontend

	mu       sync.Mutex // guards jobs, draining, sub, stop
	jobs     map[string]*tracked
	draining bool
	sub      *nats.Subscription
	stop     context.CancelFunc

	waits    sync.WaitGroup // Run calls in flight
	abandon  chan struct{}  // closed when Drain gives up waiting
	abandonO sync.Once
	loop     sync.WaitGroup // reconcile loop
}

type tracked struct {
	namespace string
	running   bool
	bytes     int64 // of its code and files: what it holds of the queue
}

func newAdmission(f *Frontend) *admission {
	return &admission{f: f, jobs: map[string]*tracked{}, abandon: make(chan struct{})}
}

// enabled reports whether any namespace has a job cap.
func (a *admission) enabled() bool {
	if a.f.cfg.Policy.Enabled() {
		return true
	}
	for _, p := range a.f.cfg.Policies {
		if p.Enabled() {
			return true
		}
	}
	return false
}

// start follows the lifecycle events of tracked jobs when caps are set.
func (a *admission) start() error {
	if !a.enabled() {
		return nil
	}
	sub, err := a.f.nc.Subscribe(a.f.cfg.Subjects.AllEvents(), func(m *nats.Msg) {
		job, kind, ok := a.f.cfg.Subjects.ParseEvent(m.Subject)
		if !ok || !a.counts(job, kind) {
			return
		}
		// Only a genuine event frees a slot: a worker may publish any job's
		// finished subject, but proves only the jobs it holds.
		var ev jobs.Event
		if json.Unmarshal(m.Data, &ev) != nil || !a.f.trusted(m.Subject, ev) {
			return
		}
		a.observe(job, kind)
	})
	if err != nil {
		return fmt.Errorf("follow job events for namespace caps: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.mu.Lock()
	a.sub, a.stop = sub, cancel
	a.mu.Unlock()
	a.loop.Add(1)
	go func() {
		defer a.loop.Done()
		a.reconcileLoop(ctx)
	}()
	return nil
}

func (a *admission) close() {
	a.mu.Lock()
	sub, stop := a.sub, a.stop
	a.sub, a.stop = nil, nil
	a.mu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe() // a closed connection has no subscription left
	}
	if stop != nil {
		stop()
	}
	a.loop.Wait()
}

// counts reports whether an event of kind of job id would change what the
// admission counts (so is worth decoding and checking).
func (a *admission) counts(id string, kind jobs.EventKind) bool {
	switch kind {
	case jobs.EventStarted, jobs.EventFinished, jobs.EventCancelled:
	default:
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.jobs[id] != nil
}

func (a *admission) observe(id string, kind jobs.EventKind) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.jobs[id]
	if t == nil {
		return
	}
	switch kind {
	case jobs.EventStarted:
		t.running = true
	case jobs.EventFinished, jobs.EventCancelled:
		delete(a.jobs, id)
	}
}

func (a *admission) reconcileLoop(ctx context.Context) {
	periodic.Run(ctx, reconcileEvery, func() { a.reconcile(ctx) })
}

// reconcile reads the statuses of the jobs the admission counts and settles
// those that started or ended unseen (their events lost).
func (a *admission) reconcile(ctx context.Context) {
	a.mu.Lock()
	ids := make([]string, 0, len(a.jobs))
	for id := range a.jobs {
		ids = append(ids, id)
	}
	a.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	// Statuses, not records: a tenant's queued jobs may carry megabytes of
	// code each, and this runs every few seconds.
	sts, err := a.f.state.Statuses(ctx, ids)
	if err != nil {
		return
	}
	for id, st := range sts {
		switch {
		case st.Terminal():
			a.observe(id, jobs.EventFinished)
		case st == jobs.StatusRunning:
			a.observe(id, jobs.EventStarted)
		}
	}
}

// admit checks js (normalised, with namespaces set) against the caps and tracks
// the admitted ones; refused[i] is the error of js[i] (nil when admitted): an
// error wrapping ErrOverCap with the namespace's numbers, or ErrShuttingDown.
func (a *admission) admit(js []*jobs.Job) (refused []error) {
	refused = make([]error, len(js))
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.draining {
		for i := range refused {
			refused[i] = fmt.Errorf("%w: submit to another front-end", ErrShuttingDown)
		}
		return refused
	}
	if !a.enabled() {
		return refused
	}
	type count struct {
		queued, active int
		queuedBytes    int64
	}
	counts := map[string]*count{}
	for _, t := range a.jobs {
		c := counts[t.namespace]
		if c == nil {
			c = &count{}
			counts[t.namespace] = c
		}
		c.active++
		if !t.running {
			c.queued++
			c.queuedBytes += t.bytes
		}
	}
	for i, j := range js {
		if _, dup := a.jobs[j.ID]; dup {
			continue // a resubmission of a tracked job adds nothing
		}
		c := counts[j.Namespace]
		if c == nil {
			c = &count{}
			counts[j.Namespace] = c
		}
		size := jobBytes(j)
		switch p := a.f.policyFor(j.Namespace); {
		case p.MaxQueuedBytes > 0 && c.queuedBytes+size > p.MaxQueuedBytes:
			refused[i] = fmt.Errorf("%w: namespace %q has %d bytes of code waiting for a worker (cap %d): wait for some jobs to finish, then submit again", ErrOverCap, j.Namespace, c.queuedBytes, p.MaxQueuedBytes)
		case p.MaxQueued > 0 && c.queued >= p.MaxQueued:
			refused[i] = fmt.Errorf("%w: namespace %q has %d jobs waiting for a worker (cap %d): wait for some to finish, then submit again", ErrOverCap, j.Namespace, c.queued, p.MaxQueued)
		case p.MaxActive > 0 && c.active >= p.MaxActive:
			refused[i] = fmt.Errorf("%w: namespace %q has %d jobs queued or running (cap %d): wait for some to finish, then submit again", ErrOverCap, j.Namespace, c.active, p.MaxActive)
		default:
			c.queued++
			c.active++
			c.queuedBytes += size
			a.jobs[j.ID] = &tracked{namespace: j.Namespace, bytes: size}
		}
	}
	return refused
}

// jobBytes is what job weighs in the queue: its code (and, in the events
// stream, its submission carries the same).
func jobBytes(j *jobs.Job) int64 { return int64(len(j.Code)) }

// forget stops tracking id (its submission failed, or it is done).
func (a *admission) forget(id string) {
	a.mu.Lock()
	delete(a.jobs, id)
	a.mu.Unlock()
}

// enter registers a Run call; it fails once the front-end is draining.
func (a *admission) enter() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.draining {
		return fmt.Errorf("%w: submit to another front-end", ErrShuttingDown)
	}
	a.waits.Add(1)
	return nil
}

func (a *admission) leave() { a.waits.Done() }

// Drain stops taking jobs and waits until every Run call in flight has its
// job's outcome, or ctx ends: the calls still waiting then return a
// *ResumableError naming their job, which goes on without them. Call it before
// closing the HTTP server and the NATS connection.
func (f *Frontend) Drain(ctx context.Context) {
	a := f.adm
	a.mu.Lock()
	a.draining = true
	a.mu.Unlock()
	done := make(chan struct{})
	go func() { a.waits.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		f.log.Warn("shutdown grace period over: answering waiting callers with their job ids")
		a.abandonO.Do(func() { close(a.abandon) })
		<-done
	}
}

// enterRun admits the job of a Run call and registers the call.
func (a *admission) enterRun(job *jobs.Job) error {
	if err := a.enter(); err != nil {
		return err
	}
	if err := a.admit([]*jobs.Job{job})[0]; err != nil {
		a.leave()
		return err
	}
	return nil
}

// leaveRun ends a Run call of job id.
func (a *admission) leaveRun(id string) {
	a.forget(id)
	a.leave()
}

// admitBatch admits the jobs of a SubmitMany call: todo[k] is the job of
// out[at[k]]; a refused job's error is set in out and it is left out of the
// returned lists.
func (a *admission) admitBatch(todo []*jobs.Job, at []int, out []Submitted) ([]*jobs.Job, []int) {
	refused := a.admit(todo)
	var keptJobs []*jobs.Job
	var keptAt []int
	for k, err := range refused {
		if err != nil {
			out[at[k]].Err = err
			continue
		}
		keptJobs, keptAt = append(keptJobs, todo[k]), append(keptAt, at[k])
	}
	return keptJobs, keptAt
}

// submitted records the outcome of submitting id: a job that was not queued
// is not tracked. A duplicate id stays tracked (it may be a job already counted;
// the reconcile loop drops it once it is finished).
func (a *admission) submitted(id string, err error) {
	if err != nil && !errors.Is(err, queue.ErrDuplicate) {
		a.forget(id)
	}
}
