package mcpclients_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/mcpexec/mcpexec/internal/discovery"
	"github.com/mcpexec/mcpexec/internal/mcpclients"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

func text(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	var s string
	for _, c := range res.Content {
		if tc, ok := c.(mcp.TextContent); ok {
			s += tc.Text
		}
	}
	return s
}

func call(t *testing.T, p *mcpclients.Pool, server, tool string, args map[string]any) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := p.CallTool(ctx, server, tool, args)
	if err != nil {
		return "", err
	}
	return text(t, res), nil
}

func TestPoolLazyStartCallAndToolError(t *testing.T) {
	t.Parallel()
	p := testutil.Pool(t, mcpclients.Config{}, testutil.TestServerDef(t, "ts", nil))
	if p.Running("ts") {
		t.Fatal("session started before first use")
	}
	got, err := call(t, p, "ts", "echo", map[string]any{"text": "hi"})
	if err != nil || got != "hi" {
		t.Fatalf("echo: %q %v", got, err)
	}
	if !p.Running("ts") {
		t.Fatal("session not kept warm")
	}
	_, err = call(t, p, "ts", "fail", map[string]any{"message": "disk on fire"})
	var te *mcpclients.ToolError
	if !errors.As(err, &te) || te.Message != "disk on fire" {
		t.Fatalf("tool error: %v", err)
	}
	if _, err := call(t, p, "nope", "echo", nil); !errors.Is(err, mcpclients.ErrUnknownServer) {
		t.Fatalf("unknown server: %v", err)
	}
}

func TestPoolPolicyAppliesToEveryCall(t *testing.T) {
	t.Parallel()
	p := testutil.Pool(t, mcpclients.Config{Policy: discovery.Policy{Deny: []string{"secret*"}}},
		testutil.TestServerDef(t, "secret-db", nil), testutil.TestServerDef(t, "ok", nil))
	if _, err := call(t, p, "secret-db", "echo", map[string]any{"text": "x"}); !errors.Is(err, mcpclients.ErrDenied) {
		t.Fatalf("denied server answered: %v", err)
	}
	if names := p.Names(); len(names) != 1 || names[0] != "ok" {
		t.Fatalf("names %v", names)
	}
}

