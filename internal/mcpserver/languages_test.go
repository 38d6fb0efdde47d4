package mcpserver

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// inProcess is an initialised in-process client of New(r, opts).
func inProcess(t *testing.T, r jobs.Service, opts Options) *client.Client {
	t.Helper()
	c, _ := connect(t, New(r, opts), nil)
	return c
}

// connect starts and initialises an in-process client of srv, closed when
// the test ends; onNotification, unless nil, hears its notifications.
func connect(t *testing.T, srv *server.MCPServer, onNotification func(mcp.JSONRPCNotification)) (*client.Client, *mcp.InitializeResult) {
	t.Helper()
	c, err := client.NewInProcessClient(srv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() }) // the test is over
	if onNotification != nil {
		c.OnNotification(onNotification)
	}
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "t", Version: "0"}
	ir, err := c.Initialize(ctx, init)
	if err != nil {
		t.Fatalf("initialize: %v", err)
	}
	return c, ir
}

// TestLanguagesOffered: run_javascript is offered only where JavaScript is
// among the languages, runs its code as a JavaScript job, and the manual
// documents what is offered.
func TestLanguagesOffered(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		langs []string
		tools []string
	}{
		{nil, []string{ToolName}},
		{[]string{jobs.LangPython}, []string{ToolName}},
		{jobs.Languages, []string{JSToolName, ToolName}},
	} {
		r := &echoRunner{}
		cl := inProcess(t, r, Options{Languages: c.langs})
		list, err := cl.ListTools(ctx, mcp.ListToolsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, tl := range list.Tools {
			names = append(names, tl.Name)
		}
		slices.Sort(names)
		if !slices.Equal(names, c.tools) {
			t.Fatalf("languages %v: tools %v, want %v", c.langs, names, c.tools)
		}
		rr, err := cl.ReadResource(ctx, mcp.ReadResourceRequest{Params: mcp.ReadResourceParams{URI: CapabilitiesURI}})
		if err != nil {
			t.Fatal(err)
		}
		manual := rr.Contents[0].(mcp.TextResourceContents).Text
		if strings.Contains(manual, "run_javascript") != slices.Contains(c.tools, JSToolName) {
			t.Fatalf("languages %v: the manual's JavaScript part does not match the tools", c.langs)
		}
		req := mcp.CallToolRequest{}
		req.Params.Name = JSToolName
		req.Params.Arguments = map[string]any{"code": "console.log(1)"}
		res, err := cl.CallTool(ctx, req)
		offered := slices.Contains(c.tools, JSToolName)
		switch {
		case offered && (err != nil || res.IsError || r.got.Lang() != jobs.LangJavaScript):
			t.Fatalf("run_javascript: %v %+v, job %+v", err, res, r.got)
		case !offered && err == nil && !res.IsError:
			t.Fatalf("run_javascript answered where it is not offered: %+v", res)
		}
	}
}

// TestLoggingAndBridgeResource: the server declares logging and honours
// logging/setLevel: at debug a call's job lifecycle arrives as
// notifications/message; Tools.Log reaches every session at its level; the
// manual is also served under the seed bridge's resource URI.
func TestLoggingAndBridgeResource(t *testing.T) {
	ctx := context.Background()
	srv, tools := NewServer(&echoRunner{}, Options{})
	msgs := make(chan mcp.JSONRPCNotification, 16)
	c, ir := connect(t, srv, func(n mcp.JSONRPCNotification) {
		if n.Method == string(mcp.MethodNotificationMessage) {
			msgs <- n
		}
	})
	if ir.Capabilities.Logging == nil {
		t.Fatal("initialize: no logging capability")
	}
	lvl := mcp.SetLevelRequest{}
	lvl.Params.Level = mcp.LoggingLevelDebug
	//lint:ignore SA1019 clients of protocol versions before 2026-07-28 set the level this way, and the issue asks for it
	if err := c.SetLevel(ctx, lvl); err != nil {
		t.Fatal(err)
	}
	req := mcp.CallToolRequest{}
	req.Params.Name = ToolName
	req.Params.Arguments = map[string]any{"code": "print(1)"}
	if res, err := c.CallTool(ctx, req); err != nil || res.IsError {
		t.Fatalf("call: %v %+v", err, res)
	}
	tools.Log(mcp.LoggingLevelError, map[string]any{"event": "server_failed", "server": "gh"})
	var events []string
	for len(events) < 3 {
		select {
		case n := <-msgs:
			b, _ := json.Marshal(n.Params.AdditionalFields) // decoded JSON re-encodes
			events = append(events, string(b))
		case <-time.After(10 * time.Second):
			t.Fatalf("log messages so far: %v", events)
		}
	}
	all := strings.Join(events, "\n")
	for _, want := range []string{`"event":"accepted"`, `"event":"finished"`, `"event":"server_failed"`, `"level":"debug"`, `"level":"error"`} {
		if !strings.Contains(all, want) {
			t.Fatalf("log messages lack %s:\n%s", want, all)
		}
	}
	rr, err := c.ReadResource(ctx, mcp.ReadResourceRequest{Params: mcp.ReadResourceParams{URI: BridgeCapabilitiesURI}})
	if err != nil || !strings.Contains(rr.Contents[0].(mcp.TextResourceContents).Text, "run_python") {
		t.Fatalf("the bridge's capabilities URI: %v", err)
	}
}

// TestNoPromptsButAList: mcpexec has no prompts, yet declares the capability
// and answers prompts/list with an empty list (and, on 2026-07-28, its
// caching hints), as clients and the conformance suite's caching scenario
// ask, rather than "method not found".
func TestNoPromptsButAList(t *testing.T) {
	c, ir := connect(t, New(&echoRunner{}, Options{}), nil)
	if ir.Capabilities.Prompts == nil {
		t.Fatalf("capabilities %+v: no prompts", ir.Capabilities)
	}
	res, err := c.ListPrompts(context.Background(), mcp.ListPromptsRequest{})
	if err != nil || len(res.Prompts) != 0 {
		t.Fatalf("prompts/list: %v %+v", err, res)
	}
}
