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

// EchoHost answers call_tool with its arguments and fails calls to server "bad".
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
	}
	_ = json.Unmarshal(params, &p)
	if p.Server == "bad" {
		return nil, errors.New("server bad refused the call")
	}
	return json.Marshal(map[string]any{"method": method, "echo": p.Arguments})
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
	run := func(t *testing.T, code string, timeout time.Duration, host sandbox.Host) sandbox.Result {
		t.Helper()
		if host == nil {
			host = &EchoHost{}
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout+60*time.Second)
		defer cancel()
		res, err := rt.Run(ctx, sandbox.Job{ID: t.Name(), Code: code, Timeout: timeout, OutputCap: 4096}, host)
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		return res
	}
	expect := func(t *testing.T, res sandbox.Result, status sandbox.Status, exit int) {
		t.Helper()
		if res.Status != status || res.ExitCode != exit {
			t.Fatalf("got status %s exit %d, want %s exit %d\nerror: %s\nstdout: %q\nstderr: %q",
				res.Status, res.ExitCode, status, exit, res.Error, res.Stdout, res.Stderr)
		}
	}
	short := 20 * time.Second

	t.Run("PrintsOutput", func(t *testing.T) {
		res := run(t, "print(6*7)", short, nil)
		expect(t, res, sandbox.StatusSuccess, 0)
		if res.Stdout != "42\n" {
			t.Fatalf("stdout %q, want %q", res.Stdout, "42\n")
		}
	})
	t.Run("TopLevelAwait", func(t *testing.T) {
		res := run(t, "import asyncio\nawait asyncio.sleep(0.01)\nprint('awaited')", short, nil)
		expect(t, res, sandbox.StatusSuccess, 0)
		if res.Stdout != "awaited\n" {
			t.Fatalf("stdout %q", res.Stdout)
		}
	})
	t.Run("ExceptionIsError", func(t *testing.T) {
		res := run(t, "print('before')\n1/0", short, nil)
		expect(t, res, sandbox.StatusError, 1)
		if !strings.Contains(res.Stderr, "ZeroDivisionError") || !strings.Contains(res.Stderr, "Traceback") {
			t.Fatalf("stderr lacks the traceback: %q", res.Stderr)
		}
		if res.Stdout != "before\n" {
			t.Fatalf("stdout %q", res.Stdout)
		}
	})
	t.Run("SystemExitCode", func(t *testing.T) {
		expect(t, run(t, "import sys\nsys.exit(3)", short, nil), sandbox.StatusError, 3)
		expect(t, run(t, "raise SystemExit(0)", short, nil), sandbox.StatusSuccess, 0)
	})
	t.Run("SyntaxError", func(t *testing.T) {
		res := run(t, "def (:", short, nil)
		expect(t, res, sandbox.StatusError, 1)
		if !strings.Contains(res.Stderr, "SyntaxError") {
			t.Fatalf("stderr %q", res.Stderr)
		}
	})
	t.Run("Timeout", func(t *testing.T) {
		start := time.Now()
		res := run(t, "while True:\n    pass", time.Second, nil)
		if res.Status != sandbox.StatusTimeout {
			t.Fatalf("status %s, want timeout (%s)", res.Status, res.Error)
		}
		if el := time.Since(start); el > 15*time.Second {
			t.Fatalf("timeout of 1s took %s", el)
		}
	})
	t.Run("OutputCapped", func(t *testing.T) {
		res := run(t, "import sys\nfor i in range(2000):\n    print('x'*100)\nsys.stderr.write('e'*10000)", short, nil)
		expect(t, res, sandbox.StatusSuccess, 0)
		if len(res.Stdout) != 4096 || !res.StdoutTruncated {
			t.Fatalf("stdout %d bytes truncated=%v, want 4096 and true", len(res.Stdout), res.StdoutTruncated)
		}
		if len(res.Stderr) != 4096 || !res.StderrTruncated {
			t.Fatalf("stderr %d bytes truncated=%v", len(res.Stderr), res.StderrTruncated)
		}
	})
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
	if !opts.Isolated {
		return
	}
	runIsolation(t, run, expect)
}

type runFunc func(t *testing.T, code string, timeout time.Duration, host sandbox.Host) sandbox.Result
type expectFunc func(t *testing.T, res sandbox.Result, status sandbox.Status, exit int)

func runIsolation(t *testing.T, run runFunc, expect expectFunc) {
	short := 20 * time.Second
	t.Run("RunsAsNobody", func(t *testing.T) {
		res := run(t, "import os\nprint(os.getuid(), os.getgid())", short, nil)
		expect(t, res, sandbox.StatusSuccess, 0)
		if res.Stdout != "65534 65534\n" {
			t.Fatalf("uid/gid %q", res.Stdout)
		}
	})
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
		res := run(t, code, short, nil)
		expect(t, res, sandbox.StatusSuccess, 0)
		if strings.Contains(res.Stdout, "CONNECTED") || strings.Contains(res.Stdout, "eth") {
			t.Fatalf("sandbox reached the network: %q", res.Stdout)
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
		res := run(t, code, short, nil)
		expect(t, res, sandbox.StatusSuccess, 0)
		if strings.Contains(res.Stdout, "WROTE") || !strings.Contains(res.Stdout, "fine") {
			t.Fatalf("stdout %q", res.Stdout)
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
		res := run(t, "import os\nprint(sorted(os.environ))", short, nil)
		expect(t, res, sandbox.StatusSuccess, 0)
		for _, leak := range []string{"MCPEXEC", "NATS", "HOME=/root", "SSH", "AWS", "TOKEN"} {
			if strings.Contains(strings.ToUpper(res.Stdout), leak) {
				t.Fatalf("environment leaks %s: %s", leak, res.Stdout)
			}
		}
	})
	t.Run("NoCapabilities", func(t *testing.T) {
		res := run(t, "print([l for l in open('/proc/self/status') if l.startswith(('CapEff','CapBnd','NoNewPrivs'))])", short, nil)
		expect(t, res, sandbox.StatusSuccess, 0)
		if !strings.Contains(res.Stdout, "CapEff:\\t0000000000000000") || !strings.Contains(res.Stdout, "NoNewPrivs:\\t1") {
			t.Fatalf("capabilities or no_new_privs not as expected: %s", res.Stdout)
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
