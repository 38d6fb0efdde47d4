package state_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/state"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

func openStore(t *testing.T) *state.Bolt {
	t.Helper()
	s, err := state.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// client starts a broker (with the state service) and returns a state client.
func client(t *testing.T) *state.Client {
	t.Helper()
	b := testutil.Broker(t, "", queue.DefaultConfig())
	return state.NewClient(testutil.Connect(t, b, "state-client"), jobs.Subjects{})
}

func u64(v uint64) *uint64 { return &v }

func TestMemoryThroughService(t *testing.T) {
	t.Parallel()
	c := client(t)
	ctx := context.Background()
	if _, err := c.MemoryGet(ctx, "ns", "k"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("get missing: %v, want ErrNotFound", err)
	}
	// A version is the stream sequence of the key's last write.
	m, err := c.MemoryPut(ctx, state.Memory{Namespace: "ns", Key: "k", Value: json.RawMessage(`{"a":1}`), Metadata: json.RawMessage(`{"tag":"x"}`)}, u64(0))
	if err != nil || m.Version == 0 || m.CreatedAt.IsZero() {
		t.Fatalf("create: %+v %v", m, err)
	}
	if _, err := c.MemoryPut(ctx, state.Memory{Namespace: "ns", Key: "k", Value: json.RawMessage(`2`)}, u64(0)); !errors.Is(err, state.ErrConflict) {
		t.Fatalf("create existing: %v, want ErrConflict", err)
	}
	if _, err := c.MemoryPut(ctx, state.Memory{Namespace: "ns", Key: "k", Value: json.RawMessage(`2`)}, u64(m.Version+7)); !errors.Is(err, state.ErrConflict) {
		t.Fatalf("stale CAS: %v, want ErrConflict", err)
	}
	m2, err := c.MemoryPut(ctx, state.Memory{Namespace: "ns", Key: "k", Value: json.RawMessage(`2`)}, u64(m.Version))
	if err != nil || m2.Version <= m.Version || !m2.CreatedAt.Equal(m.CreatedAt) {
		t.Fatalf("CAS: %+v %v", m2, err)
	}
	got, err := c.MemoryGet(ctx, "ns", "k")
	if err != nil || string(got.Value) != "2" || got.Version != m2.Version {
		t.Fatalf("get: %+v %v", got, err)
	}
	if _, err := c.MemoryPut(ctx, state.Memory{Namespace: "ns", Key: "big", Value: json.RawMessage(`"` + strings.Repeat("x", state.MaxMemoryValue) + `"`)}, nil); !errors.Is(err, state.ErrInvalid) || !strings.Contains(err.Error(), "over the limit") {
		t.Fatalf("oversized value: %v", err)
	}
	if _, err := c.MemoryPut(ctx, state.Memory{Namespace: "ns", Key: strings.Repeat("k", state.MaxMemoryKeyBytes+1), Value: json.RawMessage(`1`)}, nil); !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("oversized key: %v", err)
	}
	if _, err := c.MemoryPut(ctx, state.Memory{Namespace: "ns", Key: "bad", Value: json.RawMessage(`{`)}, nil); !errors.Is(err, state.ErrInvalid) {
		t.Fatalf("invalid JSON: %v", err)
	}
	list, err := c.MemoryList(ctx, "ns", "")
	if err != nil || len(list) != 1 || list[0].Key != "k" || list[0].Value != nil {
		t.Fatalf("list: %+v %v", list, err)
	}
	ok, err := c.MemoryDelete(ctx, "ns", "k")
	if err != nil || !ok {
		t.Fatalf("delete: %v %v", ok, err)
	}
	if ok, err := c.MemoryDelete(ctx, "ns", "k"); err != nil || ok {
		t.Fatalf("delete again: %v %v", ok, err)
	}
	// A deleted key can be created again with "absent" compare-and-set.
	if _, err := c.MemoryPut(ctx, state.Memory{Namespace: "ns", Key: "k", Value: json.RawMessage(`3`)}, u64(0)); err != nil {
		t.Fatalf("create after delete: %v", err)
	}
	if _, err := c.Job(ctx, "nope"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("job get missing: %v", err)
	}
}

