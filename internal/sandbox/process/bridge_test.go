package process_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcpexec/mcpexec/internal/proxyresp"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// bridgeHost answers as the front-end does for two servers, "GitHub" (tools
// getUser, read-file, Read_File, class) and "other.server": list_tools with
// mcpexec's aliases, call_tool with MCP results (cases[i] for tool "case"),
// and the docs methods with their parameters, so that the test sees what the
// sandbox sent.
type bridgeHost struct {
	cases []string
	mu    sync.Mutex
	calls []string // server.tool of each call_tool
}

func (h *bridgeHost) Call(_ context.Context, method string, params json.RawMessage) (json.RawMessage, error) {
	var p struct {
		Server    string         `json:"server"`
		Tool      string         `json:"tool"`
		Arguments map[string]any `json:"arguments"`
		Raw       bool           `json:"raw"`
	}
	_ = json.Unmarshal(params, &p) // every call here has these parameters
	switch method {
	case "list_tools":
		if p.Server != "GitHub" {
			return json.RawMessage(`[]`), nil
		}
		return json.RawMessage(`[
{"name":"getUser","alias":"getUser","description":" Get a user. ","input_schema":{"type":"object"}},
{"name":"read-file","alias":"read_file","description":"Read a file.","input_schema":{}},
{"name":"Read_File","alias":"Read_File","description":"","input_schema":{}},
{"name":"class","alias":"class_","description":"","input_schema":{}}]`), nil
	case "call_tool":
		h.mu.Lock()
		h.calls = append(h.calls, p.Server+"."+p.Tool)
		h.mu.Unlock()
		if !p.Raw {
			return nil, errors.New("the Python API asks for the MCP result")
		}
		switch p.Tool {
		case "case":
			return json.RawMessage(h.cases[int(p.Arguments["i"].(float64))]), nil
		case "getUser":
			return json.Marshal(map[string]any{"content": []any{map[string]any{"type": "text",
				"text": fmt.Sprintf(`{"login": %q}`, p.Arguments["login"])}}})
		case "class":
			return json.RawMessage(`{"content":[],"structuredContent":{"n":1}}`), nil
		}
		return json.Marshal(map[string]any{"content": []any{map[string]any{"type": "text", "text": "text of " + p.Tool}}})
	case "query_tool_docs", "search_tool_docs":
		return params, nil
	}
	return nil, fmt.Errorf("unknown method %s", method)
}

func (h *bridgeHost) Output(string, string) {}

func runWith(t *testing.T, h sandbox.Host, code string) sandbox.Result {
	t.Helper()
	rt := testutil.ProcessRuntime(t)
	res, err := rt.Run(context.Background(), sandbox.Job{ID: "b", Code: code, Servers: []string{"GitHub", "other.server"},
		Timeout: 30 * time.Second}, h)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != sandbox.StatusSuccess {
		t.Fatalf("status %s: %s%s", res.Status, res.Stdout, res.Stderr)
	}
	return res
}

