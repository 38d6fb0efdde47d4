package worker_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/state"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

func TestCancelRunningJobKillsIt(t *testing.T) {
	t.Parallel()
	q := queue.DefaultConfig()
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe")
	rt := testutil.ProcessRuntime(t)
	testutil.Worker(t, b, rt, testutil.QuickWorker("w1", q))
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
	testutil.MustSubmit(t, fe, &jobs.Job{ID: "cr-1", Code: "import time\nprint('started', flush=True)\ntime.sleep(60)", Timeout: 100})
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
		if n := testutil.ActiveJobs(t, b); n == 0 {
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
	q := testutil.ShortAck()
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe")

	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	dying := &testutil.FakeRuntime{Func: testutil.BlockUntil(release, "never")}
	nc := testutil.Connect(t, b, "dying")
	w, err := worker.New(nc, dying, testutil.QuickWorker("dying", q))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)

	testutil.MustSubmit(t, fe, &jobs.Job{ID: "rd-retry", Code: "x", MaxAttempts: 2})
	testutil.MustSubmit(t, fe, &jobs.Job{ID: "rd-lost", Code: "x", MaxAttempts: 1})
	for _, id := range []string{"rd-retry", "rd-lost"} {
		if rec := testutil.WaitRecord(t, b, id, jobs.StatusRunning); rec.Worker != "dying" {
			t.Fatalf("%s started on %s", id, rec.Worker)
		}
	}
	nc.Close() // the worker dies: no heartbeat, no result, no ack
	died := time.Now()

	healthy := &testutil.FakeRuntime{}
	testutil.Worker(t, b, healthy, testutil.QuickWorker("healthy", q))
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
	q := testutil.ShortAck()
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe")
	slow := &testutil.FakeRuntime{Func: func(ctx context.Context, _ sandbox.Job) (sandbox.Result, error) {
		time.Sleep(3500 * time.Millisecond)
		return sandbox.Result{Status: sandbox.StatusSuccess}, nil
	}}
	testutil.Worker(t, b, slow, testutil.QuickWorker("slow", q))
	testutil.MustSubmit(t, fe, &jobs.Job{ID: "long-1", Code: "x", MaxAttempts: 3})
	testutil.WaitRecord(t, b, "long-1", jobs.StatusRunning)
	other := &testutil.FakeRuntime{}
	testutil.Worker(t, b, other, testutil.QuickWorker("other", q))
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
	cfg := testutil.QuickWorker("w", q)
	cfg.Slots = 3
	testutil.Worker(t, b, rt, cfg)
	var js []*jobs.Job
	for range 20 {
		js = append(js, &jobs.Job{Code: "x"})
	}
	out := testutil.Submit(t, fe, js...)
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

// resendRuntime sends each job's code twice, as the container pool does for
// a job a damaged container did not run (sandbox.ErrNotRun): BeforeExec is
// called again for the same attempt before the code runs.
type resendRuntime struct{}

func (*resendRuntime) ReportsStart() {}
func (*resendRuntime) Close() error  { return nil }
func (*resendRuntime) Run(_ context.Context, job sandbox.Job, _ sandbox.Host) (sandbox.Result, error) {
	for range 2 {
		if err := sandbox.BeforeExec(job); err != nil {
			return sandbox.Result{}, err
		}
	}
	return sandbox.Result{Status: sandbox.StatusSuccess, Stdout: "ran\n"}, nil
}

// A first delivery's start, recorded on condition that the claim is the
// job's last event, is recorded again when the runtime sends the code a
// second time: the repeat is the same start (its Nats-Msg-Id), not a job
// with history, so a job of max_attempts 1 succeeds rather than ending
// worker_lost.
func TestStartRecordedAgainForTheSameAttempt(t *testing.T) {
	t.Parallel()
	q := queue.DefaultConfig()
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe")
	testutil.Worker(t, b, &resendRuntime{}, testutil.QuickWorker("w1", q))
	testutil.MustSubmit(t, fe, &jobs.Job{ID: "rs-1", Code: "print(1)", MaxAttempts: 1})
	rec := testutil.WaitRecord(t, b, "rs-1", jobs.StatusSuccess)
	if rec.Result == nil || rec.Result.Attempt != 1 || rec.Result.Stdout != "ran\n" {
		t.Fatalf("record %+v", rec.Result)
	}
}
