package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/process"
	"github.com/mcpexec/mcpexec/internal/state"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// blockUntil returns a run function that blocks until release is closed (then
// succeeds with out) or ctx ends.
func blockUntil(release <-chan struct{}, out string) func(context.Context, sandbox.Job) (sandbox.Result, error) {
	return func(ctx context.Context, _ sandbox.Job) (sandbox.Result, error) {
		select {
		case <-release:
			return sandbox.Result{Status: sandbox.StatusSuccess, Stdout: out}, nil
		case <-ctx.Done():
			return sandbox.Result{Status: sandbox.StatusError, Error: "stopped"}, ctx.Err()
		}
	}
}

// shortAck is a queue configuration whose worker loses a job after 1 s without
// heartbeats.
func shortAck() queue.Config {
	q := queue.DefaultConfig()
	q.AckWait = time.Second
	q.BackOff = []time.Duration{time.Second, time.Second}
	return q
}

func workerCfg(id string, q queue.Config) worker.Config {
	c := worker.DefaultConfig(id)
	c.Queue = q
	c.Slots = 2
	c.FetchWait = 200 * time.Millisecond
	c.Grace = 100 * time.Millisecond
	c.RetryDelay = 100 * time.Millisecond
	return c
}

func submit(t *testing.T, fe *frontend.Frontend, js ...*jobs.Job) []frontend.Submitted {
	t.Helper()
	return fe.SubmitMany(context.Background(), js, "")
}

func mustSubmit(t *testing.T, fe *frontend.Frontend, j *jobs.Job) *jobs.Record {
	t.Helper()
	s := submit(t, fe, j)[0]
	if s.Err != nil {
		t.Fatalf("submit %s: %v", j.ID, s.Err)
	}
	return s.Record
}

func TestDedupeWithinAndBeyondWindow(t *testing.T) {
	t.Parallel()
	q := queue.DefaultConfig()
	q.DedupeWindow = 500 * time.Millisecond
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe")
	rt := &testutil.FakeRuntime{}
	testutil.Worker(t, b, rt, workerCfg("w1", q))

	first := submit(t, fe, &jobs.Job{ID: "dup-1", Code: "print(1)"})[0]
	if first.Err != nil || first.Existing {
		t.Fatalf("first submission: %+v", first)
	}
	// Within the window, and twice in one batch.
	for _, s := range submit(t, fe, &jobs.Job{ID: "dup-1", Code: "print(1)"}, &jobs.Job{ID: "dup-1", Code: "print(1)"}) {
		if s.Err != nil || !s.Existing || s.Record.Job.ID != "dup-1" {
			t.Fatalf("resubmission within the window: %+v", s)
		}
	}
	testutil.WaitRecord(t, b, "dup-1", jobs.StatusSuccess)
	time.Sleep(q.DedupeWindow + 200*time.Millisecond) // the behaviour under test is the window's end
	// Beyond the window: the state service still refuses a second record.
	s := submit(t, fe, &jobs.Job{ID: "dup-1", Code: "print(1)"})[0]
	if s.Err != nil || !s.Existing || s.Record.Status != jobs.StatusSuccess {
		t.Fatalf("resubmission beyond the window: %+v", s)
	}
	// A different job under the same id is a conflict.
	if s := submit(t, fe, &jobs.Job{ID: "dup-1", Code: "print(2)"})[0]; !errors.Is(s.Err, frontend.ErrConflict) || s.Record == nil {
		t.Fatalf("conflicting resubmission: %+v", s)
	}
	// Even straight at the queue (no state check), the events stream refuses
	// a second claim on the id.
	c, err := queue.NewClient(testutil.Connect(t, b, "direct"), jobs.Subjects{})
	if err != nil {
		t.Fatal(err)
	}
	j := &jobs.Job{ID: "dup-1", Code: "print(1)"}
	_ = j.Normalize(jobs.DefaultLimits(), time.Now())
	j.ID = jobs.ScopedID("", j.ID)
	if err := c.Submit(context.Background(), j); !errors.Is(err, queue.ErrDuplicate) {
		t.Fatalf("direct resubmission: %v, want ErrDuplicate", err)
	}
	time.Sleep(300 * time.Millisecond) // a negative check: no second run within the time one would take
	if n := rt.Runs(); n != 1 {
		t.Fatalf("the job ran %d times, want 1", n)
	}
}