// TestBridgeNames runs code written for the Python bridge
// (mcp-server-code-execution-mode): its lower-case aliases beside mcpexec's,
// its helpers, modules and globals, results that answer the MCP result's keys.
func TestBridgeNames(t *testing.T) {
	t.Parallel()
	h := &bridgeHost{}
	res := runWith(t, h, `print(mcp_GitHub is mcp_github is mcp_servers["GitHub"] is mcp_servers["github"], mcp_other_server is mcp_servers["other.server"])
u = await mcp_github.getuser(login="octocat")
print(u["login"], u["content"][0]["text"], u["isError"], u.get("structuredContent"), u.get("nope", 0), u == {"login": "octocat"})
print((await mcp_GitHub.getUser(login="x"))["login"], (await mcp_github.GETUSER(login="y"))["login"])
r = await mcp_github.read_file()
print(r, r["content"][0]["text"] == r, r.upper(), r[:4], r.mcp_result["isError"])
print(await mcp_github.read_file_2(), await mcp_github.Read_File(), await mcp_GitHub["read-file"]())
c = await call_tool("GitHub", "class")
print(c, c["structuredContent"], c["content"])
raw = await call_tool("GitHub", "getUser", {"login": "z"}, raw=True)
print(type(raw) is dict, raw["isError"], raw["content"][0]["text"])
from mcp.servers.github import getuser, TOOLS, TOOL_MAP
from mcp.servers.GitHub import getUser
import mcp.servers.github as gh
print((await getuser(login="m"))["login"], (await getUser(login="n"))["login"], sorted(TOOL_MAP), [t["alias"] for t in TOOLS])
print(sorted(gh.__all__))
print(mcp.servers.github is gh, mcp.servers.GitHub.getUser is not None, mcp.runtime is runtime)
import mcp as m2
from mcp import runtime as rt
print(m2 is mcp, rt is runtime, rt.list_servers_sync(), LOADED_MCP_SERVERS, await rt.list_servers_sync())
d = rt.describe_server("GitHub")
print(d["name"], d["alias"], d["cwd"], d["tools"][0])
print([x["name"] for x in rt.list_loaded_server_metadata()], [x["alias"] for x in list_loaded_server_metadata()])
print([x["alias"] for x in rt.list_tools_sync("GitHub")], type(list_tools_sync("GitHub")).__mro__[1].__name__)
print(issubclass(MCPError, RuntimeError))
for f in (lambda: describe_server("nope"), lambda: list_tools_sync(), lambda: query_tool_docs_sync("GitHub", 3)):
    try:
        f()
    except RuntimeError as e:
        print(type(e).__name__, e)
print(query_tool_docs("GitHub", detail=3)["detail"], query_tool_docs("GitHub", detail="FULL")["detail"], (await query_tool_docs("GitHub", "x", None))["detail"])
print(query_tool_docs_sync("GitHub", "getuser"))
print(search_tool_docs_sync("  "), search_tool_docs_sync("user", limit="many")["limit"], search_tool_docs("user", 2, "full")["detail"])
try:
    import mcp.servers.nope
except ImportError as e:
    print("ImportError", e)
print(hasattr(mcp.servers, "nope"))`)
	want := `True True
octocat {"login": "octocat"} False None 0 True
x y
text of read-file True TEXT OF READ-FILE text False
text of Read_File text of Read_File text of read-file
{'n': 1} {'n': 1} []
True False {"login": "z"}
m n ['class_', 'getuser', 'read_file', 'read_file_2'] ['getuser', 'read_file', 'read_file_2', 'class_']
['Read_File', 'class_', 'getUser', 'getuser', 'read_file', 'read_file_2']
True True True
True True ('GitHub', 'other.server') ('GitHub', 'other.server') ('GitHub', 'other.server')
GitHub github None {'name': 'getUser', 'alias': 'getuser', 'description': 'Get a user.', 'input_schema': {'type': 'object'}}
['GitHub', 'other.server'] ['github', 'other_server']
['getuser', 'read_file', 'read_file_2', 'class_'] tuple
True
MCPError Server 'nope' is not loaded (this run's servers: GitHub, other.server)
MCPError list_tools_sync(server) requires a server name
MCPError 'tool' must be a string when provided
summary full summary
[{'server': 'GitHub', 'tool': 'getuser', 'detail': 'summary'}]
[] 5 full
ImportError no MCP server 'nope' in this run; it may use: GitHub, other.server (add it to run_python's servers)
False
`
	if res.Stdout != want {
		t.Fatalf("got:\n%s\nwant:\n%s\nstderr:\n%s", res.Stdout, want, res.Stderr)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if got := strings.Join(h.calls, " "); !strings.HasPrefix(got, "GitHub.getUser GitHub.getUser GitHub.getUser GitHub.read-file GitHub.Read_File GitHub.Read_File GitHub.read-file") {
		t.Fatalf("calls %s", got)
	}
}

// TestToolValueAgrees checks the sandbox's value of a tool result is the
// front-end's (proxyresp.ToolValue, which the JavaScript API gets): Python asks
// for the MCP result and takes the value itself.
func TestToolValueAgrees(t *testing.T) {
	t.Parallel()
	text := func(s ...string) string {
		var c []any
		for _, x := range s {
			c = append(c, map[string]any{"type": "text", "text": x})
		}
		b, _ := json.Marshal(map[string]any{"content": c})
		return string(b)
	}
	cases := []string{
		text("hello"),
		text(` {"a": [1, 2]} `),
		text("42"), text("4.5"), text("true"), text("null"), text("NaN"), text("Infinity"),
		text("-7"), text(`"quoted"`), text("nul"), text("Null"), text("x1"), text(" -Infinity"),
		text("[1,", "2]"),
		text("\u00a0{\"b\": 1}\u00a0"),
		text("\x1c1"),
		text(""),
		`{"content":[],"structuredContent":{"x":1}}`,
		`{"content":[{"type":"text","text":"t"}],"structuredContent":{"x":1}}`,
		`{"content":[]}`,
		`{"content":[{"type":"image","data":"aGk=","mimeType":"image/png"}]}`,
	}
	var code strings.Builder
	code.WriteString("import json\n")
	for i := range cases {
		fmt.Fprintf(&code, "print(json.dumps(await call_tool('GitHub', 'case', {'i': %d}), sort_keys=True))\n", i)
	}
	res := runWith(t, &bridgeHost{cases: cases}, code.String())
	got := strings.Split(strings.TrimSuffix(res.Stdout, "\n"), "\n")
	if len(got) != len(cases) {
		t.Fatalf("%d lines for %d cases: %s", len(got), len(cases), res.Stdout)
	}
	for i, c := range cases {
		raw := json.RawMessage(c)
		r, err := mcp.ParseCallToolResult(&raw)
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(proxyresp.ToolValue(r))
		if err != nil {
			t.Fatal(err)
		}
		if norm(t, got[i]) != norm(t, string(want)) {
			t.Errorf("case %d %s: Python %s, Go %s", i, c, got[i], want)
		}
	}
}

// norm re-encodes JSON canonically, without an isError that is false (which the
// Python API adds, as the bridge's results have it).
func norm(t *testing.T, s string) string {
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	if m, ok := v.(map[string]any); ok && m["isError"] == false {
		delete(m, "isError")
	}
	b, _ := json.Marshal(v)
	return string(b)
}
