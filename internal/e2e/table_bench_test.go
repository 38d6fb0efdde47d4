package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/mcpclients"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman/podmantest"
	"github.com/mcpexec/mcpexec/internal/sandbox/sandboxtest"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// The benchmarks of this file print, in one `make bench`, the table of the
// warm-call issue (docs/design.md, "Performance: the warm-call table"): warm
// calls of both languages next to `podman run --rm`, a proxied call's
// overhead, and calls per second of concurrent clients. They report figures
// and assert only that every call answered.

// fleetShapes are the two shapes of a fleet on one machine that the table's
// latency benchmarks measure each: "embedded", the front-end and the worker
// on in-process connections to the broker, their barriers going to the
// broker's own (as `frontend --data`, make run, connects them); and "tcp",
// each a NATS client over loopback TCP, as separate processes are.
var fleetShapes = []fleetShape{
	{"embedded", "the embedded default (make run): front-end and worker on in-process connections", testutil.ConnectInProcess, true},
	{"tcp", "front-end and worker as separate processes: NATS over TCP", testutil.Connect, false},
}

type fleetShape struct {
	name, what string
	connect    func(testing.TB, *broker.Broker, string) *nats.Conn
	// local: barriers go to the broker's own Barrier, and the worker's
	// proxy calls to the front-end's responder, in process (as app wires
	// the embedded default).
	local bool
}

// localProxies holds the proxy.Local of each embedded fleet, by its broker:
// its worker and its front-end start apart.
var localProxies sync.Map // *broker.Broker → *proxy.Local

func localProxy(bk *broker.Broker) *proxy.Local {
	l, _ := localProxies.LoadOrStore(bk, &proxy.Local{})
	return l.(*proxy.Local)
}

// worker starts a worker of cfg on bk, connected as sh says.
func (sh fleetShape) worker(b testing.TB, bk *broker.Broker, rt sandbox.Runtime, cfg worker.Config) *worker.Worker {
	if sh.local {
		cfg.LocalBarrier, cfg.LocalProxy = bk.Barrier(), localProxy(bk)
		b.Cleanup(func() { localProxies.Delete(bk) })
	}
	return testutil.WorkerOn(b, sh.connect(b, bk, "worker-bench"), rt, cfg)
}

// frontend starts a front-end of cfg on bk, connected as sh says.
func (sh fleetShape) frontend(b testing.TB, bk *broker.Broker, cfg frontend.Config) *frontend.Frontend {
	if sh.local {
		cfg.LocalBarrier, cfg.LocalProxy = bk.Barrier(), localProxy(bk)
	}
	return testutil.FrontendOnWith(b, sh.connect(b, bk, "frontend-bench"), cfg)
}

// BenchmarkWarmCalls is the table's latency rows, in one run through one fleet
// of each shape (MCP over streamable HTTP → front-end → JetStream → one worker
// with the default configuration → Podman), each call printing 1: run_python
// back to back (n calls: b.Loop's iterations), run_javascript back to back
// (n), run_javascript alternating with run_python (n each), each language
// spaced one second apart (min(n, 20) each: a p90 of ten would be their
// second slowest), and one `podman run --rm` per call (min(n, 10)). b.Loop
// runs each shape's function once, so its fleet starts once and its table,
// written to standard output (b.Log's output of a benchmark is cut at 10
// lines), is printed once.
//
//	go test -tags "$TAGS" -run '^$' -bench WarmCalls -benchtime 50x ./internal/e2e
func BenchmarkWarmCalls(b *testing.B) {
	for _, sh := range fleetShapes {
		b.Run(sh.name, func(b *testing.B) { warmCalls(b, sh) })
	}
}

