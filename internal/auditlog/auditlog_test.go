package auditlog_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/mcpexec/mcpexec/internal/audit"
	"github.com/mcpexec/mcpexec/internal/auditlog"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func call(tool string) auditlog.Call {
	return auditlog.Call{Entry: audit.Entry{JobID: "j", Namespace: "ns", Server: "ts", Tool: tool, At: time.Now()}, Args: map[string]any{"a": 1}}
}

// TestFullQueueIsCounted: a call whose entry finds the queue full waits
// for room, then its entry is dropped and counted, never lost silently;
// so are the entries a writer stopped before it started still held.
func TestFullQueueIsCounted(t *testing.T) {
	t.Parallel()
	b := testutil.Broker(t, "", queue.DefaultConfig())
	w, err := auditlog.New(testutil.Connect(t, b, "fe"), auditlog.Config{Queue: 1, Block: time.Millisecond, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	w.Record(call("first"))  // queued
	w.Record(call("second")) // the queue is full and nothing drains it
	if got := w.Dropped(); got != 1 {
		t.Fatalf("dropped %d, want the second", got)
	}
	w.Stop()
	if got := w.Dropped(); got != 2 {
		t.Fatalf("dropped %d after a stop before start, want both", got)
	}
	w.Record(call("third")) // after Stop: counted, never blocks
	if got := w.Dropped(); got != 3 {
		t.Fatalf("dropped %d after stop", got)
	}
}

// TestUnwritableEntriesAreCounted: entries the audit stream does not take
// (here it is gone) are retried, then dropped and counted.
func TestUnwritableEntriesAreCounted(t *testing.T) {
	t.Parallel()
	b := testutil.Broker(t, "", queue.DefaultConfig())
	nc := testutil.Connect(t, b, "fe")
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := js.DeleteStream(ctx, jobs.Subjects{}.AuditStream()); err != nil {
		t.Fatal(err)
	}
	w, err := auditlog.New(nc, auditlog.Config{Attempts: 2, Linger: time.Millisecond, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	w.Start([]byte("key"))
	w.Record(call("a"))
	w.Record(call("b"))
	w.Stop() // waits for the attempts
	if w.Dropped() != 2 || w.Written() != 0 {
		t.Fatalf("dropped %d, written %d", w.Dropped(), w.Written())
	}
}
