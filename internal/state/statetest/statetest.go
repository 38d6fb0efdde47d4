// Package statetest is the behaviour every state.Store must have, as a suite
// of tests an implementation runs on itself (as sandboxtest does for
// runtimes).
package statetest

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/state"
)

// Run runs the suite; open returns an empty store for each test.
func Run(t *testing.T, open func(t *testing.T) state.Store) {
	t.Run("Jobs", func(t *testing.T) { testJobs(t, open(t)) })
	t.Run("List", func(t *testing.T) { testList(t, open(t)) })
	t.Run("Prune", func(t *testing.T) { testPrune(t, open(t)) })
	t.Run("FilesUsage", func(t *testing.T) { testFilesUsage(t, open(t)) })
	t.Run("Memory", func(t *testing.T) { testMemory(t, open(t)) })
	t.Run("Backup", func(t *testing.T) { testBackup(t, open(t)) })
	t.Run("Resync", func(t *testing.T) { testResync(t, open(t)) })
}

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// ListAll pages through the records f selects, from f.Cursor, and returns
// their ids.
func ListAll(t testing.TB, s state.Store, f state.JobFilter) []string {
	t.Helper()
	var all []string
	for {
		recs, next, err := s.List(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			all = append(all, r.Job.ID)
		}
		if next == "" {
			return all
		}
		f.Cursor = next
	}
}

func submitted(id string, labels map[string]string, after ...string) jobs.Event {
	return jobs.Event{Job: id, Kind: jobs.EventSubmitted, At: t0,
		Spec: &jobs.Job{ID: id, Code: "print(1)", Timeout: 30, MaxAttempts: 2, Labels: labels, After: after, SubmittedAt: t0}}
}

func finished(id string, attempt int, st jobs.Status, at time.Time) jobs.Event {
	return jobs.Event{Job: id, Kind: jobs.EventFinished, Attempt: attempt, At: at, Result: &jobs.Result{Status: st}}
}

func apply(t *testing.T, s state.Store, seq uint64, evs ...jobs.Event) []*jobs.Record {
	t.Helper()
	changed, err := s.ApplyEvents(evs, seq)
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	return changed
}

func status(t *testing.T, s state.Store, id string) jobs.Status {
	t.Helper()
	rec, err := s.Job(id)
	if err != nil {
		t.Fatalf("job %s: %v", id, err)
	}
	return rec.Status
}

func testJobs(t *testing.T, s state.Store) {
	if _, err := s.Job("none"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("missing job: %v, want ErrNotFound", err)
	}
	changed := apply(t, s, 3, submitted("parent", nil), submitted("child", nil, "parent"),
		jobs.Event{Job: "parent", Kind: jobs.EventStarted, Attempt: 1, Worker: "w1", At: t0})
	if len(changed) != 2 {
		t.Fatalf("changed %d records, want 2", len(changed))
	}
	if ev, _, err := s.Applied(); err != nil || ev != 3 {
		t.Fatalf("applied %d %v, want 3", ev, err)
	}
	if st := status(t, s, "parent"); st != jobs.StatusRunning {
		t.Fatalf("parent %s", st)
	}
	if st := status(t, s, "child"); st != jobs.StatusWaiting {
		t.Fatalf("child %s", st)
	}
	if kids, err := s.Children("parent"); err != nil || !slices.Equal(kids, []string{"child"}) {
		t.Fatalf("children %v %v", kids, err)
	}
	if ids, err := s.WithStatus(jobs.StatusWaiting); err != nil || !slices.Equal(ids, []string{"child"}) {
		t.Fatalf("waiting %v %v", ids, err)
	}
	// Fencing: an older attempt's end is ignored; the terminal record never
	// changes again; a second submission changes nothing.
	apply(t, s, 4, jobs.Event{Job: "parent", Kind: jobs.EventStarted, Attempt: 2, Worker: "w2", At: t0})
	apply(t, s, 5, finished("parent", 1, jobs.StatusError, t0))
	if st := status(t, s, "parent"); st != jobs.StatusRunning {
		t.Fatalf("a stale attempt's end was applied: %s", st)
	}
	apply(t, s, 6, finished("parent", 2, jobs.StatusSuccess, t0), jobs.Event{Job: "child", Kind: jobs.EventReleased, At: t0})
	apply(t, s, 7, jobs.Event{Job: "parent", Kind: jobs.EventCancelled, At: t0}, submitted("parent", map[string]string{"x": "y"}))
	rec, err := s.Job("parent")
	if err != nil || rec.Status != jobs.StatusSuccess || rec.Worker != "w2" || rec.Attempt != 2 || rec.Job.Labels != nil {
		t.Fatalf("parent %+v %v", rec, err)
	}
	if st := status(t, s, "child"); st != jobs.StatusQueued {
		t.Fatalf("released child %s", st)
	}
	if ids, _ := s.WithStatus(jobs.StatusWaiting); len(ids) != 0 {
		t.Fatalf("still waiting: %v", ids)
	}
	got, err := s.Jobs([]string{"child", "none", "parent"})
	if err != nil || len(got) != 2 {
		t.Fatalf("jobs %v %v", got, err)
	}
}

