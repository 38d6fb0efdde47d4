package state

import (
	"context"
	"errors"
	"fmt"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// RequeueQueued publishes again the message of every job this replica
// records as queued, once it has applied everything the streams held: for a
// broker that has just replaced a jobs stream no replica would lead, whose
// messages are gone (docs/design.md, "A stream no replica will lead"). Every
// job submitted before the replacement and not yet started is then queued
// again, under the message id of its submission, so that the replicas of all
// nodes requeueing within the dedupe window queue it once. It returns how
// many jobs it requeued.
func (s *Service) RequeueQueued(ctx context.Context) (int, error) {
	if err := s.catchUp(ctx); err != nil {
		return 0, fmt.Errorf("requeue: catch up with the streams: %w", err)
	}
	ids, err := s.store.WithStatus(jobs.StatusQueued)
	if err != nil {
		return 0, fmt.Errorf("requeue: list queued jobs: %w", err)
	}
	n := 0
	var failed []error
	for lo := 0; lo < len(ids); lo += 1000 {
		recs, err := s.store.Jobs(ids[lo:min(lo+1000, len(ids))])
		if err != nil {
			return n, fmt.Errorf("requeue: read queued jobs: %w", err)
		}
		batch := make([]*jobs.Job, 0, len(recs))
		for _, r := range recs {
			if r.Status == jobs.StatusQueued {
				batch = append(batch, &r.Job)
			}
		}
		for i, err := range s.sched.q.Requeue(ctx, batch) {
			if err != nil {
				failed = append(failed, fmt.Errorf("job %s: %w", batch[i].ID, err))
				continue
			}
			n++
		}
	}
	if len(failed) > 0 {
		return n, fmt.Errorf("requeue %d of %d queued jobs failed (they stay queued until --queued-max-age rejects them): %w",
			len(failed), n+len(failed), errors.Join(failed[:min(len(failed), 5)]...))
	}
	return n, nil
}
