package sandboxtest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// runJavaScript is the suite for JavaScript jobs, on runtimes whose
// sandboxes run it: the same behaviour as Python's (output, errors, exit
// codes, timeouts, caps, proxy calls, sessions) and, for isolated runtimes,
// the same walls.
func runJavaScript(t *testing.T, rt sandbox.Runtime, opts Options) {
	if !slices.Contains(sandbox.Languages(rt), sandbox.JavaScript) {
		t.Skip("the runtime's sandboxes run no JavaScript")
	}
	run := runnerFor(rt, sandbox.JavaScript)
	runBasics(t, run, javaScriptBasics)
	t.Run("OutputFlood", func(t *testing.T) {
		res := run(t, "const s = 'x'.repeat(65536)\nwhile (true) process.stdout.write(s)", 3*time.Second, nil)
		if res.Status != sandbox.StatusTimeout || len(res.Stdout) != 4096 || !res.StdoutTruncated {
			t.Fatalf("status %s (%s), stdout %d bytes (cut %v): want a timeout and 4096 bytes kept\nstderr: %s", res.Status, res.Error, len(res.Stdout), res.StdoutTruncated, res.Stderr)
		}
	})
	t.Run("RawFDWritesAreOutputNotFrames", func(t *testing.T) {
		code := `const body = Buffer.from(JSON.stringify({type: "done", status: "success", exit_code: 0}))
const head = Buffer.alloc(4); head.writeUInt32BE(body.length)
require("fs").writeSync(1, Buffer.concat([head, body]))
throw new RangeError("real outcome")`
		res := run(t, code, short, nil)
		expect(t, res, sandbox.StatusError, 1)
		if !strings.Contains(res.Stdout, `"type":"done"`) || !strings.Contains(res.Stderr, "RangeError") {
			t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
		}
	})
	t.Run("ProxyCall", func(t *testing.T) {
		h := &EchoHost{}
		code := `const r = await callTool("s", "t", {a: 1})
console.log(r.echo.a)
try {
  await callTool("bad", "t")
} catch (e) {
  console.log(e instanceof MCPError, e.message)
}
const many = await Promise.all([...Array(40).keys()].map((i) => callTool("s", "t", {i})))
console.log(many.map((r) => r.echo.i).reduce((a, b) => a + b))`
		res := run(t, code, short, h)
		expect(t, res, sandbox.StatusSuccess, 0)
		if res.Stdout != "1\ntrue server bad refused the call\n780\n" {
			t.Fatalf("stdout %q", res.Stdout)
		}
		if len(h.Calls) != 42 {
			t.Fatalf("host saw %d calls, want 42", len(h.Calls))
		}
	})
	t.Run("HostileFrames", func(t *testing.T) {
		// The executor's own channel (fd 3) is the code's to abuse: a frame
		// the supervisor does not expect ends the job, and the host sees no
		// forged output.
		code := `const body = Buffer.from(JSON.stringify({type: "out", stream: "stdout", data: "FORGED"}))
const head = Buffer.alloc(4); head.writeUInt32BE(body.length)
require("fs").writeSync(3, Buffer.concat([head, body]))
await new Promise((r) => setTimeout(r, 2000))`
		res := run(t, code, short, nil)
		if res.Status != sandbox.StatusError || strings.Contains(res.Stdout, "FORGED") || !strings.Contains(res.Error, "protocol") {
			t.Fatalf("forged frame: %+v", res)
		}
		expect(t, run(t, "console.log('fine')", short, nil), sandbox.StatusSuccess, 0)
	})
	t.Run("ConcurrentJobs", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for i := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := rt.Run(context.Background(), sandbox.Job{ID: fmt.Sprint(i), Code: fmt.Sprintf("console.log(%d)", i), Language: sandbox.JavaScript, Timeout: short}, nil)
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
	runJavaScriptHostile(t, run)
	if srt, ok := rt.(sandbox.SessionRuntime); ok {
		t.Run("Sessions", func(t *testing.T) { runJavaScriptSessions(t, srt) })
	}
	if opts.Isolated {
		runJavaScriptIsolation(t, run)
	}
}

func runJavaScriptSessions(t *testing.T, rt sandbox.SessionRuntime) {
	in := func(t *testing.T, session, lang, code string) sandbox.Result {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		res, err := rt.RunInSession(ctx, session, sandbox.Job{ID: "s", Code: code, Language: lang, Timeout: short, OutputCap: 4096}, &EchoHost{})
		if err != nil {
			t.Fatalf("RunInSession(%s): %v", session, err)
		}
		return res
	}
	a := strings.ReplaceAll(t.Name(), "/", "-") + "-a"
	b := strings.ReplaceAll(t.Name(), "/", "-") + "-b"
	t.Cleanup(func() { _ = rt.EndSession(a); _ = rt.EndSession(b) })
	if res := in(t, a, sandbox.JavaScript, "var x = 41\nfunction twice(n) { return 2 * n }"); res.Status != sandbox.StatusSuccess {
		t.Fatalf("first job: %+v", res)
	}
	if res := in(t, a, sandbox.JavaScript, "x += 1\nglobalThis.y = await Promise.resolve(twice(x))"); res.Status != sandbox.StatusSuccess {
		t.Fatalf("second job: %+v", res)
	}
	if res := in(t, a, sandbox.JavaScript, "console.log(x, y)"); res.Stdout != "42 84\n" {
		t.Fatalf("third job of the session: %+v", res)
	}
	if res := in(t, b, sandbox.JavaScript, "console.log(typeof x)"); res.Stdout != "undefined\n" {
		t.Fatalf("another session saw x: %+v", res)
	}
	// A session keeps one interpreter: Python in it is refused, the
	// JavaScript state stays.
	if res := in(t, a, sandbox.Python, "print(1)"); res.Status != sandbox.StatusError || !strings.Contains(res.Error, "javascript") {
		t.Fatalf("python in a javascript session: %+v", res)
	}
	if res := in(t, a, sandbox.JavaScript, "console.log(x)"); res.Stdout != "42\n" {
		t.Fatalf("after the refused job: %+v", res)
	}
}

func runJavaScriptIsolation(t *testing.T, run runFunc) {
	runsAsNobody(t, run, javaScriptBasics)
	t.Run("NoNetwork", func(t *testing.T) {
		code := `const net = require("net"), os = require("os")
console.log("ifaces", Object.keys(os.networkInterfaces()).join(","))
for (const [host, port] of [["127.0.0.1", 4222], ["10.0.2.2", 80], ["1.1.1.1", 53]]) {
  const outcome = await new Promise((resolve) => {
    const s = net.connect({host, port, timeout: 2000})
    s.on("connect", () => { s.destroy(); resolve("CONNECTED") })
    s.on("timeout", () => { s.destroy(); resolve("timeout") })
    s.on("error", (e) => resolve("refused " + e.code))
  })
  console.log(host, outcome)
}`
		res := run(t, code, short, nil)
		expect(t, res, sandbox.StatusSuccess, 0)
		if strings.Contains(res.Stdout, "CONNECTED") || strings.Contains(res.Stdout, "eth") || !strings.Contains(res.Stdout, "1.1.1.1") {
			t.Fatalf("sandbox reached the network: %q", res.Stdout)
		}
	})
	t.Run("ReadOnlyRoot", func(t *testing.T) {
		code := `const fs = require("fs")
for (const p of ["/etc/evil", "/usr/evil", "/evil", "/mcpexec/evil"]) {
  try { fs.writeFileSync(p, "x"); console.log("WROTE", p) } catch {}
}
fs.writeFileSync("/tmp/ok", "fine")
console.log(fs.readFileSync("/tmp/ok", "utf8"))`
		res := run(t, code, short, nil)
		expect(t, res, sandbox.StatusSuccess, 0)
		if strings.Contains(res.Stdout, "WROTE") || !strings.Contains(res.Stdout, "fine") {
			t.Fatalf("stdout %q", res.Stdout)
		}
	})
	t.Run("NoHostEnvironment", func(t *testing.T) {
		res := run(t, "console.log(Object.keys(process.env).sort().join(' '))", short, nil)
		expect(t, res, sandbox.StatusSuccess, 0)
		for _, leak := range []string{"MCPEXEC", "NATS", "SSH", "AWS", "TOKEN"} {
			if strings.Contains(strings.ToUpper(res.Stdout), leak) {
				t.Fatalf("environment leaks %s: %s", leak, res.Stdout)
			}
		}
	})
	t.Run("ForkBombContained", func(t *testing.T) {
		code := `const {spawn} = require("child_process")
let n = 0
try {
  for (; n < 10000; n++) {
    const c = spawn("/bin/sleep", ["30"], {stdio: "ignore"})
    await new Promise((resolve, reject) => { c.once("spawn", resolve); c.once("error", reject) })
  }
} catch (e) {
  console.log("stopped after", n, e.code)
}`
		res := run(t, code, 10*time.Second, nil)
		if !strings.Contains(res.Stdout, "stopped after") {
			t.Fatalf("fork bomb not stopped: %+v", res)
		}
	})
	t.Run("MemoryBombContained", func(t *testing.T) {
		res := run(t, "const b = []\nwhile (true) b.push(Buffer.alloc(16 << 20, 1))", 30*time.Second, nil)
		if res.Status != sandbox.StatusError || !strings.Contains(strings.ToLower(res.Error+res.Stderr), "memory") {
			t.Fatalf("memory bomb: status %s error %q stderr %q", res.Status, res.Error, res.Stderr)
		}
	})
	t.Run("StillHealthyAfterAbuse", func(t *testing.T) {
		expect(t, run(t, "console.log('alive')", short, nil), sandbox.StatusSuccess, 0)
	})
}

// jsFrame is JavaScript for frame(obj): the bytes of one frame of the runner
// protocol, and sendRaw(buf): buf written to the executor's channel (fd 3)
// whole, however full the socket is.
const jsFrame = `const fs = require("fs")
function frame(obj) {
  const body = Buffer.from(JSON.stringify(obj))
  const head = Buffer.alloc(4); head.writeUInt32BE(body.length)
  return Buffer.concat([head, body])
}
function sendRaw(buf) {
  let off = 0
  while (off < buf.length) {
    try { off += fs.writeSync(3, buf, off) } catch (e) { if (e.code !== "EAGAIN") return false }
  }
  return true
}
`

// runJavaScriptHostile is the hostile-runner suite in JavaScript: code that
// attacks the supervisor and the host through the executor's channel. The
// host holds its bounds, the job ends within its limit plus the host's write
// timeout, and the next job succeeds.
func runJavaScriptHostile(t *testing.T, run runFunc) {
	const limit, bound = 4 * time.Second, 4*time.Second + sandbox.WriteTimeout + 20*time.Second
	healthy := func(t *testing.T) {
		t.Helper()
		res := run(t, "console.log('next job fine')", short, nil)
		expect(t, res, sandbox.StatusSuccess, 0)
		if res.Stdout != "next job fine\n" {
			t.Fatalf("next job: %+v", res)
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
	t.Run("SocketOutOfReach", func(t *testing.T) {
		// The host connection is the supervisor's (PID 1 of a container):
		// its descriptors and memory are closed to the code, and the socket
		// path takes no second connection.
		code := `const fs = require("fs"), net = require("net")
const report = []
const zygote = process.ppid
const supervisor = Number(fs.readFileSync("/proc/" + zygote + "/stat", "utf8").split(") ")[1].split(" ")[1])
for (const pid of [1, zygote, supervisor]) {
  try { report.push("LISTED " + pid + " " + fs.readdirSync("/proc/" + pid + "/fd")) } catch { report.push("denied fd " + pid) }
  try { const f = fs.openSync("/proc/" + pid + "/mem", "r"); fs.readSync(f, Buffer.alloc(1), 0, 1, 4096); report.push("READ " + pid) } catch { report.push("denied mem " + pid) }
}
for (const arg of fs.readFileSync("/proc/" + supervisor + "/cmdline", "latin1").split("\0")) {
  if (!arg.endsWith("/s")) continue
  report.push(await new Promise((resolve) => {
    const c = net.connect(arg)
    c.on("connect", () => { c.destroy(); resolve("CONNECTED " + arg) })
    c.on("error", (e) => resolve("refused " + e.code))
  }))
}
console.log(report.join("\n"))`
		res := timed(t, code, nil)
		expect(t, res, sandbox.StatusSuccess, 0)
		for _, bad := range []string{"LISTED", "READ", "CONNECTED"} {
			if strings.Contains(res.Stdout, bad) {
				t.Fatalf("the code reached the host channel (%s):\n%s", bad, res.Stdout)
			}
		}
		t.Logf("the code's probes:\n%s", res.Stdout)
	})
	t.Run("FloodsCallsAndStopsReading", func(t *testing.T) {
		// Raw calls as fast as the code can write them, from a loop that
		// never yields, so the executor never reads the (big) answers.
		h := &bigHost{}
		res := timed(t, jsFrame+`for (let i = 1; ; i++) {
  if (!sendRaw(frame({type: "call", id: i, method: "memory_get", params: {key: "k"}}))) break
}
await new Promise((r) => setTimeout(r, 60000))`, h)
		if res.Status == sandbox.StatusSuccess {
			t.Fatalf("flood ended in success: %+v", res)
		}
		t.Logf("status %s error %q; host answered %d calls", res.Status, res.Error, h.n())
		healthy(t)
	})
	t.Run("FloodsCallsThroughTheAPI", func(t *testing.T) {
		h := &bigHost{}
		res := timed(t, `await Promise.all([...Array(5000).keys()].map((i) => callTool("s", "t", {i}).catch(() => null)))
console.log("done")`, h)
		t.Logf("status %s error %q; host answered %d calls", res.Status, res.Error, h.n())
		if h.n() > sandbox.CallBurst+int(bound/time.Second)*sandbox.CallsPerSecond {
			t.Fatalf("host answered %d calls: over the rate bound", h.n())
		}
		healthy(t)
	})
	t.Run("ForgedAndMalformedFrames", func(t *testing.T) {
		cases := map[string]string{
			"done":      `frame({type: "done", status: "success", exit_code: 0})`,
			"hello":     `frame({type: "hello", version: 2, secret: "x"})`,
			"badid":     `frame({type: "call", id: -1, method: "memory_get", params: {}})`,
			"unknown":   `frame({type: "call", id: 1, method: "x".repeat(3 << 20)})`,
			"nonutf8":   `Buffer.from([0, 0, 0, 6, 0xff, 0xfe, 0xfd, 0xfc, 0xfb, 0xfa])`,
			"oversized": `Buffer.concat([Buffer.from([0x7f, 0xff, 0xff, 0xff]), Buffer.alloc(65536, "{")])`,
			"bigframe":  `frame({type: "out", stream: "stdout", data: "y".repeat(20 << 20)})`,
		}
		for name, payload := range cases {
			t.Run(name, func(t *testing.T) {
				res := timed(t, jsFrame+"console.log('sent', sendRaw("+payload+"))\nawait new Promise((r) => setTimeout(r, 2000))\nconsole.log('still here')", nil)
				// The code may end its own job (a done frame) or have a call
				// refused (an unknown method); what it never does is make
				// frames of its own reach the host as output.
				if strings.Contains(res.Stdout, "yyyy") {
					t.Fatalf("a forged frame's data became output: %d bytes", len(res.Stdout))
				}
				t.Logf("status %s error %q", res.Status, res.Error)
			})
		}
		healthy(t)
	})
	t.Run("ClosesChannelMidCall", func(t *testing.T) {
		res := timed(t, `setTimeout(() => require("fs").closeSync(3), 200)
await callTool("slow", "t", {})
console.log("call returned")`, &bigHost{delay: 2 * time.Second})
		if res.Status == sandbox.StatusSuccess {
			t.Fatalf("closing the channel mid-call ended in success: %+v", res)
		}
		t.Logf("status %s error %q", res.Status, res.Error)
		healthy(t)
	})
	t.Run("ForksAndWritesAfterDone", func(t *testing.T) {
		res := timed(t, `const c = require("child_process").spawn("/bin/sh", ["-c", "sleep 0.3; i=0; while [ $i -lt 2000 ]; do echo AFTER DONE; i=$((i+1)); done"], {stdio: ["ignore", "inherit", "inherit"], detached: true})
c.unref()
console.log("parent done")`, nil)
		expect(t, res, sandbox.StatusSuccess, 0)
		if strings.Contains(res.Stdout, "AFTER DONE") {
			t.Fatalf("output written after done reached the result: %q", res.Stdout)
		}
		healthy(t)
	})
}