func testList(t *testing.T, s state.Store) {
	var evs []jobs.Event
	for i := range 25 {
		lbl := map[string]string{"team": []string{"a", "b"}[i%2]}
		evs = append(evs, submitted(string(rune('a'+i)), lbl))
	}
	evs = append(evs, finished("c", 0, jobs.StatusSuccess, t0))
	apply(t, s, 30, evs...)
	all := ListAll(t, s, state.JobFilter{Limit: 10})
	if len(all) != 25 || !slices.IsSorted(all) {
		t.Fatalf("paged list %v", all)
	}
	for _, c := range []struct {
		f    state.JobFilter
		want int
	}{
		{state.JobFilter{Status: jobs.StatusSuccess}, 1},
		{state.JobFilter{Status: jobs.StatusQueued}, 24},
		{state.JobFilter{Labels: map[string]string{"team": "a"}}, 13},
		{state.JobFilter{Labels: map[string]string{"team": "a"}, Status: jobs.StatusSuccess}, 1},
		{state.JobFilter{Prefix: "c"}, 1},
		{state.JobFilter{Labels: map[string]string{"team": "z"}}, 0},
	} {
		recs, _, err := s.List(c.f)
		if err != nil || len(recs) != c.want {
			t.Errorf("%+v: %d records (%v), want %d", c.f, len(recs), err, c.want)
		}
	}
	if _, _, err := s.List(state.JobFilter{Limit: -1}); err == nil {
		t.Error("a negative limit was accepted")
	}
}

