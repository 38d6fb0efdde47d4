// Package testutil starts real parts for tests: an in-process broker with
// JetStream and bbolt in a temp dir, workers, front-ends, and MCP clients.
package testutil

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// Logger returns a logger that writes to the test log when -v is given.
func Logger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// Broker starts a broker with a TCP listener on a free loopback port in dir
// (t.TempDir() when dir is "").
func Broker(t testing.TB, dir string, qcfg queue.Config) *broker.Broker {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	b, err := broker.Start(context.Background(), broker.Config{DataDir: dir, Listen: "127.0.0.1:-1", Queue: qcfg, Logger: Logger(t)})
	if err != nil {
		t.Fatalf("start broker: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// Connect opens a TCP client connection to b, as a separate process would.
func Connect(t testing.TB, b *broker.Broker, name string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(b.ClientURL(), nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatalf("connect %s: %v", name, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Worker starts a worker on rt connected to b.
func Worker(t testing.TB, b *broker.Broker, rt sandbox.Runtime, cfg worker.Config) *worker.Worker {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = Logger(t)
	}
	w, err := worker.New(Connect(t, b, "worker-"+cfg.ID), rt, cfg)
	if err != nil {
		t.Fatalf("new worker: %v", err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatalf("start worker: %v", err)
	}
	t.Cleanup(w.Stop)
	return w
}

// Frontend starts a front-end with id connected to b.
func Frontend(t testing.TB, b *broker.Broker, id string) *frontend.Frontend {
	t.Helper()
	fe, err := frontend.New(Connect(t, b, "frontend-"+id), frontend.Config{ID: id, Limits: jobs.DefaultLimits(), Logger: Logger(t)})
	if err != nil {
		t.Fatalf("new frontend: %v", err)
	}
	if err := fe.Start(context.Background()); err != nil {
		t.Fatalf("start frontend: %v", err)
	}
	t.Cleanup(fe.Stop)
	return fe
}

// MCPClient serves fe's MCP server over streamable HTTP and returns an initialised
// client of it.
func MCPClient(t testing.TB, fe *frontend.Frontend) *client.Client {
	t.Helper()
	srv := mcpserver.New(fe, mcpserver.Options{})
	hs := httptest.NewServer(mcpserver.Handler(srv, mcpserver.HTTPOptions{Health: fe.Health}))
	t.Cleanup(hs.Close)
	c, err := client.NewStreamableHttpClient(hs.URL+"/mcp", transport.WithHTTPTimeout(5*time.Minute))
	if err != nil {
		t.Fatalf("new MCP client: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		t.Fatalf("start MCP client: %v", err)
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "mcpexec-test", Version: "0"}
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatalf("initialize MCP client: %v", err)
	}
	return c
}

// CallRunPython calls run_python with args.
func CallRunPython(t testing.TB, c *client.Client, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	req := mcp.CallToolRequest{}
	req.Params.Name = mcpserver.ToolName
	req.Params.Arguments = args
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := c.CallTool(ctx, req)
	if err != nil {
		t.Fatalf("call run_python: %v", err)
	}
	return res
}

// Text returns the concatenated text content of a tool result.
func Text(res *mcp.CallToolResult) string {
	var s string
	for _, c := range res.Content {
		if tc, ok := c.(mcp.TextContent); ok {
			s += tc.Text
		}
	}
	return s
}

// Structured decodes a run_python result's structuredContent.
func Structured(t testing.TB, res *mcp.CallToolResult) mcpserver.Structured {
	t.Helper()
	var st mcpserver.Structured
	b, err := json.Marshal(res.StructuredContent)
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	if err != nil {
		t.Fatalf("structuredContent %v: %v", res.StructuredContent, err)
	}
	return st
}

// RequirePodman reports whether tests needing Podman must fail rather than skip
// (CI sets MCPEXEC_REQUIRE_PODMAN=1).
func RequirePodman() bool { return os.Getenv("MCPEXEC_REQUIRE_PODMAN") == "1" }

// SkipOrFail skips the test with reason, or fails it when Podman is required.
func SkipOrFail(t testing.TB, reason string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(reason, args...)
	if RequirePodman() {
		t.Fatalf("MCPEXEC_REQUIRE_PODMAN=1 but %s", msg)
	}
	t.Skip(msg)
}

// WaitRecord waits until the broker's state holds job id with status; it fails
// the test after 30 s (generous: a loaded CI host may take seconds).
func WaitRecord(t testing.TB, b *broker.Broker, id string, status jobs.Status) *jobs.Record {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		rec, err := b.Store().Job(id)
		if err == nil && rec.Status == status {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: want recorded status %s, got %+v (err %v)", id, status, rec, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