func TestCancelQueuedJobNeverRuns(t *testing.T) {
	t.Parallel()
	q := queue.DefaultConfig()
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe")
	mustSubmit(t, fe, &jobs.Job{ID: "cq-1", Code: "print(1)"})
	testutil.WaitRecord(t, b, "cq-1", jobs.StatusQueued)
	if err := fe.Cancel(context.Background(), "", "cq-1", "not needed"); err != nil {
		t.Fatal(err)
	}
	rec := testutil.WaitRecord(t, b, "cq-1", jobs.StatusCancelled)
	if rec.Result == nil || rec.Result.Error != "cancelled: not needed" {
		t.Fatalf("record %+v", rec.Result)
	}
	rt := &testutil.FakeRuntime{}
	testutil.Worker(t, b, rt, workerCfg("w1", q))
	// A later job runs, so the worker has seen the cancelled one first.
	mustSubmit(t, fe, &jobs.Job{ID: "cq-2", Code: "print(2)"})
	testutil.WaitRecord(t, b, "cq-2", jobs.StatusSuccess)
	if n := rt.Runs(); n != 1 {
		t.Fatalf("runtime ran %d jobs, want 1 (the cancelled one must not run)", n)
	}
	if rec, _ := b.Store().Job(jobs.ScopedID("", "cq-1")); rec.Status != jobs.StatusCancelled || rec.StartedAt != nil {
		t.Fatalf("cancelled job changed: %+v", rec)
	}
	waitQueueEmpty(t, b)
}

