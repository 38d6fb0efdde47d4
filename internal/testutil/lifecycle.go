package testutil

import (
	"context"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// BlockUntil returns a FakeRuntime.Func that blocks until release is closed
// (then succeeds with out) or ctx ends.
func BlockUntil(release <-chan struct{}, out string) func(context.Context, sandbox.Job) (sandbox.Result, error) {
	return func(ctx context.Context, _ sandbox.Job) (sandbox.Result, error) {
		select {
		case <-release:
			return sandbox.Result{Status: sandbox.StatusSuccess, Stdout: out}, nil
		case <-ctx.Done():
			return sandbox.Result{Status: sandbox.StatusError, Error: "stopped"}, ctx.Err()
		}
	}
}

// ShortAck is a queue configuration whose worker loses a job after 1 s
// without heartbeats.
func ShortAck() queue.Config {
	q := queue.DefaultConfig()
	q.AckWait = time.Second
	q.BackOff = []time.Duration{time.Second, time.Second}
	return q
}

// QuickWorker is a worker configuration for lifecycle tests: two slots,
// short fetches, grace and retry delays.
func QuickWorker(id string, q queue.Config) worker.Config {
	c := worker.DefaultConfig(id)
	c.Queue = q
	c.Slots = 2
	c.FetchWait = 200 * time.Millisecond
	c.Grace = 100 * time.Millisecond
	c.RetryDelay = 100 * time.Millisecond
	return c
}

// Submit submits js in the default namespace.
func Submit(t testing.TB, fe *frontend.Frontend, js ...*jobs.Job) []jobs.Submitted {
	t.Helper()
	return fe.SubmitMany(context.Background(), js, "")
}

// MustSubmit submits j in the default namespace and fails the test if it is
// refused.
func MustSubmit(t testing.TB, fe *frontend.Frontend, j *jobs.Job) *jobs.Record {
	t.Helper()
	s := Submit(t, fe, j)[0]
	if s.Err != nil {
		t.Fatalf("submit %s: %v", j.ID, s.Err)
	}
	return s.Record
}

// ActiveJobs returns the default pool's job deliveries not yet acknowledged.
func ActiveJobs(t testing.TB, b *broker.Broker) int {
	t.Helper()
	c, err := queue.NewClient(Connect(t, b, "check"), jobs.Subjects{})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := c.JetStream().Consumer(context.Background(), jobs.Subjects{}.JobsStream(), jobs.Subjects{}.Consumer(jobs.DefaultPool))
	if err != nil {
		t.Fatal(err)
	}
	return cons.CachedInfo().NumAckPending
}
