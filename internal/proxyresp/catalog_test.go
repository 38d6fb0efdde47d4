package proxyresp_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcpexec/mcpexec/internal/discovery"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/proxyresp"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// catalogDef is a catalog server: a test server the operator lists but no
// namespace enabled yet.
func catalogDef(t testing.TB, name, desc string) discovery.Server {
	s := testutil.TestServerDef(t, name, nil)
	s.Description, s.Catalog = desc, true
	return s
}

// changes records the namespaces whose catalog servers changed.
type changes struct {
	mu  sync.Mutex
	nss []string
}

func (c *changes) add(ns string) { c.mu.Lock(); c.nss = append(c.nss, ns); c.mu.Unlock() }
func (c *changes) count() int    { c.mu.Lock(); defer c.mu.Unlock(); return len(c.nss) }

// TestCatalog: code finds a catalog server, enables it and calls it in the
// same run; later runs name it in servers (and see it in the servers enum);
// disabling it refuses its calls at once, also those of a run it was given
// to; a namespace whose policy leaves it out neither finds nor enables it.
func TestCatalog(t *testing.T) {
	t.Parallel()
	var ch changes
	cfg := frontend.Config{OnCatalogChange: ch.add, Policies: map[string]frontend.Policy{"restricted": {Servers: []string{"ts"}}}}
	s := setup(t, t.TempDir(), cfg, testutil.TestServerDef(t, "ts", nil),
		catalogDef(t, "weather", "Weather forecasts and severe weather alerts"),
		catalogDef(t, "files", "Read, write and search files in a workspace"),
		catalogDef(t, "Git-Hub", "Issues and pull requests of repositories"))
	c := testutil.MCPClientWith(t, s.FE, mcpserver.Options{Servers: s.Pool.Names, Definitions: s.Pool.Servers, Catalog: s.FE}, mcpserver.HTTPOptions{})
	enum := func() string { return testutil.ServersEnum(t, c) }
	if e := enum(); strings.Contains(e, "weather") || !strings.Contains(e, `"ts"`) {
		t.Fatalf("servers enum before enabling: %s", e)
	}

	got := mustRun(t, c, `
hits = find_servers("forecast for tomorrow")
print([(h["name"], h["alias"], h["enabled"]) for h in hits])
print(sorted(h["name"] for h in find_servers()))
print([h["name"] for h in find_servers("search file", limit=1)])
print("weather" in discovered_servers())
try:
    await call_tool("weather", "echo", {"text": "x"})
except MCPError as e:
    print("refused before enabling:", "not given to this run" in str(e))
e = enable_server("weather")
print(e["name"], e["alias"], e["enabled"], e.get("already_enabled", False))
print(await mcp_weather.echo(text="sunny"), list_servers(), LOADED_MCP_SERVERS)
print((await call_tool("weather", "echo", {"text": "by name"})))
print(enable_server("weather")["already_enabled"], "weather" in discovered_servers())
gh = enable_server("Git-Hub")
print(gh["alias"], await mcp_git_hub.echo(text="gh"), await mcp_servers["Git-Hub"].echo(text="gh2"))
`, "ts")
	want := `[('weather', 'weather', False)]
['Git-Hub', 'files', 'weather']
['files']
False
refused before enabling: True
weather weather True False
sunny ['ts', 'weather'] ('ts', 'weather')
by name
True True
Git_Hub gh gh2`
	if got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
	if n := ch.count(); n != 2 {
		t.Fatalf("catalog change hook told %d times, want 2 (weather and Git-Hub enabled)", n)
	}

	// The namespace's later runs: the enum has it, servers may name it.
	if e := enum(); !strings.Contains(e, `"weather"`) || !strings.Contains(e, `"Git-Hub"`) || strings.Contains(e, "files") {
		t.Fatalf("servers enum after enabling: %s", e)
	}
	if got := mustRun(t, c, `print(await mcp_weather.echo(text="later"), list_servers())`, "weather"); got != "later ['weather']" {
		t.Fatalf("a later run: %q", got)
	}
	// A run not given it cannot call it, even though the namespace enabled it.
	out, st := run(t, c, `await call_tool("weather", "echo", {"text": "x"})`, "ts")
	if st.Status != "error" || !strings.Contains(out, "not given to this run") {
		t.Fatalf("a run without weather: %s %q", st.Status, out)
	}

	// Disabling revokes it at once: the front-end refuses the calls of a run
	// that was given it.
	got = mustRun(t, c, `
print(disable_server("weather"), disable_server("weather"), list_servers())
try:
    await call_tool("weather", "echo", {"text": "x"})
except MCPError as e:
    print("refused:", str(e))
`, "weather")
	if want := `True False []
refused: server "weather" is a catalog server that namespace "default" has not enabled: call enable_server("weather") first`; got != want {
		t.Fatalf("disable:\n%s\nwant:\n%s", got, want)
	}
	res := testutil.CallRunPython(t, c, map[string]any{"code": "print(1)", "servers": []string{"weather"}})
	if !res.IsError || !strings.Contains(testutil.Text(res), "not a proxied MCP server") {
		t.Fatalf("servers naming a disabled catalog server: isError=%v %q", res.IsError, testutil.Text(res))
	}

	// A namespace whose policy leaves the catalog out.
	ctx := context.Background()
	if found, err := s.FE.FindServers(ctx, "restricted", "", 0); err != nil || len(found) != 0 {
		t.Fatalf("restricted namespace finds %v, %v", found, err)
	}
	if _, err := s.FE.EnableServer(ctx, "restricted", "weather"); err == nil || !strings.Contains(err.Error(), "not allowed for namespace") {
		t.Fatalf("restricted namespace enables weather: %v", err)
	}
	// Namespaces are apart: another one has nothing enabled.
	if names, err := s.FE.EnabledServers(ctx, "other"); err != nil || len(names) != 0 {
		t.Fatalf("other namespace: %v, %v", names, err)
	}
	if names, err := s.FE.EnabledServers(ctx, "default"); err != nil || fmt.Sprint(names) != "[Git-Hub]" {
		t.Fatalf("default namespace: %v, %v", names, err)
	}

	// JavaScript has the same catalog.
	js := testutil.MCPClientWith(t, s.FE, mcpserver.Options{Servers: s.Pool.Names, Catalog: s.FE, Languages: jobs.Languages}, mcpserver.HTTPOptions{})
	res = testutil.CallTool(t, js, mcpserver.JSToolName, map[string]any{"code": `
const hits = await findServers("files workspace");
console.log(hits.map((h) => h.name).join(","), hits[0].enabled);
const e = await enableServer("files");
console.log(e.alias, e.enabled, await mcp_files.echo({ text: "js" }), (await listServers()).join(","));
console.log(await disableServer("files"), typeof mcp_files);
try { await callTool("files", "echo", { text: "x" }); } catch (err) { console.log(err instanceof MCPError); }`, "servers": []string{"ts"}})
	if got, want := testutil.Text(res), "files false\nfiles true js files,ts\ntrue undefined\ntrue"; got != want {
		t.Fatalf("JavaScript:\n%s\nwant:\n%s", got, want)
	}
}

