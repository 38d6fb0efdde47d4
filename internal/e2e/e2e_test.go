package e2e

import (
	"strings"
	"testing"

	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman/podmantest"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// TestRunPythonInPodman is the walking skeleton: an MCP client calls run_python
// on a front-end; the job crosses JetStream to a worker that runs it in a real
// Podman container; the result comes back and is recorded by the broker.
func TestRunPythonInPodman(t *testing.T) {
	b := testutil.Broker(t, "", queue.DefaultConfig())
	rt := podmantest.New(t, podman.Config{Config: containerpool.Config{Pool: 1}})
	testutil.Worker(t, b, rt, worker.DefaultConfig("e2e-worker"))
	fe := testutil.Frontend(t, b, "e2e-fe")
	c := testutil.MCPClient(t, fe)

	res := testutil.CallRunPython(t, c, map[string]any{"code": "print(6*7)"})
	if res.IsError || testutil.Text(res) != "42" {
		t.Fatalf("isError=%v text=%q", res.IsError, testutil.Text(res))
	}
	st := testutil.Structured(t, res)
	if st.Status != "success" || st.ExitCode != 0 || st.JobID == "" {
		t.Fatalf("structured %+v", st)
	}
	testutil.WaitRecord(t, b, st.JobID, "success")

	// The code really ran sandboxed: as nobody, without network, read-only root.
	res = testutil.CallRunPython(t, c, map[string]any{"code": `import os, socket
print(os.getuid())
print([n for _, n in socket.if_nameindex()])
try:
    open("/etc/x", "w")
except OSError as e:
    print("ro", e.errno)`})
	if got := testutil.Text(res); !strings.HasPrefix(got, "65534\n['lo']\nro 30") {
		t.Fatalf("sandbox not locked down: %q", got)
	}

	// A failing and a timed-out job come back as such, and the worker goes on.
	res = testutil.CallRunPython(t, c, map[string]any{"code": "while True: pass", "timeout": 1})
	if st := testutil.Structured(t, res); st.Status != "timeout" || !res.IsError {
		t.Fatalf("timeout job: %+v", st)
	}
	res = testutil.CallRunPython(t, c, map[string]any{"code": "print('still here')"})
	if testutil.Text(res) != "still here" {
		t.Fatalf("after timeout: %q", testutil.Text(res))
	}
}
