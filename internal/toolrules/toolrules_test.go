package toolrules_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/mcpexec/mcpexec/internal/toolrules"
)

func ptr(b bool) *bool { return &b }

func TestDecide(t *testing.T) {
	t.Parallel()
	r, err := toolrules.Compile(map[string]string{
		"github/search_*":      "allow",
		"github/delete_*":      "deny",
		"github/delete_branch": "ask",
		"*/*":                  "ask",
		"github/*":             "allow",
		"*/delete_repository":  "deny",
		"fs/read_?ile":         "allow",
		"fs/[a-c]*":            "deny",
		"fs/*":                 "ask",
	}, &toolrules.Defaults{Other: "deny"})
	if err != nil {
		t.Fatal(err)
	}
	noHints := func() (toolrules.Hints, error) {
		t.Fatal("hints read though a rule matched")
		return toolrules.Hints{}, nil
	}
	for _, c := range []struct{ server, tool, rule string }{
		{"github", "search_issues", "github/search_*"},
		{"github", "delete_repo", "github/delete_*"},
		{"github", "delete_branch", "github/delete_branch"},    // exact beats globs
		{"github", "delete_repository", "*/delete_repository"}, // one wildcard each: more literals win
		{"github", "create_issue", "github/*"},
		{"slack", "post", "*/*"},
		{"fs", "read_file", "fs/read_?ile"},
		{"fs", "bad", "fs/[a-c]*"}, // one star each: the class fixes one more character
		{"fs", "zap", "fs/*"},
	} {
		d := r.Decide(c.server, c.tool, noHints)
		if d.Rule != c.rule {
			t.Errorf("%s/%s: rule %q, want %q", c.server, c.tool, d.Rule, c.rule)
		}
	}
	if d := r.Decide("github", "search_x", noHints); d.Verdict != toolrules.Allow {
		t.Errorf("verdict %v", d)
	}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	r, err := toolrules.Compile(map[string]string{"ts/echo": "allow"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		h    toolrules.Hints
		want toolrules.Decision
	}{
		{toolrules.Hints{Destructive: ptr(true)}, toolrules.Decision{Verdict: toolrules.Ask, Rule: "tool_defaults.destructive"}},
		{toolrules.Hints{Destructive: ptr(true), ReadOnly: ptr(true)}, toolrules.Decision{Verdict: toolrules.Allow, Rule: "tool_defaults.read_only"}},
		{toolrules.Hints{Destructive: ptr(false)}, toolrules.Decision{Verdict: toolrules.Allow, Rule: "tool_defaults.other"}},
		{toolrules.Hints{}, toolrules.Decision{Verdict: toolrules.Allow, Rule: "tool_defaults.other"}},
	} {
		if got := r.Decide("ts", "x", func() (toolrules.Hints, error) { return c.h, nil }); got != c.want {
			t.Errorf("%+v: %+v, want %+v", c.h, got, c.want)
		}
	}
	// Annotations that cannot be read count as destructive.
	if got := r.Decide("ts", "x", func() (toolrules.Hints, error) { return toolrules.Hints{}, errors.New("down") }); got.Verdict != toolrules.Ask {
		t.Errorf("unreadable hints: %+v", got)
	}
	// No rules and no defaults: nil, which allows everything.
	none, err := toolrules.Compile(nil, nil)
	if err != nil || none != nil {
		t.Fatalf("empty: %v %v", none, err)
	}
	if d := none.Decide("a", "b", nil); d.Verdict != toolrules.Allow {
		t.Fatalf("nil rules: %+v", d)
	}
}

func TestCompileErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		rules map[string]string
		def   *toolrules.Defaults
		want  string
	}{
		{map[string]string{"github/x": "maybe"}, nil, `tools rule "github/x": verdict "maybe"`},
		{map[string]string{"github": "allow"}, nil, `tools rule "github": want "server/tool"`},
		{map[string]string{"/x": "allow"}, nil, `tools rule "/x"`},
		{map[string]string{"gh/[a-": "deny"}, nil, `tools rule "gh/[a-": bad glob "[a-"`},
		{nil, &toolrules.Defaults{Destructive: "yes"}, `tool_defaults.destructive: verdict "yes"`},
	} {
		_, err := toolrules.Compile(c.rules, c.def)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %v: %v, want %q", c.rules, c.def, err, c.want)
		}
	}
}

func BenchmarkDecide(b *testing.B) {
	r, _ := toolrules.Compile(map[string]string{"github/search_*": "allow", "github/delete_*": "deny", "*/*": "ask", "ts/echo": "allow"}, nil)
	for range b.N {
		r.Decide("github", "search_issues", nil)
	}
}
