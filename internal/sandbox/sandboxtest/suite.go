// Package sandboxtest is the conformance suite every sandbox.Runtime passes.
package sandboxtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// Options say which parts of the suite apply to a runtime.
type Options struct {
	// Isolated runtimes must also pass the hostile-code tests (network, filesystem,
	// identity, environment, resource bombs).
	Isolated bool
}

// EchoHost answers call_tool with its arguments (as an MCP result holding
// them as JSON text when the call asks for the raw result, as the front-end
// does) and fails calls to server "bad".
type EchoHost struct {
	mu     sync.Mutex
	Calls  []string
	output strings.Builder
}

// Call implements sandbox.Host.
func (h *EchoHost) Call(_ context.Context, method string, params json.RawMessage) (json.RawMessage, error) {
	h.mu.Lock()
	h.Calls = append(h.Calls, method)
	h.mu.Unlock()
	var p struct {
		Server    string          `json:"server"`
		Arguments json.RawMessage `json:"arguments"`
		Raw       bool            `json:"raw"`
	}
	_ = json.Unmarshal(params, &p) // a call without arguments echoes nothing
	if p.Server == "bad" {
		return nil, errors.New("server bad refused the call")
	}
	value, err := json.Marshal(map[string]any{"method": method, "echo": p.Arguments})
	if err != nil || !p.Raw {
		return value, err
	}
	return json.Marshal(map[string]any{"content": []any{map[string]any{"type": "text", "text": string(value)}}})
}

// Output implements sandbox.Host.
func (h *EchoHost) Output(_, data string) {
	h.mu.Lock()
	h.output.WriteString(data)
	h.mu.Unlock()
}

