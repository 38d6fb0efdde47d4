package worker_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/durable"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// countingBarrier is the broker's Barrier, counting the barriers asked for
// the events stream.
type countingBarrier struct {
	inner  durable.Barrier
	events atomic.Int32
}

func (c *countingBarrier) Sync(ctx context.Context) error {
	c.events.Add(1)
	return c.inner.Sync(ctx)
}

func (c *countingBarrier) SyncStream(ctx context.Context, stream string) error {
	if stream == (jobs.Subjects{}).EventsStream() {
		c.events.Add(1)
	}
	return durable.SyncStream(ctx, c.inner, stream)
}

// callRuntime runs each job as code that makes one proxy call once its
// start is recorded; between, when set, runs just before the call.
type callRuntime struct {
	between func(run int, job string)
	runs    atomic.Int32 // Run called
	ran     atomic.Int32 // Run's code sent: its start recorded
	calls   chan string  // each run's call: its answer, or "error: ..."
}

func (*callRuntime) ReportsStart() {}
func (*callRuntime) Close() error  { return nil }
func (r *callRuntime) Run(ctx context.Context, job sandbox.Job, host sandbox.Host) (sandbox.Result, error) {
	n := int(r.runs.Add(1))
	if err := sandbox.BeforeExec(job); err != nil {
		return sandbox.Result{}, err
	}
	r.ran.Add(1)
	if r.between != nil {
		r.between(n, job.ID)
	}
	res, err := host.Call(ctx, proxy.MethodListServers, json.RawMessage(`{}`))
	out := string(res)
	if err != nil {
		out = "error: " + err.Error()
	}
	r.calls <- out
	if ctx.Err() != nil {
		return sandbox.Result{Status: sandbox.StatusError, Error: "interrupted"}, ctx.Err()
	}
	return sandbox.Result{Status: sandbox.StatusSuccess, Stdout: out}, nil
}

// deleteLastEvent removes job's last event of kind from the events stream,
// as a power cut that lost it would.
func deleteLastEvent(ctx context.Context, js jetstream.JetStream, job string, kind jobs.EventKind) error {
	st, err := js.Stream(ctx, jobs.Subjects{}.EventsStream())
	if err != nil {
		return err
	}
	m, err := st.GetLastMsgForSubject(ctx, jobs.Subjects{}.Event(job, kind))
	if err != nil {
		return err
	}
	return st.DeleteMsg(ctx, m.Sequence)
}

// TestFirstCallWaitsForADurableStart: a worker records a job's start
// without waiting for a barrier, and the job's first call, its first
// effect, waits for one: no effect leaves before the start is durable.
func TestFirstCallWaitsForADurableStart(t *testing.T) {
	t.Parallel()
	q := queue.DefaultConfig()
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe")
	spy := &countingBarrier{inner: b.Barrier()}
	var before, after atomic.Int32
	rt := &callRuntime{calls: make(chan string, 4)}
	rt.between = func(int, string) { before.Store(spy.events.Load()) }
	cfg := testutil.QuickWorker("w1", q)
	cfg.LocalBarrier = spy
	testutil.Worker(t, b, rt, cfg)
	testutil.MustSubmit(t, fe, &jobs.Job{ID: "ds-1", Code: "call", MaxAttempts: 1})
	call := <-rt.calls
	after.Store(spy.events.Load())
	if strings.HasPrefix(call, "error") {
		t.Fatalf("the call failed: %s", call)
	}
	rec := testutil.WaitRecord(t, b, "ds-1", jobs.StatusSuccess)
	if rec.Result == nil || rec.Result.Attempt != 1 {
		t.Fatalf("record %+v", rec.Result)
	}
	if before.Load() != 0 {
		t.Fatalf("%d barriers of the events stream before the first call: the start waited for one", before.Load())
	}
	if after.Load() == 0 {
		t.Fatal("the first call was made before any barrier of the events stream: its start may not be durable")
	}
}

// TestLostStartMakesNoCall plays a broker that lost a job's start in a
// power cut while the worker ran it: the start is removed, and the worker's
// connection made again, before the job's first call. The call is not made,
// the run ends, and the job runs again under its history.
func TestLostStartMakesNoCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := queue.DefaultConfig()
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe")
	admin := testutil.Connect(t, b, "admin")
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	nc := testutil.Connect(t, b, "worker-w1")
	rt := &callRuntime{calls: make(chan string, 4)}
	rt.between = func(run int, job string) {
		if run != 1 {
			return
		}
		if err := deleteLastEvent(ctx, js, job, jobs.EventStarted); err != nil {
			t.Error(err)
			return
		}
		if err := testutil.Reconnect(nc, 10*time.Second); err != nil {
			t.Error(err)
		}
	}
	testutil.WorkerOn(t, nc, rt, testutil.QuickWorker("w1", q))
	testutil.MustSubmit(t, fe, &jobs.Job{ID: "ls-1", Code: "call", MaxAttempts: 1})
	if first := <-rt.calls; !strings.Contains(first, "the call was not made: the job's start was lost") {
		t.Fatalf("the first run's call, whose start was lost: %q", first)
	}
	if second := <-rt.calls; strings.HasPrefix(second, "error") {
		t.Fatalf("the job's second run: %s", second)
	}
	rec := testutil.WaitRecord(t, b, "ls-1", jobs.StatusSuccess)
	if rec.Result == nil || rec.Result.Attempt != 1 {
		t.Fatalf("record %+v: want attempt 1's success (the lost start counts none)", rec.Result)
	}
	if n := rt.runs.Load(); n != 2 {
		t.Fatalf("%d runs, want 2", n)
	}
}

// TestJobWhoseClaimWasLost plays a power cut between a submission's two
// barriers that kept the job message and lost its claim (the claim's
// barrier runs beside the enqueue): the claim is removed before any worker
// takes the job. The first delivery's start, made on the claim, is refused;
// the job runs once, on its history, as attempt 1.
func TestJobWhoseClaimWasLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := queue.DefaultConfig()
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe")
	rec := testutil.MustSubmit(t, fe, &jobs.Job{ID: "cl-1", Code: "call", MaxAttempts: 1})
	js, err := jetstream.New(testutil.Connect(t, b, "admin"))
	if err != nil {
		t.Fatal(err)
	}
	if err := deleteLastEvent(ctx, js, jobs.ScopedID(jobs.DefaultNamespace, rec.Job.ID), jobs.EventSubmitted); err != nil {
		t.Fatal(err)
	}
	rt := &callRuntime{calls: make(chan string, 4)}
	testutil.Worker(t, b, rt, testutil.QuickWorker("w1", q))
	if call := <-rt.calls; strings.HasPrefix(call, "error") {
		t.Fatalf("the job's call: %s", call)
	}
	done := testutil.WaitRecord(t, b, "cl-1", jobs.StatusSuccess)
	if done.Result == nil || done.Result.Attempt != 1 {
		t.Fatalf("record %+v: want attempt 1's success", done.Result)
	}
	if n := rt.ran.Load(); n != 1 {
		t.Fatalf("the code ran %d times, want once", n)
	}
}