func warmCalls(b *testing.B, sh fleetShape) {
	bk := testutil.Broker(b, "", queue.DefaultConfig())
	rt := podmantest.New(b, workerDefaults(worker.DefaultConfig("").Slots))
	if !slices.Contains(sandbox.Languages(rt), sandbox.JavaScript) {
		b.Fatalf("the sandbox image runs %v: rebuild it with Node.js (sudo deploy/sandbox/build.sh --force)", sandbox.Languages(rt))
	}
	sh.worker(b, bk, rt, worker.DefaultConfig("bench-worker"))
	fe := sh.frontend(b, bk, frontend.Config{ID: "bench-fe"})
	c := testutil.MCPClientWith(b, fe, mcpserver.Options{Languages: jobs.Languages}, mcpserver.HTTPOptions{})
	py := func() time.Duration { return timedCall(b, c, mcpserver.ToolName, "print(1)") }
	js := func() time.Duration { return timedCall(b, c, mcpserver.JSToolName, "console.log(1)") }
	for range 3 {
		py()
		js()
	}
	// Warm calls: the pool has refilled what the warm-up took (a container
	// start imports the data stack, about a second of CPU).
	sandboxtest.WaitWarm(b, rt, worker.DefaultConfig("").Slots)
	var pyB2B, jsB2B, jsAlt, pyAlt, pySpaced, jsSpaced, baseline samples
	busy0, _, cpuOK := cpuTimes()
	for b.Loop() {
		pyB2B = append(pyB2B, py())
	}
	busy1, _, _ := cpuTimes()
	n := len(pyB2B)
	for range n {
		jsB2B = append(jsB2B, js())
	}
	for range n {
		jsAlt = append(jsAlt, js())
		pyAlt = append(pyAlt, py())
	}
	spaced := min(n, 20)
	for range spaced {
		time.Sleep(time.Second)
		pySpaced = append(pySpaced, py())
	}
	for range spaced {
		time.Sleep(time.Second)
		jsSpaced = append(jsSpaced, js())
	}
	for range min(n, 10) {
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
	fmt.Fprintf(&tbl, "\nBenchmarkWarmCalls: one worker, default configuration, real Podman; Go MCP client over streamable HTTP; %s\n\n| case | calls | p50 ms | p90 ms | goal (ms) |\n| --- | --- | --- | --- | --- |\n", sh.what)
	for _, r := range rows {
		b.ReportMetric(ms(r.s.pct(50)), r.name+"-p50-ms")
		b.ReportMetric(ms(r.s.pct(90)), r.name+"-p90-ms")
		fmt.Fprintf(&tbl, "| %s | %d | %.2f | %.2f | %s |\n", r.what, len(r.s), ms(r.s.pct(50)), ms(r.s.pct(90)), r.goal)
	}
	if cpuOK {
		// The machine's CPU time (every process: client, fleet, Podman,
		// sandboxes) per call; jiffies are 10 ms (USER_HZ 100).
		perCall := float64(busy1-busy0) * 10 / float64(len(pyB2B))
		b.ReportMetric(perCall, "python-b2b-cpu-ms/call")
		fmt.Fprintf(&tbl, "| CPU time of the machine per `print(1)` back to back (all processes) | | %.1f | | |\n", perCall)
	}
	ratio := float64(baseline.pct(50)) / float64(pyB2B.pct(50))
	b.ReportMetric(ratio, "python-b2b-speedup-p50-x")
	fmt.Fprintf(&tbl, "| ratio of `podman run` to `print(1)` back to back, p50 | | %.1f× | | ≥ 30× |\n", ratio)
	fmt.Print(tbl.String())
	b.Logf("python b2b p50 %.2f ms, javascript b2b p90 %.2f ms, alternating p90 %.2f ms; podman run p50 %.1f ms (table above)",
		ms(pyB2B.pct(50)), ms(jsB2B.pct(90)), ms(jsAlt.pct(90)), ms(baseline.pct(50)))
}

// workerDefaults is the Podman runtime a worker starts with its default
// flags, for pool warm containers: among them --preload, the data stack.
func workerDefaults(pool int) podman.Config {
	return podman.Config{Config: containerpool.Config{Pool: pool, Preload: sandbox.DefaultPreload}}
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
// included. The overhead is the difference of the two p50s. Those direct
// calls come back to back, so the server's process never sleeps between
// them, where a proxied call finds it asleep since its last answer; so each
// op then makes as many direct calls again, each after a pause as long as
// the rest of a proxied call (the p50s' difference so far), and the table
// gives the overhead against both. It runs for each of fleetShapes. b.Loop
// runs each shape's function once; each table goes to standard output.
//
//	go test -tags "$TAGS" -run '^$' -bench ProxiedEcho -benchtime 50x ./internal/e2e
func BenchmarkProxiedEcho(b *testing.B) {
	for _, sh := range fleetShapes {
		b.Run(sh.name, func(b *testing.B) { proxiedEcho(b, sh) })
	}
}

func proxiedEcho(b *testing.B, sh fleetShape) {
	bk := testutil.Broker(b, "", queue.DefaultConfig())
	rt := podmantest.New(b, workerDefaults(worker.DefaultConfig("").Slots))
	sh.worker(b, bk, rt, worker.DefaultConfig("bench-worker"))
	pool := testutil.Pool(b, mcpclients.Config{}, testutil.TestServerDef(b, "ts", nil))
	fe := sh.frontend(b, bk, frontend.Config{ID: "bench-fe", Tools: pool})
	c := testutil.MCPClientWith(b, fe, mcpserver.Options{Servers: pool.Names, Definitions: pool.Servers}, mcpserver.HTTPOptions{})
	code := sandboxtest.EchoTimingCode(echoCalls)
	ctx := context.Background()
	var sandboxed, direct, spaced samples
	callDirect := func() time.Duration {
		start := time.Now()
		r, err := pool.CallTool(ctx, "ts", "echo", map[string]any{"text": "x"})
		el := time.Since(start)
		if err != nil || r.IsError || testutil.Text(r) != "x" {
			b.Fatalf("direct echo: %v %+v", err, r)
		}
		return el
	}
	for b.Loop() {
		sandboxed = append(sandboxed, timedRun(b, c, code)...)
		for range echoCalls {
			direct = append(direct, callDirect())
		}
		pause := max(sandboxed.pct(50)-direct.pct(50), 0)
		for range echoCalls {
			time.Sleep(pause)
			spaced = append(spaced, callDirect())
		}
	}
	over := sandboxed.pct(50) - direct.pct(50)
	overSpaced := sandboxed.pct(50) - spaced.pct(50)
	b.ReportMetric(ms(sandboxed.pct(50)), "sandbox-echo-p50-ms")
	b.ReportMetric(ms(sandboxed.pct(90)), "sandbox-echo-p90-ms")
	b.ReportMetric(ms(direct.pct(50)), "server-echo-p50-ms")
	b.ReportMetric(ms(spaced.pct(50)), "server-spaced-p50-ms")
	b.ReportMetric(ms(over), "overhead-p50-ms")
	b.ReportMetric(ms(overSpaced), "overhead-spaced-p50-ms")
	fmt.Printf("\nBenchmarkProxiedEcho: one worker, real Podman, the repo's stdio test server; %s\n\n| proxied `echo` | calls | p50 ms | p90 ms |\n| --- | --- | --- | --- |\n"+
		"| from sandbox code (Podman → runner → worker → NATS → front-end → server) | %d | %.3f | %.3f |\n"+
		"| the server's own time, back to back (front-end's MCP client → stdio server) | %d | %.3f | %.3f |\n"+
		"| the server's own time, each call after a pause as long as the rest of a proxied call | %d | %.3f | %.3f |\n"+
		"| mcpexec's overhead against the server back to back (p50 difference; goal ≤ 0.5) | | %.3f | |\n"+
		"| mcpexec's overhead against the server paused as proxied calls find it (goal ≤ 0.5) | | %.3f | |\n",
		sh.what, len(sandboxed), ms(sandboxed.pct(50)), ms(sandboxed.pct(90)), len(direct), ms(direct.pct(50)), ms(direct.pct(90)),
		len(spaced), ms(spaced.pct(50)), ms(spaced.pct(90)), ms(over), ms(overSpaced))
	b.Logf("proxied echo p50 %.3f ms from the sandbox, %.3f ms the server's own back to back (%.3f paused): overhead %.3f ms (%.3f) (table above)",
		ms(sandboxed.pct(50)), ms(direct.pct(50)), ms(spaced.pct(50)), ms(over), ms(overSpaced))
}

// cpuTimes reads the machine's CPU time from /proc/stat: busy and total
// jiffies over all CPUs. ok is false where there is no /proc/stat.
func cpuTimes() (busy, total uint64, ok bool) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, false
	}
	// user nice system idle iowait irq softirq steal (guest is within user).
	for i, s := range f[1:9] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		total += v
		if i != 3 && i != 4 {
			busy += v
		}
	}
	return busy, total, true
}

