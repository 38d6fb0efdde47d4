package main

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcpexec/mcpexec/internal/cli"
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
		{[]string{"--memory", "lots"}, "--memory"},
		{[]string{"--container-user", "nobody"}, "numeric uid:gid"},
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
	t.Setenv("MCP_BRIDGE_MEMORY", "1g")
	c, err = parse([]string{"--slots", "1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := c.sandbox.Limits(); l.Memory != 1<<30 {
		t.Fatalf("MCP_BRIDGE_MEMORY not honoured: %d", l.Memory)
	}
}

// TestEmbeddedStdio runs the front-end's main as a desktop client would: no
// --nats (embedded broker and worker, real Podman), MCP on stdio.
func TestEmbeddedStdio(t *testing.T) {
	podmantest.New(t, podmanConfigForProbe()) // skips (or fails in CI) without Podman
	dir := t.TempDir()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--data", filepath.Join(dir, "data"), "--pool", "1", "--worker-id", "test-embedded-stdio"}, inR, outW, testLogWriter(t))
		_ = outW.Close() // a pipe: closing only ends the other side's reads
	}()
	c := client.NewClient(transport.NewIO(outR, inW, nil))
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "stdio-test", Version: "0"}
	ictx, icancel := context.WithTimeout(ctx, 3*time.Minute)
	defer icancel()
	if _, err := c.Initialize(ictx, init); err != nil {
		t.Fatalf("initialize: %v", err)
	}
	res := testutil.CallRunPython(t, c, map[string]any{"code": "print(6*7)"})
	if res.IsError || testutil.Text(res) != "42" {
		t.Fatalf("isError=%v text=%q", res.IsError, testutil.Text(res))
	}
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
