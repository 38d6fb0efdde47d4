package e2e

import (
	"strings"
	"testing"

	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/mcpclients"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman/podmantest"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// TestProxiedCallsFromPodman calls a real stdio MCP server from code running in
// real Podman sandboxes (no network inside: the calls cross the runner socket,
// the worker, NATS and the front-end), with docs, errors, a large result and
// memory, and measures the round trip of one proxied call.
func TestProxiedCallsFromPodman(t *testing.T) {
	b := testutil.Broker(t, "", queue.DefaultConfig())
	rt := podmantest.New(t, podman.Config{Config: containerpool.Config{Pool: 1}})
	testutil.Worker(t, b, rt, worker.DefaultConfig("e2e-worker"))
	pool := testutil.Pool(t, mcpclients.Config{}, testutil.TestServerDef(t, "ts", nil), testutil.TestServerDef(t, "other", nil))
	fe := testutil.FrontendWith(t, b, frontend.Config{ID: "e2e-fe", Tools: pool})
	c := testutil.MCPClientWith(t, fe, mcpserver.Options{Servers: pool.Names, Definitions: pool.Servers}, mcpserver.HTTPOptions{})

	code := `import asyncio, os, socket
print(os.getuid(), [n for _, n in socket.if_nameindex()])
print(await mcp_ts.echo(text="from podman"))
print((await call_tool("ts", "add", {"a": 1, "b": 2}))["sum"])
from mcp.servers.ts import big
print(len(await big(bytes=100_000)))
print(search_tool_docs("find files by pattern")[0]["tool"])
try:
    await mcp_ts.fail(message="nope")
except MCPError as e:
    print("MCPError", e)
try:
    await call_tool("other", "echo", {"text": "x"})
except MCPError as e:
    print("refused" if "not given" in str(e) else e)
print(sorted(await asyncio.gather(*[mcp_ts.echo(text="v%d" % i) for i in range(30)]))[:2])
save_memory("podman", {"ok": True})
print(load_memory("podman"))`
	res := testutil.CallRunPython(t, c, map[string]any{"code": code, "servers": []string{"ts"}})
	want := "65534 ['lo']\nfrom podman\n3\n100000\nsearch-files\nMCPError nope\nrefused\n['v0', 'v1']\n{'ok': True}"
	if got := testutil.Text(res); res.IsError || got != want {
		t.Fatalf("isError=%v\ngot:\n%s\nwant:\n%s", res.IsError, got, want)
	}

	res = testutil.CallRunPython(t, c, map[string]any{"servers": []string{"ts"}, "code": `import time
await mcp_ts.echo(text="warm")
ts = []
for _ in range(200):
    t0 = time.perf_counter()
    await mcp_ts.echo(text="x")
    ts.append((time.perf_counter() - t0) * 1000)
ts.sort()
print("p50 %.3f ms p90 %.3f ms p99 %.3f ms" % (ts[100], ts[180], ts[198]))`})
	if res.IsError || !strings.HasPrefix(testutil.Text(res), "p50") {
		t.Fatalf("timing run: %s", testutil.Text(res))
	}
	t.Logf("FIGURE proxied call round trip from sandbox code (Podman, 200 calls): %s", testutil.Text(res))
}