// TestMemoryKeysNeverCollide checks keys and namespaces are stored as exact
// bytes: no two distinct (namespace, key) pairs share an entry.
func TestMemoryKeysNeverCollide(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	pairs := [][2]string{{"a", "b:c"}, {"a:b", "c"}, {"", "ab"}, {"a", "b"}, {"a", "b/c"}, {"a", "b_c"}, {"a", "B"}, {"a", "b "}, {"a", "ü"}, {"a", "u\u0308"}}
	for i, p := range pairs {
		op := state.MemoryOp{Op: state.MemoryPutOp, Namespace: p[0], Key: p[1], Value: json.RawMessage(fmt.Sprint(i)), At: time.Now(), Seq: 1}
		if err := s.ApplyMemory([]state.MemoryOp{op}, uint64(i+1)); err != nil {
			t.Fatalf("put %q: %v", p, err)
		}
	}
	for i, p := range pairs {
		m, err := s.MemoryGet(p[0], p[1])
		if err != nil || string(m.Value) != fmt.Sprint(i) || m.Version != 1 {
			t.Fatalf("get %q = %+v %v, want value %d version 1", p, m, err, i)
		}
	}
}

// TestMemoryCompareAndSetIsAtomic runs concurrent read-modify-write increments
// (what update_memory does) and checks none is lost.
func TestMemoryCompareAndSetIsAtomic(t *testing.T) {
	t.Parallel()
	c := client(t)
	ctx := context.Background()
	const workers, each = 8, 15
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				for {
					var n int
					var ver uint64
					if m, err := c.MemoryGet(ctx, "ns", "counter"); err == nil {
						_ = json.Unmarshal(m.Value, &n)
						ver = m.Version
					} else if !errors.Is(err, state.ErrNotFound) {
						t.Error(err)
						return
					}
					_, err := c.MemoryPut(ctx, state.Memory{Namespace: "ns", Key: "counter", Value: json.RawMessage(fmt.Sprint(n + 1))}, &ver)
					if err == nil {
						break
					}
					if !errors.Is(err, state.ErrConflict) {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	m, err := c.MemoryGet(ctx, "ns", "counter")
	if err != nil || string(m.Value) != fmt.Sprint(workers*each) || m.Version != workers*each {
		t.Fatalf("counter %+v %v, want %d", m, err, workers*each)
	}
}

func finished(id string, at time.Time, st jobs.Status) []jobs.Event {
	return []jobs.Event{
		{Job: id, Kind: jobs.EventSubmitted, Spec: &jobs.Job{ID: id, Code: "x", Labels: map[string]string{"batch": "b1"}}, At: at},
		{Job: id, Kind: jobs.EventFinished, Attempt: 1, Result: &jobs.Result{Status: st}, At: at},
	}
}

func TestRetentionAndListing(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	now := time.Now()
	var evs []jobs.Event
	for i := range 10 {
		evs = append(evs, finished(fmt.Sprintf("old%02d", i), now.Add(-48*time.Hour), jobs.StatusSuccess)...)
		evs = append(evs, finished(fmt.Sprintf("new%02d", i), now.Add(time.Duration(i)*time.Second), jobs.StatusWorkerLost)...)
	}
	evs = append(evs, jobs.Event{Job: "queued1", Kind: jobs.EventSubmitted, Spec: &jobs.Job{ID: "queued1", Code: "x"}, At: now})
	if _, err := s.ApplyEvents(evs, 0); err != nil {
		t.Fatal(err)
	}
	// Paging with a prefix and a status filter.
	var all []string
	cursor := ""
	for {
		recs, next, err := s.List(state.JobFilter{Prefix: "new", Status: jobs.StatusWorkerLost, Limit: 3, Cursor: cursor, Labels: map[string]string{"batch": "b1"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			all = append(all, r.Job.ID)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if len(all) != 10 || all[0] != "new00" || all[9] != "new09" {
		t.Fatalf("paged list = %v", all)
	}
	dls, _, err := s.List(state.JobFilter{DeadLetter: true, Limit: 100})
	if err != nil || len(dls) != 10 {
		t.Fatalf("dead letters: %d %v", len(dls), err)
	}
	// Age: the ten old records go; count: then the oldest new ones beyond 6.
	n, err := s.Prune(state.Retention{MaxAge: 24 * time.Hour}, now)
	if err != nil || n != 10 {
		t.Fatalf("prune by age: %d %v", n, err)
	}
	n, err = s.Prune(state.Retention{MaxCount: 6}, now)
	if err != nil || n != 4 {
		t.Fatalf("prune by count: %d %v", n, err)
	}
	if _, err := s.Job("new03"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("new03 should be pruned: %v", err)
	}
	for _, id := range []string{"new04", "new09", "queued1"} {
		if _, err := s.Job(id); err != nil {
			t.Fatalf("%s should be kept: %v", id, err)
		}
	}
	if dls, _, _ := s.List(state.JobFilter{DeadLetter: true}); len(dls) != 6 {
		t.Fatalf("dead letters after prune: %d", len(dls))
	}
	// The indexes follow status changes and retention: a queued record that
	// starts and succeeds leaves "queued" and "running"; pruned records
	// leave every index.
	count := func(f state.JobFilter) int {
		t.Helper()
		f.Limit = state.MaxListLimit
		recs, _, err := s.List(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if f.Status != "" && r.Status != f.Status {
				t.Fatalf("listing status %s gave %s (%s)", f.Status, r.Job.ID, r.Status)
			}
		}
		return len(recs)
	}
	if n := count(state.JobFilter{Status: jobs.StatusQueued}); n != 1 {
		t.Fatalf("queued: %d", n)
	}
	if _, err := s.ApplyEvents([]jobs.Event{{Job: "queued1", Kind: jobs.EventStarted, Attempt: 1, At: now}}, 0); err != nil {
		t.Fatal(err)
	}
	if q, r := count(state.JobFilter{Status: jobs.StatusQueued}), count(state.JobFilter{Status: jobs.StatusRunning}); q != 0 || r != 1 {
		t.Fatalf("after start: %d queued, %d running", q, r)
	}
	if _, err := s.ApplyEvents([]jobs.Event{{Job: "queued1", Kind: jobs.EventFinished, Attempt: 1, Result: &jobs.Result{Status: jobs.StatusSuccess}, At: now}}, 0); err != nil {
		t.Fatal(err)
	}
	if r, ok := count(state.JobFilter{Status: jobs.StatusRunning}), count(state.JobFilter{Status: jobs.StatusSuccess}); r != 0 || ok != 1 {
		t.Fatalf("after finish: %d running, %d success", r, ok)
	}
	if n := count(state.JobFilter{Labels: map[string]string{"batch": "b1"}}); n != 6 {
		t.Fatalf("label batch=b1 after prune: %d, want the 6 kept", n)
	}
	if n := count(state.JobFilter{Labels: map[string]string{"batch": "b2"}}); n != 0 {
		t.Fatalf("label batch=b2: %d", n)
	}
	if n := count(state.JobFilter{Status: jobs.StatusWorkerLost, Prefix: "new0"}); n != 6 {
		t.Fatalf("worker_lost with prefix new0: %d", n)
	}
	contents, err := s.Contents()
	if err != nil {
		t.Fatal(err)
	}
	byBucket := map[string]int{}
	for k := range contents {
		if strings.Contains(k, "old") || strings.Contains(k, "new03") {
			t.Errorf("a pruned record is still indexed: %q", k)
		}
		byBucket[k[:strings.IndexByte(k, '/')]]++
	}
	// One status entry per record (none stale), one label entry per labelled one.
	if byBucket["bystatus"] != byBucket["jobs"] || byBucket["bylabel"] != 6 || byBucket["jobs"] != 7 {
		t.Fatalf("entries by bucket: %v", byBucket)
	}
}

// TestMemoryQuota: a namespace cannot store more than its quota (the attack
// of issue 9: a loop of 0.9 MB save_memory calls filled the broker's disk);
// overwrites and deletes give the room back; other namespaces are unaffected.
func TestMemoryQuota(t *testing.T) {
	t.Parallel()
	c := client(t)
	ctx := context.Background()
	value := json.RawMessage(`"` + strings.Repeat("x", 900_000) + `"`)
	const quota = 5 << 20
	stored := 0
	for i := range 300 {
		_, err := c.MemoryPutQuota(ctx, state.Memory{Namespace: "greedy", Key: fmt.Sprint("k", i), Value: value}, nil, quota)
		if errors.Is(err, state.ErrInvalid) && strings.Contains(err.Error(), "quota") {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		stored++
	}
	if stored != 5 {
		t.Fatalf("stored %d values, want 5 within %d bytes", stored, quota)
	}
	// An overwrite of the same size passes; a delete makes room for one more.
	if _, err := c.MemoryPutQuota(ctx, state.Memory{Namespace: "greedy", Key: "k0", Value: value}, nil, quota); err != nil {
		t.Fatalf("overwrite within quota: %v", err)
	}
	if ok, err := c.MemoryDelete(ctx, "greedy", "k1"); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if _, err := c.MemoryPutQuota(ctx, state.Memory{Namespace: "greedy", Key: "again", Value: value}, nil, quota); err != nil {
		t.Fatalf("put after a delete: %v", err)
	}
	if _, err := c.MemoryPutQuota(ctx, state.Memory{Namespace: "other", Key: "k", Value: value}, nil, quota); err != nil {
		t.Fatalf("another namespace: %v", err)
	}
}

// TestLegacyMemoryIsRepublished: memory in a state file written before memory
// went through the memory stream (entries, no applied sequence) is put into
// the stream on start, so other replicas get it and compare-and-set works.
func TestLegacyMemoryIsRepublished(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := state.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if err := s.ApplyMemory([]state.MemoryOp{{Op: state.MemoryPutOp, Namespace: "ns", Key: "old", Value: json.RawMessage(`41`), CreatedAt: now, At: now, Seq: 7}}, 0); err != nil {
		t.Fatal(err)
	}
	s.Close()
	b := testutil.Broker(t, dir, queue.DefaultConfig())
	c := state.NewClient(testutil.Connect(t, b, "c"), jobs.Subjects{})
	ctx := context.Background()
	m, err := c.MemoryGet(ctx, "ns", "old")
	if err != nil || string(m.Value) != "41" || m.Version == 7 {
		t.Fatalf("republished entry: %+v %v (want 41 at a stream version)", m, err)
	}
	if _, err := c.MemoryPut(ctx, state.Memory{Namespace: "ns", Key: "old", Value: json.RawMessage(`42`)}, u64(m.Version)); err != nil {
		t.Fatalf("compare-and-set on the republished entry: %v", err)
	}
}

// TestRetriedPutLandsOnce: a compare-and-set put retried (same write id) after
// it landed and was overwritten by another writer is answered as the success
// it was, not refused (the caller would read again and apply its change
// twice) and not applied again.
func TestRetriedPutLandsOnce(t *testing.T) {
	t.Parallel()
	c := client(t)
	ctx := context.Background()
	first, err := c.MemoryPut(ctx, state.Memory{Namespace: "ns", Key: "n", Value: json.RawMessage(`1`), WriteID: "w-1"}, u64(0))
	if err != nil {
		t.Fatal(err)
	}
	second, err := c.MemoryPut(ctx, state.Memory{Namespace: "ns", Key: "n", Value: json.RawMessage(`2`), WriteID: "w-2"}, u64(first.Version))
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.MemoryPut(ctx, state.Memory{Namespace: "ns", Key: "n", Value: json.RawMessage(`1`), WriteID: "w-1"}, u64(0))
	if err != nil || again.Version != first.Version {
		t.Fatalf("retry of w-1: %+v %v, want its first version %d", again, err, first.Version)
	}
	if m, err := c.MemoryGet(ctx, "ns", "n"); err != nil || string(m.Value) != "2" || m.Version != second.Version {
		t.Fatalf("after the retry: %+v %v, want w-2's value", m, err)
	}
	// A new write with a stale version is still refused.
	if _, err := c.MemoryPut(ctx, state.Memory{Namespace: "ns", Key: "n", Value: json.RawMessage(`3`), WriteID: "w-3"}, u64(first.Version)); !errors.Is(err, state.ErrConflict) {
		t.Fatalf("stale write: %v, want a conflict", err)
	}
	if _, err := c.MemoryPut(ctx, state.Memory{Namespace: "ns", Key: "n", Value: json.RawMessage(`3`), WriteID: "w-4"}, u64(0)); !errors.Is(err, state.ErrConflict) {
		t.Fatalf("create over an existing key: %v, want a conflict", err)
	}
}
