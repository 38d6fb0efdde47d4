package state

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/periodic"
)

// expiryEvery is how often a replica looks for jobs queued past the max age:
// a twentieth of it, between 100 ms and a minute.
func expiryEvery(maxAge time.Duration) time.Duration {
	return min(max(maxAge/20, 100*time.Millisecond), time.Minute)
}

// expiryLoop ends the records of jobs that stayed queued longer than
// QueuedMaxAge: JetStream deletes their messages at that age (the jobs
// stream's MaxAge), so no worker will take them. Every replica runs it on
// what it has applied; the outcome is one finished event per job, with its
// proof and its message id, so replicas that race record it once.
func (s *Service) expiryLoop(ctx context.Context) {
	if s.QueuedMaxAge <= 0 {
		return
	}
	since := map[string]time.Time{} // queued job -> when it was enqueued
	periodic.Run(ctx, expiryEvery(s.QueuedMaxAge), func() {
		if err := s.expireQueued(ctx, since, time.Now()); err != nil && ctx.Err() == nil {
			s.logger.Warn("expire queued jobs", "err", err)
		}
	})
}

// expireQueued records as rejected each job still queued whose enqueue (its
// submission, or for a job that waited for parents its release) is older
// than QueuedMaxAge at now. since caches enqueue times between passes: only
// jobs newly queued are read.
func (s *Service) expireQueued(ctx context.Context, since map[string]time.Time, now time.Time) error {
	ids, err := s.store.WithStatus(jobs.StatusQueued)
	if err != nil {
		return fmt.Errorf("list queued jobs: %w", err)
	}
	queued := make(map[string]bool, len(ids))
	var unknown []string
	for _, id := range ids {
		queued[id] = true
		if _, ok := since[id]; !ok {
			unknown = append(unknown, id)
		}
	}
	for id := range since {
		if !queued[id] {
			delete(since, id)
		}
	}
	for lo := 0; lo < len(unknown); lo += 1000 {
		recs, err := s.store.Jobs(unknown[lo:min(lo+1000, len(unknown))])
		if err != nil {
			return fmt.Errorf("read queued jobs: %w", err)
		}
		for _, r := range recs {
			at, err := s.enqueuedAt(ctx, r)
			if err != nil {
				return err // the next pass asks again
			}
			since[r.Job.ID] = at
		}
	}
	var expired []string
	for id, at := range since {
		if now.Sub(at) > s.QueuedMaxAge {
			expired = append(expired, id)
		}
	}
	for _, id := range expired {
		rec, err := s.store.Job(id)
		if errors.Is(err, ErrNotFound) {
			delete(since, id)
			continue
		}
		if err != nil {
			return err
		}
		if rec.Status != jobs.StatusQueued {
			delete(since, id)
			continue
		}
		ev := jobs.Event{Job: id, Kind: jobs.EventFinished, Attempt: rec.Attempt, At: now.UTC(), Result: &jobs.Result{
			Status: jobs.StatusRejected, Attempt: rec.Attempt,
			Error: fmt.Sprintf("queued longer than %s: no worker took it (is a worker of pool %q running?)", s.QueuedMaxAge, rec.Job.Pool),
		}}
		if err := s.sched.q.PublishEvent(ctx, ev); err != nil {
			return fmt.Errorf("record the expiry of %s: %w", id, err)
		}
		s.logger.Info("job queued past the max age: rejected", "job", id, "pool", rec.Job.Pool, "queued_since", since[id])
		delete(since, id)
	}
	return nil
}

// enqueuedAt is when rec's job message was published: at its submission, or
// for a job that waited for parents at its release (the released event).
func (s *Service) enqueuedAt(ctx context.Context, rec *jobs.Record) (time.Time, error) {
	if !rec.Job.Waits() {
		return rec.CreatedAt, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	stream, err := s.js.Stream(ctx, s.sub.EventsStream())
	if err != nil {
		return time.Time{}, fmt.Errorf("events stream: %w", err)
	}
	m, err := stream.GetLastMsgForSubject(ctx, s.sub.Event(rec.Job.ID, jobs.EventReleased))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return rec.CreatedAt, nil // past the events' retention, which is at least the max age
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("release of %s: %w", rec.Job.ID, err)
	}
	return m.Time, nil
}