func TestCancelRunningJobKillsIt(t *testing.T) {
	t.Parallel()
	q := queue.DefaultConfig()
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe")
	rt, err := process.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	testutil.Worker(t, b, rt, workerCfg("w1", q))
	started := make(chan struct{}, 1)
	stopWatch, err := fe.WatchOutput("", "cr-1", func(_, data string) {
		if strings.Contains(data, "started") {
			select {
			case started <- struct{}{}:
			default:
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stopWatch()
	mustSubmit(t, fe, &jobs.Job{ID: "cr-1", Code: "import time\nprint('started', flush=True)\ntime.sleep(60)", Timeout: 100})
	select { // the code runs: its first line of output arrived
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the job's code did not start within 30 s")
	}
	start := time.Now()
	if err := fe.Cancel(context.Background(), "", "cr-1", ""); err != nil {
		t.Fatal(err)
	}
	testutil.WaitRecord(t, b, "cr-1", jobs.StatusCancelled)
	// The worker's own record of the run (the sandbox was stopped) follows,
	// long before the job's minute of sleep would have ended.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if time.Now().After(deadline) {
			t.Fatalf("the running job was not stopped within 30s of its cancellation")
		}
		if n := activeJobs(t, b); n == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("job stopped %s after cancel", time.Since(start))
}

// TestRedeliveryAfterWorkerDies kills a worker (closes its connection) in the
// middle of a job: JetStream redelivers it after AckWait to another worker,
// which runs it again while attempts remain, and records worker_lost after.
func TestRedeliveryAfterWorkerDies(t *testing.T) {
	t.Parallel()
	q := shortAck()
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe")

	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	dying := &testutil.FakeRuntime{Func: blockUntil(release, "never")}
	nc := testutil.Connect(t, b, "dying")
	w, err := worker.New(nc, dying, workerCfg("dying", q))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)

	mustSubmit(t, fe, &jobs.Job{ID: "rd-retry", Code: "x", MaxAttempts: 2})
	mustSubmit(t, fe, &jobs.Job{ID: "rd-lost", Code: "x", MaxAttempts: 1})
	for _, id := range []string{"rd-retry", "rd-lost"} {
		if rec := testutil.WaitRecord(t, b, id, jobs.StatusRunning); rec.Worker != "dying" {
			t.Fatalf("%s started on %s", id, rec.Worker)
		}
	}
	nc.Close() // the worker dies: no heartbeat, no result, no ack
	died := time.Now()

	healthy := &testutil.FakeRuntime{}
	testutil.Worker(t, b, healthy, workerCfg("healthy", q))
	rec := testutil.WaitRecord(t, b, "rd-retry", jobs.StatusSuccess)
	if rec.Worker != "healthy" || rec.Attempt != 2 {
		t.Fatalf("retried job: worker %s attempt %d", rec.Worker, rec.Attempt)
	}
	lost := testutil.WaitRecord(t, b, "rd-lost", jobs.StatusWorkerLost)
	if lost.Attempt != 2 || !lost.DeadLetter() {
		t.Fatalf("lost job: %+v", lost)
	}
	// Noticed by the short AckWait and BackOff (about 2 s), not the default
	// 30 s; the bound leaves room for a loaded host.
	if since := time.Since(died); since > 20*time.Second {
		t.Fatalf("the dead worker was noticed after %s", since)
	}
	if n := healthy.Runs(); n != 1 {
		t.Fatalf("healthy worker ran %d jobs, want 1 (the max_attempts=1 job must not run twice)", n)
	}
	dls, _, err := fe.DeadLetters(context.Background(), "", state.JobFilter{})
	if err != nil || len(dls) != 1 || dls[0].Job.ID != "rd-lost" {
		t.Fatalf("dead letters %v %v", dls, err)
	}
}

// TestLongJobIsNotRedelivered runs a job for several AckWaits: heartbeats keep
// it with its worker.
func TestLongJobIsNotRedelivered(t *testing.T) {
	t.Parallel()
	q := shortAck()
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe")
	slow := &testutil.FakeRuntime{Func: func(ctx context.Context, _ sandbox.Job) (sandbox.Result, error) {
		time.Sleep(3500 * time.Millisecond)
		return sandbox.Result{Status: sandbox.StatusSuccess}, nil
	}}
	testutil.Worker(t, b, slow, workerCfg("slow", q))
	mustSubmit(t, fe, &jobs.Job{ID: "long-1", Code: "x", MaxAttempts: 3})
	testutil.WaitRecord(t, b, "long-1", jobs.StatusRunning)
	other := &testutil.FakeRuntime{}
	testutil.Worker(t, b, other, workerCfg("other", q))
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec, _ := b.Store().Job(jobs.ScopedID("", "long-1"))
		if rec != nil && rec.Status == jobs.StatusSuccess {
			if rec.Attempt != 1 || rec.Worker != "slow" {
				t.Fatalf("long job finished as attempt %d on %s", rec.Attempt, rec.Worker)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("long job did not finish: %+v", rec)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := other.Runs() + slow.Runs(); n != 1 {
		t.Fatalf("the job ran %d times", n)
	}
}

// TestStaleResultIsFenced lets a worker's attempt go stale (its heartbeats are
// slower than the consumer's AckWait), so JetStream hands the job to a second
// worker; the first attempt's late result must not become the record.
func TestStaleResultIsFenced(t *testing.T) {
	t.Parallel()
	q := shortAck()
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe")

	slowQ := queue.DefaultConfig() // heartbeats every 10 s: too slow for 1 s
	slowQ.MaxDeliver = q.MaxDeliver
	releaseA, releaseB := make(chan struct{}), make(chan struct{})
	a := &testutil.FakeRuntime{Func: blockUntil(releaseA, "from A")}
	acfg := workerCfg("A", slowQ)
	acfg.Slots = 1 // so the redelivery cannot go back to A
	testutil.Worker(t, b, a, acfg)
	mustSubmit(t, fe, &jobs.Job{ID: "stale-1", Code: "x", MaxAttempts: 3})
	testutil.WaitRecord(t, b, "stale-1", jobs.StatusRunning)
	// B re-creates the consumer with AckWait 1 s; A's delivery expires.
	bRT := &testutil.FakeRuntime{Func: blockUntil(releaseB, "from B")}
	testutil.Worker(t, b, bRT, workerCfg("B", q))
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

// TestBrokerRestart stops the broker with jobs queued and memory written, and
// starts a new one on the same directory: the jobs run, the records and the
// memory are all there.
func TestBrokerRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	q := queue.DefaultConfig()
	b1 := startBroker(t, dir, q)
	nc := connect(t, b1)
	fe, err := frontend.New(nc, frontend.Config{ID: "fe", Limits: jobs.DefaultLimits()})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"br-1", "br-2", "br-3"}
	for _, id := range ids {
		mustSubmit(t, fe, &jobs.Job{ID: id, Code: "x"})
	}
	sc := state.NewClient(nc, jobs.Subjects{})
	if _, err := sc.MemoryPut(context.Background(), state.Memory{Namespace: "ns", Key: "k", Value: json.RawMessage(`"v"`)}, nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		testutil.WaitRecord(t, b1, id, jobs.StatusQueued)
	}
	nc.Close()
	b1.Close()

	b2 := testutil.Broker(t, dir, q)
	rt := &testutil.FakeRuntime{}
	testutil.Worker(t, b2, rt, workerCfg("w", q))
	for _, id := range ids {
		testutil.WaitRecord(t, b2, id, jobs.StatusSuccess)
	}
	sc2 := state.NewClient(testutil.Connect(t, b2, "c"), jobs.Subjects{})
	if m, err := sc2.MemoryGet(context.Background(), "ns", "k"); err != nil || string(m.Value) != `"v"` {
		t.Fatalf("memory after restart: %+v %v", m, err)
	}
	if n := rt.Runs(); n != 3 {
		t.Fatalf("ran %d jobs after restart, want 3", n)
	}
}

// TestRebuildAfterStateLoss deletes the state file while the broker is down:
// the new broker rebuilds the job records from the events stream.
func TestRebuildAfterStateLoss(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	q := queue.DefaultConfig()
	b1 := startBroker(t, dir, q)
	nc := connect(t, b1)
	fe, err := frontend.New(nc, frontend.Config{ID: "fe", Limits: jobs.DefaultLimits()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(connect(t, b1), &testutil.FakeRuntime{}, workerCfg("w", q))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	mustSubmit(t, fe, &jobs.Job{ID: "rb-1", Code: "x"})
	testutil.WaitRecord(t, b1, "rb-1", jobs.StatusSuccess)
	mustSubmit(t, fe, &jobs.Job{ID: "rb-2", Code: "x"})
	testutil.WaitRecord(t, b1, "rb-2", jobs.StatusSuccess)
	w.Stop()
	mustSubmit(t, fe, &jobs.Job{ID: "rb-3", Code: "x"})
	testutil.WaitRecord(t, b1, "rb-3", jobs.StatusQueued)
	nc.Close()
	b1.Close()
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

func TestFullQueueRejects(t *testing.T) {
	t.Parallel()
	q := queue.DefaultConfig()
	q.MaxQueued = 2
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe")
	res := submit(t, fe, &jobs.Job{ID: "f-1", Code: "x"}, &jobs.Job{ID: "f-2", Code: "x"}, &jobs.Job{ID: "f-3", Code: "x"})
	if res[0].Err != nil || res[1].Err != nil {
		t.Fatalf("first two: %v %v", res[0].Err, res[1].Err)
	}
	if !errors.Is(res[2].Err, queue.ErrQueueFull) || res[2].Record.Status != jobs.StatusRejected {
		t.Fatalf("third: %+v", res[2])
	}
	rec := testutil.WaitRecord(t, b, "f-3", jobs.StatusRejected)
	if !rec.DeadLetter() {
		t.Fatalf("rejected job is not a dead letter: %+v", rec)
	}
	// Resubmitting the rejected id returns the rejection; once the queue
	// drains, a new id is accepted.
	if s := submit(t, fe, &jobs.Job{ID: "f-3", Code: "x"})[0]; !s.Existing || s.Record.Status != jobs.StatusRejected {
		t.Fatalf("resubmitted rejected: %+v", s)
	}
	testutil.Worker(t, b, &testutil.FakeRuntime{}, workerCfg("w", q))
	testutil.WaitRecord(t, b, "f-2", jobs.StatusSuccess)
	mustSubmit(t, fe, &jobs.Job{ID: "f-4", Code: "x"})
	testutil.WaitRecord(t, b, "f-4", jobs.StatusSuccess)
}

// TestWorkerTakesOnlyItsSlots checks a worker never runs more jobs at once than
// it has slots.
func TestWorkerTakesOnlyItsSlots(t *testing.T) {
	t.Parallel()
	q := queue.DefaultConfig()
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe")
	var mu sync.Mutex
	running, peak := 0, 0
	rt := &testutil.FakeRuntime{Func: func(ctx context.Context, _ sandbox.Job) (sandbox.Result, error) {
		mu.Lock()
		running++
		peak = max(peak, running)
		mu.Unlock()
		time.Sleep(30 * time.Millisecond)
		mu.Lock()
		running--
		mu.Unlock()
		return sandbox.Result{Status: sandbox.StatusSuccess}, nil
	}}
	cfg := workerCfg("w", q)
	cfg.Slots = 3
	testutil.Worker(t, b, rt, cfg)
	var js []*jobs.Job
	for range 20 {
		js = append(js, &jobs.Job{Code: "x"})
	}
	out := submit(t, fe, js...)
	for _, s := range out {
		if s.Err != nil {
			t.Fatal(s.Err)
		}
	}
	for _, s := range out {
		testutil.WaitRecord(t, b, s.Record.Job.ID, jobs.StatusSuccess)
	}
	if peak != 3 {
		t.Fatalf("peak concurrency %d, want 3", peak)
	}
}

func startBroker(t *testing.T, dir string, q queue.Config) *broker.Broker {
	t.Helper()
	b, err := broker.Start(context.Background(), broker.Config{DataDir: dir, Listen: "127.0.0.1:-1", Queue: q, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func connect(t *testing.T, b *broker.Broker) *nats.Conn {
	t.Helper()
	nc, err := b.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func waitQueueEmpty(t *testing.T, b *broker.Broker) {
	t.Helper()
	js := testutil.Connect(t, b, "check")
	c, err := queue.NewClient(js, jobs.Subjects{})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		s, err := c.JetStream().Stream(context.Background(), jobs.Subjects{}.JobsStream())
		if err != nil {
			t.Fatal(err)
		}
		if s.CachedInfo().State.Msgs == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d job messages left in the queue", s.CachedInfo().State.Msgs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// activeJobs returns the job deliveries not yet acknowledged.
func activeJobs(t *testing.T, b *broker.Broker) int {
	t.Helper()
	c, err := queue.NewClient(testutil.Connect(t, b, "check"), jobs.Subjects{})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := c.JetStream().Consumer(context.Background(), jobs.Subjects{}.JobsStream(), jobs.Subjects{}.Consumer(jobs.DefaultPool))
	if err != nil {
		t.Fatal(err)
	}
	return cons.CachedInfo().NumAckPending
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
	testutil.Worker(t, b, &testutil.FakeRuntime{Func: blockUntil(release, "real")}, workerCfg("w1", q))
	mustSubmit(t, fe, &jobs.Job{ID: "victim", Code: "x"})
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
	close(release)
	got := testutil.WaitRecord(t, b, "victim", jobs.StatusSuccess)
	if got.Result.Stdout != "real" || got.Worker != "w1" {
		t.Fatalf("a forged outcome was recorded: %+v", got.Result)
	}
}
