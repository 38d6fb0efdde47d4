package queue_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// Events published at once through one client in a three-node cluster (the
// events stream replicated three ways, in atomic batches where they meet):
// every one is stored once, and the client's sequence covers them all.
func TestPublishEventsAtOnceInACluster(t *testing.T) {
	t.Parallel()
	client := clusterClient(t, "events")
	ctx := context.Background()
	const n = 200
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ev := jobs.Event{Job: fmt.Sprintf("job-%03d", i), Kind: jobs.EventCancelled, Reason: "test"}
			if err := client.PublishEvent(ctx, ev); err != nil {
				t.Errorf("event %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	s, err := client.JetStream().Stream(ctx, jobs.Subjects{}.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(jobs.Subjects{}.AllEvents()))
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != n || len(info.State.Subjects) != n {
		t.Fatalf("the events stream holds %d events on %d subjects, want %d", info.State.Msgs, len(info.State.Subjects), n)
	}
	if got := client.EventsSeq(); got != info.State.LastSeq {
		t.Fatalf("the client saw sequence %d, the stream's last is %d", got, info.State.LastSeq)
	}
}

// First starts published at once in a three-node cluster, where the group
// commit stores them in atomic batches: each is stored only while its job's
// claim is the job's last event. Half the jobs are cancelled first; a batch
// that holds one of their starts is refused whole and its starts are then
// published one by one, so every other start is still stored, once.
func TestFirstStartsAtOnceInACluster(t *testing.T) {
	t.Parallel()
	client := clusterClient(t, "first-starts")
	ctx := context.Background()
	const n = 64
	js := make([]*jobs.Job, n)
	for i := range js {
		js[i] = &jobs.Job{ID: fmt.Sprintf("fs-%03d", i), Code: "pass"}
		if err := js[i].Normalize(jobs.DefaultLimits(), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	for i, err := range client.SubmitMany(ctx, js) {
		if err != nil {
			t.Fatalf("submit %d: %v", i, err)
		}
	}
	sub := jobs.Subjects{}
	msgs := make([]*queue.Message, n)
	for i := range msgs {
		if msgs[i] = jobMessage(t, client, uint64(i+1)); msgs[i].ClaimSeq == 0 {
			t.Fatalf("job message %d carries no claim sequence", i)
		}
	}
	for i := 0; i < n; i += 2 {
		if err := client.PublishEvent(ctx, jobs.Event{Job: msgs[i].ID, Kind: jobs.EventCancelled, Reason: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, m := range msgs {
		wg.Go(func() {
			errs[i] = client.PublishStart(ctx, jobs.Event{Job: m.ID, Kind: jobs.EventStarted, Attempt: 1, Worker: "w",
				Proof: jobs.EventProof(m.Capability, jobs.EventStarted, 1)}, queue.StartAfter{ClaimSeq: m.ClaimSeq}, queue.NewDeliveryToken())
		})
	}
	wg.Wait()
	for i, err := range errs {
		cancelled := i%2 == 0
		if cancelled && !errors.Is(err, queue.ErrHistoryMoved) || !cancelled && err != nil {
			t.Errorf("first start of job %d (cancelled: %t): %v", i, cancelled, err)
		}
	}
	events, err := client.JetStream().Stream(ctx, sub.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := events.Info(ctx, jetstream.WithSubjectFilter(sub.Event("*", jobs.EventStarted)))
	if err != nil {
		t.Fatal(err)
	}
	if len(info.State.Subjects) != n/2 {
		t.Fatalf("%d jobs have a start stored, want %d", len(info.State.Subjects), n/2)
	}
}

// clusterClient starts a three-node cluster and returns a queue client
// connected to all of its nodes.
func clusterClient(t *testing.T, name string) *queue.Client {
	t.Helper()
	c := testutil.StartCluster(t, 3, queue.DefaultConfig())
	client, err := queue.NewClient(c.ConnectAll(t, name), jobs.Subjects{})
	if err != nil {
		t.Fatal(err)
	}
	return client
}
