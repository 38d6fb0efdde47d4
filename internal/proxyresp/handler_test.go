package proxyresp_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client/transport"

	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/mcpclients"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

var (
	setup   = testutil.ProcessStack
	run     = testutil.RunCode
	mustRun = testutil.MustRunCode
)

// TestSandboxAPI exercises every way sandbox code reaches a proxied server.
func TestSandboxAPI(t *testing.T) {
	t.Parallel()
	s := setup(t, "", frontend.Config{}, testutil.TestServerDef(t, "ts", nil), testutil.TestServerDef(t, "other-server", nil))
	code := `import asyncio
print(await mcp_ts.echo(text="a"))
print((await call_tool("ts", "add", {"a": 2, "b": 3}))["sum"])
print(await mcp_servers["ts"].echo(text="b"))
print(await mcp_ts["search-files"](pattern="*.txt"))
print(await mcp_ts.search_files(pattern="*"))
from mcp.servers.ts import echo as e2
print(await e2(text="c"))
from mcp.servers.ts import *
print(await big(bytes=3))
import runtime
from mcp import runtime as rt2
print(runtime is rt2, runtime.list_servers(), await list_servers())
print(discovered_servers(), [(s["name"], s["available"]) for s in await discovered_servers(detailed=True)])
raw = await call_tool("ts", "echo", {"text": "r"}, raw=True)
print(raw["content"][0]["text"], raw.get("isError", False))
try:
    await mcp_ts.fail(message="disk on fire")
except MCPError as e:
    print("MCPError:", e)
try:  # the bridge's way: the call fails with a RuntimeError (MCPError)
    await mcp_ts.no_such_tool(x=1)
except RuntimeError as e:
    print(type(e).__name__ + ":", str(e)[:40])
tools = await mcp_ts.list_tools()
print(sorted(t["alias"] for t in tools)[:3])
docs = query_tool_docs("ts")
print(len(docs) >= 8, set(docs[0]) >= {"tool", "summary", "signature"}, "input_schema" in docs[0])
d = await query_tool_docs("ts", "echo", detail="full")
print(d["signature"], "input_schema" in d)
print(search_tool_docs("find files matching a pattern", limit=2)[0]["tool"])
print("mcp_ts" in capability_summary(), "other-server" in capability_summary())
r = await asyncio.gather(*[mcp_ts.echo(text=str(i)) for i in range(20)])
print(r == list(range(20)))  # "7" is JSON: it comes back as 7
print(await mcp_ts.echo(text='{"json": [1, 2]}'))
`
	want := `a
5
b
['a.txt', 'b.txt']
['a.txt', 'b.txt']
c
xxx
True ['ts'] ['ts']
['other-server', 'ts'] [('other-server', False), ('ts', True)]
r False
MCPError: disk on fire
MCPError: MCP server 'ts' has no tool 'no_such_too
['add', 'add_tool', 'big']
True True False
echo(text: str) True
search-files
True True
True
{'json': [1, 2]}`
	if got := mustRun(t, s.C, code, "ts"); got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
}

// TestLargeResults sends results far above the seed's 64 KiB frame limit.
func TestLargeResults(t *testing.T) {
	t.Parallel()
	s := setup(t, "", frontend.Config{}, testutil.TestServerDef(t, "ts", nil))
	// The longest time limit: some 8 MiB cross the proxy, which under the race
	// detector on a loaded host can take longer than the default 30 s.
	res := testutil.CallRunPython(t, s.C, map[string]any{"code": `for n in (65537, 200_000, 4 << 20):
    r = await mcp_ts.big(bytes=n)
    print(len(r), r == "x" * n)`, "servers": []string{"ts"}, "timeout": jobs.DefaultLimits().MaxTimeout})
	if got, st := testutil.Text(res), testutil.Structured(t, res); st.Status != "success" || got != "65537 True\n200000 True\n4194304 True" {
		t.Fatalf("status %s, got %q", st.Status, got)
	}
}

func TestRefusedServers(t *testing.T) {
	t.Parallel()
	s := setup(t, "", frontend.Config{}, testutil.TestServerDef(t, "ts", nil), testutil.TestServerDef(t, "locked", nil))
	got := mustRun(t, s.C, `for f in (lambda: call_tool("locked", "echo", {"text": "x"}), lambda: mcp_servers["locked"]):
    try:
        r = f()
        if hasattr(r, "__await__"):
            await r
        print("no error")
    except (MCPError, KeyError) as e:
        print(type(e).__name__, str(e)[:60])
try:
    from mcp.servers.locked import *
except ImportError as e:
    print("ImportError", str(e)[:30])`, "ts")
	want := "MCPError server \"locked\" was not given to this run (it may use \"ts\"):\n" +
		"KeyError \"MCP server 'locked' was not given to this run; it may use: \n" +
		"ImportError no MCP server 'locked' in this"
	if got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
	res := testutil.CallRunPython(t, s.C, map[string]any{"code": "print(1)", "servers": []string{"nope"}})
	if !res.IsError || !strings.Contains(testutil.Text(res), `"nope" is not a proxied MCP server; known servers: locked, ts`) {
		t.Fatalf("unknown server accepted: %q", testutil.Text(res))
	}
	// Anyone on NATS calling for a job without its capability.
	nc := testutil.Connect(t, s.B, "intruder")
	_, err := proxy.Call(context.Background(), nc, jobs.Subjects{}.ProxyServer("ts"), proxy.Request{Job: jobs.NewID(), Method: "call_tool",
		Capability: "forged", Params: json.RawMessage(`{"server":"ts","tool":"echo","arguments":{"text":"x"}}`)})
	if err == nil || !strings.Contains(err.Error(), "does not carry its job's capability") {
		t.Fatalf("call without the job's capability: %v", err)
	}
}

