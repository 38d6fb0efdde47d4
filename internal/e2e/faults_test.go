package e2e

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// faultQueue redelivers a lost worker's job after one second, so fault tests
// do not wait for the production deadlines.
func faultQueue() queue.Config {
	q := queue.DefaultConfig()
	q.AckWait = time.Second
	q.BackOff = []time.Duration{time.Second, time.Second, time.Second}
	q.MaxDeliver = 5
	return q
}

func faultWorker(id string, q queue.Config) worker.Config {
	cfg := worker.DefaultConfig(id)
	cfg.Queue, cfg.Grace, cfg.FetchWait, cfg.RetryDelay = q, 200*time.Millisecond, 500*time.Millisecond, 100*time.Millisecond
	return cfg
}

// waitTerminal waits until the state service has a terminal record of every id
// and returns them; it fails the test with the missing ids after limit.
func waitTerminal(t *testing.T, b *broker.Broker, ids []string, limit time.Duration) map[string]*jobs.Record {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		wire := make([]string, len(ids))
		for i, id := range ids {
			wire[i] = jobs.ScopedID("ns", id)
		}
		recs, err := b.Store().Jobs(wire)
		got := map[string]*jobs.Record{}
		for _, r := range recs {
			if r.Status.Terminal() {
				got[r.View("ns").Job.ID] = r
			}
		}
		if err == nil && len(got) == len(ids) {
			return got
		}
		if time.Now().After(deadline) {
			var missing []string
			for _, id := range ids {
				if got[id] == nil {
					missing = append(missing, id)
				}
			}
			t.Fatalf("%d of %d accepted jobs have no terminal record after %s (err %v): %v", len(missing), len(ids), limit, err, missing)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestBrokerNodeLostUnderLoad kills one of three clustered brokers (one that
// leads the jobs stream, not the state service's node) while jobs are being
// submitted and run: every accepted job reaches a recorded terminal status.
func TestBrokerNodeLostUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster fault test")
	}
	q := faultQueue()
	c := testutil.StartCluster(t, 3, q)
	for _, i := range []int{1, 2} {
		rt := testutil.NewFakeRuntime(0)
		testutil.WorkerOn(t, c.ConnectAll(t, fmt.Sprint("w", i)), rt, faultWorker(fmt.Sprint("w", i), q))
	}
	fe := testutil.FrontendOn(t, c.ConnectAll(t, "fe"), "fe1")

	// Put the jobs stream's leader on a node other than the state service's.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	js, err := jetstream.New(c.ConnectAll(t, "admin"))
	if err != nil {
		t.Fatal(err)
	}
	victim := -1
	for victim <= 0 {
		leader, err := testutil.StreamLeader(ctx, js, q.Subjects.JobsStream())
		if err == nil {
			victim = c.Index(leader)
		}
		if victim == 0 {
			_, _ = js.Conn().RequestWithContext(ctx, "$JS.API.STREAM.LEADER.STEPDOWN."+q.Subjects.JobsStream(), nil)
		}
		if victim <= 0 {
			if ctx.Err() != nil {
				t.Fatalf("jobs stream has no leader off node 0: %v", err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	t.Logf("killing node %d, leader of %s", victim, q.Subjects.JobsStream())

	const n, batch = 60, 5
	var mu sync.Mutex // guards accepted
	var accepted []string
	submit := func(from, to int) {
		js := make([]*jobs.Job, 0, to-from)
		for i := from; i < to; i++ {
			js = append(js, &jobs.Job{ID: fmt.Sprintf("job%03d", i), Code: "sleep 50ms", MaxAttempts: 3})
		}
		// A client retries a failed submission with the same ids: it is idempotent.
		for try := 0; len(js) > 0 && try < 40 && ctx.Err() == nil; try++ {
			out := fe.SubmitMany(ctx, js, "ns")
			var again []*jobs.Job
			for i, s := range out {
				switch {
				case s.Err == nil:
					mu.Lock()
					accepted = append(accepted, js[i].ID)
					mu.Unlock()
				case errors.Is(s.Err, frontend.ErrUnavailable):
					again = append(again, &jobs.Job{ID: js[i].ID, Code: js[i].Code, MaxAttempts: js[i].MaxAttempts})
				default:
					t.Errorf("submit %s: %v", js[i].ID, s.Err)
				}
			}
			if js = again; len(js) > 0 {
				time.Sleep(250 * time.Millisecond)
			}
		}
	}
	for from := 0; from < n; from += batch {
		if from == n/3 {
			c.Kill(victim)
		}
		submit(from, from+batch)
	}
	if len(accepted) < n/2 {
		t.Fatalf("only %d of %d jobs were accepted", len(accepted), n)
	}
	recs := waitTerminal(t, c.State(), accepted, 45*time.Second)
	byStatus := map[jobs.Status]int{}
	for _, r := range recs {
		byStatus[r.Status]++
	}
	t.Logf("%d accepted, terminal records by status: %v", len(accepted), byStatus)
	if byStatus[jobs.StatusSuccess] == 0 {
		t.Fatalf("no job succeeded: %v", byStatus)
	}
}

// TestWorkerKilledMidJob kills a worker (its connection drops without a word)
// while it runs two jobs: the one allowed a second attempt runs again on
// another worker, the other ends worker_lost.
func TestWorkerKilledMidJob(t *testing.T) {
	q := faultQueue()
	b := testutil.Broker(t, "", q)
	fe := testutil.Frontend(t, b, "fe1")
	rtA := testutil.NewFakeRuntime(4)
	ncA := testutil.Connect(t, b, "worker-a")
	testutil.WorkerOn(t, ncA, rtA, faultWorker("wa", q))

	out := fe.SubmitMany(context.Background(), []*jobs.Job{
		{ID: "retried", Code: "block", MaxAttempts: 2},
		{ID: "lost", Code: "block", MaxAttempts: 1},
	}, "ns")
	for _, s := range out {
		if s.Err != nil {
			t.Fatal(s.Err)
		}
	}
	for range 2 {
		select {
		case <-rtA.Started:
		case <-time.After(20 * time.Second):
			t.Fatal("worker A did not start both jobs")
		}
	}
	ncA.Close() // the worker is gone: no ack, no heartbeat, no nak

	// Worker B finishes what it is given at once ("block" would block: give
	// it a runtime that treats the redelivered job as done).
	rtB := &codeRuntime{FakeRuntime: testutil.NewFakeRuntime(4), code: "print('second attempt')"}
	testutil.Worker(t, b, rtB, faultWorker("wb", q))

	recs := waitTerminal(t, b, []string{"retried", "lost"}, 30*time.Second)
	if r := recs["retried"]; r.Status != jobs.StatusSuccess || r.Worker != "wb" || r.Attempt != 2 {
		t.Errorf("retried job: status %s worker %s attempt %d, want success on wb at attempt 2 (%+v)", r.Status, r.Worker, r.Attempt, r.Result)
	}
	if r := recs["lost"]; r.Status != jobs.StatusWorkerLost {
		t.Errorf("lost job: status %s, want worker_lost (%+v)", r.Status, r.Result)
	}
}

// TestFrontendRestartedMidJob kills the front-end that submitted a running job
// and asks a new front-end for it: the job ran to the end and its result is
// retrievable by id; the dead front-end's departure did not cancel it.
func TestFrontendRestartedMidJob(t *testing.T) {
	q := faultQueue()
	b := testutil.Broker(t, "", q)
	rt := testutil.NewFakeRuntime(1)
	testutil.Worker(t, b, rt, faultWorker("w1", q))
	nc1 := testutil.Connect(t, b, "frontend-1")
	fe1 := testutil.FrontendOn(t, nc1, "fe1")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := fe1.Run(ctx, &jobs.Job{ID: "survivor", Code: "sleep 1500ms"}, nil)
		done <- err
	}()
	select {
	case <-rt.Started:
	case <-time.After(20 * time.Second):
		t.Fatal("the job did not start")
	}
	nc1.Close() // the front-end process dies...
	cancel()    // ...and its caller's request with it
	// What the gone caller's Run returns is not the point: the job's fate below is.
	t.Logf("the gone caller's Run: %v", <-done)

	fe2 := testutil.Frontend(t, b, "fe2")
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	rec, err := fe2.Wait(wctx, "", "survivor")
	if err != nil {
		t.Fatalf("wait for the job through a new front-end: %v", err)
	}
	if rec.Status != jobs.StatusSuccess || rec.Result == nil || rec.Result.Stdout != "sleep 1500ms" {
		t.Fatalf("record %+v, want success", rec)
	}
}

// codeRuntime runs every job as if its code were code.
type codeRuntime struct {
	*testutil.FakeRuntime
	code string
}

func (r *codeRuntime) Run(ctx context.Context, job sandbox.Job, host sandbox.Host) (sandbox.Result, error) {
	job.Code = r.code
	return r.FakeRuntime.Run(ctx, job, host)
}
