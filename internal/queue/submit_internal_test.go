package queue

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/mcpexec/mcpexec/internal/durable"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

// streamBarrierFunc is a durable.StreamBarrier: f gets the stream a
// request names ("" for a whole pass).
type streamBarrierFunc func(ctx context.Context, stream string) error

func (f streamBarrierFunc) Sync(ctx context.Context) error { return f(ctx, "") }
func (f streamBarrierFunc) SyncStream(ctx context.Context, stream string) error {
	return f(ctx, stream)
}

// barrierBroker is a nats-server with the queue's streams whose state
// service says the brokers keep sync always with barriers, which b answers.
func barrierBroker(t *testing.T, b durable.Barrier) (*Client, jetstream.JetStream) {
	t.Helper()
	nc := jetStreamServer(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := Setup(context.Background(), js, DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	sub := jobs.Subjects{}
	svc, err := micro.AddService(nc, micro.Config{Name: sub.StateService(), Version: "1.0.0",
		Metadata: map[string]string{SyncMetadata: "always", durable.BarrierMetadata: "true"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() }) // the test is over with it
	srv, err := durable.Serve(nc, sub.SyncBarrier(), b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	c, err := NewClient(nc, sub)
	if err != nil {
		t.Fatal(err)
	}
	return c, js
}

func streamMsgs(t *testing.T, js jetstream.JetStream, name string) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func newJob(t *testing.T, id string) *jobs.Job {
	t.Helper()
	j := &jobs.Job{ID: id, Code: "print(1)"}
	if err := j.Normalize(jobs.DefaultLimits(), time.Now()); err != nil {
		t.Fatal(err)
	}
	j.ID = jobs.ScopedID("", j.ID)
	return j
}

// TestClaimSyncedBesideTheEnqueue: where the brokers need barriers, a
// submission's job message is queued while its claim's barrier runs (a
// worker takes it at once), and Submit returns only once both are durable.
func TestClaimSyncedBesideTheEnqueue(t *testing.T) {
	t.Parallel()
	sub := jobs.Subjects{}
	release := make(chan struct{})
	c, js := barrierBroker(t, streamBarrierFunc(func(ctx context.Context, stream string) error {
		if stream == sub.EventsStream() {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}))
	done := make(chan error, 1)
	go func() { done <- c.Submit(context.Background(), newJob(t, "beside")) }()
	deadline := time.Now().Add(10 * time.Second)
	for streamMsgs(t, js, sub.JobsStream()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the job message was not queued while its claim's barrier ran")
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("Submit returned (%v) before its claim was durable", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("Submit: %v", err)
	}
}

// TestClaimBarrierFailedIsRetried: when the claim's barrier fails, the
// submission is retried (the claim found, the message deduplicated), so the
// job is claimed and queued once.
func TestClaimBarrierFailedIsRetried(t *testing.T) {
	t.Parallel()
	sub := jobs.Subjects{}
	var failed atomic.Bool
	c, js := barrierBroker(t, streamBarrierFunc(func(_ context.Context, stream string) error {
		if stream == sub.EventsStream() && failed.CompareAndSwap(false, true) {
			return errors.New("the pass was cut short")
		}
		return nil
	}))
	c.Patience = 10 * time.Second
	if err := c.Submit(context.Background(), newJob(t, "retried")); err != nil {
		t.Fatalf("Submit: %v", err)
	}
	if !failed.Load() {
		t.Fatal("no claim barrier failed: the test tested nothing")
	}
	if n := streamMsgs(t, js, sub.JobsStream()); n != 1 {
		t.Fatalf("%d job messages queued, want 1", n)
	}
	if n := streamMsgs(t, js, sub.EventsStream()); n != 1 {
		t.Fatalf("%d events recorded, want the one claim", n)
	}
}
