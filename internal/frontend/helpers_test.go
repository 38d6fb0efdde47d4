package frontend_test

import (
	"context"
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/server"

	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// npmDir returns the installed npm packages' dir, or "" without Node.js.
func npmDir(t *testing.T) string {
	if _, err := exec.LookPath("npm"); err != nil {
		return ""
	}
	return testutil.NodeModules(t)
}

// stdioClient serves fe's MCP server over in-memory stdio pipes (as a desktop
// client would reach it) and returns an initialised client.
func stdioClient(t *testing.T, fe *frontend.Frontend) *client.Client {
	t.Helper()
	srv := mcpserver.New(fe, mcpserver.Options{})
	cr, sw := io.Pipe() // server → client
	sr, cw := io.Pipe() // client → server
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = server.NewStdioServer(srv).Listen(ctx, sr, sw)
	}()
	c := client.NewClient(transport.NewIO(cr, cw, io.NopCloser(strings.NewReader(""))))
	t.Cleanup(func() {
		_ = c.Close() // a failing close changes no result
		cancel()
		_ = sr.Close() // a failing close changes no result
		_ = sw.Close() // a failing close changes no result
		<-done
	})
	testutil.StartMCP(t, ctx, c, "stdio-test")
	return c
}

var _ mcpserver.ServerCatalog = (*frontend.Frontend)(nil)
