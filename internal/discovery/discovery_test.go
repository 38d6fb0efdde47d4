package discovery

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func write(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func names(ss []Server) string {
	var n []string
	for _, s := range ss {
		n = append(n, s.Name+"@"+filepath.Base(s.Source))
	}
	return strings.Join(n, ",")
}

// TestDiscoverLocations lays out every supported location under a fake home and
// project dir and checks what is found, in which order, and what is reported.
func TestDiscoverLocations(t *testing.T) {
	home, cwd, other := t.TempDir(), t.TempDir(), t.TempDir()
	explicit := filepath.Join(other, "explicit.json")
	write(t, explicit, `{"mcpServers": {"fs": {"command": "fs-explicit"}}}`)
	envFile := filepath.Join(other, "env.json")
	write(t, envFile, `{"mcpServers": {"env-only": {"command": "e"}, "fs": {"command": "fs-env"}}}`)
	write(t, filepath.Join(home, ".claude.json"), `{"mcpServers": {"claude": {"command": "c"}},
		"projects": {"`+cwd+`": {"mcpServers": {"proj": {"command": "p"}}}, "/elsewhere": {"mcpServers": {"nope": {"command": "n"}}}}}`)
	write(t, filepath.Join(home, ".config", "Claude", "claude_desktop_config.json"), `{"mcpServers": {"desktop": {"command": "d", "args": ["-x"], "env": {"K": "${HOME_VAR}"}}}}`)
	write(t, filepath.Join(home, ".cursor", "mcp.json"), `{"mcpServers": {"cursor": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ${TOKEN:-none}"}}}}`)
	write(t, filepath.Join(home, ".config", "Code", "User", "mcp.json"), `{"servers": {"vscode": {"type": "stdio", "command": "v"}, "remote": {"type": "sse", "url": "http://h/sse"}}}`)
	write(t, filepath.Join(home, ".config", "mcp", "servers", "a.json"), `{"mcpServers": {"shared": {"command": "s", "description": "shared one"}}}`)
	write(t, filepath.Join(home, ".config", "mcp", "servers", "b.json"), `{not json`)
	write(t, filepath.Join(cwd, "mcp-servers", "local.json"), `{"mcpServers": {"local": {"command": "l"}, "bad": {"args": ["no command"]}, "self": {"command": "npx", "args": ["mcpexec"]}}}`)
	write(t, filepath.Join(cwd, ".vscode", "mcp.json"), `{"servers": {"claude": {"command": "shadowed-by-project-file-order"}}}`)

	env := map[string]string{"HOME_VAR": "expanded"}
	res := Discover(Options{
		Files:     []string{explicit, filepath.Join(other, "missing.json")},
		EnvConfig: envFile,
		Home:      home,
		Cwd:       cwd,
		Policy:    Policy{Deny: []string{"nope*"}},
		LookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
	})
	want := "fs@explicit.json,env-only@env.json,claude@mcp.json,local@local.json,proj@.claude.json,desktop@claude_desktop_config.json,cursor@mcp.json,remote@mcp.json,vscode@mcp.json,shared@a.json"
	if got := names(res.Servers); got != want {
		t.Fatalf("servers\n got %s\nwant %s", got, want)
	}
	byName := map[string]Server{}
	for _, s := range res.Servers {
		byName[s.Name] = s
	}
	if s := byName["fs"]; s.Command != "fs-explicit" {
		t.Errorf("first definition should win: %+v", s)
	}
	if s := byName["desktop"]; s.Env["K"] != "expanded" || s.Args[0] != "-x" || s.Type != "stdio" {
		t.Errorf("desktop %+v", s)
	}
	if s := byName["cursor"]; s.Type != "http" || s.Headers["Authorization"] != "Bearer none" || !s.Remote() {
		t.Errorf("cursor %+v", s)
	}
	if s := byName["remote"]; s.Type != "sse" {
		t.Errorf("remote %+v", s)
	}
	if s := byName["shared"]; s.Description != "shared one" {
		t.Errorf("shared %+v", s)
	}
	var problems []string
	for _, p := range res.Problems {
		problems = append(problems, p.Error())
	}
	all := strings.Join(problems, "\n")
	for _, want := range []string{"missing.json: cannot read it", "b.json: not valid JSON", `local.json: server "bad": needs "command"`} {
		if !strings.Contains(all, want) {
			t.Errorf("problems lack %q:\n%s", want, all)
		}
	}
	if len(res.Problems) != 3 {
		t.Errorf("want 3 problems, got:\n%s", all)
	}
	var skipped []string
	for _, s := range res.Skipped {
		skipped = append(skipped, s.Name+": "+s.Reason)
	}
	if len(skipped) != 1 || !strings.HasPrefix(skipped[0], "self: it launches mcpexec") {
		t.Errorf("skipped %v", skipped)
	}
}

func TestDiscoverSkipsOwnBinary(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "frontend")
	write(t, self, "#!/bin/sh\n")
	cfg := filepath.Join(dir, "c.json")
	write(t, cfg, `{"mcpServers": {"me": {"command": "`+self+`", "args": ["--servers", "x"]}, "other": {"command": "true"}}}`)
	res := Discover(Options{Files: []string{cfg}, Self: self})
	if names(res.Servers) != "other@c.json" || len(res.Skipped) != 1 || res.Skipped[0].Name != "me" {
		t.Fatalf("servers %s skipped %+v", names(res.Servers), res.Skipped)
	}
}

func TestDiscoverNoRootsReadsNothing(t *testing.T) {
	res := Discover(Options{})
	if len(res.Servers)+len(res.Problems)+len(res.Skipped) != 0 {
		t.Fatalf("%+v", res)
	}
}

