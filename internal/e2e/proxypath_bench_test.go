package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcpexec/mcpexec/internal/discovery"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/sandboxtest"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// pathCalls is how many calls one job of BenchmarkProxyPath makes.
const pathCalls = 200

// callingRuntime runs no code: each job makes pathCalls call_tool calls of
// server "ts" through its host, one after the other, each after a pause of
// as many microseconds as the job's code says (0: back to back), and prints
// each one's time in microseconds. A benchmark's stand-in for the sandbox,
// never a test's.
type callingRuntime struct{}

func (callingRuntime) Run(ctx context.Context, job sandbox.Job, host sandbox.Host) (sandbox.Result, error) {
	params := json.RawMessage(`{"server":"ts","tool":"echo","arguments":{"text":"x"},"raw":true}`)
	pause, err := strconv.Atoi(job.Code)
	if err != nil {
		return sandbox.Result{Status: sandbox.StatusError, ExitCode: 1, Error: "the code is the pause in microseconds"}, nil
	}
	var out strings.Builder
	for range pathCalls {
		time.Sleep(time.Duration(pause) * time.Microsecond)
		start := time.Now()
		if _, err := host.Call(ctx, proxy.MethodCallTool, params); err != nil {
			return sandbox.Result{Status: sandbox.StatusError, ExitCode: 1, Error: err.Error()}, nil
		}
		fmt.Fprintf(&out, "%d ", time.Since(start).Microseconds())
	}
	return sandbox.Result{Status: sandbox.StatusSuccess, Stdout: out.String()}, nil
}

func (callingRuntime) Close() error { return nil }

// instantTools is an MCP client pool of one server, "ts", whose tools
// answer at once, without a server process.
type instantTools struct{}

func (instantTools) Servers() []discovery.Server { return []discovery.Server{{Name: "ts"}} }

func (instantTools) Tools(context.Context, string) ([]mcp.Tool, error) {
	return []mcp.Tool{mcp.NewTool("echo")}, nil
}

func (instantTools) CallTool(context.Context, string, string, map[string]any) (*mcp.CallToolResult, error) {
	return mcp.NewToolResultText("x"), nil
}

// BenchmarkProxyPath is mcpexec's own share of a proxied call, with neither
// a sandbox nor an MCP server in it: a worker's host (package worker) →
// NATS → the front-end's proxy responder (capability, the job's record, the
// namespace's rules, the audit) → a tool source that answers at once, and
// back. Each op is two run_python jobs whose runtime makes pathCalls calls
// through its host, timed around host.Call: back to back, then each after
// a pause of 0.5 ms (about the rest of a proxied call, so that the threads
// on the way fall asleep between calls, as they do for a sandbox's calls);
// it reports both's p50 and p90 in microseconds, for each of fleetShapes.
// What the sandbox adds is BenchmarkContainerRuntime/Call's; the server's
// own time is BenchmarkProxiedEcho's. Nothing here waits on another
// process, so it moves less with the machine's load than those.
//
//	go test -tags "$TAGS" -run '^$' -bench ProxyPath -benchtime 20x ./internal/e2e
func BenchmarkProxyPath(b *testing.B) {
	for _, sh := range fleetShapes {
		b.Run(sh.name, func(b *testing.B) { proxyPath(b, sh) })
	}
}

// timedRun runs code with run_python through c, with server "ts", and
// returns the times, in microseconds, it printed (sandboxtest.Micros).
func timedRun(b *testing.B, c *client.Client, code string) samples {
	b.Helper()
	res := testutil.CallRunPython(b, c, map[string]any{"code": code, "servers": []string{"ts"}})
	if res.IsError {
		b.Fatalf("run_python: %q", testutil.Text(res))
	}
	ds, err := sandboxtest.Micros(testutil.Text(res))
	if err != nil {
		b.Fatal(err)
	}
	return ds
}

func proxyPath(b *testing.B, sh fleetShape) {
	bk := testutil.Broker(b, "", queue.DefaultConfig())
	sh.worker(b, bk, callingRuntime{}, worker.DefaultConfig("bench-worker"))
	fe := sh.frontend(b, bk, frontend.Config{ID: "bench-fe", Tools: instantTools{}})
	c := testutil.MCPClientWith(b, fe, mcpserver.Options{Servers: func() []string { return []string{"ts"} }}, mcpserver.HTTPOptions{})
	var hot, paused samples
	for b.Loop() {
		for _, m := range []struct {
			pause string
			into  *samples
		}{{"0", &hot}, {"500", &paused}} {
			*m.into = append(*m.into, timedRun(b, c, m.pause)...)
		}
	}
	if len(hot) == 0 || len(paused) == 0 {
		b.Fatal("no call was timed")
	}
	b.ReportMetric(float64(hot.pct(50).Microseconds()), "call-p50-us")
	b.ReportMetric(float64(hot.pct(90).Microseconds()), "call-p90-us")
	b.ReportMetric(float64(paused.pct(50).Microseconds()), "paused-call-p50-us")
	b.ReportMetric(float64(paused.pct(90).Microseconds()), "paused-call-p90-us")
}
