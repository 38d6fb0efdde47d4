package main

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mcpexec/mcpexec/internal/cli"
)

// TestTokensFilePools: the tokens file's policies take pools; a namespace
// without them inherits default_policy's; a bad pool name is a usage error.
func TestTokensFilePools(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) string { return writeTokensFile(t, dir, body) }
	f := write(`{"tokens": {"tok-gpu-0123456789": "gpu", "tok-plain-0123456789": "plain"},
		"default_policy": {"pools": ["default"]},
		"namespaces": {"gpu": {"pools": ["default", "gpu"]}, "plain": {"max_sessions": 2}}}`)
	c, err := parse([]string{"--auth-tokens-file", f}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	def, policies := c.policies()
	if !slices.Equal(def.Pools, []string{"default"}) {
		t.Fatalf("default policy pools: %v", def.Pools)
	}
	if got := policies["gpu"].Pools; !slices.Equal(got, []string{"default", "gpu"}) {
		t.Fatalf("gpu pools: %v", got)
	}
	if got := policies["plain"].Pools; !slices.Equal(got, []string{"default"}) {
		t.Fatalf("plain inherits pools: %v", got)
	}
	f = write(`{"tokens": {"tok-gpu-0123456789": "gpu"}, "namespaces": {"gpu": {"pools": ["no pool"]}}}`)
	_, err = parse([]string{"--auth-tokens-file", f}, io.Discard)
	if cli.ExitCode(err) != cli.ExitUsage || !strings.Contains(err.Error(), `pool "no pool"`) {
		t.Fatalf("bad pool name: %v", err)
	}
}

// TestTokensFileToolRules: a policy's tool rules are inherited like its other
// fields, and a bad verdict or glob stops the front-end, naming the
// namespace and the rule.
func TestTokensFileToolRules(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) string { return writeTokensFile(t, dir, body) }
	f := write(`{"tokens": {"tok-a-0123456789": "a", "tok-b-0123456789": "b"},
		"default_policy": {"tools": {"*/*": "ask"}, "approval_timeout": 120},
		"namespaces": {"a": {"tools": {"github/delete_*": "deny"}, "tool_defaults": {"destructive": "deny"}}, "b": {"max_sessions": 2}}}`)
	c, err := parse([]string{"--auth-tokens-file", f}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	_, policies := c.policies()
	if a := policies["a"]; a.Tools["github/delete_*"] != "deny" || a.Tools["*/*"] != "" || a.ToolDefaults.Destructive != "deny" || a.ApprovalTimeout != 120 {
		t.Fatalf("a: %+v", a)
	}
	if b := policies["b"]; b.Tools["*/*"] != "ask" || b.ApprovalTimeout != 120 {
		t.Fatalf("b inherits the rules: %+v", b)
	}
	for body, want := range map[string]string{
		`{"namespaces": {"a": {"tools": {"github/x": "maybe"}}}}`:      `namespace "a": policy tools rule "github/x": verdict "maybe"`,
		`{"namespaces": {"a": {"tools": {"github/[x": "deny"}}}}`:      `namespace "a": policy tools rule "github/[x": bad glob "[x"`,
		`{"namespaces": {"a": {"tools": {"github": "deny"}}}}`:         `want "server/tool"`,
		`{"default_policy": {"tool_defaults": {"read_only": "sure"}}}`: `default_policy: policy tool_defaults.read_only: verdict "sure"`,
		`{"namespaces": {"a": {"approval_timeout": 7200}}}`:            `approval_timeout 7200 is over 3600`,
		`{"namespaces": {"a": {"max_pending_approvals": -1}}}`:         `must not be negative`,
	} {
		body = `{"tokens": {"tok-a-0123456789": "a"}, ` + body[1:]
		_, err := parse([]string{"--auth-tokens-file", write(body)}, io.Discard)
		if cli.ExitCode(err) != cli.ExitUsage || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", body, err, want)
		}
	}
}

// writeTokensFile writes body as dir's tokens file and returns its path.
func writeTokensFile(t *testing.T, dir, body string) string {
	t.Helper()
	f := filepath.Join(dir, "tokens.json")
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}