// concurrencyClients are the client counts of BenchmarkConcurrency's columns.
var concurrencyClients = []int{1, 4, 8, 16}

// cell is one measurement of BenchmarkConcurrency.
type cell struct {
	calls  int
	perSec float64
	cpu    float64 // busy % of all CPUs; -1 unknown
	p50    time.Duration
}

// BenchmarkConcurrency is the table's concurrency matrix: 1, 4, 8 and 16 MCP
// clients (each its own streamable HTTP session) calling run_python
// `print(1)` back to back at once, all of one namespace or each of a
// namespace of its own (up to 16), first on one worker with 4 slots (the
// default configuration), then with a second such worker added. Each cell
// runs b.N × 60 ms (3 s at -benchtime 50x), after warmUpCalls unmeasured
// calls of each client (warmUp), from a full warm pool, and reports
// calls per second and the machine's CPU busy % over the cell (/proc/stat,
// all processes: the fleet, Podman and the containers, and whatever else
// runs). The table goes to standard output; Go runs a benchmark with b.N = 1
// first (60 ms cells), so the run's table is the second, headed with its b.N.
//
//	go test -tags "$TAGS" -run '^$' -bench Concurrency -benchtime 50x ./internal/e2e
func BenchmarkConcurrency(b *testing.B) {
	bk := testutil.Broker(b, "", queue.DefaultConfig())
	fe := testutil.Frontend(b, bk, "bench-fe")
	slots := worker.DefaultConfig("").Slots
	var rts []*podman.Runtime
	addWorker := func() {
		rt := podmantest.New(b, workerDefaults(slots))
		testutil.Worker(b, bk, rt, worker.DefaultConfig(fmt.Sprintf("bench-worker-%d", len(rts))))
		rts = append(rts, rt)
	}
	waitWarm := func() {
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) && slices.ContainsFunc(rts, func(rt *podman.Runtime) bool { return rt.Warm() < slots }) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	maxClients := slices.Max(concurrencyClients)
	modes := []struct {
		name, key string // key names the mode in metrics
		clients   []*client.Client
	}{{name: "1 namespace", key: "one-ns"}, {name: "a namespace each", key: "ns-each"}}
	for i := range maxClients {
		for m, ns := range []string{"bench", fmt.Sprintf("bench-%02d", i)} {
			opts := mcpserver.Options{Namespace: func(context.Context) string { return ns }}
			modes[m].clients = append(modes[m].clients, testutil.MCPClientWith(b, fe, opts, mcpserver.HTTPOptions{}))
		}
	}
	cellTime := time.Duration(b.N) * 60 * time.Millisecond

	var tbl strings.Builder
	fmt.Fprintf(&tbl, "\nBenchmarkConcurrency (b.N = %d): calls/s (CPU busy %% of %d CPUs; p50 ms of a call), each cell %v of back-to-back `print(1)` after %d unmeasured calls of each client\n",
		b.N, runtime.NumCPU(), cellTime, warmUpCalls)
	b.ResetTimer()
	for w := 1; w <= 2; w++ {
		addWorker()
		fmt.Fprintf(&tbl, "\n| %s × %d slots | %s |\n| --- |%s\n", plural(w, "worker"), slots,
			strings.Join(mapSlice(concurrencyClients, func(n int) string { return plural(n, "client") }), " | "),
			strings.Repeat(" --- |", len(concurrencyClients)))
		for _, m := range modes {
			fmt.Fprintf(&tbl, "| %s |", m.name)
			for _, n := range concurrencyClients {
				b.StopTimer()
				warmUp(b, m.clients[:n])
				waitWarm()
				b.StartTimer()
				r := runCell(b, m.clients[:n], cellTime)
				b.ReportMetric(r.perSec, fmt.Sprintf("w%d-%s-c%d-calls/s", w, m.key, n))
				cpu := "n/a"
				if r.cpu >= 0 {
					cpu = fmt.Sprintf("%.0f%%", r.cpu)
					b.ReportMetric(r.cpu, fmt.Sprintf("w%d-%s-c%d-cpu-%%", w, m.key, n))
				}
				fmt.Fprintf(&tbl, " %.1f (%s; %.1f) |", r.perSec, cpu, ms(r.p50))
			}
			tbl.WriteString("\n")
		}
	}
	b.StopTimer()
	if b.N == 1 && !oneRun() {
		b.Logf("%d cells of %v: the framework's first run, whose table is not printed", 2*len(modes)*len(concurrencyClients), cellTime)
		return
	}
	fmt.Println(tbl.String())
	b.Logf("%d cells of %v (table above)", 2*len(modes)*len(concurrencyClients), cellTime)
}

