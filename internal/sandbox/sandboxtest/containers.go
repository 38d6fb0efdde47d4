package sandboxtest

// This file holds the tests and helpers the container runtimes (Podman,
// Docker) share beyond the conformance suite.
import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// WorkerID is a worker id of its own for tb: its containers are told apart
// from every other test's.
func WorkerID(tb testing.TB) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b) // never fails
	name := strings.NewReplacer("/", "-", " ", "-").Replace(tb.Name())
	return "test-" + name + "-" + hex.EncodeToString(b)
}

// Warmer is a runtime with a warm pool.
type Warmer interface {
	sandbox.Runtime
	Warm() int // started containers waiting in the pool
}

// WaitWarm waits until rt's pool holds n containers.
func WaitWarm(tb testing.TB, rt Warmer, n int) {
	tb.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if rt.Warm() >= n {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	tb.Fatalf("pool did not reach %d warm containers", n)
}

// WaitArmed waits until one of tenant's idle containers in rt is armed: a
// job of tenant sent then runs in it (a job sent while the tenant's only
// container re-arms takes a warm one).
func WaitArmed(tb testing.TB, rt interface{ Armed(tenant string) int }, tenant string) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for rt.Armed(tenant) == 0 {
		if time.Now().After(deadline) {
			tb.Fatalf("no idle container of %q armed after 30 s", tenant)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// BenchRun measures Run of a trivial job on rt, whose pool holds pool
// containers, for tenant ("": a fresh container per run).
func BenchRun(b *testing.B, rt Warmer, pool int, tenant string) {
	if pool > 0 {
		WaitWarm(b, rt, pool)
	}
	ctx := context.Background()
	job := sandbox.Job{ID: "bench", Code: "print(1)", Timeout: 10 * time.Second, Tenant: tenant}
	var ds []time.Duration
	b.ResetTimer()
	for b.Loop() {
		if pool > 0 && tenant == "" {
			b.StopTimer()
			WaitWarm(b, rt, pool) // measure the warm path only: no refill competes for the CPUs
			b.StartTimer()
		}
		start := time.Now()
		res, err := rt.Run(ctx, job, nil)
		ds = append(ds, time.Since(start))
		if err != nil || res.Stdout != "1\n" {
			b.Fatalf("%v %+v", err, res)
		}
	}
	b.StopTimer()
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(ds[len(ds)*9/10].Microseconds())/1000, "p90-ms")
}

// RunnerExitReported: os._exit ends the code's process mid-job; the runner
// (PID 1, another process) reports it with what the code printed just
// before.
func RunnerExitReported(t *testing.T, rt sandbox.Runtime) {
	res, err := rt.Run(context.Background(), sandbox.Job{ID: "exit", Code: "import os\nprint('bye', flush=True)\nos._exit(5)", Timeout: 10 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != sandbox.StatusError || res.ExitCode != 5 || res.Error != "the code's process exited with code 5" || res.Stdout != "bye\n" {
		t.Fatalf("result %+v", res)
	}
}

// MemoryLimitMessage: code that outgrows rt's memory limit of 96 MiB
// (enforced) is killed and told so, or gets a MemoryError.
func MemoryLimitMessage(t *testing.T, rt sandbox.Runtime) {
	// The runtime's limit (96 MiB), then a job's own: the message names the
	// limit the killed sandbox had.
	for _, c := range []struct {
		memory int64
		want   string
	}{{0, "memory limit (96 MiB)"}, {80 << 20, "memory limit (80 MiB)"}} {
		res, err := rt.Run(context.Background(), sandbox.Job{ID: "oom", Code: "b = []\nwhile True:\n    b.append(bytearray(8 << 20))", Timeout: 30 * time.Second, Memory: c.memory}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("memory %d: %s exit %d error %q stderr %q", c.memory, res.Status, res.ExitCode, res.Error, res.Stderr)
		if res.Status != sandbox.StatusError {
			t.Fatalf("status %s", res.Status)
		}
		if res.ExitCode == 137 && !strings.Contains(res.Error, c.want) {
			t.Fatalf("OOM kill reported as %q, want it to name the %s", res.Error, c.want)
		}
		if res.ExitCode != 137 && !strings.Contains(res.Stderr, "MemoryError") {
			t.Fatalf("neither an OOM kill nor a MemoryError: %+v", res)
		}
	}
}

// SessionContainers: a session keeps one container (count says how many
// rt has) until EndSession or a job that fails it (a timeout). It leaves
// session "c" live, for the caller to check that Close removes it.
func SessionContainers(t *testing.T, rt sandbox.SessionRuntime, count func() int) {
	ctx := context.Background()
	job := sandbox.Job{ID: "s", Code: "x = 1", Timeout: 10 * time.Second}
	for _, s := range []string{"a", "b"} {
		if res, err := rt.RunInSession(ctx, s, job, nil); err != nil || res.Status != sandbox.StatusSuccess {
			t.Fatalf("RunInSession %s: %v %+v", s, err, res)
		}
	}
	if n := count(); n != 2 {
		t.Fatalf("%d containers for 2 live sessions", n)
	}
	if err := rt.EndSession("a"); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 1 {
		t.Fatalf("%d containers after ending one of 2 sessions", n)
	}
	// A timeout ends the session and removes its container.
	if res, _ := rt.RunInSession(ctx, "b", sandbox.Job{ID: "s", Code: "while True: pass", Timeout: time.Second}, nil); res.Status != sandbox.StatusTimeout {
		t.Fatalf("status %s", res.Status)
	}
	if n := count(); n != 0 || rt.HasSession("b") {
		t.Fatalf("%d containers after the session's timeout (session kept %v)", n, rt.HasSession("b"))
	}
	if _, err := rt.RunInSession(ctx, "c", job, nil); err != nil {
		t.Fatal(err)
	}
}

// JavaScriptSpareOutOfReach: a reused container whose last job was
// JavaScript's keeps a JavaScript executor started ahead, and no job's code
// meets the one a later job gets: a Python job that signals every process
// it may runs in that container, then JavaScript jobs find no other process
// to kill and an executor started ahead: the first in a container the
// namespace takes from the warm pool (its first container, after a Python
// job, waits with a Python executor only), the next in that same container
// (the spare never counts as a process a job left behind). rt reuses
// containers within a namespace and keeps one warm.
func JavaScriptSpareOutOfReach(t *testing.T, rt interface {
	Warmer
	sandbox.LanguageReporter
}) {
	if !slices.Contains(rt.Languages(), sandbox.JavaScript) {
		t.Fatalf("the sandbox image runs %v: rebuild it with Node.js (sudo deploy/sandbox/build.sh --force)", rt.Languages())
	}
	run := func(lang, code string) (host, out string) {
		t.Helper()
		res, err := rt.Run(context.Background(), sandbox.Job{ID: "spare", Tenant: "a", Language: lang, Code: code, Timeout: 30 * time.Second}, nil)
		if err != nil || res.Status != sandbox.StatusSuccess {
			t.Fatalf("run %s: %v %+v", lang, err, res)
		}
		host, out, _ = strings.Cut(strings.TrimSpace(res.Stdout), "\n")
		return host, out
	}
	// others lists the processes but PID 1 (the supervisor), the zygote and
	// the job's own (not the spares this job did not take: killed as it
	// started, they are reaped when it ends, and may still be exiting as it
	// runs: a zombie, or PF_EXITING (4) in its flags); the uptime says
	// whether the executor was started ahead.
	const jsProbe = `const fs = require("fs")
console.log(require("os").hostname())
const alive = (p) => { try { const f = fs.readFileSync("/proc/" + p + "/stat", "utf8").split(") ")[1].split(" "); return f[0] !== "Z" && (Number(f[6]) & 4) === 0 } catch { return false } }
const others = fs.readdirSync("/proc").filter((p) => /^\d+$/.test(p)).map(Number).filter((p) => ![1, process.pid, process.ppid].includes(p) && alive(p))
for (const p of others) { try { process.kill(p, "SIGKILL") } catch {} }
console.log(others.length, process.uptime() > 0.5 ? "ahead" : "started now")`
	// The first job takes a warm container; the one that refills the pool
	// starts after a JavaScript job was seen, with a JavaScript spare.
	WaitWarm(t, rt, 1)
	first, _ := run(sandbox.JavaScript, jsProbe)
	time.Sleep(time.Second) // the spare loads
	host, _ := run(sandbox.Python, `import os, signal, socket
print(socket.gethostname())
for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
    if pid not in (1, os.getpid(), os.getppid()):  # the runner's own are another test's
        try:
            os.kill(pid, signal.SIGSTOP)
        except OSError:
            pass`)
	if host != first {
		t.Fatalf("python job in container %s, not %s", host, first)
	}
	WaitWarm(t, rt, 1)
	var jsHost string
	for i := range 3 {
		time.Sleep(time.Second)
		host, out := run(sandbox.JavaScript, jsProbe)
		if i == 0 {
			jsHost = host
		}
		if host != jsHost || out != "0 ahead" {
			t.Fatalf("javascript job %d: container %s (the first javascript job after python's: %s; python's %s), other processes and start: %q",
				i, host, jsHost, first, out)
		}
	}
}

// HostLoopbackUnreachable: code in rt's sandboxes reaches no listener on the
// host's loopback, by any of hosts (127.0.0.1, localhost, and the names and
// bridge addresses the engine gives the host) or otherwise: the listener
// counts every connection it accepts.
func HostLoopbackUnreachable(t *testing.T, rt sandbox.Runtime, hosts ...string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }() // the test is over with it: a failing close changes no result
	got := make(chan struct{}, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close() // the test only counts connections
			select {
			case got <- struct{}{}:
			default:
			}
		}
	}()
	quoted := make([]string, len(hosts))
	for i, h := range hosts {
		quoted[i] = fmt.Sprintf("%q", h)
	}
	code := fmt.Sprintf(`import socket
for host in (%s,):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((host, %d))
        print("CONNECTED", host)
    except OSError as e:
        print("blocked", host, e)`, strings.Join(quoted, ", "), ln.Addr().(*net.TCPAddr).Port)
	res, err := rt.Run(context.Background(), sandbox.Job{ID: "loop", Code: code, Timeout: 20 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res.Stdout)
	if res.Status != sandbox.StatusSuccess || strings.Contains(res.Stdout, "CONNECTED") || strings.Count(res.Stdout, "blocked") != len(hosts) {
		t.Fatalf("result %+v", res)
	}
	select {
	case <-got:
		t.Fatal("the host listener accepted a connection from the sandbox")
	default:
	}
}

// NoContainerLeftAfterRun: after jobs that end well, loop until their time
// limit and kill their runner, no container of pool's and no container
// directory is left (rt runs a container per job: ReuseNone, no warm pool).
func NoContainerLeftAfterRun(t *testing.T, rt ContainerRuntime) {
	ctx := context.Background()
	for _, code := range []string{"print(1)", "while True: pass", "import os\nos._exit(9)"} {
		res, err := rt.Run(ctx, sandbox.Job{ID: "left", Code: code, Timeout: 2 * time.Second}, nil)
		if err != nil {
			t.Fatalf("Run(%q): %v", code, err)
		}
		t.Logf("%q: %s exit %d %s", code, res.Status, res.ExitCode, res.Error)
	}
	rt.WaitRemovals()
	ids, err := rt.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 0 {
		t.Fatalf("%d containers left after runs: %v", len(ids), ids)
	}
	if ents, _ := os.ReadDir(rt.Dir()); len(ents) != 0 { // a dir that cannot be read holds nothing left
		t.Fatalf("%d container dirs left in %s", len(ents), rt.Dir())
	}
}

// Open opens a runtime for tb with open (within two minutes), closing it
// when tb ends; a runtime that cannot be opened is unavailable (which skips,
// or fails where the runtime is required).
func Open[R interface{ Close() error }](tb testing.TB, open func(context.Context) (R, error), unavailable func(tb testing.TB, format string, args ...any)) R {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rt, err := open(ctx)
	if err != nil {
		unavailable(tb, "%v", err)
	}
	tb.Cleanup(func() {
		if err := rt.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return rt
}