func testPrune(t *testing.T, s state.Store) {
	apply(t, s, 5, submitted("old", nil), submitted("new", nil), submitted("open", nil),
		finished("old", 0, jobs.StatusSuccess, t0.Add(-48*time.Hour)), finished("new", 0, jobs.StatusSuccess, t0))
	n, err := s.Prune(state.Retention{MaxAge: 24 * time.Hour}, t0)
	if err != nil || n != 1 {
		t.Fatalf("pruned %d %v, want 1", n, err)
	}
	if _, err := s.Job("old"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("old: %v", err)
	}
	for _, id := range []string{"new", "open"} {
		if _, err := s.Job(id); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
}

// testFilesUsage checks the bytes a namespace's files hold: inputs counted at
// the submission, outputs at the finish (once, whatever the events' order
// and repeats), all of a record dropped when retention deletes it.
func testFilesUsage(t *testing.T, s state.Store) {
	usage := func(ns string) int64 {
		t.Helper()
		n, err := s.FilesUsage(ns)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	sub := func(id, ns string, in int64) jobs.Event {
		ev := submitted(id, nil)
		ev.Spec.Namespace = ns
		ev.Spec.Files = []jobs.FileInfo{{Name: "in.csv", Size: in}}
		return ev
	}
	fin := func(id string, out int64, at time.Time) jobs.Event {
		ev := finished(id, 1, jobs.StatusSuccess, at)
		ev.Result.Files = []jobs.FileInfo{{Name: "out.csv", Size: out}}
		return ev
	}
	apply(t, s, 1, sub("a1", "a", 10), sub("b1", "b", 100))
	if usage("a") != 10 || usage("b") != 100 || usage("c") != 0 {
		t.Fatalf("after submissions: a %d b %d", usage("a"), usage("b"))
	}
	apply(t, s, 2, fin("a1", 5, t0.Add(-48*time.Hour)), fin("a1", 7, t0), sub("a1", "a", 10))
	if usage("a") != 15 {
		t.Fatalf("after the finish (and a late repeat): a %d, want 15", usage("a"))
	}
	if _, err := s.Prune(state.Retention{MaxAge: 24 * time.Hour}, t0); err != nil {
		t.Fatal(err)
	}
	if usage("a") != 0 || usage("b") != 100 {
		t.Fatalf("after retention: a %d b %d", usage("a"), usage("b"))
	}
}

func put(ns, key, value, writeID string, seq uint64) state.MemoryOp {
	return state.MemoryOp{Op: state.MemoryPutOp, Namespace: ns, Key: key, Value: json.RawMessage(value),
		CreatedAt: t0, At: t0, WriteID: writeID, Seq: seq}
}

func testMemory(t *testing.T, s state.Store) {
	if _, err := s.MemoryGet("a", "k"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("missing key: %v", err)
	}
	ops := []state.MemoryOp{put("a", "k", `1`, "w1", 10), put("a", "kk", `"x"`, "", 11), put("b", "k", `2`, "", 12), put("a", "k", `3`, "w2", 13)}
	if err := s.ApplyMemory(ops, 13); err != nil {
		t.Fatal(err)
	}
	if _, mem, err := s.Applied(); err != nil || mem != 13 {
		t.Fatalf("applied %d %v", mem, err)
	}
	m, err := s.MemoryGet("a", "k")
	if err != nil || string(m.Value) != "3" || m.Version != 13 {
		t.Fatalf("a/k %+v %v", m, err)
	}
	if seq, ok, err := s.WriteSeq("w1"); err != nil || !ok || seq != 10 {
		t.Fatalf("write w1: %d %v %v", seq, ok, err)
	}
	if _, ok, _ := s.WriteSeq("never"); ok {
		t.Fatal("an unknown write id was found")
	}
	if seq, err := s.LastWrite("a", "k"); err != nil || seq != 13 {
		t.Fatalf("last write %d %v", seq, err)
	}
	list, err := s.MemoryList("a", "k")
	if err != nil || len(list) != 2 {
		t.Fatalf("list %v %v", list, err)
	}
	if all, err := s.AllMemory(); err != nil || len(all) != 3 {
		t.Fatalf("all %d %v", len(all), err)
	}
	del := state.MemoryOp{Op: state.MemoryDeleteOp, Namespace: "a", Key: "k", At: t0, Seq: 14}
	if err := s.ApplyMemory([]state.MemoryOp{del}, 14); err != nil {
		t.Fatal(err)
	}
	if _, err := s.MemoryGet("a", "k"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("deleted key: %v", err)
	}
	if seq, err := s.LastWrite("a", "k"); err != nil || seq != 14 {
		t.Fatalf("last write of a deleted key %d %v", seq, err)
	}
	if grow, err := s.QuotaCheck(put("b", "small", `""`, "", 0), 1<<20, 0); err != nil || grow <= 0 {
		t.Fatalf("a small write: %d %v", grow, err)
	}
	big := put("b", "big", `"`+string(slices.Repeat([]byte("x"), 2000))+`"`, "", 0)
	if _, err := s.QuotaCheck(big, 1000, 0); !errors.Is(err, state.ErrQuota) {
		t.Fatalf("a write over quota: %v", err)
	}
	// Bytes reserved by writes not yet folded count as held.
	grow, err := s.QuotaCheck(big, 4000, 0)
	if err != nil || grow < 2000 {
		t.Fatalf("a write within quota: %d %v", grow, err)
	}
	if _, err := s.QuotaCheck(big, 4000, 4000-grow+1); !errors.Is(err, state.ErrQuota) {
		t.Fatalf("a write over quota with what is reserved: %v", err)
	}
}

// testResync: a replica ahead of streams that lost their last writes keeps
// its records but applies the events that take the lost sequences again, and
// folds memory again from nothing.
func testResync(t *testing.T, s state.Store) {
	if ev, mem, err := s.AppliedAt(); err != nil || !ev.IsZero() || !mem.IsZero() {
		t.Fatalf("applied at %v %v %v, want zero before any", ev, mem, err)
	}
	start := time.Now()
	apply(t, s, 9, submitted("kept", nil))
	if ev, mem, err := s.AppliedAt(); err != nil || ev.Before(start.Add(-time.Second)) || ev.After(time.Now().Add(time.Second)) || !mem.IsZero() {
		t.Fatalf("applied at %v %v %v, want events about %v", ev, mem, err, start)
	}
	if err := s.RewindEvents(4); err != nil {
		t.Fatal(err)
	}
	if ev, _, err := s.Applied(); err != nil || ev != 4 {
		t.Fatalf("applied events %d %v after a rewind to 4", ev, err)
	}
	if st := status(t, s, "kept"); st != jobs.StatusQueued {
		t.Fatalf("a record was lost in a rewind: %s", st)
	}
	apply(t, s, 5, submitted("new", nil), finished("kept", 1, jobs.StatusSuccess, t0))
	if st := status(t, s, "new"); st != jobs.StatusQueued {
		t.Fatalf("new %s", st)
	}
	if st := status(t, s, "kept"); st != jobs.StatusSuccess {
		t.Fatalf("kept %s", st)
	}

	huge := put("a", "huge", `"`+string(slices.Repeat([]byte("x"), 3000))+`"`, "", 12)
	ops := []state.MemoryOp{put("a", "k", `1`, "w1", 10), put("b", "k", `"x"`, "w2", 11), huge}
	if err := s.ApplyMemory(ops, 12); err != nil {
		t.Fatal(err)
	}
	if _, mem, err := s.AppliedAt(); err != nil || mem.Before(start.Add(-time.Second)) {
		t.Fatalf("memory applied at %v %v, want about %v", mem, err, start)
	}
	big := put("a", "big", `"`+string(slices.Repeat([]byte("x"), 2000))+`"`, "", 0)
	if _, err := s.QuotaCheck(big, 3000, 0); !errors.Is(err, state.ErrQuota) {
		t.Fatalf("a write over quota: %v", err)
	}
	before, err := s.MemoryDigests()
	if err != nil || len(before) != 3 {
		t.Fatalf("digests %v %v", before, err)
	}
	if err := s.ResetMemory(); err != nil {
		t.Fatal(err)
	}
	if ev, mem, err := s.Applied(); err != nil || ev != 5 || mem != 0 {
		t.Fatalf("applied %d %d %v after a memory reset, want 5 0", ev, mem, err)
	}
	if _, err := s.MemoryGet("a", "k"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("memory after a reset: %v", err)
	}
	if seq, err := s.LastWrite("a", "k"); err != nil || seq != 0 {
		t.Fatalf("last write after a reset: %d %v", seq, err)
	}
	if _, ok, err := s.WriteSeq("w1"); err != nil || ok {
		t.Fatalf("a write id outlived a reset: %v %v", ok, err)
	}
	if d, err := s.MemoryDigests(); err != nil || len(d) != 0 {
		t.Fatalf("digests after a reset: %v %v", d, err)
	}
	// The same writes folded again: the same entries; another one differs.
	if err := s.ApplyMemory([]state.MemoryOp{ops[0], put("b", "k", `"y"`, "w3", 11)}, 11); err != nil {
		t.Fatal(err)
	}
	after, err := s.MemoryDigests()
	if err != nil || len(after) != 2 {
		t.Fatalf("digests %v %v", after, err)
	}
	if after["a\x00k"] != before["a\x00k"] || after["b\x00k"] == before["b\x00k"] {
		t.Fatalf("digests before %x, after %x", before, after)
	}
	// Usage counts only what was folded again.
	if _, err := s.QuotaCheck(big, 3000, 0); err != nil {
		t.Fatalf("usage survived a reset: %v", err)
	}
}

func testBackup(t *testing.T, s state.Store) {
	apply(t, s, 1, submitted("j", nil))
	path := filepath.Join(t.TempDir(), "backup.db")
	n, err := s.Backup(path)
	if err != nil || n <= 0 {
		t.Fatalf("backup %d %v", n, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != n {
		t.Fatalf("backup file %v %v", fi, err)
	}
}