func TestPoolRestartsCrashedServerWithBackoff(t *testing.T) {
	t.Parallel()
	p := testutil.Pool(t, mcpclients.Config{MinBackoff: 200 * time.Millisecond}, testutil.TestServerDef(t, "ts", nil))
	pid1, err := call(t, p, "ts", "pid", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = call(t, p, "ts", "crash", nil)
	if err == nil || !strings.Contains(err.Error(), "exited during the call") || !strings.Contains(err.Error(), "crashing on request") {
		t.Fatalf("crash: %v", err)
	}
	start := time.Now()
	pid2, err := call(t, p, "ts", "pid", nil)
	if err != nil {
		t.Fatalf("after crash: %v", err)
	}
	if pid1 == pid2 {
		t.Fatalf("same pid %s after crash", pid1)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Fatalf("restarted after %s, before the backoff", d)
	}
}

func TestPoolToolListRefreshedOnListChanged(t *testing.T) {
	t.Parallel()
	p := testutil.Pool(t, mcpclients.Config{}, testutil.TestServerDef(t, "ts", nil))
	ctx := context.Background()
	tools, err := p.Tools(ctx, "ts")
	if err != nil {
		t.Fatal(err)
	}
	n := len(tools)
	if _, err := call(t, p, "ts", "add_tool", map[string]any{"name": "brand_new"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		tools, err = p.Tools(ctx, "ts")
		if err != nil {
			t.Fatal(err)
		}
		if len(tools) == n+1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tool list still has %d tools after list_changed", len(tools))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestPoolClosesIdleSessions(t *testing.T) {
	t.Parallel()
	p := testutil.Pool(t, mcpclients.Config{IdleTimeout: 200 * time.Millisecond}, testutil.TestServerDef(t, "ts", nil))
	if _, err := call(t, p, "ts", "echo", map[string]any{"text": "x"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.Running("ts") {
		if time.Now().After(deadline) {
			t.Fatal("idle session not closed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got, err := call(t, p, "ts", "echo", map[string]any{"text": "again"}); err != nil || got != "again" {
		t.Fatalf("after idle close: %q %v", got, err)
	}
}

func TestPoolStartFailureSaysWhy(t *testing.T) {
	t.Parallel()
	p := testutil.Pool(t, mcpclients.Config{StartTimeout: 5 * time.Second},
		testutil.TestServerDef(t, "broken", map[string]string{"TESTSERVER_EXIT_AT_START": "1"}))
	_, err := call(t, p, "broken", "echo", nil)
	if err == nil || !strings.Contains(err.Error(), `"broken"`) {
		t.Fatalf("start failure: %v", err)
	}
	t.Logf("start failure reads: %v", err)
}

// TestPoolWithServerWeDidNotWrite drives the reference "everything" server of the
// MCP project (TypeScript SDK, installed from npm).
func TestPoolWithServerWeDidNotWrite(t *testing.T) {
	t.Parallel()
	dir := testutil.NodeModules(t)
	p := testutil.Pool(t, mcpclients.Config{}, discovery.Server{Name: "everything", Type: "stdio",
		Command: "node", Args: []string{dir + "/node_modules/@modelcontextprotocol/server-everything/dist/index.js", "stdio"}})
	tools, err := p.Tools(context.Background(), "everything")
	if err != nil {
		t.Fatal(err)
	}
	if len(tools) < 3 {
		t.Fatalf("only %d tools", len(tools))
	}
	got, err := call(t, p, "everything", "echo", map[string]any{"message": "from go"})
	if err != nil || !strings.Contains(got, "from go") {
		t.Fatalf("echo: %q %v", got, err)
	}
}

// TestPoolRemoteServer reaches a server by URL over streamable HTTP, with the
// configured headers.
func TestPoolRemoteServer(t *testing.T) {
	t.Parallel()
	s := server.NewMCPServer("remote", "1")
	s.AddTool(mcp.NewTool("hello", mcp.WithDescription("Say hello.")), func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("hello " + r.Header.Get("X-Test")), nil
	})
	hs := httptest.NewServer(server.NewStreamableHTTPServer(s))
	t.Cleanup(hs.Close)
	p := testutil.Pool(t, mcpclients.Config{}, discovery.Server{Name: "remote", Type: "http", URL: hs.URL + "/mcp",
		Headers: map[string]string{"X-Test": "with header"}})
	got, err := call(t, p, "remote", "hello", nil)
	if err != nil || got != "hello with header" {
		t.Fatalf("remote: %q %v", got, err)
	}
}

// TestPoolUpdate: a new discovery adds servers, restarts changed ones with
// their new definition, and closes removed ones (whose calls then say so).
func TestPoolUpdate(t *testing.T) {
	t.Parallel()
	a := testutil.TestServerDef(t, "a", nil)
	b := testutil.TestServerDef(t, "b", nil)
	p := testutil.Pool(t, mcpclients.Config{}, a, b)
	for _, s := range []string{"a", "b"} {
		if got, err := call(t, p, s, "echo", map[string]any{"text": s}); err != nil || got != s {
			t.Fatalf("%s: %q %v", s, got, err)
		}
	}
	a2 := a
	a2.Env = map[string]string{"CHANGED": "1"}
	c := testutil.TestServerDef(t, "c", nil)
	added, changed, removed := p.Update([]discovery.Server{a2, c})
	if strings.Join(added, ",") != "c" || strings.Join(changed, ",") != "a" || strings.Join(removed, ",") != "b" {
		t.Fatalf("added %v changed %v removed %v", added, changed, removed)
	}
	if p.Running("a") || p.Running("b") {
		t.Fatal("a changed or removed server's session is still running")
	}
	if names := strings.Join(p.Names(), ","); names != "a,c" {
		t.Fatalf("names %s", names)
	}
	for _, s := range []string{"a", "c"} {
		if got, err := call(t, p, s, "echo", map[string]any{"text": s}); err != nil || got != s {
			t.Fatalf("%s after the update: %q %v", s, got, err)
		}
	}
	if _, err := call(t, p, "b", "echo", nil); !errors.Is(err, mcpclients.ErrUnknownServer) {
		t.Fatalf("removed server: %v", err)
	}
	if a, c, r := p.Update([]discovery.Server{a2, c}); len(a)+len(c)+len(r) != 0 || !p.Running("a") {
		t.Fatalf("an unchanged discovery changed the pool: %v %v %v", a, c, r)
	}
}