func TestCrashingServer(t *testing.T) {
	t.Parallel()
	s := setup(t, "", frontend.Config{}, testutil.TestServerDef(t, "ts", nil))
	got := mustRun(t, s.C, `pid = await mcp_ts.pid()
try:
    await mcp_ts.crash()
except MCPError as e:
    print("MCPError:", str(e)[:60])
print(await mcp_ts.pid() != pid)`, "ts")
	if got != "MCPError: MCP server \"ts\" exited during the call to crash (it is resta\nTrue" {
		t.Fatalf("got %q", got)
	}
}

func TestSlowServerHitsPerCallTimeout(t *testing.T) {
	t.Parallel()
	s := setup(t, "", frontend.Config{CallTimeout: 500 * time.Millisecond}, testutil.TestServerDef(t, "ts", nil))
	got := mustRun(t, s.C, `import time
t0 = time.monotonic()
try:
    await mcp_ts.slow(seconds=10)
except MCPError as e:
    print("MCPError:", e)
print(round(time.monotonic() - t0) < 3)
print(await call_tool("ts", "slow", {"seconds": 1}, timeout=5))`, "ts")
	if got != "MCPError: ts.slow did not answer within 500ms (the per-call timeout): pass timeout=SECONDS to call_tool for slow tools\nTrue\ndone" {
		t.Fatalf("got %q", got)
	}
	// The job's deadline bounds a call that asks for more: the call ends with
	// the job, whichever of the two is noticed first, and well before the 30 s
	// the tool would take (the bound leaves room for a loaded host).
	start := time.Now()
	res := testutil.CallRunPython(t, s.C, map[string]any{"code": `await call_tool("ts", "slow", {"seconds": 30}, timeout=60)`,
		"servers": []string{"ts"}, "timeout": 2})
	st := testutil.Structured(t, res)
	if !(st.Status == "timeout" || strings.Contains(testutil.Text(res), "did not answer before the job's time limit")) || time.Since(start) > 25*time.Second {
		t.Fatalf("status %s after %s: %s", st.Status, time.Since(start), testutil.Text(res))
	}
}

func TestConcurrentCallsPerJobAreCapped(t *testing.T) {
	t.Parallel()
	s := setup(t, "", frontend.Config{MaxCallsPerJob: 2}, testutil.TestServerDef(t, "ts", nil))
	got := mustRun(t, s.C, `import asyncio, time
t0 = time.monotonic()
r = await asyncio.gather(*[mcp_ts.slow(seconds=0.3) for _ in range(6)])
print(r.count("done"), time.monotonic() - t0 >= 0.85)`, "ts")
	if got != "6 True" {
		t.Fatalf("got %q", got)
	}
}

// TestMemory keeps memory across runs, updates it atomically from concurrent
// runs, keeps namespaces apart, and survives a broker restart.
func TestMemory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := setup(t, dir, frontend.Config{}, testutil.TestServerDef(t, "ts", nil))
	got := mustRun(t, s.C, `print(save_memory("notes/a b", {"x": [1, 2]}, metadata={"tag": "t"})["version"])
print(memory_exists("notes/a b"), memory_exists("notes/a_b"))
save_memory("notes/a_b", "different key, same after sanitising")`)
	if got != "1\nTrue False" {
		t.Fatalf("got %q", got)
	}
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mustRun(t, s.C, `for _ in range(5):
    update_memory("counter", lambda v: v + 1, default=0)`)
		}()
	}
	wg.Wait()
	got = mustRun(t, s.C, `print(load_memory("notes/a b"), load_memory("notes/a_b"), load_memory("counter"), load_memory("missing", "dflt"))
info = get_memory_info("notes/a b")
print(info["metadata"], info["version"], "value" in info)
print([m["key"] for m in list_memories("notes/")])
print(delete_memory("notes/a_b"), delete_memory("notes/a_b"))`)
	want := "{'x': [1, 2]} different key, same after sanitising 15 dflt\n{'tag': 't'} 1 False\n['notes/a b', 'notes/a_b']\nTrue False"
	if got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}

	// Another caller (another token) sees its own namespace.
	tokens := map[string]string{"token-alice-123": "alice", "token-bob-4567": "bob"}
	alice := testutil.MCPClientWith(t, s.FE, mcpserver.Options{Namespace: httpauth.Namespace}, mcpserver.HTTPOptions{Auth: httpauth.New(httpauth.Config{Tokens: tokens})},
		transportHeader("Bearer token-alice-123"))
	if got := mustRun(t, alice, `print(load_memory("counter")); save_memory("mine", 1)`); got != "None" {
		t.Fatalf("alice sees the default namespace: %q", got)
	}

	// The broker restarts on the same data: memory is still there.
	if err := s.B.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := setup(t, dir, frontend.Config{ID: "fe2"}, testutil.TestServerDef(t, "ts", nil))
	if got := mustRun(t, s2.C, `print(load_memory("counter"), load_memory("mine"))`); got != "15 None" {
		t.Fatalf("after broker restart: %q", got)
	}
}

