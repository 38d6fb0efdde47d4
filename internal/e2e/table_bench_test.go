package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"

	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/mcpclients"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman/podmantest"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// The benchmarks of this file print, in one `make bench`, the table of the
// warm-call issue (docs/design.md, "Performance: the warm-call table"): warm
// calls of both languages next to `podman run --rm` and a proxied call's
// overhead. They report figures
// and assert only that every call answered.

// BenchmarkWarmCalls is the table's latency rows, in one run through one fleet
// (MCP over streamable HTTP → front-end → JetStream → one worker with the
// default configuration → Podman), each call printing 1: run_python back to
// back (b.N calls), run_javascript back to back (b.N), run_javascript
// alternating with run_python (b.N each), each language spaced one second
// apart (min(b.N, 10) each), and one `podman run --rm` per call (min(b.N, 10)).
//
//	go test -tags "$TAGS" -run '^$' -bench WarmCalls -benchtime 50x ./internal/e2e
func BenchmarkWarmCalls(b *testing.B) {
	bk := testutil.Broker(b, "", queue.DefaultConfig())
	rt := podmantest.New(b, podman.Config{Config: containerpool.Config{Pool: worker.DefaultConfig("").Slots}})
	if !slices.Contains(sandbox.Languages(rt), sandbox.JavaScript) {
		b.Fatalf("the sandbox image runs %v: rebuild it with Node.js (sudo deploy/sandbox/build.sh --force)", sandbox.Languages(rt))
	}
	testutil.Worker(b, bk, rt, worker.DefaultConfig("bench-worker"))
	fe := testutil.Frontend(b, bk, "bench-fe")
	c := testutil.MCPClientWith(b, fe, mcpserver.Options{Languages: jobs.Languages}, mcpserver.HTTPOptions{})
	py := func() time.Duration { return timedCall(b, c, mcpserver.ToolName, "print(1)") }
	js := func() time.Duration { return timedCall(b, c, mcpserver.JSToolName, "console.log(1)") }
	for range 3 {
		py()
		js()
	}
	var pyB2B, jsB2B, jsAlt, pyAlt, pySpaced, jsSpaced, baseline samples
	b.ResetTimer()
	for range b.N {
		pyB2B = append(pyB2B, py())
	}
	b.StopTimer()
	for range b.N {
		jsB2B = append(jsB2B, js())
	}
	for range b.N {
		jsAlt = append(jsAlt, js())
		pyAlt = append(pyAlt, py())
	}
	spaced := min(b.N, 10)
	for range spaced {
		time.Sleep(time.Second)
		pySpaced = append(pySpaced, py())
	}
	for range spaced {
		time.Sleep(time.Second)
		jsSpaced = append(jsSpaced, js())
	}
	for range spaced {
		baseline = append(baseline, podmanRunOnce(b, benchImage()))
	}
	rows := []struct {
		name, what, goal string
		s                samples
	}{
		{"python-b2b", "`print(1)` back to back", "p50 ≤ 5, p90 ≤ 8", pyB2B},
		{"python-spaced", "`print(1)` spaced 1 s", "p50 ≤ 5, p90 ≤ 8", pySpaced},
		{"javascript-b2b", "`console.log(1)` back to back", "p90 ≤ 40", jsB2B},
		{"javascript-spaced", "`console.log(1)` spaced 1 s", "p90 ≤ 40", jsSpaced},
		{"javascript-alternating", "`console.log(1)` alternating with `print(1)`", "p90 ≤ 40", jsAlt},
		{"python-alternating", "`print(1)` alternating with `console.log(1)`", "", pyAlt},
		{"podman-run", "`podman run --rm` per call (python3 -c)", "", baseline},
	}
	var tbl strings.Builder
	tbl.WriteString("\n| case | calls | p50 ms | p90 ms | goal (ms) |\n| --- | --- | --- | --- | --- |\n")
	for _, r := range rows {
		b.ReportMetric(ms(r.s.pct(50)), r.name+"-p50-ms")
		b.ReportMetric(ms(r.s.pct(90)), r.name+"-p90-ms")
		fmt.Fprintf(&tbl, "| %s | %d | %.2f | %.2f | %s |\n", r.what, len(r.s), ms(r.s.pct(50)), ms(r.s.pct(90)), r.goal)
	}
	ratio := float64(baseline.pct(50)) / float64(pyB2B.pct(50))
	b.ReportMetric(ratio, "python-b2b-speedup-p50-x")
	fmt.Fprintf(&tbl, "| ratio of `podman run` to `print(1)` back to back, p50 | | %.1f× | | ≥ 30× |", ratio)
	b.Log(tbl.String())
}

