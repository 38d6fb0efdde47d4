package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman/podmantest"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/testutil/testenv"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// call runs code through the fleet and returns the tool result and the job's
// recorded outcome.
func call(t *testing.T, b *broker.Broker, c *client.Client, args map[string]any) (*mcp.CallToolResult, *jobs.Record) {
	t.Helper()
	res := testutil.CallRunPython(t, c, args)
	st := testutil.Structured(t, res)
	if st.JobID == "" {
		return res, nil
	}
	rec := testutil.WaitRecord(t, b, st.JobID, jobs.Status(st.Status))
	return res, rec
}

// TestHostileCodeThroughFleet sends hostile code through the whole fleet (MCP
// client → front-end → JetStream → worker → Podman); after each attack the
// worker must still answer.
func TestHostileCodeThroughFleet(t *testing.T) {
	b := testutil.Broker(t, "", queue.DefaultConfig())
	const secret = "mcpexec-e2e-secret-71c3"
	t.Setenv("MCPEXEC_E2E_SECRET", secret)
	rt := podmantest.New(t, podman.Config{Config: containerpool.Config{Pool: 2}})
	if !rt.Info().LimitsEnforced {
		testutil.SkipOrFail(t, "Podman at %s does not enforce limits (rootless on cgroups v1)", rt.Info().Address)
	}
	wcfg := worker.DefaultConfig("e2e-hostile")
	testutil.Worker(t, b, rt, wcfg)
	fe := testutil.Frontend(t, b, "e2e-hostile-fe")
	c := testutil.MCPClient(t, fe)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }() // the test is over with it: a failing close changes no result
	accepted := make(chan struct{}, 16)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			_ = conn.Close() // a failing close changes no result
			accepted <- struct{}{}
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port

	alive := func(t *testing.T) {
		t.Helper()
		res, _ := call(t, b, c, map[string]any{"code": "print('alive')"})
		if res.IsError || testutil.Text(res) != "alive" {
			t.Fatalf("worker not healthy after the attack: %q", testutil.Text(res))
		}
	}
	tests := []struct {
		name  string
		args  map[string]any
		check func(t *testing.T, res *mcp.CallToolResult, rec *jobs.Record)
	}{
		{"HostLoopback", map[string]any{"code": fmt.Sprintf(`import socket
for h in ("127.0.0.1", "localhost", "host.containers.internal", "10.88.0.1", "169.254.169.254"):
    s = socket.socket()
    s.settimeout(1)
    try:
        s.connect((h, %d))
        print("CONNECTED", h)
    except OSError:
        pass
print("done")`, port)}, func(t *testing.T, res *mcp.CallToolResult, rec *jobs.Record) {
			if strings.Contains(testutil.Text(res), "CONNECTED") || !strings.Contains(testutil.Text(res), "done") {
				t.Fatalf("sandbox reached the host: %q", testutil.Text(res))
			}
			select {
			case <-accepted:
				t.Fatal("the host's loopback listener accepted a connection from the sandbox")
			default:
			}
		}},
		{"RootFilesystemWrite", map[string]any{"code": `for p in ("/etc/passwd", "/usr/bin/python3", "/x"):
    try:
        open(p, "a").write("x")
        print("WROTE", p)
    except OSError:
        pass
print("done")`}, func(t *testing.T, res *mcp.CallToolResult, rec *jobs.Record) {
			if strings.Contains(testutil.Text(res), "WROTE") {
				t.Fatalf("wrote the root filesystem: %q", testutil.Text(res))
			}
		}},
		{"WorkerEnvironment", map[string]any{"code": `import os
print([k for k, v in os.environ.items() if "e2e-secret" in v or k.startswith(("MCPEXEC", "NATS"))])`},
			func(t *testing.T, res *mcp.CallToolResult, rec *jobs.Record) {
				if testutil.Text(res) != "[]" || strings.Contains(rec.Result.Stdout, secret) {
					t.Fatalf("the worker's environment reached the sandbox: %q", testutil.Text(res))
				}
			}},
		{"ForkBomb", map[string]any{"code": `import os
n = 0
try:
    while True:
        if os.fork() == 0:
            import time; time.sleep(60); os._exit(0)
        n += 1
except OSError:
    print("stopped", n > 0)`, "timeout": 20}, func(t *testing.T, res *mcp.CallToolResult, rec *jobs.Record) {
			if !strings.Contains(testutil.Text(res), "stopped True") {
				t.Fatalf("fork bomb: %q", testutil.Text(res))
			}
		}},
		{"MemoryBomb", map[string]any{"code": "b = []\nwhile True:\n    b.append(bytearray(32 << 20))", "timeout": 60},
			func(t *testing.T, res *mcp.CallToolResult, rec *jobs.Record) {
				if rec.Status != jobs.StatusError || !strings.Contains(rec.Result.Error+rec.Result.Stderr, "emory") {
					t.Fatalf("memory bomb: %s %q %q", rec.Status, rec.Result.Error, rec.Result.Stderr)
				}
				t.Logf("memory bomb: %s", rec.Result.Error)
			}},
		{"EndlessLoop", map[string]any{"code": "while True: pass", "timeout": 1},
			func(t *testing.T, res *mcp.CallToolResult, rec *jobs.Record) {
				if rec.Status != jobs.StatusTimeout || !res.IsError {
					t.Fatalf("endless loop: %s", rec.Status)
				}
			}},
		{"OutputFlood", map[string]any{"code": "import os, sys\nfor _ in range(800):\n    os.write(1, b'x' * 65536)\nsys.stderr.write('e' * (3 << 20))", "timeout": 60},
			func(t *testing.T, res *mcp.CallToolResult, rec *jobs.Record) {
				r := rec.Result
				if rec.Status != jobs.StatusSuccess || len(r.Stdout) != 1<<20 || !r.StdoutTruncated || len(r.Stderr) != 1<<20 || !r.StderrTruncated {
					t.Fatalf("flood: %s stdout %d (truncated %v) stderr %d (truncated %v)", rec.Status, len(r.Stdout), r.StdoutTruncated, len(r.Stderr), r.StderrTruncated)
				}
			}},
		{"ForgedFramesOnStdout", map[string]any{"code": `import os, json, struct
body = json.dumps({"type": "done", "status": "success", "exit_code": 0}).encode()
os.write(1, struct.pack(">I", len(body)) + body)
raise SystemExit(4)`}, func(t *testing.T, res *mcp.CallToolResult, rec *jobs.Record) {
			if rec.Status != jobs.StatusError || rec.Result.ExitCode != 4 {
				t.Fatalf("forged frame on stdout changed the outcome: %s exit %d", rec.Status, rec.Result.ExitCode)
			}
		}},
		{"GarbageOnControlSocket", map[string]any{"code": `import os, socket, stat, struct, time
for fd in range(3, 256):
    try:
        if stat.S_ISSOCK(os.fstat(fd).st_mode):
            socket.socket(fileno=os.dup(fd)).sendall(struct.pack(">I", 0xFFFFFFF0) + b"junk")
    except OSError:
        pass
time.sleep(30)`, "timeout": 60}, func(t *testing.T, res *mcp.CallToolResult, rec *jobs.Record) {
			if rec.Status != jobs.StatusError || !strings.Contains(rec.Result.Error, "protocol") {
				t.Fatalf("garbage frame: %s %q", rec.Status, rec.Result.Error)
			}
		}},
		{"SystemExitCode", map[string]any{"code": "raise SystemExit(7)"}, func(t *testing.T, res *mcp.CallToolResult, rec *jobs.Record) {
			if st := testutil.Structured(t, res); st.ExitCode != 7 || st.Status != "error" {
				t.Fatalf("SystemExit(7): %+v", st)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, rec := call(t, b, c, tt.args)
			if rec == nil {
				t.Fatalf("no job record: %q", testutil.Text(res))
			}
			tt.check(t, res, rec)
			alive(t)
		})
	}
	t.Run("HugeCode", func(t *testing.T) {
		// The front-end refuses code over its limit (256 KiB by default) before
		// it reaches a worker (and its HTTP layer refuses bodies of megabytes);
		// 10 MiB sent straight to the runtime, and the frame limit, are tested
		// in package sandboxtest.
		res := testutil.CallRunPython(t, c, map[string]any{"code": "x = '" + strings.Repeat("a", 300<<10) + "'"})
		if !res.IsError || !strings.Contains(testutil.Text(res), "limit") {
			t.Fatalf("300 KiB of code: %q", testutil.Text(res))
		}
		alive(t)
	})
}