// slowStartRuntime stands for a sandbox that takes delay to come up (a loaded
// host) before its code, whose own time limit starts then, makes one call.
type slowStartRuntime struct{ delay time.Duration }

func (r slowStartRuntime) Run(ctx context.Context, job sandbox.Job, host sandbox.Host) (sandbox.Result, error) {
	select {
	case <-time.After(r.delay):
	case <-ctx.Done():
		return sandbox.Result{}, ctx.Err()
	}
	out, err := host.Call(ctx, "call_tool", json.RawMessage(`{"server":"ts","tool":"echo","arguments":{"text":"late"}}`))
	if err != nil {
		return sandbox.Result{Status: sandbox.StatusError, ExitCode: 1, Stderr: err.Error()}, nil
	}
	return sandbox.Result{Status: sandbox.StatusSuccess, Stdout: string(out)}, nil
}

func (slowStartRuntime) Close() error { return nil }

// TestSlowSandboxStartKeepsItsTimeLimit: the worker announces a job before its
// sandbox is up; the front-end must not count the sandbox's start against the
// time limit of the code's calls.
func TestSlowSandboxStartKeepsItsTimeLimit(t *testing.T) {
	t.Parallel()
	b := testutil.Broker(t, "", queue.DefaultConfig())
	testutil.Worker(t, b, slowStartRuntime{delay: 1500 * time.Millisecond}, worker.DefaultConfig("w1"))
	pool := testutil.Pool(t, mcpclients.Config{}, testutil.TestServerDef(t, "ts", nil))
	fe := testutil.FrontendWith(t, b, frontend.Config{ID: "fe1", Tools: pool})
	c := testutil.MCPClientWith(t, fe, mcpserver.Options{Servers: pool.Names, Definitions: pool.Servers}, mcpserver.HTTPOptions{})
	res := testutil.CallRunPython(t, c, map[string]any{"code": "unused", "servers": []string{"ts"}, "timeout": 1})
	if st := testutil.Structured(t, res); st.Status != "success" || !strings.Contains(testutil.Text(res), "late") {
		t.Fatalf("status %s: %s", st.Status, testutil.Text(res))
	}
}

// TestBridgeShapes checks the host's answers carry the keys the Python bridge
// (mcp-server-code-execution-mode) answers beside mcpexec's: docs with
// serverAlias, toolAlias, description (in summary too) and inputSchema (full),
// tools found by the bridge's alias and regardless of case, a bad detail read as
// the summary, list_tools with inputSchema, detailed servers with a description.
func TestBridgeShapes(t *testing.T) {
	t.Parallel()
	s := setup(t, "", frontend.Config{}, testutil.TestServerDef(t, "GitHub", nil), testutil.TestServerDef(t, "ts", nil))
	got := mustRun(t, s.C, `d = query_tool_docs("GitHub", "getuser")
print(sorted(d))
print(d["server"], d["serverAlias"], d["tool"], d["toolAlias"], d["alias"], d["description"])
f = query_tool_docs("GitHub", "GETUSER", detail="FULL")
print(f["inputSchema"] == f["input_schema"], f["inputSchema"]["required"])
for bad in ("bogus", None, 3):
    print("inputSchema" in query_tool_docs("GitHub", "echo", detail=bad), end=" ")
print()
docs = query_tool_docs("GitHub")
print(all(x["description"] for x in docs), {x["serverAlias"] for x in docs})
hit = search_tool_docs("github user profile", limit=1, detail="full")[0]
print(hit["server"], hit["tool"], hit["toolAlias"], hit["serverAlias"], "inputSchema" in hit)
print([t["inputSchema"] == t["input_schema"] for t in list_tools("ts")][:2])
print([(s["name"], s["description"]) for s in discovered_servers(detailed=True)])`, "GitHub", "ts")
	want := `['alias', 'description', 'server', 'serverAlias', 'signature', 'summary', 'tool', 'toolAlias']
GitHub github getUser getuser getUser Get a user's profile by login. Answers JSON.
True ['login']
False False False 
True {'github'}
GitHub getUser getuser github True
[True, True]
[('GitHub', 'test server GitHub'), ('ts', 'test server ts')]`
	if got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
}

func transportHeader(auth string) transport.StreamableHTTPCOption {
	return transport.WithHTTPHeaders(map[string]string{"Authorization": auth})
}
