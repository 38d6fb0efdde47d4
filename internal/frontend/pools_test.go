package frontend

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// TestServedPoolsCache: the served pools are asked of the workers once and
// trusted for poolsFresh; a pool not seen asks again, at most every
// poolsRetry; concurrent misses share one question.
func TestServedPoolsCache(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	served := []string{"gpu"}
	var asks atomic.Int32
	release := make(chan struct{}, 100)
	release <- struct{}{}
	s := newServedPools(func(context.Context) ([]jobs.WorkerStatus, error) {
		asks.Add(1)
		select {
		case <-release:
		case <-time.After(10 * time.Second):
			return nil, errors.New("the test did not expect this question")
		}
		mu.Lock()
		defer mu.Unlock()
		var ws []jobs.WorkerStatus
		for _, p := range served {
			ws = append(ws, jobs.WorkerStatus{ID: "w-" + p, Pool: p})
		}
		return ws, nil
	})
	s.now = clock
	ctx := context.Background()
	check := func(pool string, want bool, wantAsks int32) {
		t.Helper()
		got, err := s.serves(ctx, pool)
		if err != nil || got != want || asks.Load() != wantAsks {
			t.Fatalf("serves(%s) = %v %v after %d asks, want %v after %d", pool, got, err, asks.Load(), want, wantAsks)
		}
	}
	check("gpu", true, 1)
	advance(poolsRetry / 2)
	check("arm", false, 1) // last answers under poolsRetry old: refused without asking
	advance(poolsFresh - poolsRetry)
	check("gpu", true, 1) // fresh: no question
	mu.Lock()
	served = append(served, "arm")
	mu.Unlock()
	release <- struct{}{}
	check("arm", true, 2) // a miss asks again, and sees the new worker
	check("gpu", true, 2)

	// Concurrent misses share one question.
	advance(poolsFresh)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if ok, err := s.serves(ctx, "none"); ok || err != nil {
				t.Errorf("serves(none) = %v %v", ok, err)
			}
		})
	}
	time.Sleep(50 * time.Millisecond)
	release <- struct{}{}
	wg.Wait()
	if n := asks.Load(); n != 3 {
		t.Fatalf("%d asks for 8 concurrent misses, want one more (3)", n)
	}
}
