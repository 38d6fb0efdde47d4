package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman/podmantest"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

func TestBadFlagsExitTwo(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--no-such-flag"}, "flag provided but not defined"},
		{[]string{"--http", "0.0.0.0:8080"}, "set --auth-token"},
		{[]string{"--http", "nonsense"}, "want HOST:PORT"},
		{[]string{"--timeout", "200"}, "must be between 1 and --max-timeout"},
		{[]string{"--slots", "0"}, "--slots must be at least 1"},
		{[]string{"--queued-max-age", "1s"}, "queue QueuedMaxAge (1s) must be at least DedupeWindow"},
		{[]string{"--audit-retention", "1m"}, "--audit-retention 1m0s: queue AuditMaxAge (the audit retention, 1m0s) must be at least DedupeWindow"},
		{[]string{"--memory", "lots"}, "--memory"},
		{[]string{"--container-user", "nobody"}, "numeric uid:gid"},
		{[]string{"--sync", "sometimes"}, "want always or interval:D"},
		{[]string{"--sync", "interval:0s"}, "positive duration"},
		{[]string{"--oauth-issuer", "https://as.example"}, "set --http too"},
		{[]string{"--http", "0.0.0.0:8080", "--oauth-issuer", "https://as.example"}, "--oauth-audience"},
		{[]string{"--http", "127.0.0.1:8080", "--oauth-issuer", "as.example"}, "not an issuer URL"},
		{[]string{"--http", "127.0.0.1:8080", "--oauth-issuer", "https://as.example", "--oauth-client-id", "rs"}, "set both"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stderr bytes.Buffer
			err := run(context.Background(), tc.args, strings.NewReader(""), io.Discard, &stderr)
			if code := cli.ExitCode(err); code != cli.ExitUsage {
				t.Fatalf("exit code %d (err %v), want %d", code, err, cli.ExitUsage)
			}
			if !strings.Contains(err.Error()+stderr.String(), tc.want) {
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

func TestEnvironmentConfiguresFlags(t *testing.T) {
	t.Setenv("MCPEXEC_SLOTS", "0")
	err := run(context.Background(), nil, strings.NewReader(""), io.Discard, io.Discard)
	if cli.ExitCode(err) != cli.ExitUsage || !strings.Contains(err.Error(), "--slots") {
		t.Fatalf("MCPEXEC_SLOTS=0 not applied: %v", err)
	}
	// Flags win over the environment.
	c, err := parse([]string{"--slots", "3"}, io.Discard)
	if err != nil || c.slots != 3 {
		t.Fatalf("flag did not win: %v %+v", err, c)
	}
	if c.sync.String() != "always" {
		t.Fatalf("the embedded broker's sync policy is %s by default, want always", c.sync)
	}
	t.Setenv("MCPEXEC_SYNC", "interval:10s")
	if c, err = parse([]string{"--slots", "3"}, io.Discard); err != nil || c.sync.Interval != 10*time.Second {
		t.Fatalf("MCPEXEC_SYNC not applied: %v %v", err, c.sync)
	}
	t.Setenv("MCP_BRIDGE_MEMORY", "1g")
	c, err = parse([]string{"--slots", "1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := c.sandbox.Limits(); l.Memory != 1<<30 {
		t.Fatalf("MCP_BRIDGE_MEMORY not honoured: %d", l.Memory)
	}
}

// startStdio runs the front-end's main with args, MCP on a pair of pipes, and
// returns a started client on them (onNotification, unless nil, hears the
// notifications) and stop, which cancels the front-end and fails the test
// unless it exits cleanly within 60s.
func startStdio(t *testing.T, args []string, onNotification func(mcp.JSONRPCNotification)) (context.Context, *client.Client, func()) {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, args, inR, outW, testLogWriter(t))
		_ = outW.Close() // a pipe: closing only ends the other side's reads
	}()
	c := client.NewClient(transport.NewIO(outR, inW, nil))
	if onNotification != nil {
		c.OnNotification(onNotification)
	}
	if err := c.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	stop := func() {
		t.Helper()
		cancel()
		_ = inW.Close() // a pipe: closing only ends the other side's reads
		select {
		case err := <-done:
			if cli.ExitCode(err) != cli.ExitOK {
				t.Fatalf("front-end exited with %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("front-end did not stop within 60s of cancellation")
		}
	}
	return ctx, c, stop
}

// podmanHome needs Podman (it skips, or fails in CI, without) and makes a
// temporary HOME with no config in it, for a front-end run as a user would.
func podmanHome(t *testing.T) string {
	t.Helper()
	podmantest.New(t, podmanConfigForProbe())
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", "")
	t.Setenv("MCP_SERVERS_CONFIG", "")
	return home
}

// initialize sends c's MCP initialize as the client name.
func initialize(ctx context.Context, c *client.Client, name string) error {
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: name, Version: "0"}
	_, err := c.Initialize(ctx, init)
	return err
}

// TestEmbeddedStdio runs the front-end's main as a desktop client would: no
// --nats (embedded broker and worker, real Podman), MCP on stdio.
func TestEmbeddedStdio(t *testing.T) {
	podmantest.New(t, podmanConfigForProbe()) // skips (or fails in CI) without Podman
	dir := t.TempDir()
	ctx, c, stop := startStdio(t, []string{"--data", filepath.Join(dir, "data"), "--pool", "1", "--worker-id", "test-embedded-stdio"}, nil)
	ictx, icancel := context.WithTimeout(ctx, 3*time.Minute)
	defer icancel()
	if err := initialize(ictx, c, "stdio-test"); err != nil {
		t.Fatalf("initialize: %v", err)
	}
	res := testutil.CallRunPython(t, c, map[string]any{"code": "print(6*7)"})
	if res.IsError || testutil.Text(res) != "42" {
		t.Fatalf("isError=%v text=%q", res.IsError, testutil.Text(res))
	}
	stop()
}

// TestStartsWithoutPodman: with no Podman on PATH (and no socket), the
// front-end still answers initialize and tools/list at once, and run_python
// says what is missing and the command that fixes it, while the start is
// retried in the background.
func TestStartsWithoutPodman(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	dir := t.TempDir()
	ctx, c, stop := startStdio(t, []string{"--data", filepath.Join(dir, "data"), "--podman", "unix://" + filepath.Join(dir, "no.sock"),
		"--discover=false", "--worker-id", "test-no-podman"}, nil)
	start := time.Now()
	if err := initialize(ctx, c, "no-podman"); err != nil {
		t.Fatalf("initialize: %v", err)
	}
	initialized := time.Since(start)
	tools, err := c.ListTools(ctx, mcp.ListToolsRequest{})
	if err != nil || len(tools.Tools) == 0 || tools.Tools[0].Name != "run_python" {
		t.Fatalf("tools/list: %v %+v", err, tools)
	}
	t.Logf("FIGURE without Podman: initialize answered in %s, tools/list %s after the start", initialized, time.Since(start))
	res := testutil.CallRunPython(t, c, map[string]any{"code": "print(1)"})
	if text := testutil.Text(res); !res.IsError || !strings.Contains(text, "not ready") || !strings.Contains(text, "apt-get install podman") {
		t.Fatalf("run_python without Podman: isError=%v %q", res.IsError, text)
	}
	stop()
}

// TestServersConfigWatched: with HOME holding only ~/MCPs (the seed bridge's
// config directory), a server file added while the front-end runs is
// proxied without a restart: clients hear notifications/tools/list_changed,
// the servers enum names it, and code calls it; removing the file removes it.
func TestServersConfigWatched(t *testing.T) {
	home := podmanHome(t)
	mcps := filepath.Join(home, "MCPs")
	if err := os.MkdirAll(mcps, 0o755); err != nil {
		t.Fatal(err)
	}
	def := testutil.TestServerDef(t, "ts", nil)
	changed := make(chan struct{}, 8)
	ctx, c, stop := startStdio(t, []string{"--data", filepath.Join(home, "data"), "--pool", "1", "--worker-id", "test-watch"}, func(n mcp.JSONRPCNotification) {
		if n.Method == string(mcp.MethodNotificationToolsListChanged) {
			changed <- struct{}{}
		}
	})
	if err := initialize(ctx, c, "watch-test"); err != nil {
		t.Fatalf("initialize: %v", err)
	}
	enum := func() string { return testutil.ServersEnum(t, c) }
	if strings.Contains(enum(), `"ts"`) {
		t.Fatal("ts is offered before its file exists")
	}
	body, _ := json.Marshal(map[string]any{"description": "test tools", "mcpServers": map[string]any{"ts": map[string]any{"command": def.Command, "args": def.Args}}}) // plain values encode
	if err := os.WriteFile(filepath.Join(mcps, "ts.json"), body, 0o644); err != nil {
		t.Fatal(err)
	}
	// Each change of the tools is announced (the embedded worker's
	// languages may come first): wait for the one that names ts.
	for deadline := time.After(30 * time.Second); !strings.Contains(enum(), `"ts"`); {
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no notifications/tools/list_changed with ts in the servers enum after its file was added: %s", enum())
		}
	}
	res := testutil.CallRunPython(t, c, map[string]any{"code": "print(await mcp_ts.echo(text='added live'))", "servers": []string{"ts"}})
	if res.IsError || testutil.Text(res) != "added live" {
		t.Fatalf("call of the new server: isError=%v %q", res.IsError, testutil.Text(res))
	}
	if err := os.Remove(filepath.Join(mcps, "ts.json")); err != nil {
		t.Fatal(err)
	}
	for deadline := time.After(30 * time.Second); strings.Contains(enum(), `"ts"`); {
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("ts is still in the servers enum after its file was removed: %s", enum())
		}
	}
	res = testutil.CallRunPython(t, c, map[string]any{"code": "print(1)", "servers": []string{"ts"}})
	if !res.IsError || !strings.Contains(testutil.Text(res), "not a proxied MCP server") {
		t.Fatalf("a removed server: isError=%v %q", res.IsError, testutil.Text(res))
	}
	stop()
}

// TestBridgeSettings: the seed bridge's MCP_BRIDGE_* settings are honoured
// with its values (compact output, Python level names, the state dir), and
// one mcpexec replaces is logged with what replaces it.
func TestBridgeSettings(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("MCP_BRIDGE_OUTPUT_MODE", "compact")
	t.Setenv("MCP_BRIDGE_LOG_LEVEL", "WARNING")
	t.Setenv("MCP_BRIDGE_STATE_DIR", dir)
	c, err := parse(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.servers.outputMode != mcpserver.OutputText || c.level != "warn" || c.data != dir {
		t.Fatalf("output %q level %q data %q", c.servers.outputMode, c.level, c.data)
	}
	t.Setenv("MCP_BRIDGE_OUTPUT_MODE", "toon")
	if c, err := parse(nil, io.Discard); err != nil || c.servers.outputMode != mcpserver.OutputTOON {
		t.Fatalf("toon: %v", err)
	}
	t.Setenv("MCP_BRIDGE_RUNTIME_IDLE_TIMEOUT", "300")
	var buf strings.Builder
	logReplacedSettings(slog.New(slog.NewTextHandler(&buf, nil)))
	if !strings.Contains(buf.String(), "MCP_BRIDGE_RUNTIME_IDLE_TIMEOUT") || !strings.Contains(buf.String(), "--pool") {
		t.Fatalf("replaced setting not logged: %s", buf.String())
	}
}
