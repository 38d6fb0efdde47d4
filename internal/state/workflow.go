package state

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
)

// SweepEvery is how often each replica looks at every waiting job, in case
// a release was missed (a replica stopped between applying a parent's end and
// releasing its children, or the broker was unreachable).
var SweepEvery = 5 * time.Second

// scheduler releases or skips waiting jobs once their parents have ended.
// Every replica runs one, on what it has applied: a parent's end never
// changes, the released event claims a job's release once (as the submitted
// event claims its id), and a skip is one deduplicated finished event, so
// replicas that race do no harm.
type scheduler struct {
	store  Store
	q      *queue.Client
	logger *slog.Logger

	mu    sync.Mutex
	check map[string]bool // waiting jobs to look at
	ended map[string]bool // jobs that ended: look at their children
	kick  chan struct{}
}

func newScheduler(s *Service, q *queue.Client) *scheduler {
	return &scheduler{store: s.store, q: q, logger: s.logger,
		check: map[string]bool{}, ended: map[string]bool{}, kick: make(chan struct{}, 1)}
}

// observe notes the records an apply changed: new waiting jobs, and ended
// jobs whose children may now run.
func (w *scheduler) observe(changed []*jobs.Record) {
	n := 0
	w.mu.Lock()
	for _, r := range changed {
		switch {
		case r.Status == jobs.StatusWaiting:
			w.check[r.Job.ID] = true
			n++
		case r.Status.Terminal():
			w.ended[r.Job.ID] = true
			n++
		}
	}
	w.mu.Unlock()
	if n > 0 {
		w.wake()
	}
}

func (w *scheduler) wake() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// run decides until ctx ends: at once after start (a sweep), on each kick, and
// every SweepEvery.
func (w *scheduler) run(ctx context.Context) {
	t := time.NewTicker(SweepEvery)
	defer t.Stop()
	w.sweep()
	for {
		w.decide(ctx)
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		case <-t.C:
			w.sweep()
		}
	}
}

// sweep queues every waiting job for a look.
func (w *scheduler) sweep() {
	ids, err := w.store.WithStatus(jobs.StatusWaiting)
	if err != nil {
		w.logger.Warn("list waiting jobs", "err", err)
		return
	}
	w.mu.Lock()
	for _, id := range ids {
		w.check[id] = true
	}
	w.mu.Unlock()
}

// decide releases the waiting jobs whose parents allow it and skips those
// whose parents forbid it.
func (w *scheduler) decide(ctx context.Context) {
	w.mu.Lock()
	check, ended := w.check, w.ended
	w.check, w.ended = map[string]bool{}, map[string]bool{}
	w.mu.Unlock()
	for id := range ended {
		kids, err := w.store.Children(id)
		if err != nil {
			w.logger.Warn("look up a job's children", "job", id, "err", err)
			continue
		}
		for _, k := range kids {
			check[k] = true
		}
	}
	var release []*jobs.Job
	var skip []jobs.Event
	for id := range check {
		rec, err := w.store.Job(id)
		if err != nil || rec.Status != jobs.StatusWaiting {
			continue
		}
		parents, err := w.store.Jobs(rec.Job.Parents())
		if err != nil {
			w.logger.Warn("look up a job's parents", "job", id, "err", err)
			continue
		}
		byID := make(map[string]*jobs.Record, len(parents))
		for _, p := range parents {
			byID[p.Job.ID] = p
		}
		switch ready, why := rec.Job.Ready(byID); ready {
		case jobs.Ready:
			job := rec.Job
			release = append(release, &job)
		case jobs.Skip:
			skip = append(skip, jobs.Event{Job: id, Kind: jobs.EventFinished, Result: &jobs.Result{
				Status: jobs.StatusSkipped, ExitCode: -1, Error: why}})
		}
	}
	var retry []string
	for i, err := range w.q.ReleaseMany(ctx, release) {
		if err != nil && !errors.Is(err, queue.ErrDuplicate) && !errors.Is(err, queue.ErrQueueFull) {
			w.logger.Warn("release a waiting job", "job", release[i].ID, "err", err)
			retry = append(retry, release[i].ID)
		}
	}
	for _, ev := range skip {
		if err := w.q.PublishEvent(ctx, ev); err != nil {
			w.logger.Warn("skip a waiting job", "job", ev.Job, "err", err)
			retry = append(retry, ev.Job)
		}
	}
	if len(retry) > 0 { // the next sweep tries again
		w.mu.Lock()
		for _, id := range retry {
			w.check[id] = true
		}
		w.mu.Unlock()
	}
}
