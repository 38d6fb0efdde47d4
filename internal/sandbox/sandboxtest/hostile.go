package sandboxtest

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// FrameHelpers is Python for attacking the runner protocol from inside a
// sandbox: frame(obj) is the bytes of one frame, reachable_sockets() every
// socket the code can get hold of, send_all(data) writes data to each of them
// and returns how many took it.
const FrameHelpers = `import os, socket, stat, struct, json, gc
def frame(obj):
    body = json.dumps(obj).encode()
    return struct.pack(">I", len(body)) + body
def reachable_sockets():
    """Every socket the code can get hold of: its file descriptors and the
    socket objects the garbage collector knows."""
    found = []
    for fd in range(3, 256):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                found.append(socket.socket(fileno=os.dup(fd)))
        except OSError:
            pass
    for o in gc.get_objects():
        if isinstance(o, socket.socket) and o.fileno() >= 0:
            try:
                found.append(socket.socket(fileno=os.dup(o.fileno())))
            except OSError:
                pass
    return found
def send_all(data):
    n = 0
    for s in reachable_sockets():
        try:
            s.sendall(data)
            n += 1
        except OSError:
            pass
    return n
`

// runHostileRunner is the hostile-runner suite: code that attacks the runner
// and the host's end of its channel. The host must hold its bounds, the job
// must end within its time limit plus the host's write timeout, and the next
// job must succeed.
func runHostileRunner(t *testing.T, rt sandbox.Runtime, run runFunc) {
	// Each case's job has a limit of `limit`; it must end within `bound`.
	const limit, bound = 4 * time.Second, 4*time.Second + sandbox.WriteTimeout + 20*time.Second
	healthy := func(t *testing.T) {
		t.Helper()
		if out := succeeds(t, run, "print('next job fine')"); out != "next job fine\n" {
			t.Fatalf("next job: stdout %q", out)
		}
	}
	timed := func(t *testing.T, code string, host sandbox.Host) sandbox.Result {
		t.Helper()
		start := time.Now()
		res := run(t, code, limit, host)
		if el := time.Since(start); el > bound {
			t.Fatalf("job with a %s limit took %s: %+v", limit, el, res)
		}
		return res
	}

	t.Run("HostChannelOutOfReach", func(t *testing.T) {
		// The code looks for the runner's host connection everywhere it can:
		// its descriptors, the garbage collector, the runner's /proc files, a
		// ptrace, the socket path. A frame that reached the host straight
		// would show as output; what reaches the runner ends the job as a
		// protocol error at most.
		code := FrameHelpers + `
import ctypes, glob
report = []
for path in ("/proc/1/fd", "/proc/%d/fd" % os.getppid()):
    try:
        report.append("LISTED %s %s" % (path, os.listdir(path)))
    except OSError as e:
        report.append("denied %s" % path)
for path in ("/proc/1/mem", "/proc/%d/mem" % os.getppid()):
    try:
        open(path, "rb").read(1)
        report.append("READ " + path)
    except OSError:
        report.append("denied " + path)
try:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(16, os.getppid(), 0, 0) == 0:
        report.append("PTRACED")
    else:
        report.append("ptrace denied")
except Exception as e:
    report.append("no ptrace %s" % e)
cmdline = open("/proc/%d/cmdline" % os.getppid(), "rb").read().split(b"\0")
for arg in cmdline:
    if arg.endswith(b"s") or arg.endswith(b".sock"):
        try:
            c = socket.socket(socket.AF_UNIX)
            c.connect(arg.decode())
            report.append("CONNECTED %s" % arg)
        except OSError:
            pass
print("\n".join(report), flush=True)
send_all(frame({"type": "out", "stream": "stdout", "data": "FORGED"}))
import time
time.sleep(2)
`
		res := timed(t, code, nil)
		for _, bad := range []string{"FORGED", "LISTED", "READ /proc", "PTRACED", "CONNECTED"} {
			if strings.Contains(res.Stdout, bad) {
				t.Fatalf("the code reached the host channel (%s):\n%s\nerror: %s", bad, res.Stdout, res.Error)
			}
		}
		t.Logf("status %s error %q; the code's probes:\n%s", res.Status, res.Error, res.Stdout)
		healthy(t)
	})
	t.Run("FloodsCallsAndStopsReading", func(t *testing.T) {
		// Raw calls as fast as the code can write them, never reading the
		// (big) answers.
		h := &bigHost{}
		code := FrameHelpers + `
import threading
socks = reachable_sockets()
def flood(s):
    i = 1
    while True:
        try:
            s.sendall(frame({"type": "call", "id": i, "method": "memory_get", "params": {"key": "k"}}))
        except OSError:
            return
        i += 1
for s in socks:
    threading.Thread(target=flood, args=(s,), daemon=True).start()
import time
time.sleep(60)
`
		res := timed(t, code, h)
		if res.Status == sandbox.StatusSuccess {
			t.Fatalf("flood ended in success: %+v", res)
		}
		t.Logf("status %s error %q; host answered %d calls", res.Status, res.Error, h.n())
		healthy(t)
	})
	t.Run("FloodsCallsThroughTheAPI", func(t *testing.T) {
		h := &bigHost{}
		code := `import asyncio
async def one(i):
    try:
        await call_tool("s", "t", {"i": i})
    except MCPError:
        pass
await asyncio.gather(*(one(i) for i in range(5000)))
print("done")`
		res := timed(t, code, h)
		t.Logf("status %s error %q; host answered %d calls", res.Status, res.Error, h.n())
		if h.n() > sandbox.CallBurst+int(bound/time.Second)*sandbox.CallsPerSecond {
			t.Fatalf("host answered %d calls: over the rate bound", h.n())
		}
		healthy(t)
	})
	t.Run("ForgedAndMalformedFrames", func(t *testing.T) {
		cases := map[string]string{
			"done":      `frame({"type": "done", "status": "success", "exit_code": 0})`,
			"hello":     `frame({"type": "hello", "version": 2, "secret": "x"})`,
			"unknown":   `frame({"type": "call", "id": 1, "method": "x" * (3 << 20)})`,
			"nonutf8":   `struct.pack(">I", 6) + b"\xff\xfe\xfd\xfc\xfb\xfa"`,
			"oversized": `struct.pack(">I", 0x7FFFFFFF) + b"{" * 65536`,
			"bigframe":  `frame({"type": "out", "stream": "stdout", "data": "y" * (20 << 20)})`,
		}
		for name, payload := range cases {
			t.Run(name, func(t *testing.T) {
				res := timed(t, FrameHelpers+"print('sent to', send_all("+payload+"))\nimport time\ntime.sleep(2)\nprint('still here')", nil)
				if strings.Contains(res.Stdout, "yyyy") {
					t.Fatalf("a forged frame's data became output: %d bytes", len(res.Stdout))
				}
				t.Logf("status %s error %q", res.Status, res.Error)
			})
		}
		healthy(t)
	})
	t.Run("ClosesChannelMidCall", func(t *testing.T) {
		code := FrameHelpers + `
import threading, time
def close_all():
    time.sleep(0.2)
    for fd in range(3, 256):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.close(fd)
        except OSError:
            pass
threading.Thread(target=close_all).start()
await call_tool("slow", "t", {})
print("call returned")`
		res := timed(t, code, &bigHost{delay: 2 * time.Second})
		if res.Status == sandbox.StatusSuccess {
			t.Fatalf("closing the channel mid-call ended in success: %+v", res)
		}
		t.Logf("status %s error %q", res.Status, res.Error)
		healthy(t)
	})
	t.Run("ForksAndWritesAfterDone", func(t *testing.T) {
		code := `import os, sys, time
if os.fork() == 0:
    time.sleep(0.3)
    for _ in range(2000):
        os.write(1, b"AFTER DONE\n")
        time.sleep(0.001)
    os._exit(0)
print("parent done")`
		res := timed(t, code, nil)
		expect(t, res, sandbox.StatusSuccess, 0)
		if strings.Contains(res.Stdout, "AFTER DONE") {
			t.Fatalf("output written after done reached the result: %q", res.Stdout)
		}
		healthy(t)
	})
}

// bigHost answers every call with a 256 KiB result, after delay.
type bigHost struct {
	delay time.Duration
	mu    sync.Mutex
	calls int
}

func (h *bigHost) Call(ctx context.Context, _ string, _ json.RawMessage) (json.RawMessage, error) {
	h.mu.Lock()
	h.calls++
	h.mu.Unlock()
	if h.delay > 0 {
		select {
		case <-time.After(h.delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return json.RawMessage(`"` + strings.Repeat("r", 256<<10) + `"`), nil
}

func (h *bigHost) Output(string, string) {}

func (h *bigHost) n() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls
}
