package e2e

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/state"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// TestRunPythonNodeLost is issue 27's agent-side case: an MCP client makes
// 30 synchronous run_python calls through a front-end whose connection
// prefers node 0 of three brokers, each call an update_memory increment,
// and node 0 is killed after call 10. Every call answers with the code's
// output, each printed value is the call's number (no increment lost or
// applied twice), and the counter ends at 30. `make faults` runs it ten
// times over.
func TestRunPythonNodeLost(t *testing.T) {
	if testing.Short() {
		t.Skip("cluster fault test")
	}
	q := faultQueue()
	q.AckWait, q.BackOff = 10*time.Second, nil // see loseBroker
	c := testutil.StartCluster(t, 3, q)
	processWorkers(t, c, 2, q)
	nc, err := nats.Connect(c.URL(), nats.Name("fe"), nats.DontRandomize(), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond), nats.ReconnectJitter(50*time.Millisecond, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if got := nc.ConnectedServerName(); got != "node0" {
		t.Fatalf("the front-end talks to %s first, want node0", got)
	}
	fe := testutil.FrontendOn(t, nc, "fe")
	hs := httptest.NewServer(mcpserver.Handler(mcpserver.New(fe, mcpserver.Options{Namespace: httpauth.Namespace}),
		mcpserver.HTTPOptions{Auth: httpauth.New(httpauth.Config{Tokens: map[string]string{replicaToken: replicaNS}})}))
	t.Cleanup(hs.Close)
	mc := mcpClient(t, hs.URL, replicaToken)

	const n, killAfter = 30, 10
	code := "n = update_memory('calls', lambda v: (v or 0) + 1)\nprint(n)"
	for i := 1; i <= n; i++ {
		start := time.Now()
		res := testutil.CallTool(t, mc, mcpserver.ToolName, map[string]any{"code": code, "timeout": 60})
		out := strings.TrimSpace(testutil.Text(res))
		if res.IsError {
			t.Fatalf("call %d failed after %s: %s", i, time.Since(start).Round(time.Millisecond), out)
		}
		if got, err := strconv.Atoi(lastLine(out)); err != nil || got != i {
			t.Fatalf("call %d printed %q, want the counter at %d", i, out, i)
		}
		if d := time.Since(start); d > time.Second {
			t.Logf("call %d took %s", i, d.Round(time.Millisecond))
		}
		if i == killAfter {
			t.Logf("killing node0 after call %d", i)
			c.Kill(0)
		}
	}

	// A new client has seen none of the writes: a replica that is still
	// folding the memory stream may answer it with an older value (each
	// client reads its own writes; others' once the replica catches up).
	// The counter must reach n and never pass it.
	sc := state.NewClient(c.ConnectAll(t, "check"), jobs.Subjects{})
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		m, err := sc.MemoryGet(ctx, replicaNS, "calls")
		cancel()
		got := ""
		if err == nil {
			got = string(m.Value)
		}
		if got == fmt.Sprint(n) {
			return
		}
		if v, _ := strconv.Atoi(got); v > n || time.Now().After(deadline) {
			t.Fatalf("counter %q (err %v) after %d calls", got, err, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// lastLine is the last line of s.
func lastLine(s string) string {
	return s[strings.LastIndexByte(s, '\n')+1:]
}