func TestParseEntries(t *testing.T) {
	cases := []struct {
		name, body, problem string
	}{
		{"BothCommandAndURL", `{"mcpServers": {"x": {"command": "a", "url": "http://h"}}}`, "either"},
		{"BadURL", `{"mcpServers": {"x": {"url": "ftp://h"}}}`, "must start with http"},
		{"BadName", `{"mcpServers": {"bad name": {"command": "a"}}}`, "name must be"},
		{"NotAnObject", `{"mcpServers": []}`, "not an object"},
		{"NoServers", `{"other": 1}`, `no "mcpServers"`},
		{"RemoteWithStdioType", `{"mcpServers": {"x": {"type": "http", "command": "a"}}}`, "needs a \"url\""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, problems := Parse([]byte(tc.body), "f.json", "")
			if len(problems) != 1 || !strings.Contains(problems[0].Error(), tc.problem) {
				t.Fatalf("problems %v, want %q", problems, tc.problem)
			}
		})
	}
	servers, problems := Parse([]byte(`{"mcpServers": {"off": {"command": "a", "disabled": true}, "on": {"command": "b"}}}`), "f", "")
	if len(problems) != 0 || len(servers) != 1 || servers[0].Name != "on" {
		t.Fatalf("disabled: %v %v", servers, problems)
	}
}

func TestPolicy(t *testing.T) {
	p := Policy{Allow: []string{"fs-*", "github"}, Deny: []string{"fs-secret"}}
	for name, want := range map[string]bool{"fs-home": true, "github": true, "fs-secret": false, "slack": false} {
		if got := p.Allowed(name); got != want {
			t.Errorf("Allowed(%q) = %v", name, got)
		}
	}
	if !(Policy{}).Allowed("anything") {
		t.Error("empty policy denies")
	}
	if err := (Policy{Allow: []string{"["}}).Validate(); err == nil {
		t.Error("bad glob accepted")
	}
}

// TestBridgeDirectoryAndWatch: ~/MCPs/*.json (the seed bridge's directory)
// is read, a file's "description" is its servers' default, and Watch
// reports a file added, changed and removed.
func TestBridgeDirectoryAndWatch(t *testing.T) {
	home := t.TempDir()
	dir := filepath.Join(home, "MCPs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.json", `{"description": "files of the project", "mcpServers": {"fs": {"command": "fs-server"}, "git": {"command": "git-server", "description": "its own"}}}`)
	o := Options{Home: home}
	since := Fingerprint(o)
	res := Discover(o)
	if len(res.Servers) != 2 || res.Servers[0].Name != "fs" || res.Servers[0].Description != "files of the project" || res.Servers[1].Description != "its own" {
		t.Fatalf("servers %+v problems %v", res.Servers, res.Problems)
	}
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan Result, 8)
	done := make(chan struct{})
	go func() {
		defer close(done)
		Watch(ctx, o, since, 10*time.Millisecond, func(r Result) { got <- r })
	}()
	defer func() { cancel(); <-done }()
	next := func(want int) Result {
		t.Helper()
		select {
		case r := <-got:
			if len(r.Servers) != want {
				t.Fatalf("after the change: %d servers, want %d: %+v", len(r.Servers), want, r.Servers)
			}
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("the change was not seen")
		}
		return Result{}
	}
	write("b.json", `{"mcpServers": {"web": {"url": "https://example.invalid/mcp"}}}`)
	next(3)
	write("b.json", `{"mcpServers": {"web": {"url": "https://example.invalid/mcp2"}, "db": {"command": "db-server"}}}`)
	if r := next(4); r.Servers[2].URL != "https://example.invalid/mcp2" && r.Servers[3].URL != "https://example.invalid/mcp2" {
		t.Fatalf("changed url not read: %+v", r.Servers)
	}
	if err := os.Remove(filepath.Join(dir, "a.json")); err != nil {
		t.Fatal(err)
	}
	next(2)
}

// TestCatalogFiles: catalog files are read last and their servers marked;
// a name configured elsewhere is not a catalog server; the policy applies;
// the watcher's fingerprint covers them.
func TestCatalogFiles(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "servers.json")
	write(t, cfg, `{"mcpServers": {"fs": {"command": "fs"}}}`)
	cat := filepath.Join(dir, "catalog.json")
	write(t, cat, `{"mcpServers": {"weather": {"command": "w", "description": "forecasts"}, "fs": {"command": "other"}, "secret": {"command": "s"}}}`)
	o := Options{Files: []string{cfg}, Catalog: []string{cat}, Policy: Policy{Deny: []string{"secret"}}}
	res := Discover(o)
	var got []string
	for _, s := range res.Servers {
		got = append(got, s.Name+"="+s.Command+map[bool]string{true: ":catalog"}[s.Catalog])
	}
	if strings.Join(got, ",") != "fs=fs,weather=w:catalog" {
		t.Fatalf("servers %v", got)
	}
	var skipped []string
	for _, s := range res.Skipped {
		skipped = append(skipped, s.Name+": "+s.Reason)
	}
	if len(skipped) != 2 || !strings.Contains(skipped[0]+skipped[1], "fs: defined earlier") || !strings.Contains(skipped[0]+skipped[1], "secret: denied") {
		t.Fatalf("skipped %v", skipped)
	}
	before := Fingerprint(o)
	write(t, cat, `{"mcpServers": {"weather": {"command": "w2"}}}`)
	if Fingerprint(o) == before {
		t.Fatal("the fingerprint does not cover the catalog file")
	}
	if res := Discover(Options{Catalog: []string{filepath.Join(dir, "missing.json")}}); len(res.Problems) != 1 {
		t.Fatalf("a missing catalog file is not a problem: %+v", res)
	}
}
