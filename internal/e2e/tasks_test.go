package e2e

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman/podmantest"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// frontendProc is a front-end binary serving streamable HTTP.
type frontendProc struct {
	cmd  *exec.Cmd
	addr string
}

// startFrontend starts bin with args plus --http on a free loopback port and
// waits until it is healthy. The test ends it (SIGTERM) unless it was killed.
func startFrontend(t *testing.T, bin string, args ...string) *frontendProc {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // only the free port was wanted
	cmd := exec.Command(bin, append(args, "--http", addr)...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &frontendProc{cmd: cmd, addr: addr}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		kill := time.AfterFunc(90*time.Second, func() { _ = cmd.Process.Kill() }) // a front-end wedged on its way out
		_ = cmd.Wait()
		kill.Stop()
	})
	deadline := time.Now().Add(2 * time.Minute)
	health := &http.Client{Timeout: 5 * time.Second}
	for {
		resp, err := health.Get("http://" + addr + "/healthz")
		if err == nil {
			_ = resp.Body.Close() // read or abandoned: nothing to report
			if resp.StatusCode == 200 {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("front-end not healthy at %s: %v", addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// kill ends the front-end at once, as a crash would.
func (p *frontendProc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
}

func (p *frontendProc) url() string { return "http://" + p.addr + "/mcp" }

// runNode runs a node script and decodes the JSON line it prints into out.
func runNode(t *testing.T, out any, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", args...)
	cmd.Stderr = os.Stderr
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %v: %v\n%s", args, err, b)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), out); err != nil {
		t.Fatalf("node %v printed %s: %v", args, b, err)
	}
}

// TestTasksOfficialSDK: the official TypeScript SDK's task client starts a
// run_python task on one front-end; that front-end is killed; a second one
// answers the task's status, result and listing from the state service; a
// task started on a third is cancelled from the second, and its container
// is gone within 2 s.
func TestTasksOfficialSDK(t *testing.T) {
	if _, err := exec.LookPath("podman"); err != nil {
		testutil.SkipOrFail(t, "podman is not installed (make deps)")
	}
	script := testutil.NodeScript(t, "tasks_client.mjs")
	bin := buildFrontend(t)
	b := testutil.Broker(t, "", queue.DefaultConfig())
	// No warm pool: the only running container of the worker is a job's.
	rt := podmantest.New(t, podman.Config{Config: containerpool.Config{Pool: 0, WorkerID: "tasks-worker"}})
	testutil.Worker(t, b, rt, worker.DefaultConfig("tasks-worker"))
	common := []string{"--nats", b.ClientURL(), "--discover=false", "--log-level", "warn"}
	fe1 := startFrontend(t, bin, append(common, "--id", "tasks-fe1")...)
	fe2 := startFrontend(t, bin, append(common, "--id", "tasks-fe2")...)

	var started struct {
		TaskID      string  `json:"taskId"`
		Status      string  `json:"status"`
		MS          float64 `json:"ms"`
		TaskSupport string  `json:"taskSupport"`
		TTL         int64   `json:"ttl"`
	}
	runNode(t, &started, script, fe1.url(), "start", "import time\ntime.sleep(2)\nprint('done', 6*7)")
	if started.TaskID == "" || started.Status != "working" || started.TaskSupport != "optional" || started.TTL != (7*24*time.Hour).Milliseconds() {
		t.Fatalf("task creation: %+v", started)
	}
	t.Logf("task created in %.1f ms (client side, one call)", started.MS)
	fe1.kill(t)

	var got struct {
		Status      string  `json:"status"`
		GetMS       float64 `json:"getMs"`
		FinalStatus string  `json:"finalStatus"`
		Text        string  `json:"text"`
		IsError     bool    `json:"isError"`
		JobStatus   string  `json:"jobStatus"`
		Listed      bool    `json:"listed"`
	}
	runNode(t, &got, script, fe2.url(), "result", started.TaskID)
	if got.Status != "working" && got.Status != "completed" {
		t.Errorf("status from the second front-end: %+v", got)
	}
	if got.FinalStatus != "completed" || got.Text != "done 42" || got.IsError || got.JobStatus != "success" || !got.Listed {
		t.Fatalf("result from the second front-end: %+v", got)
	}

	// A task started on a third front-end is cancelled from the second.
	fe3 := startFrontend(t, bin, append(common, "--id", "tasks-fe3")...)
	runNode(t, &started, script, fe3.url(), "start", "import time\nprint('sleeping', flush=True)\ntime.sleep(100)")
	testutil.WaitRecord(t, b, jobs.ScopedID(jobs.DefaultNamespace, started.TaskID), jobs.StatusRunning)
	if running(t, "tasks-worker") == "" {
		t.Fatal("the task's container is not running")
	}
	var cancelled struct {
		Status string `json:"status"`
		After  string `json:"after"`
	}
	t0 := time.Now()
	runNode(t, &cancelled, script, fe2.url(), "cancel", started.TaskID)
	if cancelled.Status != "cancelled" || cancelled.After != "cancelled" {
		t.Fatalf("cancel: %+v", cancelled)
	}
	for running(t, "tasks-worker") != "" {
		if time.Since(t0) > 2*time.Second {
			t.Fatalf("the cancelled task's container still runs %s after tasks/cancel", time.Since(t0))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("container gone %s after tasks/cancel was sent (node start-up included)", time.Since(t0).Round(time.Millisecond))
	testutil.WaitRecord(t, b, jobs.ScopedID(jobs.DefaultNamespace, started.TaskID), jobs.StatusCancelled)
}

// running lists the running containers of worker.
func running(t *testing.T, worker string) string {
	t.Helper()
	return workerContainers(t, worker, "--filter", "status=running")
}

// TestTasksExtensionOfficialClient: the official tasks extension client
// (@modelcontextprotocol/ext-tasks, over the SDK v2 client pinned to
// 2026-07-28) starts run_python on one front-end, which the server makes a
// task; the client hands the task off and that front-end is killed; a
// client of a second front-end resumes the task and gets its result from
// tasks/get, from the state service.
func TestTasksExtensionOfficialClient(t *testing.T) {
	if _, err := exec.LookPath("podman"); err != nil {
		testutil.SkipOrFail(t, "podman is not installed (make deps)")
	}
	script := testutil.NodeScript(t, "ext_tasks_client.mjs")
	bin := buildFrontend(t)
	b := testutil.Broker(t, "", queue.DefaultConfig())
	rt := podmantest.New(t, podman.Config{Config: containerpool.Config{Pool: 1, WorkerID: "ext-tasks-worker"}})
	testutil.Worker(t, b, rt, worker.DefaultConfig("ext-tasks-worker"))
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("ext-tasks-token-0123 exttasks\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	common := []string{"--nats", b.ClientURL(), "--discover=false", "--log-level", "warn", "--auth-tokens-file", tokens}
	fe1 := startFrontend(t, bin, append(common, "--id", "ext-tasks-fe1")...)
	fe2 := startFrontend(t, bin, append(common, "--id", "ext-tasks-fe2")...)

	var started struct {
		Kind      string          `json:"kind"`
		TaskID    string          `json:"taskId"`
		Status    string          `json:"status"`
		TTL       int64           `json:"ttl"`
		Poll      int64           `json:"poll"`
		Reference json.RawMessage `json:"reference"`
	}
	runNode(t, &started, script, fe1.url(), "ext-tasks-token-0123", "start", "import time\ntime.sleep(2)\nprint('done', 6*7)")
	if started.Kind != "task" || started.TaskID == "" || (started.Status != "working" && started.Status != "completed") ||
		started.TTL != (7*24*time.Hour).Milliseconds() || started.Poll <= 0 || len(started.Reference) == 0 {
		t.Fatalf("task creation: %+v", started)
	}
	fe1.kill(t)

	var got struct {
		Outcome   string   `json:"outcome"`
		Text      string   `json:"text"`
		IsError   bool     `json:"isError"`
		JobStatus string   `json:"jobStatus"`
		Sent      []string `json:"sent"`
	}
	runNode(t, &got, script, fe2.url(), "ext-tasks-token-0123", "resume", string(started.Reference))
	if got.Outcome != "completed" || got.Text != "done 42" || got.IsError || got.JobStatus != "success" {
		t.Fatalf("outcome from the second front-end: %+v", got)
	}
	if !slices.Contains(got.Sent, "tasks/get") || slices.Contains(got.Sent, "tasks/result") {
		t.Fatalf("methods the client sent: %v", got.Sent)
	}
	testutil.WaitRecord(t, b, jobs.ScopedID("exttasks", started.TaskID), jobs.StatusSuccess)
}

// TestTasksExtensionApproval: a run_python task of the official tasks
// extension client whose ts/add call the namespace's tool rules park for
// approval: the task turns input_required with a form asking about the
// call, the client answers it through tasks/update, and the call runs.
func TestTasksExtensionApproval(t *testing.T) {
	script := testutil.NodeScript(t, "ext_tasks_client.mjs")
	fe := startAskingFrontend(t, "ext-tasks-approve", tsServer(t), "ext-tasks-token-0123", map[string]string{"ts/add": "ask"})
	var r struct {
		Kind    string   `json:"kind"`
		Outcome string   `json:"outcome"`
		Text    string   `json:"text"`
		IsError bool     `json:"isError"`
		Asked   []string `json:"asked"`
		Sent    []string `json:"sent"`
	}
	runNode(t, &r, script, fe.url(), "ext-tasks-token-0123", "approve",
		"try:\n    r = await mcp_ts.add(a=40, b=2)\n    print('sum', r['sum'])\nexcept MCPError as e:\n    print('MCPError:', e)")
	if r.Kind != "task" || r.Outcome != "completed" || r.IsError || r.Text != "sum 42" {
		t.Fatalf("approved task: %+v", r)
	}
	if len(r.Asked) != 1 || !strings.Contains(r.Asked[0], "ts/add") || !slices.Contains(r.Sent, "tasks/update") {
		t.Fatalf("questions %q, methods %v", r.Asked, r.Sent)
	}
}
