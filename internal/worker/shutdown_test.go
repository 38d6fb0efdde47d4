package worker_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/testutil/testenv"
	"github.com/mcpexec/mcpexec/internal/worker"
)

func shutdownQueue() queue.Config {
	q := queue.DefaultConfig()
	q.AckWait = time.Second
	q.BackOff = []time.Duration{time.Second, time.Second}
	return q
}

// TestStopLetsRunningJobsFinish stops a worker (as SIGTERM does) while it runs
// a job: the job finishes within the grace period, and the worker takes no
// job after Stop began.
func TestStopLetsRunningJobsFinish(t *testing.T) {
	t.Parallel()
	b, fe, rt, w := setupShutdown(t, 20*time.Second)

	ctx := context.Background()
	if out := fe.SubmitMany(ctx, []*jobs.Job{{ID: "running", Code: "sleep 500ms"}}, "ns"); out[0].Err != nil {
		t.Fatal(out[0].Err)
	}
	testenv.Receive(t, rt.Started, time.Minute, "the job's start")
	stopped := make(chan struct{})
	go func() { w.Stop(); close(stopped) }()
	// Stop has begun once the worker no longer answers status requests.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		ws, err := fe.Workers(ctx)
		if err == nil && !slices.ContainsFunc(ws, func(s jobs.WorkerStatus) bool { return s.ID == "w1" }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the worker still answers status requests 10 s into Stop")
		}
	}
	if out := fe.SubmitMany(ctx, []*jobs.Job{{ID: "later", Code: "x"}}, "ns"); out[0].Err != nil {
		t.Fatal(out[0].Err)
	}
	<-stopped
	if rec := testutil.WaitRecord(t, b, jobs.ScopedID("ns", "running"), jobs.StatusSuccess); rec.Worker != "w1" {
		t.Fatalf("record %+v", rec)
	}
	if rt.Runs() != 1 {
		t.Fatalf("the stopping worker ran %d jobs, want 1", rt.Runs())
	}
	if rec, err := b.Store().Job(jobs.ScopedID("ns", "later")); err != nil || rec.Status != jobs.StatusQueued {
		t.Fatalf("job submitted during Stop: %+v, %v; want queued", rec, err)
	}
}

// TestStopHandsBackJobsAfterGrace stops a worker whose job outlasts the grace
// period: the job is handed back and another worker runs it.
func TestStopHandsBackJobsAfterGrace(t *testing.T) {
	t.Parallel()
	b, fe, rt, w := setupShutdown(t, 200*time.Millisecond)

	ctx := context.Background()
	if out := fe.SubmitMany(ctx, []*jobs.Job{{ID: "long", Code: "block", MaxAttempts: 2}}, "ns"); out[0].Err != nil {
		t.Fatal(out[0].Err)
	}
	testenv.Receive(t, rt.Started, time.Minute, "the job's start")
	w.Stop()
	if rec, err := b.Store().Job(jobs.ScopedID("ns", "long")); err != nil || rec.Status.Terminal() {
		t.Fatalf("handed-back job: %+v, %v; want it not finished", rec, err)
	}
	// Another worker takes the handed-back job (its second attempt).
	cfg2 := worker.DefaultConfig("w2")
	cfg2.Queue = shutdownQueue()
	testutil.Worker(t, b, &doneRuntime{testutil.NewFakeRuntime(1)}, cfg2)
	rec := testutil.WaitRecord(t, b, jobs.ScopedID("ns", "long"), jobs.StatusSuccess)
	if rec.Worker != "w2" || rec.Attempt != 2 {
		t.Fatalf("record %+v, want success on w2 at attempt 2", rec)
	}
}

// doneRuntime finishes every job at once.
type doneRuntime struct{ *testutil.FakeRuntime }

func (r *doneRuntime) Run(ctx context.Context, job sandbox.Job, host sandbox.Host) (sandbox.Result, error) {
	job.Code = "done"
	return r.FakeRuntime.Run(ctx, job, host)
}

// setupShutdown starts a broker, a front-end and worker w1 on a fake runtime
// whose Stop gives running jobs grace.
func setupShutdown(t *testing.T, grace time.Duration) (*broker.Broker, *frontend.Frontend, *testutil.FakeRuntime, *worker.Worker) {
	t.Helper()
	q := shutdownQueue()
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe1")
	rt := testutil.NewFakeRuntime(4)
	cfg := worker.DefaultConfig("w1")
	cfg.Queue, cfg.Grace = q, grace
	return b, fe, rt, testutil.Worker(t, b, rt, cfg)
}
