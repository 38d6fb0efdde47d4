package mcpserver_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// modernCall posts a 2026-07-28 tools/call of tool declaring caps (nil: no
// clientCapabilities at all) and returns the HTTP status and the reply.
func modernCall(t *testing.T, url, tool string, caps any) (int, map[string]any) {
	t.Helper()
	meta := map[string]any{mcp.MetaKeyProtocolVersion: "2026-07-28"}
	if caps != nil {
		meta[mcp.MetaKeyClientCapabilities] = caps
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 7, "method": "tools/call",
		"params": map[string]any{"name": tool, "arguments": map[string]any{}, "_meta": meta}})
	req, _ := http.NewRequest(http.MethodPost, url+"/mcp", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer token-alpha")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "tools/call")
	req.Header.Set("Mcp-Name", tool)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }() // read below
	b, _ := io.ReadAll(resp.Body)
	if i := bytes.Index(b, []byte("data: ")); i >= 0 { // an event stream: its one message
		b = b[i+len("data: "):]
	}
	var reply map[string]any
	if err := json.Unmarshal(b, &reply); err != nil {
		t.Fatalf("HTTP %d %s: %v", resp.StatusCode, b, err)
	}
	return resp.StatusCode, reply
}

// TestMissingClientCapability: a 2026-07-28 call of a tool that needs a
// client capability the request does not declare is refused with -32021,
// HTTP 400 and the capabilities it needs as a ClientCapabilities object,
// before the tool runs; what is declared elsewhere (null, the wrong
// extension, another request) does not count; a call that declares it runs.
func TestMissingClientCapability(t *testing.T) {
	b := testutil.Broker(t, "", queue.DefaultConfig())
	testutil.Worker(t, b, testutil.NewFakeRuntime(8), worker.DefaultConfig("w1"))
	fe := testutil.Frontend(t, b, "fe1")
	opts := mcpserver.Options{Namespace: httpauth.Namespace, ClientNeeds: mcpserver.ClientNeeds{
		"asks":   {"elicitation": map[string]any{}},
		"tasked": {"extensions": map[string]any{"io.modelcontextprotocol/tasks": map[string]any{}}},
	}}
	srv := mcpserver.New(fe, opts)
	var ran atomic.Int32
	for _, name := range []string{"asks", "tasked"} {
		srv.AddTool(mcp.NewTool(name), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			ran.Add(1)
			return mcp.NewToolResultText("ran"), nil
		})
	}
	tasks := mcpserver.NewTasks(srv, fe, opts, 0)
	t.Cleanup(tasks.Close)
	hs := httptest.NewServer(mcpserver.Handler(srv, mcpserver.HTTPOptions{Tasks: tasks, Auth: httpauth.New(httpauth.Config{Tokens: map[string]string{"token-alpha": "alpha"}})}))
	t.Cleanup(hs.Close)

	refused := []struct {
		tool string
		caps any
		want string // requiredCapabilities, as JSON
	}{
		{"asks", map[string]any{}, `{"elicitation":{}}`},
		{"asks", map[string]any{"elicitation": nil, "sampling": map[string]any{}}, `{"elicitation":{}}`},
		{"asks", "elicitation", `{"elicitation":{}}`}, // not an object: nothing declared (mcp-go's own check may answer first)
		{"tasked", map[string]any{"extensions": map[string]any{}}, `{"extensions":{"io.modelcontextprotocol/tasks":{}}}`},
		{"tasked", map[string]any{"extensions": map[string]any{"io.example/other": map[string]any{}}}, `{"extensions":{"io.modelcontextprotocol/tasks":{}}}`},
		{"tasked", map[string]any{"extensions": "io.modelcontextprotocol/tasks"}, `{"extensions":{"io.modelcontextprotocol/tasks":{}}}`},
	}
	for _, c := range refused {
		code, reply := modernCall(t, hs.URL, c.tool, c.caps)
		e, _ := reply["error"].(map[string]any)
		if e == nil {
			t.Fatalf("%s with %v: no error: %v", c.tool, c.caps, reply)
		}
		if e["code"] == float64(mcp.INVALID_PARAMS) && c.caps == "elicitation" {
			continue // malformed _meta: mcp-go's -32602 is as good
		}
		data, _ := e["data"].(map[string]any)
		got, _ := json.Marshal(data["requiredCapabilities"])
		if code != http.StatusBadRequest || e["code"] != float64(mcp.MISSING_REQUIRED_CLIENT_CAPABILITY) || string(got) != c.want ||
			!strings.Contains(e["message"].(string), "declare") || reply["id"] != float64(7) {
			t.Fatalf("%s with %v: HTTP %d %v", c.tool, c.caps, code, reply)
		}
	}
	if n := ran.Load(); n != 0 {
		t.Fatalf("a refused tool ran %d times", n)
	}

	for _, c := range []struct {
		tool string
		caps any
	}{
		{"asks", map[string]any{"elicitation": map[string]any{"form": map[string]any{}}}},
		{"tasked", map[string]any{"extensions": map[string]any{"io.modelcontextprotocol/tasks": map[string]any{}}}},
	} {
		code, reply := modernCall(t, hs.URL, c.tool, c.caps)
		if code != http.StatusOK || reply["error"] != nil {
			t.Fatalf("%s with %v: HTTP %d %v", c.tool, c.caps, code, reply)
		}
	}
	if n := ran.Load(); n != 2 {
		t.Fatalf("declared calls ran %d times, want 2", n)
	}

	// A 2025-11-25 client declared its capabilities at initialize: -32021 is
	// not its error, and the tool is its server's business.
	_, sid, body := legacyPost(t, hs.URL, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	if sid == "" {
		t.Fatalf("initialize: %s", body)
	}
	if code, _, body := legacyPost(t, hs.URL, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"asks","arguments":{}}}`); code != http.StatusOK || !strings.Contains(body, `"ran"`) {
		t.Fatalf("2025-11-25 call: HTTP %d %s", code, body)
	}
}

// legacyPost posts a 2025-11-25 message in session sid ("" for none).
func legacyPost(t *testing.T, url, sid, body string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/mcp", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer token-alpha")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	if sid != "" {
		req.Header.Set(server.HeaderKeySessionID, sid)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }() // read below
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get(server.HeaderKeySessionID), string(b)
}

// TestMissingClientCapabilityOverStdio: the same refusal on stdio, where the
// task layer filters the client's lines.
func TestMissingClientCapabilityOverStdio(t *testing.T) {
	b := testutil.Broker(t, "", queue.DefaultConfig())
	fe := testutil.Frontend(t, b, "fe1")
	opts := mcpserver.Options{ClientNeeds: mcpserver.ClientNeeds{"asks": {"sampling": map[string]any{}}}}
	srv := mcpserver.New(fe, opts)
	tasks := mcpserver.NewTasks(srv, fe, opts, 0)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	_, _ = tasks.Stdio(inR, outW) // only claimed lines are sent: nothing reaches mcp-go
	t.Cleanup(func() {
		_ = inW.Close() // ends the filter
		tasks.Close()
	})
	line := `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"asks","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{}}}}}` + "\n"
	go func() { _, _ = io.WriteString(inW, line) }() // a pipe: the reader below takes it
	reply, err := bufio.NewReader(outR).ReadBytes('\n')
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		ID    int `json:"id"`
		Error struct {
			Code int `json:"code"`
			Data struct {
				RequiredCapabilities map[string]any `json:"requiredCapabilities"`
			} `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal(reply, &r); err != nil || r.ID != 3 || r.Error.Code != mcp.MISSING_REQUIRED_CLIENT_CAPABILITY ||
		r.Error.Data.RequiredCapabilities["sampling"] == nil || len(r.Error.Data.RequiredCapabilities) != 1 {
		t.Fatalf("reply %s: %v", reply, err)
	}
}
