package proxyresp_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/mcpclients"
	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// TestProxyCallsAreCheckedAgainstTheRecord: what a worker (or anyone on NATS)
// may not do with proxy calls.
func TestProxyCallsAreCheckedAgainstTheRecord(t *testing.T) {
	t.Parallel()
	b := processFleet(t)
	fe := tsFrontend(t, b, "fe1")
	nc := testutil.Connect(t, b, "intruder")
	ctx := context.Background()
	key, err := queue.ProxyKey(ctx, mustJS(t, nc), jobs.Subjects{})
	if err != nil {
		t.Fatal(err)
	}
	call := func(id string, attempt int, method, params string) error {
		subject := jobs.Subjects{}.ProxyAny()
		if proxy.ServerMethod(method) {
			subject = jobs.Subjects{}.ProxyServer("ts")
		}
		_, err := proxy.Call(ctx, nc, subject, proxy.Request{Job: id, Attempt: attempt, Capability: jobs.Capability(key, id),
			Method: method, Params: json.RawMessage(params)})
		return err
	}
	// A job that has finished: its capability no longer opens anything.
	out := fe.SubmitMany(ctx, []*jobs.Job{{ID: "done", Code: "print(1)", Servers: []string{"ts"}}}, "a")
	if out[0].Err != nil {
		t.Fatal(out[0].Err)
	}
	if rec, err := fe.Wait(ctx, "a", "done"); err != nil || rec.Status != jobs.StatusSuccess {
		t.Fatalf("job: %+v %v", rec, err)
	}
	if err := call(jobs.ScopedID("a", "done"), 1, "memory_get", `{"key":"k"}`); err == nil || !strings.Contains(err.Error(), "has ended") {
		t.Fatalf("memory call of a finished job: %v", err)
	}
	// A running job: a stale attempt, and a server it was not given.
	out = fe.SubmitMany(ctx, []*jobs.Job{{ID: "live", Code: "import time\ntime.sleep(30)", Timeout: 60, Servers: []string{"ts"}}}, "a")
	if out[0].Err != nil {
		t.Fatal(out[0].Err)
	}
	t.Cleanup(func() { _ = fe.Cancel(context.Background(), "a", "live", "test over") })
	deadline := time.Now().Add(20 * time.Second)
	for {
		rec, err := fe.Get(ctx, "a", "live")
		if err == nil && rec.Status == jobs.StatusRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job did not start: %+v %v", rec, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := call(jobs.ScopedID("a", "live"), 2, "memory_get", `{"key":"k"}`); err == nil || !strings.Contains(err.Error(), "not the one running") {
		t.Fatalf("call of another attempt: %v", err)
	}
	if err := call(jobs.ScopedID("a", "live"), 1, "memory_get", `{"key":"k"}`); err != nil {
		t.Fatalf("the running attempt's call: %v", err)
	}
	if err := call(jobs.ScopedID("a", "live"), 1, "call_tool", `{"server":"other","tool":"echo"}`); err == nil {
		t.Fatal("call for a server the job was not given was answered")
	}
	// A worker's word on where the attempt's start is in the events stream
	// shapes one read only: a sequence far past the stream's end gets an
	// error (the replicas never reach it), not a call held open, and the
	// next call with no word is answered as before.
	time.Sleep(1100 * time.Millisecond) // the front-end's view of the job is older than its 1 s: it reads the record again
	_, err = proxy.Call(ctx, nc, jobs.Subjects{}.ProxyAny(), proxy.Request{Job: jobs.ScopedID("a", "live"), Attempt: 1,
		Capability: jobs.Capability(key, jobs.ScopedID("a", "live")), Method: "memory_get", Params: json.RawMessage(`{"key":"k"}`), StartedSeq: 1 << 62})
	if err == nil || !strings.Contains(err.Error(), "look up job") {
		t.Fatalf("a call claiming a start past the events stream's end: %v", err)
	}
	if err := call(jobs.ScopedID("a", "live"), 1, "memory_get", `{"key":"k"}`); err != nil {
		t.Fatalf("the running attempt's call after the hostile one: %v", err)
	}
	// A forged capability (another job's) is refused.
	_, err = proxy.Call(ctx, nc, jobs.Subjects{}.ProxyAny(), proxy.Request{Job: jobs.ScopedID("a", "live"), Attempt: 1, Capability: jobs.Capability(key, jobs.ScopedID("a", "done")),
		Method: "memory_get", Params: json.RawMessage(`{"key":"k"}`)})
	if err == nil || !strings.Contains(err.Error(), "capability") {
		t.Fatalf("another job's capability: %v", err)
	}
	// Unknown methods never reach a handler.
	_, err = proxy.Call(ctx, nc, jobs.Subjects{}.ProxyAny(), proxy.Request{Job: jobs.ScopedID("a", "live"), Attempt: 1, Capability: jobs.Capability(key, jobs.ScopedID("a", "live")),
		Method: strings.Repeat("x", 5000)})
	if err == nil || !strings.Contains(err.Error(), "unknown proxy method") {
		t.Fatalf("unknown method: %v", err)
	}
}

func mustJS(t *testing.T, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// processFleet starts a broker and a worker with the process runtime.
func processFleet(t *testing.T) *broker.Broker {
	t.Helper()
	b := testutil.Broker(t, "", queue.DefaultConfig())
	testutil.Worker(t, b, testutil.ProcessRuntime(t), worker.DefaultConfig("w1"))
	return b
}

// tsFrontend starts front-end id, proxying the MCP test server as "ts".
func tsFrontend(t *testing.T, b *broker.Broker, id string) *frontend.Frontend {
	t.Helper()
	pool := testutil.Pool(t, mcpclients.Config{}, testutil.TestServerDef(t, "ts", nil))
	return testutil.FrontendWith(t, b, frontend.Config{ID: id, Tools: pool})
}
