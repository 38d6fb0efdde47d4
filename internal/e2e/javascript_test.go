package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"

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

// TestJavaScriptThroughTheFleet: run_javascript, offered beside run_python,
// calls a real stdio MCP server from a Podman sandbox, shares memory with
// Python both ways, and keeps a session's globals across two calls.
func TestJavaScriptThroughTheFleet(t *testing.T) {
	b := testutil.Broker(t, "", queue.DefaultConfig())
	rt := podmantest.New(t, podman.Config{Config: containerpool.Config{Pool: 1}})
	if !slices.Contains(sandbox.Languages(rt), sandbox.JavaScript) {
		t.Fatalf("the sandbox image runs %v: rebuild it with Node.js (sudo deploy/sandbox/build.sh --force)", sandbox.Languages(rt))
	}
	testutil.Worker(t, b, rt, worker.DefaultConfig("js-worker"))
	pool := testutil.Pool(t, mcpclients.Config{}, testutil.TestServerDef(t, "ts", nil))
	fe := testutil.FrontendWith(t, b, frontend.Config{ID: "js-fe", Tools: pool})
	c := testutil.MCPClientWith(t, fe, mcpserver.Options{Servers: pool.Names, Definitions: pool.Servers, Languages: jobs.Languages}, mcpserver.HTTPOptions{})

	if names := testutil.ToolNames(t, c); !slices.Equal(names, []string{"run_javascript", "run_python"}) {
		t.Fatalf("tools %v, want run_python and run_javascript", names)
	}

	code := `console.log(process.getuid(), Object.keys(require("os").networkInterfaces()).join(","))
console.log(await mcp_ts.echo({text: "from node"}))
console.log((await callTool("ts", "add", {a: 1, b: 2})).sum)
try {
  await mcp_ts.fail({message: "nope"})
} catch (e) {
  console.log(e instanceof MCPError ? "MCPError" : "other", e.message)
}
const docs = await searchToolDocs("find files by pattern")
console.log(docs[0].tool)
const all = await Promise.all([...Array(30).keys()].map((i) => mcp_ts.echo({text: "v" + i})))
console.log(all.length, all[29])
await saveMemory("from-js", {n: 1, lang: "javascript"})
console.log(JSON.stringify(await loadMemory("from-py", "none yet")))`
	res := testutil.CallTool(t, c, mcpserver.JSToolName, map[string]any{"code": code, "servers": []string{"ts"}})
	want := "65534 lo\nfrom node\n3\nMCPError nope\nsearch-files\n30 v29\n\"none yet\""
	if got := testutil.Text(res); res.IsError || got != want {
		t.Fatalf("isError=%v\ngot:\n%s\nwant:\n%s", res.IsError, got, want)
	}

	// Memory is one per namespace, whatever the language.
	res = testutil.CallRunPython(t, c, map[string]any{"code": `print(load_memory("from-js"))
save_memory("from-py", [1, 2])
save_memory("counter", 40)`})
	if got := testutil.Text(res); res.IsError || got != "{'n': 1, 'lang': 'javascript'}" {
		t.Fatalf("python read of javascript's memory: %q", got)
	}
	res = testutil.CallTool(t, c, mcpserver.JSToolName, map[string]any{"code": `console.log(JSON.stringify(await loadMemory("from-py")))
console.log(await updateMemory("counter", async (n) => n + 2))`})
	if got := testutil.Text(res); res.IsError || got != "[1,2]\n42" {
		t.Fatalf("javascript read of python's memory: %q", got)
	}

	// A session keeps its globals across calls.
	res = testutil.CallTool(t, c, mcpserver.JSToolName, map[string]any{"session": "js-s", "code": "var seen = ['first']\nfunction add(x) { seen.push(x); return seen.length }"})
	if res.IsError {
		t.Fatalf("first session call: %s", testutil.Text(res))
	}
	res = testutil.CallTool(t, c, mcpserver.JSToolName, map[string]any{"session": "js-s", "code": "console.log(add('second'), seen.join(' '))"})
	if got := testutil.Text(res); res.IsError || got != "2 first second" {
		t.Fatalf("second session call: %q", got)
	}

	// Errors come back as the code's errors.
	res = testutil.CallTool(t, c, mcpserver.JSToolName, map[string]any{"code": "JSON.parse('{')"})
	if !res.IsError || !strings.Contains(testutil.Text(res), "SyntaxError") {
		t.Fatalf("an uncaught error: isError=%v %q", res.IsError, testutil.Text(res))
	}

	// The manual documents both languages.
	rr, err := c.ReadResource(context.Background(), mcp.ReadResourceRequest{Params: mcp.ReadResourceParams{URI: mcpserver.CapabilitiesURI}})
	if err != nil {
		t.Fatal(err)
	}
	manual := rr.Contents[0].(mcp.TextResourceContents).Text
	for _, want := range []string{"run_python", "run_javascript", "saveMemory", "save_memory"} {
		if !strings.Contains(manual, want) {
			t.Fatalf("the capabilities manual lacks %q", want)
		}
	}
}
