package proxyresp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/state"
)

// Bounds of the proxy's view of running jobs.
const (
	// accessTTL is how long a job's record answers its calls before it is
	// looked up again: a job that ended stops being served within it.
	accessTTL = time.Second
	// startedWait bounds the wait for the state service to apply the started
	// event of an attempt that already calls (the worker announces it just
	// before the sandbox runs).
	startedWait = 3 * time.Second
	// maxAccessEntries bounds the cache; idle entries past their TTL are
	// dropped first.
	maxAccessEntries = 10_000
)

// accessCache looks up the records of the jobs whose sandboxes call, keeps
// each for accessTTL, and caps each job's calls in flight on this front-end.
type accessCache struct {
	records  Records
	maxCalls int
	// waited, when set, says how long a job's calls have waited for a
	// person (its clock stood still meanwhile): consulted only once the
	// job's time limit has passed here, it moves the limit on by that much.
	waited func(ctx context.Context, ns, job string) time.Duration

	mu   sync.Mutex // guards jobs
	jobs map[string]*jobAccess
}

// jobAccess is one job's entry. Its fields are guarded by accessCache.mu
// (sem is only sent to and received from).
type jobAccess struct {
	rj       *runningJob
	base     time.Time // the attempt's time limit before any wait for a person
	attempt  int
	fetched  time.Time
	inFlight int           // calls holding the entry
	sem      chan struct{} // caps calls in flight
}

func newAccessCache(records Records, maxCalls int) *accessCache {
	return &accessCache{records: records, maxCalls: maxCalls, jobs: map[string]*jobAccess{}}
}

// acquire returns the running job id as attempt sees it, holding one of its
// call slots until release is called. It fails, saying why, unless the job's
// record shows that attempt running. startedSeq is the events sequence the
// worker says the attempt's start is at (proxy.Request.StartedSeq; 0: not
// said).
func (a *accessCache) acquire(ctx context.Context, id string, attempt int, startedSeq uint64) (_ *runningJob, release func(), err error) {
	now := time.Now()
	var rj *runningJob // e.rj as of this call: e's fields are read under a.mu only
	a.mu.Lock()
	e := a.jobs[id]
	fresh := e != nil && e.attempt == attempt && now.Sub(e.fetched) < accessTTL
	if fresh {
		e.inFlight++
		rj = e.rj
	}
	a.mu.Unlock()
	if !fresh {
		rec, err := a.lookup(ctx, id, attempt, startedSeq)
		if err != nil {
			return nil, nil, err
		}
		a.mu.Lock()
		e = a.jobs[id]
		if e == nil || e.attempt != attempt {
			// This attempt's first call here: its time limit runs from now
			// (its sandbox started at most now).
			base := now.Add(rec.Job.TimeoutDuration())
			e = &jobAccess{attempt: attempt, sem: make(chan struct{}, a.maxCalls), base: base,
				rj: newRunningJob(rec, base)}
			a.evictLocked(now)
			a.jobs[id] = e
		} else {
			e.rj = newRunningJob(rec, e.rj.deadline)
		}
		e.fetched = now
		e.inFlight++
		rj = e.rj
		a.mu.Unlock()
	}
	done := func() {
		a.mu.Lock()
		e.inFlight--
		a.mu.Unlock()
	}
	if now.After(rj.deadline) && a.waited != nil {
		w := a.waited(ctx, rj.namespace(), id)
		a.mu.Lock()
		if d := e.base.Add(w); d.After(e.rj.deadline) {
			next := *e.rj
			next.deadline = d
			e.rj = &next
		}
		rj = e.rj
		a.mu.Unlock()
	}
	dctx, cancel := context.WithDeadline(ctx, rj.deadline)
	defer cancel()
	select {
	case e.sem <- struct{}{}:
		return rj, func() { <-e.sem; done() }, nil
	case <-dctx.Done():
		done()
		return nil, nil, fmt.Errorf("%d proxy calls of this job are already in flight and none finished before the job's time limit: await calls before starting more", cap(e.sem))
	}
}

func newRunningJob(rec *jobs.Record, deadline time.Time) *runningJob {
	rj := &runningJob{job: rec.Job, servers: map[string]bool{}, deadline: deadline}
	for _, s := range rec.Job.Servers {
		rj.servers[s] = true
	}
	return rj
}

// lookup returns job id's record once it shows attempt running, waiting up to
// startedWait for the state service to catch up with the worker. With the
// sequence of the attempt's start (startedSeq), the first read asks a
// replica that has applied it, so a worker's first call needs one read, not
// a poll; the poll stays for workers that do not say it. The sequence is the
// worker's word: the read it shapes is bounded by the same startedWait.
func (a *accessCache) lookup(ctx context.Context, id string, attempt int, startedSeq uint64) (*jobs.Record, error) {
	deadline := time.Now().Add(startedWait)
	for first := true; ; first = false {
		rctx, cancel := ctx, context.CancelFunc(func() {})
		if first && startedSeq > 0 {
			rctx, cancel = context.WithDeadline(state.WithEventsFloor(ctx, startedSeq), deadline)
		}
		rec, err := a.records.Job(rctx, id)
		cancel()
		behind := errors.Is(err, state.ErrNotFound) ||
			(err == nil && !rec.Status.Terminal() && (rec.Status == jobs.StatusQueued || rec.Attempt < attempt))
		if !behind || time.Now().After(deadline) {
			switch {
			case errors.Is(err, state.ErrNotFound):
				return nil, fmt.Errorf("job %s is not running: no proxy calls", id)
			case err != nil:
				return nil, fmt.Errorf("look up job %s: %w", id, err)
			case rec.Status.Terminal():
				return nil, fmt.Errorf("job %s has ended (%s): no more proxy calls", id, rec.Status)
			case rec.Status != jobs.StatusRunning || rec.Attempt != attempt:
				return nil, fmt.Errorf("attempt %d of job %s is not the one running: no proxy calls", attempt, id)
			}
			return rec, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("look up job %s: %w", id, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// evictLocked makes room for one more entry.
func (a *accessCache) evictLocked(now time.Time) {
	if len(a.jobs) < maxAccessEntries {
		return
	}
	for id, e := range a.jobs {
		if e.inFlight == 0 && (now.Sub(e.fetched) >= accessTTL || now.After(e.rj.deadline)) {
			delete(a.jobs, id)
		}
	}
	if len(a.jobs) < maxAccessEntries {
		return
	}
	for id, e := range a.jobs { // all busy or fresh: drop idle ones anyway
		if e.inFlight == 0 {
			delete(a.jobs, id)
			if len(a.jobs) < maxAccessEntries {
				return
			}
		}
	}
}
