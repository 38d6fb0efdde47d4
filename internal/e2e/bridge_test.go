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

// bridgePrograms are the examples of the Python bridge's documentation
// (mcp-server-code-execution-mode: README.md, GUIDE.md, and the programs its
// tests run in the sandbox), one per example, changed only to call the test
// server's tools (echo, add, getUser, search-files, big, fail; listed in name
// order) instead of those of the servers they name, with the servers named "GitHub",
// "filesystem" and "demo-server" (test servers all three), and with the import
// of asyncio that two of them lack (the bridge has no asyncio among the globals
// either). Each line of want matches a line of
// the output: exactly, or as a prefix when it ends with "*".
var bridgePrograms = []struct {
	name    string
	servers []string
	code    string
	want    []string
}{
	{"README/fuzzy search", []string{"GitHub"}, `from mcp import runtime

matches = await runtime.search_tool_docs("user profile", limit=5)
for hit in matches:
    print(hit["server"], hit["tool"], hit.get("description", ""))`,
		[]string{"GitHub getUser Get a user's profile by login. Answers JSON."}},

	{"README/access patterns", []string{"GitHub"}, `print(await mcp_servers["GitHub"].echo(text="dynamic"))   # Dynamic lookup
print(await mcp_github.echo(text="attribute"))                 # Attribute access
from mcp.servers.github import *                               # Module import
print(await echo(text="module"), await getuser(login="m"))`,
		[]string{"dynamic", "attribute", "module {'login': 'm', 'name': 'User m'}"}},

	{"README/execute code", []string{"GitHub", "filesystem"}, `# Use MCP tools in sandboxed code
result = await mcp_filesystem.echo(text='/tmp/test.txt')

# Complex workflows
data = await mcp_filesystem.search_files(pattern="TODO")
print(await mcp_github.echo(text=data[0]), result)`,
		[]string{"a.txt /tmp/test.txt"}},

	{"README/load servers explicitly", []string{"GitHub", "filesystem"}, `print(await mcp_github.getuser(login='latest AI papers'))`,
		[]string{"{'login': 'latest AI papers', 'name': 'User latest AI papers'}"}},

	{"README/file processing", []string{"filesystem"}, `# List and filter files
files = await mcp_filesystem.search_files(pattern='*')

for file in files:
    content = await mcp_filesystem.echo(text='TODO: fix' if file == 'a.txt' else 'clean')
    if 'TODO' in content:
        print(f"TODO in {file}")`,
		[]string{"TODO in a.txt"}},

	{"README/data pipeline", []string{"GitHub", "filesystem"}, `# Extract data
transcript = await mcp_filesystem.big(bytes=600)

# Process
summary = transcript[:500] + "..."

# Store
stored = await mcp_github.echo(
    text=summary
)
print(len(stored))`,
		[]string{"503"}},

	{"README/multi-system workflow", []string{"GitHub", "filesystem"}, `# Jira → GitHub migration
issues = await mcp_filesystem.search_files(pattern='*.txt')

for issue in issues:
    details = await mcp_filesystem.getUser(login=issue)

    if 'a.txt' in details['name'].lower():
        print(await mcp_github.echo(
            text=f"Bug: {issue}",
        ))`,
		[]string{"Bug: a.txt"}},

	{"README/inspect available servers", []string{"GitHub"}, `from mcp import runtime

print("Discovered:", runtime.discovered_servers())
print("Cached servers:", runtime.list_servers_sync())
print("Loaded metadata:", runtime.list_loaded_server_metadata())
print("Selectable via RPC:", await runtime.list_servers())

# Peek at tool docs for a server that's already loaded in this run
loaded = runtime.list_loaded_server_metadata()
if loaded:
  first = runtime.describe_server(loaded[0]["name"])
  for tool in first["tools"]:
    print(tool["alias"], "→", tool.get("description", ""))

# Ask for summaries or full schemas only when needed
if loaded:
  summaries = await runtime.query_tool_docs(loaded[0]["name"])
  detailed = await runtime.query_tool_docs(
    loaded[0]["name"],
    tool=summaries[0]["toolAlias"],
    detail="full",
  )
  print("Summaries:", summaries)
  print("Cached tools:", runtime.list_tools_sync(loaded[0]["name"]))
  print("Detailed doc:", detailed)

# Fuzzy search across loaded servers without rehydrating every schema
results = await runtime.search_tool_docs("echo message", limit=3)
for result in results:
  print(result["server"], result["tool"], result.get("description", ""))

# Synchronous helpers for quick answers without extra awaits
print("Capability summary:", runtime.capability_summary())
print("Docs from cache:", runtime.query_tool_docs_sync(loaded[0]["name"]) if loaded else [])
print("Search from cache:", runtime.search_tool_docs_sync("echo"))`,
		[]string{
			"Discovered: ['GitHub', 'demo-server', 'filesystem']",
			"Cached servers: ('GitHub',)",
			"Loaded metadata: ({'name': 'GitHub', 'alias': 'github', 'tools': [{'name': 'add', 'alias': 'add', 'description': 'Add two numbers and return their sum as JSON.', 'input_schema': {*",
			"Selectable via RPC: ['GitHub']",
			"add → Add two numbers and return their sum as JSON.",
			"add_tool → *", "big → *", "crash → *",
			"echo → Echo the provided message back unchanged.",
			"fail → *", "getuser → Get a user's profile by login. Answers JSON.", "pid → *",
			"search_files → Find files on disk whose names match a pattern, recursively.", "slow → *",
			"Summaries: [{'server': 'GitHub', 'tool': 'add', 'alias': 'add', 'summary': *",
			"Cached tools: ({'name': 'add', 'alias': 'add', *",
			"Detailed doc: {'server': 'GitHub', 'tool': 'add', 'alias': 'add', 'summary': 'Add two numbers and return their sum as JSON.', 'signature': 'add(a: float, b: float)', 'description': 'Add two numbers and return their sum as JSON.', 'input_schema': {*",
			"GitHub echo Echo the provided message back unchanged.",
			"GitHub fail Always fail with the given message (a tool error).",
			"Capability summary: MCP servers available to this run:",
			"- GitHub (mcp_GitHub), 10 tools: *",
			"",
			"Other servers *",
			"",
			"Call: *",
			"Docs from cache: [{'server': 'GitHub', 'tool': 'add', *",
			"Search from cache: [{'server': 'GitHub', 'tool': 'echo', *",
		}},

	{"GUIDE/server cwd", []string{"GitHub"}, `from mcp import runtime

desc = runtime.describe_server('GitHub')
cdir = desc.get('cwd') or 'bridge-default'
print('Server cwd:', cdir)`,
		[]string{"Server cwd: bridge-default"}},

	{"GUIDE/tool discovery flow", []string{"GitHub"}, `print(await mcp.runtime.discovered_servers())
print(mcp.runtime.list_servers_sync())
docs = await mcp.runtime.query_tool_docs("GitHub")
hits = await mcp.runtime.search_tool_docs("github user")
print(len(docs), hits[0]["toolAlias"])
r = await mcp.runtime.call_tool("GitHub", hits[0]["tool"], {"login": "octocat"})
print(r["login"], r["content"][0]["text"])`,
		[]string{"['GitHub', 'demo-server', 'filesystem']", "('GitHub',)", "10 getuser",
			`octocat {"login": "octocat", "name": "User octocat"}`}},

	{"GUIDE/direct tool use", []string{"filesystem"}, `# Call a single tool
result = await mcp_filesystem.echo(text='/tmp/data.txt')
print(result)`,
		[]string{"/tmp/data.txt"}},

	{"GUIDE/chained operations", []string{"GitHub"}, `def process(data):
    return data["sum"] * 10

# Chain multiple operations
data = await mcp_github.add(a=1, b=2)
processed = process(data)
print(await mcp_github.echo(text=str(processed)))`,
		[]string{"30"}},

	{"GUIDE/data pipeline", []string{"filesystem", "GitHub"}, `def clean_data(data):
    return [d.upper() for d in data]

# Extract
source_data = await mcp_filesystem.search_files(pattern='*')

# Transform
cleaned = clean_data(source_data)

# Load
await mcp_github.echo(text=",".join(cleaned))

# Report
print(f"Processed {len(cleaned)} items")`,
		[]string{"Processed 2 items"}},

	{"GUIDE/batch processing", []string{"filesystem"}, `import asyncio

# Get list
items = await mcp_filesystem.search_files(pattern='*')

# Process in parallel
tasks = [
    mcp_filesystem.getuser(login=item)
    for item in items
]

# Wait for all
results = await asyncio.gather(*tasks)
print([r["login"] for r in results])`,
		[]string{"['a.txt', 'b.txt']"}},

	{"GUIDE/error handling", []string{"GitHub"}, `try:
    result = await mcp_github.fail(message="risky operation failed")
except Exception as e:
    print(f"Operation failed: {e}")
try:
    await mcp_github.fail()
except RuntimeError as e:
    print(type(e).__name__, isinstance(e, MCPError))`,
		[]string{"Operation failed: risky operation failed", "MCPError True"}},

	{"GUIDE/conditional execution", []string{"GitHub"}, `# Check before acting
status = await mcp_github.add(a=1, b=1)

if status["sum"] == 2:
    print(await mcp_github.echo(text="executed"))
else:
    print("Service not ready")`,
		[]string{"executed"}},

	{"GUIDE/multi-server workflow", []string{"GitHub", "filesystem", "demo-server"}, `# Get data from service A
data = await mcp_github.getuser(login='xyz')

# Process with service B
processed = await mcp_filesystem.echo(text=data["name"])

# Save with service C
saved = await mcp_demo_server.echo(text=processed)

# Notify with service D
print(await mcp_servers["demo-server"].echo(text='Done: ' + saved))`,
		[]string{"Done: User xyz"}},

	{"GUIDE/accessing raw MCP client", []string{"filesystem"}, `# Direct server access
server = mcp_servers['filesystem']
result = await server.echo(text='/tmp')
print(result)`,
		[]string{"/tmp"}},

	{"GUIDE/batching", []string{"GitHub"}, `import asyncio

results = await asyncio.gather(
    mcp_github.echo(text="1"),
    mcp_github.echo(text="2"),
    mcp_github.add(a=1, b=2),
)
print(results)`,
		[]string{"[1, 2, {'sum': 3}]"}},

	{"tests/stub echo", []string{"GitHub"}, `result = await mcp_github.echo(text='hello world')
assert result['content'][0]['text'] == 'hello world'
assert result['isError'] is False
print("ok")`,
		[]string{"ok"}},

	{"tests/runtime helpers sync and async", []string{"demo-server"}, `from mcp import runtime
assert runtime.list_servers_sync() == ('demo-server',)
docs_sync = runtime.query_tool_docs_sync('demo-server')
assert docs_sync and docs_sync[0]['toolAlias'] == 'add'
search_sync = runtime.search_tool_docs_sync('echo')
assert search_sync and search_sync[0]['toolAlias'] == 'echo'
summary = runtime.capability_summary()
print('SUMMARY:', summary[:10])
async def _exercise_async():
    docs = await runtime.query_tool_docs('demo-server')
    search = await runtime.search_tool_docs('echo')
    servers = await runtime.list_servers()
    print('ASYNC:', len(docs), search[0]['tool'], servers)
await _exercise_async()`,
		[]string{"SUMMARY: MCP server", "ASYNC: 10 echo ['demo-server']"}},

	{"tests/runtime metadata helpers and errors", []string{"demo-server"}, `from mcp import runtime
meta = runtime.list_loaded_server_metadata()
assert isinstance(meta, tuple) and meta and meta[0]['alias'] == 'demo_server'
desc = runtime.describe_server('demo-server')
assert desc['name'] == 'demo-server'
try:
    runtime.list_tools_sync()
except runtime.MCPError:
    print('EXPECTED_SYNC_ERROR')
else:
    raise AssertionError('list_tools_sync should require a server name')
doc_full = await runtime.query_tool_docs('demo-server', tool='echo', detail='full')
assert isinstance(doc_full, dict) and 'inputSchema' in doc_full
search_full = await runtime.search_tool_docs('echo', limit=1, detail='full')
assert search_full and len(search_full) == 1 and 'inputSchema' in search_full[0]
sync_results = runtime.search_tool_docs_sync('echo demo', limit=1, detail='full')
assert sync_results and 'inputSchema' in sync_results[0]
print(LOADED_MCP_SERVERS, mcp_demo_server is mcp_servers['demo-server'])`,
		[]string{"EXPECTED_SYNC_ERROR", "('demo-server',) True"}},

	{"tests/server module TOOLS", []string{"GitHub"}, `import mcp.servers.github as gh
from mcp.servers.github import TOOLS, TOOL_MAP, getuser
print(len(TOOLS), TOOL_MAP["getuser"]["name"], gh.__doc__)
print((await getuser(login="q"))["name"], (await mcp.servers.github.search_files(pattern="*"))[1])`,
		[]string{"10 getUser MCP server 'GitHub' wrappers", "User q b.txt"}},

	// The bridge sends a call to a tool the server lacks and raises the
	// server's error as a RuntimeError: code that catches it goes on.
	{"README error handling of a missing tool", []string{"GitHub"}, `try:
    await mcp_github.no_such_tool(login="q")
except RuntimeError as e:
    print("caught:", type(e).__name__, "no_such_tool" in str(e), "getuser" in str(e).lower())`,
		[]string{"caught: MCPError True True"}},
}

