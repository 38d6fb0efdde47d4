package queue_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/durable"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// gateBarrier is the broker's Barrier, holding each barrier of one stream
// until open is closed.
type gateBarrier struct {
	inner  durable.Barrier
	stream string
	open   chan struct{}
}

func (g *gateBarrier) Sync(ctx context.Context) error { return g.inner.Sync(ctx) }

func (g *gateBarrier) SyncStream(ctx context.Context, stream string) error {
	if stream == g.stream {
		select {
		case <-g.open:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return durable.SyncStream(ctx, g.inner, stream)
}

// TestJobQueuedBesideItsClaimsBarrier: a submission enqueues its job once
// the claim is stored, without waiting for the claim's barrier, and
// succeeds only once that barrier is done too.
func TestJobQueuedBesideItsClaimsBarrier(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := testutil.Broker(t, "", queue.DefaultConfig())
	c, err := queue.NewClient(testutil.Connect(t, b, "fe"), jobs.Subjects{})
	if err != nil {
		t.Fatal(err)
	}
	gate := &gateBarrier{inner: b.Barrier(), stream: jobs.Subjects{}.EventsStream(), open: make(chan struct{})}
	c.UseLocalBarrier(gate)
	var opened sync.Once
	openGate := func() { opened.Do(func() { close(gate.open) }) }
	t.Cleanup(openGate) // a failed test leaves no submission waiting
	job := &jobs.Job{ID: "beside-1", Code: "pass"}
	if err := job.Normalize(jobs.DefaultLimits(), time.Now()); err != nil {
		t.Fatal(err)
	}
	submitted := make(chan error, 1)
	go func() { submitted <- c.Submit(ctx, job) }()

	st, err := c.JetStream().Stream(ctx, jobs.Subjects{}.JobsStream())
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool {
		info, err := st.Info(ctx)
		return err == nil && info.State.Msgs == 1
	}, "the job was not enqueued while its claim's barrier waited")
	select {
	case err := <-submitted:
		t.Fatalf("the submission ended (%v) before its claim's barrier", err)
	default:
	}
	openGate()
	select {
	case err := <-submitted:
		if err != nil {
			t.Fatalf("submit: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the submission did not end once its claim's barrier was done")
	}
}
