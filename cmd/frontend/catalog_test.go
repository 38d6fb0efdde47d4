package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// TestCatalogAcrossRestart: the front-end as run (embedded broker, Podman)
// with a --catalog file and --agent-discovery: code finds a catalog server,
// enables it and calls it; after a restart of the front-end the namespace
// still has it (the enabled set is in the state service) and calls it
// again; disabling it (here through the MCP tool) refuses it.
func TestCatalogAcrossRestart(t *testing.T) {
	home := podmanHome(t)
	def := testutil.TestServerDef(t, "weather", nil)
	body, _ := json.Marshal(map[string]any{"mcpServers": map[string]any{"weather": map[string]any{ // plain values encode
		"command": def.Command, "args": def.Args, "description": "Weather forecasts and severe weather alerts"}}})
	catalog := filepath.Join(home, "catalog.json")
	if err := os.WriteFile(catalog, body, 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"--data", filepath.Join(home, "data"), "--pool", "1", "--worker-id", "test-catalog", "--catalog", catalog, "--agent-discovery"}

	ctx, c, stop := startStdio(t, args, nil)
	if err := initialize(ctx, c, "catalog-test"); err != nil {
		t.Fatalf("initialize: %v", err)
	}
	res := testutil.CallRunPython(t, c, map[string]any{"code": `
print([s["name"] for s in find_servers("weather forecast")])
enable_server("weather")
print(await mcp_weather.echo(text="before restart"))`})
	if got := testutil.Text(res); res.IsError || got != "['weather']\nbefore restart" {
		t.Fatalf("find, enable, call: isError=%v %q", res.IsError, got)
	}
	stop()

	ctx, c, stop = startStdio(t, args, nil)
	defer stop()
	if err := initialize(ctx, c, "catalog-test"); err != nil {
		t.Fatalf("initialize after restart: %v", err)
	}
	res = testutil.CallRunPython(t, c, map[string]any{"code": `print(await mcp_weather.echo(text="after restart"), find_servers("weather")[0]["enabled"])`, "servers": []string{"weather"}})
	if got := testutil.Text(res); res.IsError || got != "after restart True" {
		t.Fatalf("call after restart: isError=%v %q", res.IsError, got)
	}
	res = testutil.CallTool(t, c, mcpserver.DisableServerTool, map[string]any{"name": "weather"})
	if got := testutil.Text(res); res.IsError || got != `{"disabled":true,"name":"weather"}` {
		t.Fatalf("disable_server: isError=%v %q", res.IsError, got)
	}
	res = testutil.CallRunPython(t, c, map[string]any{"code": "print(1)", "servers": []string{"weather"}})
	if !res.IsError || !strings.Contains(testutil.Text(res), "not a proxied MCP server") {
		t.Fatalf("a disabled catalog server: isError=%v %q", res.IsError, testutil.Text(res))
	}
	res = testutil.CallRunPython(t, c, map[string]any{"code": `
try:
    await call_tool("weather", "echo", {"text": "x"})
except MCPError as e:
    print(e)`})
	if got := testutil.Text(res); !strings.Contains(got, "not given to this run") {
		t.Fatalf("a call of a disabled server: %q", got)
	}
	if names := testutil.ToolNames(t, c); !strings.Contains(strings.Join(names, ","), mcpserver.EnableServerTool) {
		t.Fatalf("--agent-discovery: tools %v", names)
	}
}
