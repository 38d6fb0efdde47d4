package frontend

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
)

// How long the pools workers answered with are trusted.
const (
	// poolsFresh: a pool seen served this recently is taken without asking.
	poolsFresh = 5 * time.Second
	// poolsRetry: a pool not seen is asked about again only when the last
	// answers are older than this, so a stream of jobs for a pool nobody
	// serves asks the workers at most once a second.
	poolsRetry = time.Second
)

// servedPools caches the pools live workers serve, from their status answers
// (jobs.WorkerStatus.Pool). One question is in flight at a time: callers that
// miss meanwhile wait for its answers.
type servedPools struct {
	ask func(context.Context) ([]jobs.WorkerStatus, error)
	now func() time.Time

	mu       sync.Mutex
	pools    map[string]bool
	at       time.Time     // when pools was answered (zero: never)
	inflight chan struct{} // closed when the question in flight has its answers
}

func newServedPools(ask func(context.Context) ([]jobs.WorkerStatus, error)) *servedPools {
	return &servedPools{ask: ask, now: time.Now}
}

// serves reports whether a live worker serves pool: from answers younger than
// poolsFresh when they name it, else from answers asked for now (unless the
// last are younger than poolsRetry).
func (s *servedPools) serves(ctx context.Context, pool string) (bool, error) {
	for {
		s.mu.Lock()
		age := s.now().Sub(s.at)
		switch {
		case s.pools[pool] && age < poolsFresh:
			s.mu.Unlock()
			return true, nil
		case !s.at.IsZero() && age < poolsRetry:
			s.mu.Unlock()
			return s.pools[pool], nil
		}
		if ch := s.inflight; ch != nil {
			s.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return false, ctx.Err()
			}
		}
		ch := make(chan struct{})
		s.inflight = ch
		s.mu.Unlock()
		// Answers are shared: a caller that goes away does not cut them short
		// (the question is bounded by its own wait).
		ws, err := s.ask(context.WithoutCancel(ctx))
		s.mu.Lock()
		s.inflight = nil
		close(ch)
		if err == nil {
			s.pools = make(map[string]bool, len(ws))
			for _, w := range ws {
				s.pools[w.Pool] = true
			}
			s.at = s.now()
		}
		s.mu.Unlock()
		if err != nil {
			return false, err
		}
	}
}

// checkPool refuses a prepared job (its pool filled in) for a pool other
// than the default one that no live worker serves: it would wait in the
// shared jobs stream until it expires. The default pool always passes (its
// workers may be starting).
func (f *Frontend) checkPool(ctx context.Context, job *jobs.Job) error {
	if job.Pool == "" || job.Pool == jobs.DefaultPool {
		return nil
	}
	ok, err := f.pools.serves(ctx, job.Pool)
	switch {
	case err != nil:
		return fmt.Errorf("%w: ask which pools workers serve: %w", ErrUnavailable, err)
	case !ok:
		return &jobs.InvalidError{Field: "pool", Message: fmt.Sprintf(
			"no worker serves pool %q: start one with `worker --job-pool %s`, or leave pool out for the default pool",
			job.Pool, job.Pool)}
	}
	return nil
}

// askWorkers asks every worker for its status (the pools they serve).
func (f *Frontend) askWorkers(ctx context.Context) ([]jobs.WorkerStatus, error) {
	return queue.WorkerStatuses(ctx, f.nc, f.cfg.Subjects, workersWait)
}
