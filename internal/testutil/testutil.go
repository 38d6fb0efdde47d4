// Package testutil starts real parts for tests: an in-process broker with
// JetStream and bbolt in a temp dir, workers, front-ends, and MCP clients.
package testutil

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/process"
	"github.com/mcpexec/mcpexec/internal/testutil/testenv"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// The environment helpers live in the leaf package testenv (runtime test
// packages use it without importing the fleet); these names keep the tests
// that reach them through testutil working.
var (
	Logger           = testenv.Logger
	RequirePodman    = testenv.RequirePodman
	SkipOrFail       = testenv.SkipOrFail
	RequireDocker    = testenv.RequireDocker
	SkipOrFailDocker = testenv.SkipOrFailDocker
	DockerHost       = testenv.DockerHost
)

// Broker starts a broker with a TCP listener on a free loopback port in dir
// (t.TempDir() when dir is ""); each mutate function may change its
// configuration before it starts.
func Broker(t testing.TB, dir string, qcfg queue.Config, mutate ...func(cfg *broker.Config)) *broker.Broker {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	cfg := broker.Config{DataDir: dir, Listen: "127.0.0.1:-1", Queue: qcfg, Logger: Logger(t)}
	for _, m := range mutate {
		m(&cfg)
	}
	b, err := broker.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start broker: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() }) // Close always returns nil
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

// ConnectInProcess opens an in-process client connection to b, as the
// embedded default (frontend --data) connects its front-end and worker.
func ConnectInProcess(t testing.TB, b *broker.Broker, name string) *nats.Conn {
	t.Helper()
	nc, err := b.Connect(name)
	if err != nil {
		t.Fatalf("connect %s in process: %v", name, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Worker starts a worker on rt connected to b.
func Worker(t testing.TB, b *broker.Broker, rt sandbox.Runtime, cfg worker.Config) *worker.Worker {
	t.Helper()
	return WorkerOn(t, Connect(t, b, "worker-"+cfg.ID), rt, cfg)
}

// Frontend starts a front-end with id connected to b.
func Frontend(t testing.TB, b *broker.Broker, id string) *frontend.Frontend {
	t.Helper()
	return FrontendWith(t, b, frontend.Config{ID: id})
}

// MCPClient serves fe's MCP server over streamable HTTP and returns an initialised
// client of it.
func MCPClient(t testing.TB, fe *frontend.Frontend) *client.Client {
	t.Helper()
	return MCPClientWith(t, fe, mcpserver.Options{}, mcpserver.HTTPOptions{})
}

// CallRunPython calls run_python with args.
func CallRunPython(t testing.TB, c *client.Client, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	return CallTool(t, c, mcpserver.ToolName, args)
}

// CallTool calls tool (run_python, run_javascript) with args.
func CallTool(t testing.TB, c *client.Client, tool string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	req := mcp.CallToolRequest{}
	req.Params.Name = tool
	req.Params.Arguments = args
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := c.CallTool(ctx, req)
	if err != nil {
		t.Fatalf("call %s: %v", tool, err)
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

// WaitRecord waits until the broker's state holds job id (an id of the
// default namespace, or a wire id) with status; it fails the test after 30 s
// (generous: a loaded CI host may take seconds).
func WaitRecord(t testing.TB, b *broker.Broker, id string, status jobs.Status) *jobs.Record {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		rec, err := b.Store().Job(jobs.ScopedID(jobs.DefaultNamespace, id))
		if err != nil {
			rec, err = b.Store().Job(id)
		}
		if err == nil && rec.Status == status {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: want recorded status %s, got %+v (err %v)", id, status, rec, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Eventually waits up to within for ok, checking every 10 ms, and fails the
// test with what when it never holds.
func Eventually(t testing.TB, within time.Duration, ok func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Reconnect makes nc connect again, as after its broker restarted, and
// returns once it has (an error after within). It may be called from any
// goroutine.
func Reconnect(nc *nats.Conn, within time.Duration) error {
	was := nc.Stats().Reconnects
	if err := nc.ForceReconnect(); err != nil {
		return err
	}
	for deadline := time.Now().Add(within); !(nc.IsConnected() && nc.Stats().Reconnects != was); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not connect again within %s", nc.Opts.Name, within)
		}
	}
	return nil
}

// ProcessRuntime returns a process sandbox runtime, closed when the test ends.
func ProcessRuntime(t testing.TB) *process.Runtime {
	t.Helper()
	rt, err := process.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rt.Close(); err != nil {
			t.Error(err)
		}
	})
	return rt
}

// ListTools returns c's tools (tools/list).
func ListTools(t testing.TB, c *client.Client) []mcp.Tool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := c.ListTools(ctx, mcp.ListToolsRequest{})
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	return res.Tools
}

// ToolNames returns the names of c's tools, sorted.
func ToolNames(t testing.TB, c *client.Client) []string {
	t.Helper()
	var names []string
	for _, tl := range ListTools(t, c) {
		names = append(names, tl.Name)
	}
	slices.Sort(names)
	return names
}

// ServersEnum returns run_python's "servers" property as c sees it (JSON):
// the servers enum of c's namespace.
func ServersEnum(t testing.TB, c *client.Client) string {
	t.Helper()
	for _, tl := range ListTools(t, c) {
		if tl.Name == mcpserver.ToolName {
			b, _ := json.Marshal(tl.InputSchema.Properties["servers"]) // a schema always encodes
			return string(b)
		}
	}
	t.Fatal("no run_python among the tools")
	return ""
}

// HTTPCall sends method url with the bearer token (none when empty) and body
// (a string as is, anything else as JSON; nil: none) and returns the status
// and the response body.
func HTTPCall(t testing.TB, token, method, url string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		if s, ok := body.(string); ok {
			rd = strings.NewReader(s)
		} else {
			b, err := json.Marshal(body)
			if err != nil {
				t.Fatal(err)
			}
			rd = bytes.NewReader(b)
		}
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := httpCallClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }() // read or abandoned: nothing to report
	data, _ := io.ReadAll(resp.Body)         // a short body is what the test then sees
	return resp.StatusCode, data
}

// APIDo sends an HTTP request with a bearer token and body as JSON, and
// answers the status and body. Unlike HTTPCall it fails no test (it may run
// outside the test's goroutine, while a fault is injected): a request that
// gets no answer within timeout answers status 0 and the error's text.
func APIDo(token, method, url string, body any, timeout time.Duration) (int, []byte) {
	var rd *bytes.Reader
	if body != nil {
		data, _ := json.Marshal(body)
		rd = bytes.NewReader(data)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return 0, []byte(err.Error())
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	hc := &http.Client{Timeout: timeout}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer func() { _ = resp.Body.Close() }() // read or abandoned: nothing to report
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	return resp.StatusCode, buf.Bytes()
}

// httpCallClient bounds each HTTPCall: a handler that never answers fails
// the test, saying which request, rather than hanging the package until
// the test binary's timeout (the longest wait the tests ask for is 60 s).
var httpCallClient = &http.Client{Timeout: 2 * time.Minute}

// DiffKeys returns, sorted, the keys whose values differ between two state
// files' contents (Store.Contents), or that only one of them holds.
func DiffKeys(a, b map[string][]byte) []string {
	var diff []string
	for k, v := range a {
		if w, ok := b[k]; !ok || !bytes.Equal(v, w) {
			diff = append(diff, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			diff = append(diff, k)
		}
	}
	slices.Sort(diff)
	return diff
}