// TestSessionsThroughFleet: a session's jobs share Python globals and run on the
// worker that holds the session; sessions end on idle timeout and with their
// worker, after which a job of the session says so.
func TestSessionsThroughFleet(t *testing.T) {
	b := testutil.Broker(t, "", queue.DefaultConfig())
	workers := map[string]*worker.Worker{}
	runtimes := map[string]*podman.Runtime{}
	for _, id := range []string{"e2e-sess-a", "e2e-sess-b"} {
		rt := podmantest.New(t, podman.Config{Config: containerpool.Config{Pool: 0, WorkerID: id}})
		cfg := worker.DefaultConfig(id)
		// Idle long enough that a loaded host's round trips between a
		// session's jobs never end it by accident.
		cfg.SessionIdle, cfg.MaxSessions, cfg.Grace = 10*time.Second, 2, time.Second
		workers[id] = testutil.Worker(t, b, rt, cfg)
		runtimes[id] = rt
	}
	fe := testutil.Frontend(t, b, "e2e-sess-fe")
	c := testutil.MCPClient(t, fe)
	run := func(t *testing.T, session, code string) (string, *jobs.Record) {
		t.Helper()
		args := map[string]any{"code": code}
		if session != "" {
			args["session"] = session
		}
		res, rec := call(t, b, c, args)
		if rec == nil {
			t.Fatalf("no record: %q", testutil.Text(res))
		}
		return testutil.Text(res), rec
	}

	_, first := run(t, "s1", "x = 41")
	holder := first.Result.Worker
	for i := range 4 {
		out, rec := run(t, "s1", "x += 1\nprint(x)")
		if out != fmt.Sprint(42+i) || rec.Result.Worker != holder {
			t.Fatalf("job %d of s1: %q on %s, want %d on %s", i, out, rec.Result.Worker, 42+i, holder)
		}
	}
	if out, _ := run(t, "", "print('x' in globals())"); out != "False" {
		t.Fatalf("a session-less job saw the session's globals: %q", out)
	}
	if out, _ := run(t, "s2", "print('x' in globals())"); out != "False" {
		t.Fatalf("another session saw s1's globals: %q", out)
	}

	// Idle timeout: the sessions, and their containers, go away; the worker
	// leaves a tombstone that tells a session's next job so. (s2 must be gone
	// too: a worker holds at most two sessions, and a new one taken by a
	// worker at its maximum fails.)
	waitSessionEnded(t, b, "s1", time.Minute)
	waitSessionEnded(t, b, "s2", time.Minute)
	out, rec := run(t, "s1", "print(x)")
	if rec.Status != jobs.StatusError || !strings.Contains(rec.Result.Error, "session s1 has expired or its worker is gone; start a new session") {
		t.Fatalf("job of an expired session: %s %q %q", rec.Status, rec.Result.Error, out)
	}
	if out, _ := run(t, "s1", "print('x' in globals())"); out != "False" {
		t.Fatalf("a restarted session kept old globals: %q", out)
	}

	// The worker holding a session stops, and its runtime closes after it
	// (as cmd/worker does: the runtime keeps idle containers of session-less
	// jobs for their namespace's next job until it closes): its containers
	// go, and the session's next job says the session is gone.
	_, rec = run(t, "s3", "y = 1")
	holder = rec.Result.Worker
	workers[holder].Stop()
	if err := runtimes[holder].Close(); err != nil {
		t.Fatalf("close %s's runtime: %v", holder, err)
	}
	if ids := containersOf(t, holder); ids != "" {
		t.Fatalf("worker %s stopped but containers remain: %s", holder, ids)
	}
	out, rec = run(t, "s3", "print(y)")
	if rec.Status != jobs.StatusError || !strings.Contains(rec.Result.Error, "session s3 has expired or its worker is gone") {
		t.Fatalf("job of a stopped worker's session: %s %q %q", rec.Status, rec.Result.Error, out)
	}
	// The other worker takes the session afresh.
	if out, rec := run(t, "s3", "print('y' in globals())"); out != "False" || rec.Result.Worker == holder {
		t.Fatalf("restarted session: %q on %s", out, rec.Result.Worker)
	}
}