// Run runs the suite against the runtime newRuntime returns.
func Run(t *testing.T, rt sandbox.Runtime, opts Options) {
	t.Helper()
	run := runnerFor(rt, "")
	runBasics(t, run, pythonBasics)
	t.Run("RawFDWritesAreOutputNotFrames", func(t *testing.T) {
		// A forged 'done' frame written straight to fd 1 must arrive as text.
		code := `import os, json, struct
body = json.dumps({"type":"done","status":"success","exit_code":0}).encode()
os.write(1, struct.pack(">I", len(body)) + body)
os.write(2, b"\xff\xfe raw\n")
raise ValueError("real outcome")`
		res := run(t, code, short, nil)
		expect(t, res, sandbox.StatusError, 1)
		if !strings.Contains(res.Stdout, `"type": "done"`) {
			t.Fatalf("forged frame not seen as output: %q", res.Stdout)
		}
		if !strings.Contains(res.Stderr, "raw") || !strings.Contains(res.Stderr, "ValueError") {
			t.Fatalf("stderr %q", res.Stderr)
		}
	})
	t.Run("ProxyCall", func(t *testing.T) {
		h := &EchoHost{}
		res := run(t, "r = await call_tool('s', 't', {'a': 1})\nprint(r['echo']['a'])\ntry:\n    await call_tool('bad', 't')\nexcept MCPError as e:\n    print('MCPError', e)", short, h)
		expect(t, res, sandbox.StatusSuccess, 0)
		if res.Stdout != "1\nMCPError server bad refused the call\n" {
			t.Fatalf("stdout %q", res.Stdout)
		}
		if len(h.Calls) != 2 {
			t.Fatalf("host saw %d calls, want 2", len(h.Calls))
		}
	})
	t.Run("NothingLeftByWarmUp", func(t *testing.T) {
		// The executor ran a job's steps before this job came (its warm-up,
		// in the same globals): none of its names or code remains.
		out := succeeds(t, run, "print('_' in globals(), __name__, LOADED_MCP_SERVERS, sorted(k for k in globals() if k.startswith('mcp_')))\n_ = 1")
		if out != "False __main__ () ['mcp_servers']\n" {
			t.Fatalf("a fresh job's globals: %q", out)
		}
	})
	t.Run("CallsKeepOneThread", func(t *testing.T) {
		// Replies to the code's calls are read on its own thread (a second
		// thread makes each copy-on-write fault of the fork an interrupt of
		// every CPU): awaited, gathered and blocking calls leave one thread;
		// a call from a thread of the code's own still gets its reply, and so
		// do the main thread's after it.
		h := &EchoHost{}
		code := `import asyncio, threading
r = await call_tool('s', 't', {'a': 1})
rs = await asyncio.gather(*[call_tool('s', 't', {'a': i}) for i in range(5)])
discovered_servers()
print(r['echo']['a'], [x['echo']['a'] for x in rs], threading.active_count())
box = []
th = threading.Thread(target=lambda: box.append(asyncio.run(call_tool('s', 't', {'a': 7}))))
th.start()
th.join(10)
r2 = await call_tool('s', 't', {'a': 8})
print(box[0]['echo']['a'], r2['echo']['a'], discovered_servers()['method'])`
		res := run(t, code, short, h)
		expect(t, res, sandbox.StatusSuccess, 0)
		if want := "1 [0, 1, 2, 3, 4] 1\n7 8 discovered_servers\n"; res.Stdout != want {
			t.Fatalf("stdout %q, want %q (stderr %q)", res.Stdout, want, res.Stderr)
		}
	})
	t.Run("LiveOutput", func(t *testing.T) {
		h := &EchoHost{}
		res := run(t, "print('live')", short, h)
		expect(t, res, sandbox.StatusSuccess, 0)
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.output.String() != "live\n" {
			t.Fatalf("host output %q", h.output.String())
		}
	})
	t.Run("ConcurrentJobs", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for i := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := rt.Run(context.Background(), sandbox.Job{ID: fmt.Sprint(i), Code: fmt.Sprintf("print(%d)", i), Timeout: short}, nil)
				if err != nil {
					errs <- err
					return
				}
				if res.Stdout != fmt.Sprintf("%d\n", i) {
					errs <- fmt.Errorf("job %d stdout %q", i, res.Stdout)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
	runHostileProtocol(t, rt, run)
	runHostileRunner(t, rt, run)
	t.Run("Files", func(t *testing.T) { runFiles(t, rt, run) })
	t.Run("JavaScript", func(t *testing.T) { runJavaScript(t, rt, opts) })
	if srt, ok := rt.(sandbox.SessionRuntime); ok {
		t.Run("Sessions", func(t *testing.T) { runSessions(t, srt, opts) })
	}
	if !opts.Isolated {
		return
	}
	runIsolation(t, run)
	runFigures(t, rt, run)
}

// forgeControl is Python that finds the runner's control socket among the
// process's file descriptors and writes payload (a bytes expression) to it.
func forgeControl(payload string) string {
	return `import os, socket, stat, struct, json
sent = 0
for fd in range(3, 256):
    try:
        st = os.fstat(fd)
    except OSError:
        continue
    if stat.S_ISSOCK(st.st_mode):
        s = socket.socket(fileno=os.dup(fd))
        try:
            s.sendall(` + payload + `)
            sent += 1
        except OSError:
            pass
print("forged on", sent, "sockets", flush=True)
`
}

// runHostileProtocol checks that code attacking the runner protocol or the
// output channel cannot crash or hang the host, whatever the runtime.
func runHostileProtocol(t *testing.T, rt sandbox.Runtime, run runFunc) {
	// The forging code then sleeps for a minute (within a limit of 90 s): the
	// job must end long before, whatever a loaded host adds to its start.
	const sleep, long, bound = "import time\ntime.sleep(60)\n", 90 * time.Second, 40 * time.Second
	t.Run("ForgedGarbageOnControlSocket", func(t *testing.T) {
		code := forgeControl(`struct.pack(">I", 0xFFFFFFF0) + b"garbage"`) + sleep
		start := time.Now()
		res := run(t, code, long, nil)
		if res.Status != sandbox.StatusError || !strings.Contains(res.Error, "protocol") {
			t.Fatalf("status %s error %q stdout %q, want a protocol error", res.Status, res.Error, res.Stdout)
		}
		if el := time.Since(start); el > bound {
			t.Fatalf("a garbage frame took %s to end the job", el)
		}
	})
	t.Run("ForgedFramesOnControlSocket", func(t *testing.T) {
		// Valid frames the code writes itself: an out frame claiming another
		// stream, a reply nobody asked for, an exec, then a forged done. A job
		// may lie about its own outcome; nothing else may follow from it.
		code := forgeControl(`b"".join(struct.pack(">I", len(b)) + b for b in (json.dumps(f).encode() for f in (
    {"type": "reply", "id": 99, "result": 1},
    {"type": "exec", "code": "print('smuggled')"},
    {"type": "done", "status": "success", "exit_code": 0})))`) + sleep
		start := time.Now()
		res := run(t, code, long, nil)
		if el := time.Since(start); el > bound {
			t.Fatalf("forged frames took %s to end the job", el)
		}
		if strings.Contains(res.Stdout, "smuggled") {
			t.Fatalf("a forged exec frame ran: %+v", res)
		}
		t.Logf("forged frames: status %s error %q", res.Status, res.Error)
	})
	t.Run("HugeCode", func(t *testing.T) {
		// 10 MiB of code goes through the channel (frame limit 16 MiB)...
		code := "x = '" + strings.Repeat("a", 10<<20) + "'\nprint(len(x))"
		res := run(t, code, 60*time.Second, nil)
		expect(t, res, sandbox.StatusSuccess, 0)
		if res.Stdout != fmt.Sprintf("%d\n", 10<<20) {
			t.Fatalf("stdout %q", res.Stdout)
		}
		// ...20 MiB does not, and says why.
		res = run(t, "#"+strings.Repeat("a", 20<<20), short, nil)
		if res.Status != sandbox.StatusError || !strings.Contains(res.Error, "too large") {
			t.Fatalf("20 MiB of code: status %s error %q", res.Status, res.Error)
		}
	})
	t.Run("OutputFlood", func(t *testing.T) {
		start := time.Now()
		res := run(t, "import os, sys\nchunk = b'x' * 65536\nfor _ in range(1024):\n    os.write(1, chunk)\nfor _ in range(100000):\n    print('y' * 100, file=sys.stderr)", 60*time.Second, nil)
		expect(t, res, sandbox.StatusSuccess, 0)
		if len(res.Stdout) != 4096 || !res.StdoutTruncated || len(res.Stderr) != 4096 || !res.StderrTruncated {
			t.Fatalf("flood not capped: stdout %d (truncated %v) stderr %d (truncated %v)",
				len(res.Stdout), res.StdoutTruncated, len(res.Stderr), res.StderrTruncated)
		}
		t.Logf("64 MiB stdout + 10 MiB stderr flood took %s", time.Since(start))
	})
	t.Run("HealthyAfterProtocolAbuse", func(t *testing.T) {
		out := succeeds(t, run, "print('alive')")
		if out != "alive\n" {
			t.Fatalf("stdout %q", out)
		}
	})
}

// runSessions checks a SessionRuntime's sessions.
func runSessions(t *testing.T, rt sandbox.SessionRuntime, opts Options) {
	n := 0
	key := func() string { n++; return fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), n) }
	in := func(t *testing.T, session, code string, timeout time.Duration) sandbox.Result {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), timeout+60*time.Second)
		defer cancel()
		res, err := rt.RunInSession(ctx, session, sandbox.Job{ID: "s", Code: code, Timeout: timeout, OutputCap: 4096}, &EchoHost{})
		if err != nil {
			t.Fatalf("RunInSession(%s): %v", session, err)
		}
		return res
	}
	t.Run("KeepsGlobals", func(t *testing.T) {
		a, b := key(), key()
		t.Cleanup(func() { _ = rt.EndSession(a); _ = rt.EndSession(b) })
		if res := in(t, a, "x = 41\nimport json", short); res.Status != sandbox.StatusSuccess {
			t.Fatalf("first job: %+v", res)
		}
		if !rt.HasSession(a) {
			t.Fatal("HasSession false after a clean job")
		}
		if res := in(t, a, "x += 1\nprint(x, json.dumps([1]))", short); res.Stdout != "42 [1]\n" {
			t.Fatalf("second job of the session: %+v", res)
		}
		// An error in the code does not end the session.
		if res := in(t, a, "1/0", short); res.Status != sandbox.StatusError || !rt.HasSession(a) {
			t.Fatalf("exception: %+v, session kept %v", res, rt.HasSession(a))
		}
		if res := in(t, b, "print(x)", short); !strings.Contains(res.Stderr, "NameError") {
			t.Fatalf("another session saw x: %+v", res)
		}
		// A plain run sees no session's globals.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if res, err := rt.Run(ctx, sandbox.Job{ID: "p", Code: "print(x)", Timeout: short}, nil); err != nil || !strings.Contains(res.Stderr, "NameError") {
			t.Fatalf("plain run saw session globals: %v %+v", err, res)
		}
		if err := rt.EndSession(a); err != nil || rt.HasSession(a) {
			t.Fatalf("EndSession: %v, HasSession %v", err, rt.HasSession(a))
		}
		if res := in(t, a, "print(x)", short); !strings.Contains(res.Stderr, "NameError") {
			t.Fatalf("an ended session kept its globals: %+v", res)
		}
		if err := rt.EndSession("no-such-session"); err != nil {
			t.Fatalf("EndSession of an unknown session: %v", err)
		}
	})
	t.Run("TimeoutEndsSession", func(t *testing.T) {
		a := key()
		t.Cleanup(func() { _ = rt.EndSession(a) })
		in(t, a, "x = 1", short)
		if res := in(t, a, "while True: pass", time.Second); res.Status != sandbox.StatusTimeout {
			t.Fatalf("status %s, want timeout", res.Status)
		}
		if rt.HasSession(a) {
			t.Fatal("session survived a timeout")
		}
	})
	t.Run("ProtocolAbuseEndsSession", func(t *testing.T) {
		a := key()
		t.Cleanup(func() { _ = rt.EndSession(a) })
		res := in(t, a, forgeControl(`struct.pack(">I", 0xFFFFFFF0)`)+"import time\ntime.sleep(10)", short)
		if res.Status != sandbox.StatusError || rt.HasSession(a) {
			t.Fatalf("result %+v, session kept %v", res, rt.HasSession(a))
		}
	})
	t.Run("JobsRunOneAtATime", func(t *testing.T) {
		a := key()
		t.Cleanup(func() { _ = rt.EndSession(a) })
		in(t, a, "import time\nlog = []", short)
		var wg sync.WaitGroup
		for i := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				in(t, a, fmt.Sprintf("log.append(('start', %d))\ntime.sleep(0.2)\nlog.append(('end', %d))", i, i), short)
			}()
		}
		wg.Wait()
		res := in(t, a, "print(all(log[k][1] == log[k+1][1] for k in range(0, len(log), 2)), len(log))", short)
		if res.Stdout != "True 6\n" {
			t.Fatalf("jobs of one session interleaved: %q", res.Stdout)
		}
	})
	if !opts.Isolated {
		return
	}
	t.Run("KeepsWorkspace", func(t *testing.T) { runSessionFiles(t, rt, key()) })
	t.Run("SessionsDoNotShareFiles", func(t *testing.T) {
		a, b := key(), key()
		t.Cleanup(func() { _ = rt.EndSession(a); _ = rt.EndSession(b) })
		in(t, a, "open('/tmp/mine', 'w').write('secret')", short)
		if res := in(t, a, "print(open('/tmp/mine').read())", short); res.Stdout != "secret\n" {
			t.Fatalf("a session lost its own file: %+v", res)
		}
		if res := in(t, b, "import os\nprint(os.path.exists('/tmp/mine'))", short); res.Stdout != "False\n" {
			t.Fatalf("another session sees the file: %+v", res)
		}
	})
}