// runCell has every client of cs call run_python `print(1)` back to back for
// d, and measures the calls per second and the machine's CPU use. Every call
// must answer 1.
func runCell(b *testing.B, cs []*client.Client, d time.Duration) cell {
	b.Helper()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		lat      samples
		failures atomic.Int64
		firstErr atomic.Value
	)
	busy0, total0, cpuOK := cpuTimes()
	start := time.Now()
	deadline := start.Add(d)
	for _, c := range cs {
		wg.Go(func() {
			var mine samples
			for time.Now().Before(deadline) {
				el, err := callPrint(c)
				if err != nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, err)
					return
				}
				mine = append(mine, el)
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	el := time.Since(start)
	busy1, total1, cpuOK1 := cpuTimes()
	if n := failures.Load(); n > 0 {
		b.Fatalf("%d clients: %d calls failed, the first: %v", len(cs), n, firstErr.Load())
	}
	r := cell{calls: len(lat), perSec: float64(len(lat)) / el.Seconds(), cpu: -1, p50: lat.pct(50)}
	if cpuOK && cpuOK1 && total1 > total0 {
		r.cpu = 100 * float64(busy1-busy0) / float64(total1-total0)
	}
	return r
}

// callPrint calls run_python `print(1)` on c and returns how long it took;
// an answer other than 1 is an error.
func callPrint(c *client.Client) (time.Duration, error) {
	req := mcp.CallToolRequest{}
	req.Params.Name = mcpserver.ToolName
	req.Params.Arguments = map[string]any{"code": "print(1)"}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	t0 := time.Now()
	res, err := c.CallTool(ctx, req)
	el := time.Since(t0)
	if err == nil && (res.IsError || testutil.Text(res) != "1") {
		err = fmt.Errorf("run_python: %q", testutil.Text(res))
	}
	return el, err
}

// warmUpCalls is how many unmeasured calls each client of a cell makes
// first (warmUp).
const warmUpCalls = 8

// warmUp has each client of cs call `print(1)` warmUpCalls times, all at
// once. A namespace's first calls take warm containers, which the pool
// then starts again (~0.3 s of CPU each): a cell measures the state after.
func warmUp(b *testing.B, cs []*client.Client) {
	b.Helper()
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Go(func() {
			for range warmUpCalls {
				if _, err := callPrint(c); err != nil {
					b.Errorf("warm-up call: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// mapSlice returns f of each element of s.
func mapSlice[T, U any](s []T, f func(T) U) []U {
	out := make([]U, 0, len(s))
	for _, v := range s {
		out = append(out, f(v))
	}
	return out
}

// plural is n and noun, with an s unless n is 1.
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// oneRun says whether -test.benchtime asks for one iteration (1x): b.N = 1
// is then the run, not the framework's first try before it.
func oneRun() bool {
	f := flag.Lookup("test.benchtime")
	return f != nil && f.Value.String() == "1x"
}