// TestDiscoveryFollowsPolicy: discovered_servers and capability_summary
// name only the servers the namespace may use, as find_servers does: not a
// configured server its policy leaves out, not a catalog server it has not
// enabled (the review found both named), and a catalog server once enabled.
func TestDiscoveryFollowsPolicy(t *testing.T) {
	t.Parallel()
	cfg := frontend.Config{Policies: map[string]frontend.Policy{"default": {Servers: []string{"ts", "weather"}}}}
	s := setup(t, t.TempDir(), cfg, testutil.TestServerDef(t, "ts", nil),
		testutil.TestServerDef(t, "excluded-srv", nil),
		catalogDef(t, "weather", "Weather forecasts and severe weather alerts"),
		catalogDef(t, "catalog-excluded", "A catalog server the policy leaves out"))
	c := testutil.MCPClientWith(t, s.FE, mcpserver.Options{Servers: s.Pool.Names, Definitions: s.Pool.Servers, Catalog: s.FE}, mcpserver.HTTPOptions{})
	code := `
print(discovered_servers(), [d["name"] for d in discovered_servers(detailed=True)])
summary = capability_summary()
print([n for n in ("excluded-srv", "catalog-excluded", "weather") if n in summary])
`
	got := mustRun(t, c, code+`print([h["name"] for h in find_servers()])
enable_server("weather")`, "ts")
	if want := "['ts'] ['ts']\n[]\n['weather']"; got != want {
		t.Fatalf("before enabling:\n%s\nwant:\n%s", got, want)
	}
	// Enabled, the catalog server is the namespace's: both name it.
	if got, want := mustRun(t, c, code, "ts"), "['ts', 'weather'] ['ts', 'weather']\n['weather']"; got != want {
		t.Fatalf("after enabling:\n%s\nwant:\n%s", got, want)
	}
}

