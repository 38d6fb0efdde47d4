package frontend_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/discovery"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/state"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

var (
	setup   = testutil.ProcessStack
	mustRun = testutil.MustRunCode
)

func TestFigures(t *testing.T) {
	if testing.Short() {
		t.Skip("figures")
	}
	servers := []discovery.Server{testutil.TestServerDef(t, "ts", nil)}
	if dir := npmDir(t); dir != "" {
		servers = append(servers, discovery.Server{Name: "everything", Type: "stdio", Command: "node",
			Args: []string{dir + "/node_modules/@modelcontextprotocol/server-everything/dist/index.js", "stdio"}})
	}
	s := setup(t, "", frontend.Config{}, servers...)
	ctx := context.Background()
	feTools, err := s.C.ListTools(ctx, mcp.ListToolsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	feBytes := jsonLen(t, feTools)
	sum := 0
	var parts []string
	for _, srv := range servers {
		ts, err := s.Pool.Tools(ctx, srv.Name)
		if err != nil {
			t.Fatal(err)
		}
		n := jsonLen(t, mcp.ListToolsResult{Tools: ts})
		sum += n
		parts = append(parts, fmt.Sprintf("%s %d tools %d B", srv.Name, len(ts), n))
	}
	t.Logf("FIGURE tools/list: front-end %d B (1 tool) vs proxied servers %d B (%s)", feBytes, sum, strings.Join(parts, "; "))

	out := mustRun(t, s.C, `import time, statistics
await mcp_ts.echo(text="warm")
ts = []
for _ in range(300):
    t0 = time.perf_counter()
    await mcp_ts.echo(text="x")
    ts.append((time.perf_counter() - t0) * 1000)
ts.sort()
print("p50 %.3f ms p90 %.3f ms p99 %.3f ms" % (ts[150], ts[270], ts[297]))`, "ts")
	t.Logf("FIGURE proxied call round trip from sandbox code (process runtime, 300 calls): %s", out)
}

func jsonLen(t *testing.T, v any) int {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return len(b)
}

// TestProgressNotifications checks queued, started and output-line progress
// notifications reach a client that sent a progress token.
func TestProgressNotifications(t *testing.T) {
	t.Parallel()
	s := setup(t, "", frontend.Config{})
	var mu sync.Mutex
	var msgs []string
	s.C.OnNotification(func(n mcp.JSONRPCNotification) {
		if n.Method == "notifications/progress" {
			mu.Lock()
			msgs = append(msgs, fmt.Sprint(n.Params.AdditionalFields["message"]))
			mu.Unlock()
		}
	})
	req := mcp.CallToolRequest{}
	req.Params.Name = mcpserver.ToolName
	req.Params.Arguments = map[string]any{"code": "import sys, time\nprint('line one')\nprint('oops', file=sys.stderr)\ntime.sleep(0.5)\nprint('line two')\ntime.sleep(0.3)"}
	req.Params.Meta = &mcp.Meta{ProgressToken: "p1"}
	res, err := s.C.CallTool(context.Background(), req)
	if err != nil || res.IsError {
		t.Fatalf("call: %v %v", err, testutil.Text(res))
	}
	mu.Lock()
	got := strings.Join(msgs, "|")
	mu.Unlock()
	for _, want := range []string{"queued", "started on w1", "stdout: line one", "stderr: oops", "stdout: line two"} {
		if !strings.Contains(got, want) {
			t.Errorf("progress lacks %q: %s", want, got)
		}
	}
}

// TestClientCancelCancelsJob cancels a running call the two ways clients do:
// over stdio with notifications/cancelled, over streamable HTTP by closing the
// request; either way the job ends cancelled.
func TestClientCancelCancelsJob(t *testing.T) {
	t.Parallel()
	s := setup(t, "", frontend.Config{})
	stdio := stdioClient(t, s.FE)
	for name, c := range map[string]*client.Client{"stdio": stdio, "http": s.C} {
		t.Run(name, func(t *testing.T) {
			started := make(chan struct{})
			var once sync.Once
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			c.OnNotification(func(n mcp.JSONRPCNotification) {
				if m := fmt.Sprint(n.Params.AdditionalFields["message"]); strings.HasPrefix(m, "started") {
					once.Do(func() { close(started) })
					cancel()
				}
			})
			qc, err := queue.NewClient(testutil.Connect(t, s.B, "check-"+name), jobs.Subjects{})
			if err != nil {
				t.Fatal(err)
			}
			code := "import time\nprint('tick " + name + "', flush=True)\ntime.sleep(60)"
			req := mcp.CallToolRequest{}
			req.Params.Name = mcpserver.ToolName
			req.Params.Arguments = map[string]any{"code": code}
			req.Params.Meta = &mcp.Meta{ProgressToken: name}
			if _, err = c.CallTool(ctx, req); err == nil {
				t.Fatal("call returned a result after cancellation")
			}
			select {
			case <-started:
			default:
				t.Fatalf("the call ended before its job started: %v", err)
			}
			// The job's sandbox sleeps for a minute: the front-end lets go of
			// the job, records it cancelled, and the worker stops it (and acks
			// its delivery) well before.
			deadline := time.Now().Add(30 * time.Second)
			for {
				rec := jobWithCode(t, s.B, code)
				if s.FE.Running() == 0 && rec != nil && rec.Status == jobs.StatusCancelled && unacked(t, qc) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("30s after the client cancelled: %d jobs running on the front-end, %d deliveries unacked, record %+v",
						s.FE.Running(), unacked(t, qc), rec)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// jobWithCode returns the record of the job of code in b's state, or nil.
func jobWithCode(t *testing.T, b *broker.Broker, code string) *jobs.Record {
	t.Helper()
	recs, _, err := b.Store().List(state.JobFilter{Limit: state.MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Job.Code == code {
			return r
		}
	}
	return nil
}

// unacked returns the default pool's job deliveries not yet acknowledged: jobs
// a worker is running.
func unacked(t *testing.T, c *queue.Client) int {
	t.Helper()
	cons, err := c.JetStream().Consumer(context.Background(), jobs.Subjects{}.JobsStream(), jobs.Subjects{}.Consumer(jobs.DefaultPool))
	if err != nil {
		t.Fatal(err)
	}
	return cons.CachedInfo().NumAckPending
}
