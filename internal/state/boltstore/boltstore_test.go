package boltstore_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/state"
	"github.com/mcpexec/mcpexec/internal/state/boltstore"
	"github.com/mcpexec/mcpexec/internal/state/statetest"
)

// TestConformance: the bbolt store has the behaviour of a Store.
func TestConformance(t *testing.T) {
	statetest.Run(t, func(t *testing.T) state.Store { return openStore(t) })
}

func openStore(t *testing.T) *boltstore.Store {
	t.Helper()
	s, err := boltstore.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

func finished(id string, at time.Time, st jobs.Status) []jobs.Event {
	return []jobs.Event{
		{Job: id, Kind: jobs.EventSubmitted, Spec: &jobs.Job{ID: id, Code: "x", Labels: map[string]string{"batch": "b1"}}, At: at},
		{Job: id, Kind: jobs.EventFinished, Attempt: 1, Result: &jobs.Result{Status: st}, At: at},
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
	all := statetest.ListAll(t, s, state.JobFilter{Prefix: "new", Status: jobs.StatusWorkerLost, Limit: 3, Labels: map[string]string{"batch": "b1"}})
	if len(all) != 10 || all[0] != "new00" || all[9] != "new09" {
		t.Fatalf("paged list = %v", all)
	}
	// Newest first, paged, through each index: the same ids in reverse.
	for _, f := range []state.JobFilter{{Prefix: "new"}, {Prefix: "new", Status: jobs.StatusWorkerLost}, {Prefix: "new", Labels: map[string]string{"batch": "b1"}}} {
		f.Newest, f.Limit = true, 3
		desc := statetest.ListAll(t, s, f)
		if len(desc) != 10 || desc[0] != "new09" || desc[9] != "new00" {
			t.Fatalf("newest first %+v = %v", f, desc)
		}
	}
	if desc := statetest.ListAll(t, s, state.JobFilter{Newest: true, Limit: 7}); len(desc) != 21 || desc[0] != "queued1" || desc[20] != "new00" {
		t.Fatalf("newest first, no prefix = %v", desc)
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
