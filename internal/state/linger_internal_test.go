package state

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestWaitHurriesTheFollower: a request waiting for more of a stream than
// is applied tells that stream's follower (a token on its hurry channel),
// and only that one.
func TestWaitHurriesTheFollower(t *testing.T) {
	for _, memory := range []bool{false, true} {
		a := newApplied(5, 5)
		ev, mem := uint64(6), uint64(0)
		if memory {
			ev, mem = 0, 6
		}
		done := make(chan error, 1)
		go func() { done <- a.wait(context.Background(), ev, mem, time.Minute, false) }()
		select {
		case <-a.hurry(memory):
		case <-time.After(10 * time.Second):
			t.Fatalf("memory %v: a waiting request gave the follower no token", memory)
		}
		if len(a.hurry(!memory)) != 0 {
			t.Errorf("memory %v: the other stream's follower was hurried too", memory)
		}
		a.advance(6, 6)
		if err := <-done; err != nil {
			t.Fatalf("memory %v: wait: %v", memory, err)
		}
	}
}

// TestGatherStopsLingeringWhenHurried: a lingering gather returns what it
// has when a request waits, taking the token (one that lingered to its
// deadline would leave it).
func TestGatherStopsLingeringWhenHurried(t *testing.T) {
	msgs := make(chan jetstream.Msg, 4)
	hurry := make(chan struct{}, 1)
	hurry <- struct{}{}
	if got := gather(msgs, make([]jetstream.Msg, 1), 1024, true, hurry); len(got) != 1 {
		t.Fatalf("hurried gather returned %d messages, want the 1 it had", len(got))
	}
	if len(hurry) != 0 {
		t.Fatal("a hurried gather left the token: it lingered to its deadline instead")
	}
}
