package sandbox

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	"github.com/mcpexec/mcpexec/internal/proxy"
)

// relayRunner plays a runner that keeps MaxConcurrentCalls calls in flight
// by starting a new one as each answer arrives, the way the JavaScript
// executor's pool does.
type relayRunner struct {
	g    *callGate
	host Host

	mu      sync.Mutex // guards left, refused, replies
	left    int        // calls still to start
	refused []string
	replies int
	done    chan struct{}
}

func (r *relayRunner) write(f *proxy.Frame) error {
	r.mu.Lock()
	r.replies++
	if f.Error != "" {
		r.refused = append(r.refused, f.Error)
	}
	next := r.left > 0
	if next {
		r.left--
	}
	finished := r.left == 0 && r.replies == r.total()
	r.mu.Unlock()
	if next {
		r.start()
	}
	if finished {
		close(r.done)
	}
	return nil
}

func (r *relayRunner) sendAsync(f *proxy.Frame) { _ = r.write(f) }

// total is every call the runner makes: the first window and the relays.
func (r *relayRunner) total() int { return MaxConcurrentCalls + 200 }

func (r *relayRunner) start() {
	serveCall(r, r.g, r.host, &proxy.Frame{Type: proxy.TypeCall, Method: proxy.MethodCallTool, Params: json.RawMessage(`{}`)})
}

// answerOnceFull answers every call once the first window is all in flight.
type answerOnceFull struct{ full chan struct{} }

func (h answerOnceFull) Call(context.Context, string, json.RawMessage) (json.RawMessage, error) {
	<-h.full
	return json.RawMessage(`{"ok":true}`), nil
}
func (answerOnceFull) Output(string, string) {}

// TestCallSlotFreeBeforeAnswer: a runner that starts a call each time one
// returns, keeping the limit in flight, is never told it has too many in flight.
// The slot must be free before the runner can read the answer.
func TestCallSlotFreeBeforeAnswer(t *testing.T) {
	g := newCallGate(context.Background(), false)
	g.rate = newBucket(1e9, 1e9) // this test is about the in-flight bound only
	full := make(chan struct{})
	r := &relayRunner{g: g, host: answerOnceFull{full}, left: 200, done: make(chan struct{})}
	for range MaxConcurrentCalls {
		r.start()
	}
	close(full)
	<-r.done
	g.stop()
	if len(r.refused) > 0 {
		t.Fatalf("%d of %d calls refused, first: %s", len(r.refused), r.total(), r.refused[0])
	}
	if g.inFlight != 0 || g.bytes != 0 {
		t.Fatalf("after every answer the gate holds %d calls of %d bytes", g.inFlight, g.bytes)
	}
}
