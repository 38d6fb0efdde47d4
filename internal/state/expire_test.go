package state_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// TestQueuedJobsExpire: with a 2 s queued max age, a job for a pool whose
// worker takes nothing ends rejected, saying why, and its message leaves the
// jobs stream; a job that waited for a slow parent expires 2 s after its
// release, not after its submission; a job of a served pool runs as before.
func TestQueuedJobsExpire(t *testing.T) {
	t.Parallel()
	q := queue.DefaultConfig()
	q.DedupeWindow, q.QueuedMaxAge = time.Second, 2*time.Second
	b := testutil.Broker(t, "", q)
	testutil.Worker(t, b, testutil.NewFakeRuntime(8), worker.DefaultConfig("w1"))
	testutil.AnnouncePool(t, testutil.Connect(t, b, "announcer"), "stuck") // served, as far as front-ends know
	fe := testutil.Frontend(t, b, "fe")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc := testutil.Connect(t, b, "test")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, jobs.Subjects{}.JobsStream())
	if err != nil {
		t.Fatal(err)
	}
	if c := stream.CachedInfo().Config; c.MaxAge != q.QueuedMaxAge {
		t.Fatalf("jobs stream MaxAge %s, want %s", c.MaxAge, q.QueuedMaxAge)
	}
	msgs := func() uint64 {
		t.Helper()
		info, err := stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}

	out := fe.SubmitMany(ctx, []*jobs.Job{
		{ID: "lost", Code: "x", Pool: "stuck"},
		{ID: "slow", Code: "sleep 3s", Timeout: 30},
		{ID: "child", Code: "x", Pool: "stuck", After: []string{"slow"}},
		{ID: "normal", Code: "x"},
	}, "a")
	for i, o := range out {
		if o.Err != nil {
			t.Fatalf("submit %d: %v", i, o.Err)
		}
	}
	if rec, err := fe.Wait(ctx, "a", "normal"); err != nil || rec.Status != jobs.StatusSuccess {
		t.Fatalf("the normal job: %+v %v", rec, err)
	}
	rec, err := fe.Wait(ctx, "a", "lost")
	if err != nil || rec.Status != jobs.StatusRejected || rec.Result == nil ||
		!strings.Contains(rec.Result.Error, "queued longer than 2s: no worker took it") {
		t.Fatalf("the job no worker took: %+v %v", rec, err)
	}
	if waited := rec.FinishedAt.Sub(rec.CreatedAt); waited < q.QueuedMaxAge {
		t.Fatalf("rejected after %s in the queue, before the max age", waited)
	}
	t.Logf("rejected: %s", rec.Result.Error)
	slow, err := fe.Wait(ctx, "a", "slow")
	if err != nil || slow.Status != jobs.StatusSuccess {
		t.Fatalf("the slow parent: %+v %v", slow, err)
	}
	child, err := fe.Wait(ctx, "a", "child")
	if err != nil || child.Status != jobs.StatusRejected {
		t.Fatalf("the released child: %+v %v", child, err)
	}
	// Queued at its release, after its parent ended: it expires 2 s later,
	// although it was submitted over 3 s before.
	if d := child.FinishedAt.Sub(*slow.FinishedAt); d < q.QueuedMaxAge {
		t.Fatalf("the child was rejected %s after its release, before the max age", d)
	}
	for n := msgs(); n != 0; n = msgs() {
		if ctx.Err() != nil {
			t.Fatalf("%d job messages left in the stream", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if rec, err := fe.Get(ctx, "a", "normal"); err != nil || rec.Status != jobs.StatusSuccess {
		t.Fatalf("the normal job afterwards: %+v %v", rec, err)
	}
}
