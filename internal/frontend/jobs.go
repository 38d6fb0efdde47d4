package frontend

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/mcpexec/mcpexec/internal/errs"

	"go.opentelemetry.io/otel/trace"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/state"
)

// ErrIDTaken is the error of a submission whose id belongs to a different job
// (of kind errs.Conflict; state.ErrConflict is a memory write's lost race).
var ErrIDTaken = errs.New(errs.Conflict, "a different job with this id exists")

// Submitted is the outcome of submitting one job with SubmitMany.
type Submitted = jobs.Submitted

// SubmitMany validates and submits jobs for namespace ns ("" is the default
// one) without waiting for them; jobs that fail validation are not submitted.
// A job whose id the namespace used before is not submitted again, whatever
// the time since the first submission: the existing record comes back instead
// (or ErrIDTaken when the resubmission asks for something else). Ids are the
// namespace's own: another namespace's job of the same id is another job.
// Records come back as the namespace sees them.
func (f *Frontend) SubmitMany(ctx context.Context, js []*jobs.Job, ns string) []Submitted {
	ns = jobs.NamespaceOf(ns)
	return viewed(f.submit(ctx, js, ns, false), ns)
}

// viewed returns out with its records as namespace ns sees them.
func viewed(out []Submitted, ns string) []Submitted {
	for i := range out {
		if out[i].Record != nil {
			out[i].Record = out[i].Record.View(ns)
		}
	}
	return out
}

