package testutil

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/discovery"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/mcpclients"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/testutil/testenv"
)

// FrontendWith starts a front-end configured by cfg (ID, Tools, ...) on b.
// Limits and Logger default like Frontend's.
func FrontendWith(t testing.TB, b *broker.Broker, cfg frontend.Config) *frontend.Frontend {
	t.Helper()
	return FrontendOnWith(t, Connect(t, b, "frontend-"+cfg.ID), cfg)
}

// MCPClientWith serves an MCP server made with opts over streamable HTTP (with
// hopts) and returns an initialised client of it.
func MCPClientWith(t testing.TB, fe *frontend.Frontend, opts mcpserver.Options, hopts mcpserver.HTTPOptions, copts ...transport.StreamableHTTPCOption) *client.Client {
	t.Helper()
	srv := mcpserver.New(fe, opts)
	if hopts.Health == nil {
		hopts.Health = fe.Health
	}
	if hopts.Tasks == nil {
		hopts.Tasks = mcpserver.NewTasks(srv, fe, opts, 0)
		t.Cleanup(hopts.Tasks.Close) // after the server below is closed
	}
	hs := httptest.NewServer(mcpserver.Handler(srv, hopts))
	t.Cleanup(hs.Close)
	c, err := client.NewStreamableHttpClient(hs.URL+"/mcp", append([]transport.StreamableHTTPCOption{transport.WithHTTPTimeout(5 * time.Minute)}, copts...)...)
	if err != nil {
		t.Fatalf("new MCP client: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() }) // the test is over: a failing close changes no result
	StartMCP(t, context.Background(), c, "mcpexec-test")
	return c
}

// StartMCP starts MCP client c and initialises its session as client name.
func StartMCP(t testing.TB, ctx context.Context, c *client.Client, name string) {
	t.Helper()
	if err := c.Start(ctx); err != nil {
		t.Fatalf("start MCP client: %v", err)
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: name, Version: "0"}
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatalf("initialize MCP client: %v", err)
	}
}

var (
	testServerOnce sync.Once
	testServerPath string
	testServerErr  error
)

// TestServer builds the stdio MCP test server (internal/mcpclients/testserver)
// once per test process and returns its path. Every test process shares one
// path (a process-wide build has no test to clean it up after, so a directory
// per process would outlive each run): each builds to a file of its own and
// renames it into place, which leaves a running copy undisturbed.
func TestServer(t testing.TB) string {
	t.Helper()
	testServerOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		dir := filepath.Join(os.TempDir(), fmt.Sprintf("mcpexec-testserver-%d", os.Getuid()))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			testServerErr = err
			return
		}
		testServerPath = filepath.Join(dir, "testserver")
		tmp := fmt.Sprintf("%s.%d", testServerPath, os.Getpid())
		cmd, cancel := testenv.Command(15*time.Minute, "go", "build", "-o", tmp, "./internal/mcpclients/testserver")
		defer cancel()
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			_ = os.Remove(tmp) // best effort: the build failed, which is what the test reports
			testServerErr = &buildError{out: string(out), err: err}
			return
		}
		testServerErr = os.Rename(tmp, testServerPath)
	})
	if testServerErr != nil {
		t.Fatalf("build the MCP test server: %v", testServerErr)
	}
	return testServerPath
}

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return e.err.Error() + ": " + e.out }

// TestServerDef is a discovery entry launching the test server as name.
func TestServerDef(t testing.TB, name string, env map[string]string) discovery.Server {
	t.Helper()
	return discovery.Server{Name: name, Type: "stdio", Command: TestServer(t), Args: []string{"-name", name},
		Env: env, Description: "test server " + name}
}

// Pool returns a started client pool of servers, stopped when the test ends.
func Pool(t testing.TB, cfg mcpclients.Config, servers ...discovery.Server) *mcpclients.Pool {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = Logger(t)
	}
	p := mcpclients.New(servers, cfg)
	if err := p.Start(context.Background()); err != nil {
		t.Fatalf("start pool: %v", err)
	}
	t.Cleanup(p.Stop)
	return p
}
