package mcpserver

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

func inProcess(t *testing.T, r Runner, opts Options) *client.Client {
	t.Helper()
	c, err := client.NewInProcessClient(New(r, opts))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() }) // the test is over
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "t", Version: "0"}
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatal(err)
	}
	return c
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
