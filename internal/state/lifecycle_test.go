package state_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/state"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// TestStaleResultIsFenced lets a worker's attempt go stale (its heartbeats are
// slower than the consumer's AckWait), so JetStream hands the job to a second
// worker; the first attempt's late result must not become the record.
func TestStaleResultIsFenced(t *testing.T) {
	t.Parallel()
	q := testutil.ShortAck()
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe")

	slowQ := queue.DefaultConfig() // heartbeats every 10 s: too slow for 1 s
	slowQ.MaxDeliver = q.MaxDeliver
	releaseA, releaseB := make(chan struct{}), make(chan struct{})
	a := &testutil.FakeRuntime{Func: testutil.BlockUntil(releaseA, "from A")}
	acfg := testutil.QuickWorker("A", slowQ)
	acfg.Slots = 1 // so the redelivery cannot go back to A
	testutil.Worker(t, b, a, acfg)
	testutil.MustSubmit(t, fe, &jobs.Job{ID: "stale-1", Code: "x", MaxAttempts: 3})
	testutil.WaitRecord(t, b, "stale-1", jobs.StatusRunning)
	// B re-creates the consumer with AckWait 1 s; A's delivery expires.
	bRT := &testutil.FakeRuntime{Func: testutil.BlockUntil(releaseB, "from B")}
	testutil.Worker(t, b, bRT, testutil.QuickWorker("B", q))
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec, _ := b.Store().Job(jobs.ScopedID("", "stale-1"))
		if rec.Attempt == 2 && rec.Worker == "B" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job was not redelivered to B: %+v", rec)
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(releaseA)                    // A's stale attempt 1 reports success
	time.Sleep(500 * time.Millisecond) // a negative check: A's stale result, sent now, is never applied
	if rec, _ := b.Store().Job(jobs.ScopedID("", "stale-1")); rec.Status != jobs.StatusRunning || rec.Attempt != 2 {
		t.Fatalf("stale result was applied: %+v", rec)
	}
	close(releaseB)
	rec := testutil.WaitRecord(t, b, "stale-1", jobs.StatusSuccess)
	if rec.Result.Stdout != "from B" || rec.Attempt != 2 || rec.Worker != "B" {
		t.Fatalf("final record: %+v / %+v", rec, rec.Result)
	}
}

// TestRebuildAfterStateLoss deletes the state file while the broker is down:
// the new broker rebuilds the job records from the events stream.
func TestRebuildAfterStateLoss(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	q := queue.DefaultConfig()
	b1 := testutil.Broker(t, dir, q)
	nc := testutil.Connect(t, b1, "fe")
	fe, err := frontend.New(nc, frontend.Config{ID: "fe", Limits: jobs.DefaultLimits()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(testutil.Connect(t, b1, "w"), &testutil.FakeRuntime{}, testutil.QuickWorker("w", q))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	testutil.MustSubmit(t, fe, &jobs.Job{ID: "rb-1", Code: "x"})
	testutil.WaitRecord(t, b1, "rb-1", jobs.StatusSuccess)
	testutil.MustSubmit(t, fe, &jobs.Job{ID: "rb-2", Code: "x"})
	testutil.WaitRecord(t, b1, "rb-2", jobs.StatusSuccess)
	w.Stop()
	testutil.MustSubmit(t, fe, &jobs.Job{ID: "rb-3", Code: "x"})
	testutil.WaitRecord(t, b1, "rb-3", jobs.StatusQueued)
	nc.Close()
	if err := b1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "state.db")); err != nil {
		t.Fatal(err)
	}
	b2 := testutil.Broker(t, dir, q)
	for _, id := range []string{"rb-1", "rb-2"} {
		if rec := testutil.WaitRecord(t, b2, id, jobs.StatusSuccess); rec.Worker != "w" || rec.Result == nil {
			t.Fatalf("rebuilt %s: %+v", id, rec)
		}
	}
	testutil.WaitRecord(t, b2, "rb-3", jobs.StatusQueued)
}

// TestEventsNeedTheirJobsProof: a worker (or anyone who may publish events)
// cannot record a start or an outcome for a job it was not given: without the
// job's capability the state service ignores the event.
func TestEventsNeedTheirJobsProof(t *testing.T) {
	t.Parallel()
	q := queue.DefaultConfig()
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe")
	release := make(chan struct{})
	testutil.Worker(t, b, &testutil.FakeRuntime{Func: testutil.BlockUntil(release, "real")}, testutil.QuickWorker("w1", q))
	testutil.MustSubmit(t, fe, &jobs.Job{ID: "victim", Code: "x"})
	rec := testutil.WaitRecord(t, b, "victim", jobs.StatusRunning)
	forger, err := queue.NewClient(testutil.Connect(t, b, "forger"), jobs.Subjects{})
	if err != nil {
		t.Fatal(err)
	}
	wire := jobs.ScopedID("", "victim")
	ctx := context.Background()
	for _, proof := range []string{"", "not-the-capability", jobs.EventProof(jobs.Capability([]byte("another key, guessed"), wire), jobs.EventFinished, rec.Attempt+1)} {
		if err := forger.PublishEvent(ctx, jobs.Event{Job: wire, Kind: jobs.EventFinished, Attempt: rec.Attempt + 1, Worker: "forger",
			Proof: proof, Result: &jobs.Result{Status: jobs.StatusSuccess, Stdout: "forged"}}); err != nil {
			t.Fatal(err)
		}
	}
	// On the subjects a worker may publish, kinds that need no proof: a
	// cancellation of the victim, a submission of a job nobody submitted.
	planted := jobs.ScopedID("", "planted")
	for subject, ev := range map[string]jobs.Event{
		jobs.Subjects{}.Event(wire, jobs.EventFinished):   {Job: wire, Kind: jobs.EventCancelled, Reason: "forged"},
		jobs.Subjects{}.Event(planted, jobs.EventStarted): {Job: planted, Kind: jobs.EventSubmitted, Spec: &jobs.Job{ID: planted, Code: "x"}},
	} {
		data, _ := json.Marshal(ev)
		if _, err := forger.JetStream().Publish(ctx, subject, data); err != nil {
			t.Fatal(err)
		}
	}
	close(release)
	got := testutil.WaitRecord(t, b, "victim", jobs.StatusSuccess)
	if got.Result.Stdout != "real" || got.Worker != "w1" {
		t.Fatalf("a forged outcome was recorded: %+v", got.Result)
	}
	if rec, err := fe.Get(ctx, "", "planted"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("a forged submission was recorded: %+v %v", rec, err)
	}
}
