package state_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/state"
	"github.com/mcpexec/mcpexec/internal/state/boltstore"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// benchRecords is how many job records BenchmarkMillionRecords's file holds
// (MCPEXEC_BENCH_RECORDS overrides it).
func benchRecords() int {
	if n, err := strconv.Atoi(os.Getenv("MCPEXEC_BENCH_RECORDS")); err == nil && n > 0 {
		return n
	}
	return 1_000_000
}

// benchStatus spreads the records over statuses: 90% success, 5% error, 3%
// queued, 2% running.
func benchStatus(i int) jobs.Status {
	switch p := i % 100; {
	case p < 90:
		return jobs.StatusSuccess
	case p < 95:
		return jobs.StatusError
	case p < 98:
		return jobs.StatusQueued
	default:
		return jobs.StatusRunning
	}
}

// buildRecords writes n job records (with a label each, and the status of
// benchStatus) into dir/state.db.
func buildRecords(b *testing.B, dir string, n int) []string {
	s, err := boltstore.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			b.Error(err)
		}
	}()
	at := time.Now().Add(-time.Hour)
	ids := make([]string, n)
	const batch = 20_000
	for lo := 0; lo < n; lo += batch {
		var evs []jobs.Event
		for i := lo; i < min(lo+batch, n); i++ {
			id := fmt.Sprintf("ns-%08d", i)
			ids[i] = id
			evs = append(evs, jobs.Event{Job: id, Kind: jobs.EventSubmitted, At: at,
				Spec: &jobs.Job{ID: id, Code: "print('hello')", Labels: map[string]string{"batch": strconv.Itoa(i % 50)}}})
			switch st := benchStatus(i); st {
			case jobs.StatusQueued:
			case jobs.StatusRunning:
				evs = append(evs, jobs.Event{Job: id, Kind: jobs.EventStarted, Attempt: 1, At: at})
			default:
				evs = append(evs, jobs.Event{Job: id, Kind: jobs.EventStarted, Attempt: 1, At: at},
					jobs.Event{Job: id, Kind: jobs.EventFinished, Attempt: 1, At: at, Result: &jobs.Result{Status: st, Stdout: "hello\n"}})
			}
		}
		if _, err := s.ApplyEvents(evs, 0); err != nil {
			b.Fatal(err)
		}
	}
	return ids
}

// reportLatency reports the p50 and p99 of ds.
func reportLatency(b *testing.B, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(ds[len(ds)*99/100].Microseconds())/1000, "p99-ms")
}

// BenchmarkMillionRecords measures reads of a replica holding a million job
// records, through the state service over NATS (what a front-end does):
// job.get of a random id, and a page of 100 records of one status or label
// from a random place.
func BenchmarkMillionRecords(b *testing.B) {
	n := benchRecords()
	dir := b.TempDir()
	start := time.Now()
	ids := buildRecords(b, dir, n)
	b.Logf("wrote %d records in %s", n, time.Since(start).Round(time.Millisecond))
	br := testutil.Broker(b, dir, queue.DefaultConfig())
	c := state.NewClient(testutil.Connect(b, br, "bench"), jobs.Subjects{})
	ctx := context.Background()

	b.Run("job.get", func(b *testing.B) {
		ds := make([]time.Duration, 0, b.N)
		for range b.N {
			id := ids[rand.IntN(len(ids))]
			t0 := time.Now()
			rec, err := c.Job(ctx, id)
			ds = append(ds, time.Since(t0))
			if err != nil || rec.Job.ID != id {
				b.Fatalf("job.get %s: %v", id, err)
			}
		}
		reportLatency(b, ds)
	})
	for _, tc := range []struct {
		name string
		f    state.JobFilter
	}{
		{"list100.status=error", state.JobFilter{Status: jobs.StatusError}},
		{"list100.status=queued", state.JobFilter{Status: jobs.StatusQueued}},
		{"list100.label", state.JobFilter{Labels: map[string]string{"batch": "7"}}},
		{"list100.prefix", state.JobFilter{Prefix: "ns-000001"}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ds := make([]time.Duration, 0, b.N)
			for range b.N {
				f := tc.f
				f.Limit = 100
				if f.Prefix == "" {
					f.Cursor = ids[rand.IntN(len(ids)*9/10)] // a page from anywhere
				}
				t0 := time.Now()
				recs, _, err := c.List(ctx, f)
				ds = append(ds, time.Since(t0))
				if err != nil || len(recs) == 0 {
					b.Fatalf("list %+v: %d records, %v", f, len(recs), err)
				}
			}
			reportLatency(b, ds)
		})
	}
}

// BenchmarkUpdateMemory measures update_memory (read, then compare-and-set,
// again on a conflict) of one shared counter through a three-node cluster,
// every node a replica, with 1 and 2 writers racing. It reports the p50 and
// p99 of one successful increment and the conflicts per increment.
func BenchmarkUpdateMemory(b *testing.B) {
	c := testutil.StartCluster(b, 3, queue.DefaultConfig())
	for _, writers := range []int{1, 2} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			key := fmt.Sprintf("counter-%d-%d", writers, b.N)
			var mu sync.Mutex // guards ds, conflicts
			var ds []time.Duration
			conflicts := 0
			var wg sync.WaitGroup
			for w := range writers {
				sc := state.NewClient(c.ConnectAll(b, fmt.Sprint("writer", w)), jobs.Subjects{})
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx := context.Background()
					for range b.N / writers {
						t0 := time.Now()
						lost, err := increment(ctx, sc, key)
						if err != nil {
							b.Error(err)
							return
						}
						mu.Lock()
						ds, conflicts = append(ds, time.Since(t0)), conflicts+lost
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			reportLatency(b, ds)
			b.ReportMetric(float64(conflicts)/float64(max(len(ds), 1)), "conflicts/op")
		})
	}
}

// increment adds one to key's value as update_memory does, and returns the
// conflicts it met.
func increment(ctx context.Context, sc *state.Client, key string) (int, error) {
	for lost := 0; ; lost++ {
		m, err := sc.MemoryGet(ctx, "bench", key)
		var n, version uint64
		switch {
		case errors.Is(err, state.ErrNotFound):
		case err != nil:
			return lost, err
		default:
			if err := json.Unmarshal(m.Value, &n); err != nil {
				return lost, err
			}
			version = m.Version
		}
		_, err = sc.MemoryPut(ctx, state.Memory{Namespace: "bench", Key: key, Value: json.RawMessage(strconv.FormatUint(n+1, 10))}, &version)
		if errors.Is(err, state.ErrConflict) {
			continue
		}
		return lost, err
	}
}
