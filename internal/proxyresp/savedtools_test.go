package proxyresp_test

import (
	"strings"
	"testing"

	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/proxyresp"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

func TestSavedToolChecks(t *testing.T) {
	for _, name := range []string{"f", "_x", "fetch_all2", "match", strings.Repeat("a", proxyresp.MaxSavedToolName)} {
		if err := proxyresp.CheckSavedToolName(name); err != nil {
			t.Errorf("%q: %v", name, err)
		}
	}
	for _, name := range []string{"", "2x", "a-b", "a b", "class", "None", "é", "a.b", strings.Repeat("a", proxyresp.MaxSavedToolName+1)} {
		if err := proxyresp.CheckSavedToolName(name); err == nil {
			t.Errorf("%q accepted", name)
		}
	}
	if err := proxyresp.CheckSavedToolSource("def f(): pass"); err != nil {
		t.Error(err)
	}
	for _, src := range []string{"", " \n", strings.Repeat("#", proxyresp.MaxSavedToolSource+1)} {
		if err := proxyresp.CheckSavedToolSource(src); err == nil {
			t.Errorf("source of %d bytes accepted", len(src))
		}
	}
}

// TestSavedTools saves a function in one job and uses it in later ones, lists
// and deletes it, reports a broken one without failing the job, holds the
// host's checks and caps, and keeps namespaces apart.
func TestSavedTools(t *testing.T) {
	t.Parallel()
	s := setup(t, t.TempDir(), frontend.Config{}, testutil.TestServerDef(t, "ts", nil))
	got := mustRun(t, s.C, `
import json

@staticmethod
def _unused(): pass

def double(x):
    """Twice x."""
    return helper(x) * 2

def helper(x):
    return x

print(save_tool(helper))
print(save_tool(double))
print(save_tool(double))`)
	if want := "Tool 'helper' saved. It will be available in future runs of this namespace.\n" +
		"Tool 'double' saved. It will be available in future runs of this namespace.\n" +
		"Tool 'double' replaced. It will be available in future runs of this namespace."; got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
	// A later job uses them by name, and through the bridge's module.
	if got := mustRun(t, s.C, `print(double(21), double.__doc__)
from user_tools import helper
print(helper("x"))`); got != "42 Twice x.\nx" {
		t.Fatalf("later job: %q", got)
	}
	// A job that names none of them does not load them.
	if got := mustRun(t, s.C, `x = 1
print(x, "double" in globals())`); got != "1 False" {
		t.Fatalf("job without saved tools: %q", got)
	}
	if got := mustRun(t, s.C, `print([(t["name"], t["source"].splitlines()[0]) for t in list_saved_tools()])`); got != "[('double', 'def double(x):'), ('helper', 'def helper(x):')]" {
		t.Fatalf("list: %q", got)
	}

	// A broken saved tool (its source raises when defined) is reported; the
	// job runs, with the other tools.
	got = mustRun(t, s.C, `exec("def broken():\n    pass\n")
print(save_tool(broken, source="raise RuntimeError('boom')\ndef broken(): pass\n"))`)
	if !strings.Contains(got, "'broken' saved") {
		t.Fatalf("save broken: %q", got)
	}
	out, st := run(t, s.C, `print(double(2))
print("broken" in globals())`)
	if st.Status != "success" || !strings.Contains(out, "4\nFalse") || !strings.Contains(out, "saved tool broken failed to load") ||
		!strings.Contains(out, "RuntimeError: boom") {
		t.Fatalf("broken tool: %s %q", st.Status, out)
	}
	if got := mustRun(t, s.C, `print(delete_saved_tool("broken"), delete_saved_tool("broken"), [t["name"] for t in list_saved_tools()])`); got != "True False ['double', 'helper']" {
		t.Fatalf("delete: %q", got)
	}

	// The host's checks: names, sizes, the count cap, the reserved memory key.
	for code, want := range map[string]string{
		`save_tool(double, source="x" * 70000)`:          "over the 65536-byte limit",
		`exec("def f(): pass"); save_tool(f, source="")`: "source is empty",
		`save_tool(lambda: 1)`:                           "lambda",
		`print(load_memory("__mcpexec_saved_tools__"))`:  "reserved",
		`save_memory("__mcpexec_saved_tools__", {})`:     "reserved",
	} {
		out, st := run(t, s.C, code)
		if st.Status == "success" || !strings.Contains(out, want) {
			t.Errorf("%s: %s %q, want an error with %q", code, st.Status, out, want)
		}
	}
	out, st = run(t, s.C, `
for i in range(120):
    exec("def t%d(): return %d" % (i, i))
    try:
        save_tool(globals()["t%d" % i], source="def t%d(): return %d\n" % (i, i))
    except MCPError as e:
        print(i, e)
        break
print(len(list_saved_tools()), [k["key"] for k in list_memories()])`)
	if st.Status != "success" || !strings.Contains(out, "98 namespace \"default\" already has 100 saved tools") || !strings.HasSuffix(out, "100 []") {
		t.Fatalf("count cap: %s %q", st.Status, out)
	}

	// Another namespace sees none of them.
	tokens := map[string]string{"token-alice-123": "alice"}
	alice := testutil.MCPClientWith(t, s.FE, mcpserver.Options{Namespace: httpauth.Namespace}, mcpserver.HTTPOptions{Auth: httpauth.New(httpauth.Config{Tokens: tokens})},
		transportHeader("Bearer token-alice-123"))
	out, st = run(t, alice, `print(list_saved_tools())
double(1)`)
	if st.Status == "success" || !strings.Contains(out, "[]") || !strings.Contains(out, "NameError") {
		t.Fatalf("alice: %s %q", st.Status, out)
	}
}