// submit submits js for namespace ns; with all, none is submitted unless
// every one is valid (a workflow).
func (f *Frontend) submit(ctx context.Context, js []*jobs.Job, ns string, all bool) []Submitted {
	out := make([]Submitted, len(js))
	// The caller's jobs stay as they are (a client may submit them again):
	// the wire jobs are copies.
	mine := make([]*jobs.Job, len(js))
	for i, j := range js {
		c := *j
		c.SubmittedBy = jobs.SubmitterOf(ctx) // the authenticated caller, never the caller's word
		mine[i] = &c
	}
	js = mine
	for i, j := range js {
		if err := f.prepare(j, ns); err != nil {
			out[i].Err = err
		} else if err := f.checkPool(ctx, j); err != nil {
			out[i].Err = err
		}
	}
	for i, err := range f.checkSessions(ctx, js) {
		if out[i].Err == nil && err != nil {
			out[i].Err = err
		}
	}
	// Parents first: a job's submission reaches the events stream after its
	// parents' in the same batch.
	order := f.order(js, out)
	var ids []string
	for _, i := range order {
		if out[i].Err == nil {
			ids = append(ids, js[i].ID)
		}
	}
	// Ids already recorded (possibly beyond the events stream's retention),
	// and parents named outside the batch.
	inBatch := make(map[string]int, len(js))
	for i, j := range js {
		inBatch[j.ID] = i
	}
	look := ids
	for _, i := range order {
		for _, p := range js[i].Parents() {
			if _, ok := inBatch[p]; !ok {
				look = append(look, p)
			}
		}
	}
	known, err := f.state.Jobs(ctx, look)
	if err != nil {
		return unavailable(out, err)
	}
	byID := map[string]*jobs.Record{}
	for _, r := range known {
		byID[r.Job.ID] = r
	}
	f.checkParents(js, order, out, inBatch, byID, ns)
	// Input files are stored before anything is submitted (a workflow is
	// refused whole when one step's files are).
	for _, i := range order {
		if out[i].Err == nil && byID[js[i].ID] == nil {
			if err := f.stageFiles(ctx, js[i], ns); err != nil {
				out[i].Err = err
			}
		}
	}
	if all {
		if bad := slices.IndexFunc(out, func(s Submitted) bool { return s.Err != nil }); bad >= 0 {
			for i := range out {
				if out[i].Err == nil {
					out[i].Err = &jobs.InvalidError{Field: "jobs", Message: fmt.Sprintf("not submitted: job %d of the workflow was refused (%v)", bad, out[bad].Err)}
				}
			}
			return out
		}
	}
	var todo []*jobs.Job
	var at []int
	for _, i := range order {
		j := js[i]
		if out[i].Err != nil {
			continue
		}
		if r := byID[j.ID]; r != nil {
			if r.Status == jobs.StatusQueued && sameJob(&r.Job, j) {
				// Claimed, and perhaps never enqueued: the first submission
				// may have failed between its claim and its enqueue (a stream
				// leader lost; its caller answered 503, or gone). Answering
				// with the record would acknowledge a job no worker will see.
				// Submit the recorded job again: its claim is a duplicate,
				// the queue republishes its message (the jobs stream drops it
				// if the first one landed), and the answer is the record.
				rj := r.Job
				todo, at = append(todo, &rj), append(at, i)
				continue
			}
			out[i] = existing(r, j)
			continue
		}
		todo, at = append(todo, j), append(at, i)
	}
	todo, at = f.adm.admitBatch(todo, at, out)
	spans := make([]trace.Span, len(todo))
	for k, j := range todo {
		_, spans[k] = f.startSubmit(ctx, j)
	}
	errs := f.client.SubmitMany(ctx, todo)
	submitted(spans, errs)
	var dupIDs []string
	for k, err := range errs {
		i, j := at[k], todo[k]
		f.adm.submitted(j.ID, err)
		switch {
		case err == nil:
			st := jobs.StatusQueued
			if j.Waits() {
				st = jobs.StatusWaiting
			}
			out[i].Record = &jobs.Record{Job: *j, Status: st, CreatedAt: j.SubmittedAt, TraceID: jobs.TraceID(j.Trace())}
		case errors.Is(err, queue.ErrQueueFull):
			fin := time.Now().UTC()
			out[i] = Submitted{Err: queue.ErrQueueFull, Record: &jobs.Record{Job: *j, Status: jobs.StatusRejected, CreatedAt: j.SubmittedAt, FinishedAt: &fin, TraceID: jobs.TraceID(j.Trace()),
				Result: &jobs.Result{Status: jobs.StatusRejected, Error: "the job queue is full: retry later with a new id, or add workers"}}}
		case errors.Is(err, queue.ErrDuplicate):
			dupIDs = append(dupIDs, j.ID)
		default:
			out[i].Err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
	}
	if len(dupIDs) == 0 {
		return out
	}
	// Raced with another submission of the same id: its record appears as soon
	// as the state service applies it.
	recs, err := f.waitRecords(ctx, dupIDs)
	for k, j := range todo {
		if !errors.Is(errs[k], queue.ErrDuplicate) {
			continue
		}
		if r := recs[j.ID]; r != nil {
			out[at[k]] = existing(r, j)
		} else {
			out[at[k]].Err = fmt.Errorf("%w: job %s was submitted before but its record is not available yet: %w", ErrUnavailable, j.ID, err)
		}
	}
	return out
}

// order returns the indexes of js, parents before children; a cycle marks
// every job of the batch invalid.
func (f *Frontend) order(js []*jobs.Job, out []Submitted) []int {
	order, err := jobs.Order(js)
	if err == nil {
		return order
	}
	for i := range out {
		if out[i].Err == nil {
			out[i].Err = err
		}
	}
	order = make([]int, len(js))
	for i := range order {
		order[i] = i
	}
	return order
}

// checkParents refuses jobs whose parents are neither recorded in namespace
// ns nor submitted with them, and jobs whose parent in the batch is refused.
func (f *Frontend) checkParents(js []*jobs.Job, order []int, out []Submitted, inBatch map[string]int, known map[string]*jobs.Record, ns string) {
	for _, i := range order {
		if out[i].Err != nil {
			continue
		}
		for _, p := range js[i].Parents() {
			name, _ := jobs.UnscopedID(ns, p)
			if k, ok := inBatch[p]; ok {
				if out[k].Err != nil {
					out[i].Err = &jobs.InvalidError{Field: "after", Message: fmt.Sprintf("parent %s was refused: %v", name, out[k].Err)}
					break
				}
				continue
			}
			if known[p] == nil {
				out[i].Err = &jobs.InvalidError{Field: "after", Message: fmt.Sprintf("parent %s is not a job of this namespace: submit it first, or in the same request", name)}
				break
			}
		}
	}
}

func (f *Frontend) waitRecords(ctx context.Context, ids []string) (map[string]*jobs.Record, error) {
	got := map[string]*jobs.Record{}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var missing []string
		for _, id := range ids {
			if got[id] == nil {
				missing = append(missing, id)
			}
		}
		recs, err := f.state.Jobs(ctx, missing)
		for _, r := range recs {
			got[r.Job.ID] = r
		}
		if len(recs) == len(missing) || time.Now().After(deadline) || ctx.Err() != nil {
			return got, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func unavailable(out []Submitted, err error) []Submitted {
	for i := range out {
		if out[i].Err == nil {
			out[i].Err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
	}
	return out
}

// existing answers a resubmission of rec's id: the record, or ErrIDTaken when
// the new submission asks for a different job.
func existing(rec *jobs.Record, j *jobs.Job) Submitted {
	if !sameJob(&rec.Job, j) {
		name, _ := jobs.UnscopedID(j.Namespace, j.ID)
		return Submitted{Record: rec, Existing: true, Err: fmt.Errorf("%w: job %s was submitted before with different code, servers, timeout, attempts, session, labels or parents: choose a new id", ErrIDTaken, name)}
	}
	return Submitted{Record: rec, Existing: true}
}

func sameJob(a, b *jobs.Job) bool {
	return a.Code == b.Code && slices.Equal(a.Servers, b.Servers) && a.Timeout == b.Timeout &&
		a.MaxAttempts == b.MaxAttempts && a.Session == b.Session && a.Pool == b.Pool &&
		a.Namespace == b.Namespace && maps.Equal(a.Labels, b.Labels) &&
		slices.Equal(a.After, b.After) && slices.Equal(a.AfterAny, b.AfterAny) &&
		a.MemoryMB == b.MemoryMB && a.CPUs == b.CPUs
}

// Wait returns namespace ns's record of job id once it is terminal, or its
// latest record when ctx ends first (with ctx's error). It returns
// state.ErrNotFound for an id the namespace has not submitted.
func (f *Frontend) Wait(ctx context.Context, ns, id string) (*jobs.Record, error) {
	ns = jobs.NamespaceOf(ns)
	if _, err := f.Get(ctx, ns, id); err != nil {
		return nil, err
	}
	rec, err := f.wait(ctx, jobs.ScopedID(ns, id))
	if rec != nil {
		rec = rec.View(ns)
	}
	return rec, err
}

// wait is Wait for a wire id.
func (f *Frontend) wait(ctx context.Context, id string) (*jobs.Record, error) {
	events, stop, err := f.client.WatchEvents(id, f.trusted)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	defer stop()
	poll := time.NewTicker(time.Second)
	defer poll.Stop()
	for {
		rec, err := f.record(context.WithoutCancel(ctx), id)
		if err != nil || rec.Status.Terminal() {
			return rec, err
		}
		select {
		case <-ctx.Done():
			return rec, ctx.Err()
		case ev := <-events:
			if ev.Kind != jobs.EventFinished && ev.Kind != jobs.EventCancelled {
				continue
			}
			// The state service applies the event within milliseconds.
			time.Sleep(5 * time.Millisecond)
		case <-poll.C:
		}
	}
}

// List returns namespace ns's job records matching flt (its Namespace is
// ignored; Prefix and Cursor are the namespace's ids), as the namespace sees
// them, and the cursor of the next page.
func (f *Frontend) List(ctx context.Context, ns string, flt state.JobFilter) ([]*jobs.Record, string, error) {
	return f.list(ctx, ns, flt, f.state.List)
}

// DeadLetters is List of the namespace's dead letters.
func (f *Frontend) DeadLetters(ctx context.Context, ns string, flt state.JobFilter) ([]*jobs.Record, string, error) {
	return f.list(ctx, ns, flt, f.state.DeadLetters)
}

func (f *Frontend) list(ctx context.Context, ns string, flt state.JobFilter, fn func(context.Context, state.JobFilter) ([]*jobs.Record, string, error)) ([]*jobs.Record, string, error) {
	ns = jobs.NamespaceOf(ns)
	// The namespace's records are one prefix of the index: a listing (and its
	// cursor) never passes another namespace's.
	flt.Namespace = ns
	flt.Prefix = jobs.ScopedID(ns, flt.Prefix)
	if flt.Cursor != "" {
		flt.Cursor = jobs.ScopedID(ns, flt.Cursor)
	}
	recs, next, err := fn(ctx, flt)
	if err != nil {
		if errors.Is(err, state.ErrUnavailable) {
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return nil, "", err
	}
	for i, r := range recs {
		recs[i] = r.View(ns)
	}
	if next != "" {
		next, _ = jobs.UnscopedID(ns, next)
	}
	return recs, next, nil
}

// State returns the client of the state service (job records and memory).
func (f *Frontend) State() *state.Client { return f.state }

// SubmitWorkflow is SubmitMany for jobs that belong together: unless every
// job is valid (parents known, no cycle), none is submitted.
func (f *Frontend) SubmitWorkflow(ctx context.Context, js []*jobs.Job, ns string) []Submitted {
	ns = jobs.NamespaceOf(ns)
	return viewed(f.submit(ctx, js, ns, true), ns)
}

// Submit validates and submits one job for its namespace (job.Namespace) without
// waiting for it, and returns its record as the namespace sees it: what
// SubmitMany does for a batch of one. A job refused because the queue is full
// comes back as its rejected record with queue.ErrQueueFull.
func (f *Frontend) Submit(ctx context.Context, job *jobs.Job) (*jobs.Record, error) {
	s := f.SubmitMany(ctx, []*jobs.Job{job}, job.Namespace)[0]
	return s.Record, s.Err
}