type runFunc func(t *testing.T, code string, timeout time.Duration, host sandbox.Host) sandbox.Result

// short is the time limit of the jobs that should end at once.
const short = 20 * time.Second

// expect fails the test unless res has status and exit code exit.
func expect(t *testing.T, res sandbox.Result, status sandbox.Status, exit int) {
	t.Helper()
	if res.Status != status || res.ExitCode != exit {
		t.Fatalf("got status %s exit %d, want %s exit %d\nerror: %s\nstdout: %q\nstderr: %q",
			res.Status, res.ExitCode, status, exit, res.Error, res.Stdout, res.Stderr)
	}
}

// succeeds runs code (short time limit, echo host), wants it to succeed and
// returns its stdout.
func succeeds(t *testing.T, run runFunc, code string) string {
	t.Helper()
	res := run(t, code, short, nil)
	expect(t, res, sandbox.StatusSuccess, 0)
	return res.Stdout
}

func runIsolation(t *testing.T, run runFunc) {
	runsAsNobody(t, run, pythonBasics)
	t.Run("NoNetwork", func(t *testing.T) {
		code := `import socket
ifs = [n for _, n in socket.if_nameindex()]
print("ifaces", ifs)
for host, port in (("127.0.0.1", 4222), ("10.0.2.2", 80), ("1.1.1.1", 53)):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((host, port))
        print("CONNECTED", host)
    except OSError as e:
        print("refused", host)`
		out := succeeds(t, run, code)
		if strings.Contains(out, "CONNECTED") || strings.Contains(out, "eth") {
			t.Fatalf("sandbox reached the network: %q", out)
		}
	})
	t.Run("ReadOnlyRoot", func(t *testing.T) {
		code := `import os
for p in ("/etc/evil", "/usr/evil", "/evil"):
    try:
        open(p, "w").write("x")
        print("WROTE", p)
    except OSError:
        pass
open("/tmp/ok", "w").write("fine")
print(open("/tmp/ok").read())`
		out := succeeds(t, run, code)
		if strings.Contains(out, "WROTE") || !strings.Contains(out, "fine") {
			t.Fatalf("stdout %q", out)
		}
	})
	t.Run("TmpIsNoexec", func(t *testing.T) {
		code := `import os, subprocess
open("/tmp/x.sh", "w").write("#!/bin/sh\necho ran\n")
os.chmod("/tmp/x.sh", 0o755)
try:
    subprocess.run(["/tmp/x.sh"], check=True)
    print("EXECUTED")
except OSError as e:
    print("blocked", e.errno)`
		res := run(t, code, short, nil)
		if strings.Contains(res.Stdout, "EXECUTED") || strings.Contains(res.Stdout, "ran") {
			t.Fatalf("executed from /tmp: %q", res.Stdout)
		}
	})
	t.Run("NoHostEnvironment", func(t *testing.T) {
		out := succeeds(t, run, "import os\nprint(sorted(os.environ))")
		for _, leak := range []string{"MCPEXEC", "NATS", "HOME=/root", "SSH", "AWS", "TOKEN"} {
			if strings.Contains(strings.ToUpper(out), leak) {
				t.Fatalf("environment leaks %s: %s", leak, out)
			}
		}
	})
	t.Run("NoSecretFromWorkerEnvironment", func(t *testing.T) {
		const secret = "mcpexec-probe-5f1c2d9e"
		t.Setenv("MCPEXEC_SECRET_PROBE", secret)
		t.Setenv("NATS_PASSWORD", secret)
		code := `import os
found = [k for k, v in os.environ.items() if "mcpexec-probe" in v]
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            if b"mcpexec-probe" in open("/proc/%s/environ" % pid, "rb").read():
                found.append(pid)
        except OSError:
            pass
print("found", found)`
		out := succeeds(t, run, code)
		if out != "found []\n" {
			t.Fatalf("the worker's secret reached the sandbox: %s", out)
		}
	})
	t.Run("NoCapabilities", func(t *testing.T) {
		out := succeeds(t, run, "print([l for l in open('/proc/self/status') if l.startswith(('CapEff','CapBnd','NoNewPrivs'))])")
		if !strings.Contains(out, "CapEff:\\t0000000000000000") || !strings.Contains(out, "NoNewPrivs:\\t1") {
			t.Fatalf("capabilities or no_new_privs not as expected: %s", out)
		}
	})
	t.Run("ForkBombContained", func(t *testing.T) {
		code := `import os
n = 0
try:
    for _ in range(10000):
        if os.fork() == 0:
            import time; time.sleep(30); os._exit(0)
        n += 1
except OSError as e:
    print("stopped after", n)`
		res := run(t, code, 10*time.Second, nil)
		if !strings.Contains(res.Stdout, "stopped after") {
			t.Fatalf("fork bomb not stopped: %+v", res)
		}
	})
	t.Run("MemoryBombContained", func(t *testing.T) {
		res := run(t, "b = []\nwhile True:\n    b.append(bytearray(16 << 20))", 30*time.Second, nil)
		if res.Status != sandbox.StatusError || !strings.Contains(strings.ToLower(res.Error+res.Stderr), "memory") {
			t.Fatalf("memory bomb: status %s error %q stderr %q", res.Status, res.Error, res.Stderr)
		}
	})
	t.Run("StillHealthyAfterAbuse", func(t *testing.T) {
		expect(t, run(t, "print('alive')", short, nil), sandbox.StatusSuccess, 0)
	})
}
