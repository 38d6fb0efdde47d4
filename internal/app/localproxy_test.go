package app_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/internal/app"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/mcpclients"
	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/process"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// TestEmbeddedProxyCallsStayInProcess: in the embedded default the
// worker's proxy calls (a proxied server's tool, memory) are answered by
// the front-end's responder in process: a spy on the broker subscribed to
// every proxy subject sees none of them, though it sees a call sent over
// NATS (the control), and the job gets its answers.
func TestEmbeddedProxyCallsStayInProcess(t *testing.T) {
	pool := testutil.Pool(t, mcpclients.Config{}, testutil.TestServerDef(t, "ts", nil))
	wcfg := worker.DefaultConfig("local-proxy-worker")
	wcfg.Logger = testutil.Logger(t)
	stack, err := app.StartFrontend(context.Background(), app.FrontendConfig{
		DataDir:  t.TempDir(),
		Frontend: frontend.Config{ID: "local-proxy-fe", Limits: jobs.DefaultLimits(), Tools: pool, Logger: testutil.Logger(t)},
		Worker:   wcfg,
		NewRuntime: func(context.Context) (sandbox.Runtime, error) {
			return process.New()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stack.Close)
	spy, err := stack.Broker.Connect("spy")
	if err != nil {
		t.Fatal(err)
	}
	defer spy.Close()
	subjects := wcfg.Queue.Subjects
	var seen atomic.Int64
	sub, err := spy.Subscribe(strings.TrimSuffix(subjects.ProxyAny(), ".any")+".>", func(*nats.Msg) { seen.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}

	rec, err := stack.Frontend.Run(context.Background(), &jobs.Job{Servers: []string{"ts"}, Code: `save_memory("k", 1)
print(await mcp_ts.echo(text="in process"), load_memory("k"))`}, nil)
	if err != nil || rec.Status != jobs.StatusSuccess || rec.Result == nil || rec.Result.Stdout != "in process 1\n" {
		t.Fatalf("run: %v %+v", err, rec)
	}
	if n := seen.Load(); n != 0 {
		t.Fatalf("the spy saw %d proxy requests of the embedded worker", n)
	}

	// The control: a call over NATS is seen (and answered: a refusal, as it
	// names no running job).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := proxy.Call(ctx, spy, subjects.ProxyAny(), proxy.Request{Job: "none", Method: proxy.MethodMemoryGet, Params: json.RawMessage(`{"key":"k"}`)}); err == nil {
		t.Fatal("a call for no job was answered")
	}
	for deadline := time.Now().Add(5 * time.Second); seen.Load() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the spy saw no request sent over NATS: it proves nothing")
		}
	}
}
