package frontend_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/testutil/testenv"
	"github.com/mcpexec/mcpexec/internal/worker"
)

func setupAdmission(t *testing.T, p frontend.Policy, withWorker bool) (*broker.Broker, *frontend.Frontend, *testutil.FakeRuntime) {
	t.Helper()
	b := testutil.Broker(t, "", queue.DefaultConfig())
	rt := testutil.NewFakeRuntime(16)
	if withWorker {
		cfg := worker.DefaultConfig("w1")
		cfg.Grace = 100 * time.Millisecond
		testutil.Worker(t, b, rt, cfg)
	}
	fe, err := frontend.New(testutil.Connect(t, b, "fe"), frontend.Config{ID: "fe1", Limits: jobs.DefaultLimits(), Policy: p, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := fe.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fe.Stop)
	return b, fe, rt
}

func TestNamespaceQueuedCap(t *testing.T) {
	t.Parallel()
	_, fe, _ := setupAdmission(t, frontend.Policy{MaxQueued: 2}, false) // no worker: jobs stay queued
	ctx := context.Background()
	out := fe.SubmitMany(ctx, []*jobs.Job{{ID: "a1", Code: "x"}, {ID: "a2", Code: "x"}, {ID: "a3", Code: "x"}}, "alice")
	if out[0].Err != nil || out[1].Err != nil {
		t.Fatalf("first two: %v, %v", out[0].Err, out[1].Err)
	}
	if !errors.Is(out[2].Err, frontend.ErrOverCap) || !strings.Contains(out[2].Err.Error(), `namespace "alice" has 2 jobs waiting`) {
		t.Fatalf("third: want ErrOverCap naming the namespace, got %v", out[2].Err)
	}
	// Another namespace has its own cap; a resubmitted id adds nothing.
	out = fe.SubmitMany(ctx, []*jobs.Job{{ID: "b1", Code: "x"}, {ID: "a1", Code: "x"}}, "bob")
	if out[0].Err != nil {
		t.Fatalf("bob's job: %v", out[0].Err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := fe.Run(rctx, &jobs.Job{ID: "a4", Code: "x", Namespace: "alice"}, nil); !errors.Is(err, frontend.ErrOverCap) {
		t.Fatalf("Run over the cap: want ErrOverCap, got %v", err)
	}
}

func TestNamespaceActiveCap(t *testing.T) {
	t.Parallel()
	_, fe, rt := setupAdmission(t, frontend.Policy{MaxActive: 2}, true)
	ctx := context.Background()
	out := fe.SubmitMany(ctx, []*jobs.Job{{ID: "r1", Code: "block"}, {ID: "r2", Code: "block"}, {ID: "r3", Code: "block"}}, "alice")
	if out[0].Err != nil || out[1].Err != nil || !errors.Is(out[2].Err, frontend.ErrOverCap) {
		t.Fatalf("want two admitted and the third refused, got %v, %v, %v", out[0].Err, out[1].Err, out[2].Err)
	}
	for range 2 {
		testenv.Receive(t, rt.Started, time.Minute, "a job's start")
	}
	if err := fe.Cancel(ctx, "alice", "r1", "test"); err != nil {
		t.Fatal(err)
	}
	// Once r1 has ended, alice may submit again.
	deadline := time.Now().Add(20 * time.Second)
	for {
		out = fe.SubmitMany(ctx, []*jobs.Job{{ID: "r4", Code: "done"}}, "alice")
		if out[0].Err == nil {
			break
		}
		if !errors.Is(out[0].Err, frontend.ErrOverCap) || time.Now().After(deadline) {
			t.Fatalf("after a cancel: %v", out[0].Err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestDrainAnswersInFlightCalls(t *testing.T) {
	t.Parallel()
	_, fe, rt := setupAdmission(t, frontend.Policy{}, true)
	ctx := context.Background()
	type outcome struct {
		rec *jobs.Record
		err error
	}
	run := func(job *jobs.Job) chan outcome {
		ch := make(chan outcome, 1)
		go func() {
			rec, err := fe.Run(ctx, job, nil)
			ch <- outcome{rec, err}
		}()
		return ch
	}
	short := run(&jobs.Job{ID: "short", Code: "sleep 300ms"})
	long := run(&jobs.Job{ID: "long", Code: "block"})
	for range 2 {
		testenv.Receive(t, rt.Started, time.Minute, "a job's start")
	}
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	fe.Drain(dctx)

	if o := <-short; o.err != nil || o.rec.Status != jobs.StatusSuccess {
		t.Fatalf("short job: %+v, %v; want success within the grace period", o.rec, o.err)
	}
	o := <-long
	var re *frontend.ResumableError
	if !errors.As(o.err, &re) || re.JobID != "long" || !strings.Contains(o.err.Error(), "/api/jobs/long/wait") {
		t.Fatalf("long job: want a ResumableError naming it, got %v", o.err)
	}
	// The job goes on: it was not cancelled.
	if rec, err := fe.Get(ctx, "", "long"); err != nil || rec.Status != jobs.StatusRunning {
		t.Fatalf("long job after drain: %+v, %v; want running", rec, err)
	}
	if _, err := fe.Run(ctx, &jobs.Job{Code: "x"}, nil); !errors.Is(err, frontend.ErrShuttingDown) {
		t.Fatalf("Run while draining: want ErrShuttingDown, got %v", err)
	}
}

// TestNamespaceQueuedBytesCap: a tenant whose queued jobs carry large code
// is refused once their bytes pass its cap (well before its job count cap),
// so it cannot fill the fleet's queue and events stream with few jobs;
// another namespace still submits.
func TestNamespaceQueuedBytesCap(t *testing.T) {
	t.Parallel()
	_, fe, _ := setupAdmission(t, frontend.Policy{MaxQueued: 100, MaxQueuedBytes: 500 << 10}, false) // no worker: jobs stay queued
	ctx := context.Background()
	big := "#" + strings.Repeat("x", 200<<10)
	out := fe.SubmitMany(ctx, []*jobs.Job{{ID: "a1", Code: big}, {ID: "a2", Code: big}, {ID: "a3", Code: big}, {ID: "a4", Code: "x"}}, "alice")
	if out[0].Err != nil || out[1].Err != nil || out[3].Err != nil {
		t.Fatalf("under the cap: %v, %v, %v", out[0].Err, out[1].Err, out[3].Err)
	}
	if !errors.Is(out[2].Err, frontend.ErrOverCap) || !strings.Contains(out[2].Err.Error(), "bytes of code waiting") {
		t.Fatalf("over the bytes cap: want ErrOverCap saying so, got %v", out[2].Err)
	}
	if out := fe.SubmitMany(ctx, []*jobs.Job{{ID: "b1", Code: big}}, "bob"); out[0].Err != nil {
		t.Fatalf("another namespace: %v", out[0].Err)
	}
}

// TestPoolNobodyServesRefused: a job for a pool no live worker serves is
// refused at submission (SubmitMany and Run), saying how to start one; the
// default pool is accepted without workers; once a worker serves the pool,
// its jobs are accepted and run.
func TestPoolNobodyServesRefused(t *testing.T) {
	t.Parallel()
	b, fe, _ := setupAdmission(t, frontend.Policy{}, false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := fe.SubmitMany(ctx, []*jobs.Job{{ID: "g1", Code: "x", Pool: "gpu"}, {ID: "d1", Code: "x"}}, "alice")
	var inv *jobs.InvalidError
	if !errors.As(out[0].Err, &inv) || inv.Field != "pool" || !strings.Contains(inv.Message, `no worker serves pool "gpu": start one with `+"`worker --job-pool gpu`") {
		t.Fatalf("job for a pool nobody serves: %v", out[0].Err)
	}
	if out[1].Err != nil {
		t.Fatalf("job for the default pool without workers: %v", out[1].Err)
	}
	if _, err := fe.Run(ctx, &jobs.Job{ID: "g2", Code: "x", Pool: "gpu", Namespace: "alice"}, nil); !errors.As(err, &inv) || inv.Field != "pool" {
		t.Fatalf("Run for a pool nobody serves: %v", err)
	}
	if _, err := fe.Get(ctx, "alice", "g1"); err == nil {
		t.Fatal("a refused job was recorded")
	}
	cfg := worker.DefaultConfig("gpu1")
	cfg.Pool, cfg.Grace = "gpu", 100*time.Millisecond
	testutil.Worker(t, b, testutil.NewFakeRuntime(4), cfg)
	start := time.Now()
	for {
		out = fe.SubmitMany(ctx, []*jobs.Job{{ID: "g3", Code: "x", Pool: "gpu"}}, "alice")
		if out[0].Err == nil {
			break
		}
		if !errors.As(out[0].Err, &inv) || time.Since(start) > 5*time.Second {
			t.Fatalf("job for a pool a worker serves: %v after %s", out[0].Err, time.Since(start))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if rec, err := fe.Wait(ctx, "alice", "g3"); err != nil || rec.Status != jobs.StatusSuccess {
		t.Fatalf("the gpu job: %+v %v", rec, err)
	}
}