// TestBridgePrograms runs the bridge's documented examples unchanged (but for
// the tools they call) through a fleet with Podman sandboxes and a proxied
// stdio MCP server, each as a run_python call.
func TestBridgePrograms(t *testing.T) {
	b := testutil.Broker(t, "", queue.DefaultConfig())
	rt := podmantest.New(t, podman.Config{Config: containerpool.Config{Pool: 1}})
	testutil.Worker(t, b, rt, worker.DefaultConfig("e2e-worker"))
	pool := testutil.Pool(t, mcpclients.Config{}, testutil.TestServerDef(t, "GitHub", nil),
		testutil.TestServerDef(t, "filesystem", nil), testutil.TestServerDef(t, "demo-server", nil))
	fe := testutil.FrontendWith(t, b, frontend.Config{ID: "e2e-fe", Tools: pool})
	c := testutil.MCPClientWith(t, fe, mcpserver.Options{Servers: pool.Names, Definitions: pool.Servers}, mcpserver.HTTPOptions{})
	for _, p := range bridgePrograms {
		t.Run(p.name, func(t *testing.T) {
			res := testutil.CallRunPython(t, c, map[string]any{"code": p.code, "servers": p.servers})
			out := testutil.Text(res)
			if res.IsError {
				t.Fatalf("failed:\n%s", out)
			}
			got := strings.Split(out, "\n")
			if len(got) != len(p.want) {
				t.Fatalf("%d lines, want %d:\n%s", len(got), len(p.want), out)
			}
			for i, w := range p.want {
				if prefix, ok := strings.CutSuffix(w, "*"); ok && strings.HasPrefix(got[i], prefix) || got[i] == w {
					continue
				}
				t.Errorf("line %d:\n got %s\nwant %s", i+1, got[i], w)
			}
		})
	}
}