// TestCatalogHostile: what sandbox code may send the catalog is checked:
// names, unknown and configured servers, oversized queries, the reserved
// memory entry, the cap on enabled servers.
func TestCatalogHostile(t *testing.T) {
	t.Parallel()
	servers := []discovery.Server{testutil.TestServerDef(t, "ts", nil)}
	for i := range proxyresp.MaxEnabledServers + 1 {
		servers = append(servers, catalogDef(t, fmt.Sprintf("c%02d", i), "catalog server"))
	}
	s := setup(t, t.TempDir(), frontend.Config{}, servers...)
	got := mustRun(t, s.C, `
for args in [("../etc",), ("",), (None,), ("nope",), ("ts",), ("x" * 5000,)]:
    try:
        enable_server(*args)
        print("enabled", args)
    except (MCPError, TypeError) as e:
        print(type(e).__name__, str(e)[:90].strip())
try:
    find_servers("q" * 2000)
except MCPError as e:
    print(str(e)[:60].strip())
for key in ["__mcpexec_enabled_servers__"]:
    try:
        save_memory(key, {"servers": {"ts": {}}})
    except MCPError as e:
        print("reserved:", "reserved" in str(e))
print(len(find_servers(limit=1000)))
`)
	want := `MCPError "../etc" is not a server name: find_servers(query) lists the servers you may enable
TypeError server names are non-empty strings, got ''
TypeError server names are non-empty strings, got None
MCPError no catalog server is named "nope": find_servers(query) lists the servers you may enable
MCPError "ts" is configured on this front-end, not a catalog server: it needs no enabling; pass it
MCPError LONG
the query is 2000 bytes, over the 1024-byte limit: describe
reserved: True
65`
	long := fmt.Sprintf("%.80q is not a server name", strings.Repeat("x", 5000))[:90]
	if want = strings.Replace(want, "LONG", strings.TrimSpace(long), 1); got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
	got = mustRun(t, s.C, fmt.Sprintf(`
for i in range(%d):
    enable_server("c%%02d" %% i)
try:
    enable_server("c%02d")
except MCPError as e:
    print(e)
print(len([h for h in find_servers(limit=100) if h["enabled"]]))
`, proxyresp.MaxEnabledServers, proxyresp.MaxEnabledServers))
	if want := fmt.Sprintf("namespace \"default\" has %d catalog servers enabled, the most it may: disable_server(name) one first\n%d", proxyresp.MaxEnabledServers, proxyresp.MaxEnabledServers); got != want {
		t.Fatalf("cap: %q, want %q", got, want)
	}
}

// TestCatalogTools: with agent discovery on, the catalog is MCP tools too.
func TestCatalogTools(t *testing.T) {
	t.Parallel()
	s := setup(t, t.TempDir(), frontend.Config{}, testutil.TestServerDef(t, "ts", nil), catalogDef(t, "weather", "Weather forecasts"))
	for _, on := range []bool{false, true} {
		c := testutil.MCPClientWith(t, s.FE, mcpserver.Options{Servers: s.Pool.Names, Definitions: s.Pool.Servers, Catalog: s.FE, AgentDiscovery: on}, mcpserver.HTTPOptions{})
		names := testutil.ToolNames(t, c)
		if has := strings.Contains(fmt.Sprint(names), mcpserver.FindServersTool); has != on {
			t.Fatalf("agent discovery %v: tools %v", on, names)
		}
		if !on {
			continue
		}
		call := func(name string, args map[string]any) *mcp.CallToolResult { return testutil.CallTool(t, c, name, args) }
		if res := call(mcpserver.FindServersTool, map[string]any{"query": "forecast"}); res.IsError || !strings.Contains(testutil.Text(res), `"name":"weather"`) {
			t.Fatalf("find_servers: %q", testutil.Text(res))
		}
		if res := call(mcpserver.EnableServerTool, map[string]any{"name": "weather"}); res.IsError || !strings.Contains(testutil.Text(res), `"enabled":true`) {
			t.Fatalf("enable_server: %q", testutil.Text(res))
		}
		if got := mustRun(t, c, `print(await mcp_weather.echo(text="via tools"))`, "weather"); got != "via tools" {
			t.Fatalf("run after enable_server: %q", got)
		}
		if res := call(mcpserver.EnableServerTool, map[string]any{"name": "ts"}); !res.IsError {
			t.Fatalf("enable_server of a configured server: %q", testutil.Text(res))
		}
		if res := call(mcpserver.DisableServerTool, map[string]any{"name": "weather"}); res.IsError || testutil.Text(res) != `{"disabled":true,"name":"weather"}` {
			t.Fatalf("disable_server: %q", testutil.Text(res))
		}
	}
}

// BenchmarkCatalogCall: what a call of an enabled catalog server costs next
// to a configured one (the front-end reads the namespace's enabled set at
// each call). Each op is one job of 50 sequential calls; call-ms is per call.
func BenchmarkCatalogCall(b *testing.B) {
	s := setup(b, b.TempDir(), frontend.Config{}, testutil.TestServerDef(b, "ts", nil), catalogDef(b, "weather", "forecasts"))
	if _, err := s.FE.EnableServer(context.Background(), jobs.DefaultNamespace, "weather"); err != nil {
		b.Fatal(err)
	}
	c := testutil.MCPClientWith(b, s.FE, mcpserver.Options{Servers: s.Pool.Names, Catalog: s.FE}, mcpserver.HTTPOptions{})
	const calls = 50
	for _, server := range []string{"ts", "weather"} {
		b.Run(server, func(b *testing.B) {
			code := fmt.Sprintf("for i in range(%d):\n    await mcp_%s.echo(text='x')\nprint('ok')", calls, server)
			mustRun(b, c, code, server) // warm: the server started, the sandbox ready
			b.ResetTimer()
			for range b.N {
				mustRun(b, c, code, server)
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N*calls), "call-ms")
		})
	}
}