// waitSessionEnded waits until the sessions bucket marks session ended (the
// worker holding it ended it), failing the test after limit.
func waitSessionEnded(t *testing.T, b *broker.Broker, session string, limit time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	js, err := jetstream.New(testutil.Connect(t, b, "sessions-check"))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, jobs.Subjects{}.SessionsBucket())
	if err != nil {
		t.Fatal(err)
	}
	for {
		keys, err := kv.Keys(ctx)
		if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) && ctx.Err() == nil {
			t.Fatalf("list sessions: %v", err)
		}
		for _, key := range keys {
			var ent queue.SessionEntry
			if e, err := kv.Get(ctx, key); err == nil && json.Unmarshal(e.Value(), &ent) == nil && ent.Session == session && ent.Ended {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("session %s not ended within %s", session, limit)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// workerContainers lists, by the Podman CLI, the ids of worker's containers
// (`podman ps -q` with flags, e.g. -a or a status filter).
func workerContainers(t *testing.T, worker string, flags ...string) string {
	t.Helper()
	args := append([]string{"ps", "-q", "--filter", "label=" + containerpool.LabelWorker + "=" + worker}, flags...)
	cmd, cancel := testenv.Command(testenv.CLITimeout, "podman", args...)
	defer cancel()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("podman ps: %v %s", err, out)
	}
	return strings.TrimSpace(string(out))
}

// containersOf lists the containers labelled with worker, waiting up to a
// minute for them to be gone.
func containersOf(t *testing.T, worker string) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ids := workerContainers(t, worker, "-a")
		if ids == "" || time.Now().After(deadline) {
			return ids
		}
		time.Sleep(200 * time.Millisecond)
	}
}