// timedCall calls tool with code, which must print 1, and returns how long
// the call took.
func timedCall(b *testing.B, c *client.Client, tool, code string) time.Duration {
	b.Helper()
	start := time.Now()
	res := testutil.CallTool(b, c, tool, map[string]any{"code": code})
	el := time.Since(start)
	if res.IsError || testutil.Text(res) != "1" {
		b.Fatalf("%s: %q", tool, testutil.Text(res))
	}
	return el
}

// benchImage is the sandbox image the benchmarks' `podman run --rm` runs.
func benchImage() string {
	if image := os.Getenv("MCPEXEC_IMAGE"); image != "" {
		return image
	}
	return podman.DefaultImage
}

// echoCalls is how many proxied calls one job of BenchmarkProxiedEcho makes.
const echoCalls = 50

// BenchmarkProxiedEcho is the table's proxied-call row: what mcpexec adds to a
// tool call from sandbox code to a proxied stdio MCP server (the repo's test
// server's echo) and back. Each op is one run_python job on real Podman that
// times echoCalls sequential `await mcp_ts.echo(text="x")` in the sandbox
// (time.perf_counter around each call), followed by as many calls of the same
// tool from the front-end's own MCP client of the server (mcpclients.Pool, the
// hop every proxied call ends with): that is the server's own time, stdio
// included. The overhead is the difference of the two p50s.
//
//	go test -tags "$TAGS" -run '^$' -bench ProxiedEcho -benchtime 50x ./internal/e2e
func BenchmarkProxiedEcho(b *testing.B) {
	bk := testutil.Broker(b, "", queue.DefaultConfig())
	rt := podmantest.New(b, podman.Config{Config: containerpool.Config{Pool: worker.DefaultConfig("").Slots}})
	testutil.Worker(b, bk, rt, worker.DefaultConfig("bench-worker"))
	pool := testutil.Pool(b, mcpclients.Config{}, testutil.TestServerDef(b, "ts", nil))
	fe := testutil.FrontendWith(b, bk, frontend.Config{ID: "bench-fe", Tools: pool})
	c := testutil.MCPClientWith(b, fe, mcpserver.Options{Servers: pool.Names, Definitions: pool.Servers}, mcpserver.HTTPOptions{})
	code := fmt.Sprintf(`import time
await mcp_ts.echo(text="warm")
ts = []
for _ in range(%d):
    t0 = time.perf_counter()
    await mcp_ts.echo(text="x")
    ts.append(int((time.perf_counter() - t0) * 1e6))
print(" ".join(map(str, ts)))`, echoCalls)
	ctx := context.Background()
	var sandboxed, direct samples
	b.ResetTimer()
	for range b.N {
		res := testutil.CallRunPython(b, c, map[string]any{"code": code, "servers": []string{"ts"}})
		if res.IsError {
			b.Fatalf("run_python: %q", testutil.Text(res))
		}
		for f := range strings.FieldsSeq(testutil.Text(res)) {
			us, err := strconv.Atoi(f)
			if err != nil {
				b.Fatalf("run_python printed %q: %v", testutil.Text(res), err)
			}
			sandboxed = append(sandboxed, time.Duration(us)*time.Microsecond)
		}
		for range echoCalls {
			start := time.Now()
			r, err := pool.CallTool(ctx, "ts", "echo", map[string]any{"text": "x"})
			el := time.Since(start)
			if err != nil || r.IsError || testutil.Text(r) != "x" {
				b.Fatalf("direct echo: %v %+v", err, r)
			}
			direct = append(direct, el)
		}
	}
	b.StopTimer()
	over := sandboxed.pct(50) - direct.pct(50)
	b.ReportMetric(ms(sandboxed.pct(50)), "sandbox-echo-p50-ms")
	b.ReportMetric(ms(sandboxed.pct(90)), "sandbox-echo-p90-ms")
	b.ReportMetric(ms(direct.pct(50)), "server-echo-p50-ms")
	b.ReportMetric(ms(over), "overhead-p50-ms")
	b.Logf("\n| proxied `echo` | calls | p50 ms | p90 ms |\n| --- | --- | --- | --- |\n"+
		"| from sandbox code (Podman → runner → worker → NATS → front-end → server) | %d | %.3f | %.3f |\n"+
		"| the server's own time (front-end's MCP client → stdio server) | %d | %.3f | %.3f |\n"+
		"| mcpexec's overhead (p50 difference; goal ≤ 0.5) | | %.3f | |",
		len(sandboxed), ms(sandboxed.pct(50)), ms(sandboxed.pct(90)), len(direct), ms(direct.pct(50)), ms(direct.pct(90)), ms(over))
}
