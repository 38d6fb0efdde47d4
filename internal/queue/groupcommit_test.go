package queue_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

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
	c := testutil.StartCluster(t, 3, queue.DefaultConfig())
	nc := c.ConnectAll(t, "events")
	client, err := queue.NewClient(nc, jobs.Subjects{})
	if err != nil {
		t.Fatal(err)
	}
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
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, jobs.Subjects{}.EventsStream())
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
