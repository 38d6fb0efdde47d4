package testutil

import (
	"testing"

	"github.com/mark3labs/mcp-go/client"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/discovery"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/mcpclients"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// Stack is a broker, a worker on the process runtime, a client pool of
// servers, and a front-end with an MCP client, all joined over TCP NATS.
type Stack struct {
	B    *broker.Broker
	FE   *frontend.Frontend
	Pool *mcpclients.Pool
	C    *client.Client
}

// ProcessStack starts a Stack (dir: the broker's data, "" for a temporary
// one); cfg's ID defaults to fe1 and its Tools are the pool of servers.
func ProcessStack(t testing.TB, dir string, cfg frontend.Config, servers ...discovery.Server) *Stack {
	t.Helper()
	b := Broker(t, dir, queue.DefaultConfig())
	Worker(t, b, ProcessRuntime(t), worker.DefaultConfig("w1"))
	pool := Pool(t, mcpclients.Config{}, servers...)
	if cfg.ID == "" {
		cfg.ID = "fe1"
	}
	cfg.Tools = pool
	fe := FrontendWith(t, b, cfg)
	c := MCPClientWith(t, fe, mcpserver.Options{Servers: pool.Names, Definitions: pool.Servers}, mcpserver.HTTPOptions{})
	return &Stack{B: b, FE: fe, Pool: pool, C: c}
}

// RunCode calls run_python with code (given servers) and returns its text
// and structured result.
func RunCode(t testing.TB, c *client.Client, code string, servers ...string) (string, mcpserver.Structured) {
	t.Helper()
	args := map[string]any{"code": code}
	if len(servers) > 0 {
		args["servers"] = servers
	}
	res := CallRunPython(t, c, args)
	return Text(res), Structured(t, res)
}

// MustRunCode is RunCode that fails the test unless the job succeeded.
func MustRunCode(t testing.TB, c *client.Client, code string, servers ...string) string {
	t.Helper()
	out, st := RunCode(t, c, code, servers...)
	if st.Status != "success" {
		t.Fatalf("status %s: %s", st.Status, out)
	}
	return out
}
