package sandboxtest

// This file is the suite of the container runtimes: Exercise runs it on one
// engine's runtime (Podman's, Docker's), each engine's tests call it once.
import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
)

// ContainerRuntime is what Exercise needs of an engine's runtime: a
// containerpool.Runtime, with the engine's own methods beside.
type ContainerRuntime interface {
	sandbox.SessionRuntime
	sandbox.StatsReporter
	sandbox.LanguageReporter
	Warmer
	Info() containerpool.Info
	Idle() int
	Armed(tenant string) int
	Close() error
	// The Pool's.
	NewBox(ctx context.Context, label string, l sandbox.Limits) (*containerpool.Box, error)
	Discard(b *containerpool.Box)
	WaitRemovals()
	List(ctx context.Context) ([]string, error)
	Ownerless(ctx context.Context) ([]string, error)
	Limits() sandbox.Limits
	Dir() string
}

// Engine is what Exercise needs of an engine.
type Engine[R ContainerRuntime] struct {
	// Open opens a runtime of cfg for tb on the engine the test environment
	// names.
	Open func(ctx context.Context, tb testing.TB, cfg containerpool.Config) (R, error)
	// Conformance opens the runtime the conformance suite runs on; nil: New
	// with the zero Config.
	Conformance func(tb testing.TB) R
	// Unavailable skips the test, or fails it where the engine is required.
	Unavailable func(tb testing.TB, format string, args ...any)
	// Plant creates, without starting it, a managed container of rt's image
	// with labels over rt's own, removed when the test ends; it returns the
	// container's id.
	Plant func(t *testing.T, rt R, labels map[string]string) string
	// Exists says whether container id exists.
	Exists func(t *testing.T, rt R, id string) bool
	// Left returns the containers of worker that the engine still has,
	// asked apart from rt (which may be closed).
	Left func(t *testing.T, rt R, worker string) []string
	// HostNames are the names and bridge addresses by which a container may
	// reach the host (beyond 127.0.0.1 and localhost).
	HostNames []string
}

// New opens a runtime of cfg for tb, with a worker id of its own unless cfg
// names one and $MCPEXEC_IMAGE unless cfg names an image; it is closed when
// tb ends. An engine that cannot be opened skips tb (or fails it, as
// e.Unavailable says).
func (e Engine[R]) New(tb testing.TB, cfg containerpool.Config) R {
	tb.Helper()
	if cfg.WorkerID == "" {
		cfg.WorkerID = WorkerID(tb)
	}
	if cfg.Image == "" {
		cfg.Image = os.Getenv("MCPEXEC_IMAGE")
	}
	return Open(tb, func(ctx context.Context) (R, error) { return e.Open(ctx, tb, cfg) }, e.Unavailable)
}

// Exercise runs the container runtimes' suite on e: the conformance suite
// and the tests of the pool, orphans, sessions and limits.
func Exercise[R ContainerRuntime](t *testing.T, e Engine[R]) {
	t.Run("Conformance", func(t *testing.T) {
		rt := e.conformance(t)
		info := rt.Info()
		t.Logf("%s %s (API %s) at %s, rootless=%v cgroups=%s driver=%s runtime=%s seccomp=%v userns=%v limits enforced=%v %v",
			info.Engine, info.ServerVersion, info.APIVersion, info.Address, info.Rootless, info.CgroupsVersion, info.CgroupDriver,
			info.OCIRuntime, info.Seccomp, info.UserNS, info.LimitsEnforced, info.Missing)
		if !info.LimitsEnforced {
			e.Unavailable(t, "%s at %s does not enforce resource limits %v: the isolation suite would fail", info.Engine, info.Address, info.Missing)
		}
		Run(t, rt, Options{Isolated: true})
	})
	t.Run("WarmPool", func(t *testing.T) { warmPool(t, e.New(t, containerpool.Config{Pool: 2})) })
	t.Run("WarmPoolReuse", func(t *testing.T) {
		if testing.Short() {
			t.Skip("short")
		}
		warmPoolReuse(t, e.New(t, containerpool.Config{Pool: 2}))
	})
	t.Run("OrphansRemoved", func(t *testing.T) { orphansRemoved(t, e) })
	t.Run("OwnerlessReaped", func(t *testing.T) { ownerlessReaped(t, e) })
	t.Run("NoContainerLeftAfterRun", func(t *testing.T) {
		NoContainerLeftAfterRun(t, e.New(t, containerpool.Config{Reuse: containerpool.ReuseNone}))
	})
	t.Run("DataStack", func(t *testing.T) {
		DataStack(t, e.New(t, containerpool.Config{Pool: 1, Preload: sandbox.DefaultPreload}))
	})
	t.Run("RunnerExitReported", func(t *testing.T) { RunnerExitReported(t, e.New(t, containerpool.Config{})) })
	t.Run("MemoryLimitMessage", func(t *testing.T) {
		limits := sandbox.DefaultLimits()
		limits.Memory = 96 << 20
		rt := e.New(t, containerpool.Config{Limits: limits})
		if !rt.Info().LimitsEnforced {
			e.Unavailable(t, "limits are not enforced by %s", rt.Info().Address)
		}
		MemoryLimitMessage(t, rt)
	})
	t.Run("JobSizedSandbox", func(t *testing.T) { jobSizedSandbox(t, e) })
	t.Run("HostLoopbackUnreachable", func(t *testing.T) {
		HostLoopbackUnreachable(t, e.New(t, containerpool.Config{}), append([]string{"127.0.0.1", "localhost"}, e.HostNames...)...)
	})
	t.Run("RunDirPrivate", func(t *testing.T) {
		info := e.New(t, containerpool.Config{}).Info()
		for _, d := range []string{filepath.Dir(info.RunDir), info.RunDir} {
			if st, err := os.Stat(d); err != nil || st.Mode().Perm() != 0o700 {
				t.Fatalf("run dir %s: %v, want mode 0700", d, err)
			}
		}
	})
	t.Run("MissingImage", func(t *testing.T) {
		e.New(t, containerpool.Config{}) // skips when the engine is unavailable
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := e.Open(ctx, t, containerpool.Config{Image: "localhost/mcpexec-no-such-image:x", WorkerID: WorkerID(t)})
		if !errors.Is(err, sandbox.ErrNoImage) || !strings.Contains(err.Error(), "build.sh") {
			t.Fatalf("error %v, want ErrNoImage and how to build the image", err)
		}
		t.Log(err)
	})
	t.Run("SessionContainerLifecycle", func(t *testing.T) { sessionLifecycle(t, e) })
	t.Run("JavaScriptSpareOutOfReach", func(t *testing.T) {
		JavaScriptSpareOutOfReach(t, e.New(t, containerpool.Config{Pool: 1}))
	})
	t.Run("CallsPastTheSupervisor", func(t *testing.T) { callsPastTheSupervisor(t, e.New(t, containerpool.Config{})) })
	t.Run("StartBesideTheCode", func(t *testing.T) { startBesideTheCode(t, e.New(t, containerpool.Config{Pool: 1})) })
}

// watchingHost answers calls as echoHost does, and counts the calls and the
// output that reach it.
type watchingHost struct {
	echoHost
	calls, output atomic.Int64
}

func (h *watchingHost) Call(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error) {
	h.calls.Add(1)
	return h.echoHost.Call(ctx, method, params)
}

func (h *watchingHost) Output(_, data string) { h.output.Add(int64(len(data))) }

// startBesideTheCode: a fresh job's code runs while its start is recorded
// (BeforeExec); when that fails, nothing the code did reaches the host
// (neither its calls nor its output), the run says it did not start, and
// the next job runs as usual.
func startBesideTheCode(t *testing.T, rt ContainerRuntime) {
	const code = "await mcp_ts.echo(text=\"x\")\nprint(\"ran\")"
	run := func(id string, start func() error) (*watchingHost, sandbox.Result, error) {
		h := &watchingHost{}
		res, err := rt.Run(context.Background(), sandbox.Job{ID: id, Code: code, Servers: []string{"ts"}, Timeout: 20 * time.Second,
			Tenant: "t", BeforeExec: start}, h)
		return h, res, err
	}
	h, _, err := run("start-fails", func() error {
		time.Sleep(500 * time.Millisecond) // the code has called by now
		return errors.New("a cancellation was recorded first")
	})
	if !errors.Is(err, sandbox.ErrNotStarted) {
		t.Fatalf("a job whose start failed: %v, want ErrNotStarted", err)
	}
	if h.calls.Load() != 0 || h.output.Load() != 0 {
		t.Fatalf("a job whose start failed reached the host: %d calls, %d output bytes", h.calls.Load(), h.output.Load())
	}
	h, res, err := run("start-ok", func() error { time.Sleep(100 * time.Millisecond); return nil })
	if err != nil {
		t.Fatal(err)
	}
	expect(t, res, sandbox.StatusSuccess, 0)
	if res.Stdout != "ran\n" || h.calls.Load() == 0 {
		t.Fatalf("stdout %q, %d calls: want the job run with its calls answered", res.Stdout, h.calls.Load())
	}
}

// callsPastTheSupervisor: a container's (fresh) job sends its calls on the
// call channel the host gave it, not through the supervisor; a frame other
// than a call that the code writes there is not the job's end.
func callsPastTheSupervisor(t *testing.T, rt ContainerRuntime) {
	run := func(code string) sandbox.Result {
		t.Helper()
		res, err := rt.Run(context.Background(), sandbox.Job{ID: "calls", Code: code, Servers: []string{"ts"}, Timeout: 20 * time.Second}, echoHost{})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// The code's own way to its runner: the API's closures hold it.
	const runner = "runner = [c.cell_contents for c in call_tool.__closure__ if type(c.cell_contents).__name__ == 'Runner'][0]\n"
	res := run(runner + `print("channel" if runner.chan.fds is None else "relayed")
for _ in range(3):
    await mcp_ts.echo(text="x")
print("calls answered")`)
	expect(t, res, sandbox.StatusSuccess, 0)
	if res.Stdout != "channel\ncalls answered\n" {
		t.Fatalf("stdout %q, want the calls on the job's call channel", res.Stdout)
	}
	res = run(runner + FrameHelpers + `runner.chan._sock.sendall(frame({"type": "done", "job": "calls", "status": "success", "exit_code": 0}))
import time
time.sleep(0.5)
print("still running")
raise SystemExit(3)`)
	expect(t, res, sandbox.StatusError, 3)
	if res.Stdout != "still running\n" {
		t.Fatalf("stdout %q: a done frame on the call channel ended the job", res.Stdout)
	}
}

func (e Engine[R]) conformance(t *testing.T) R {
	if e.Conformance != nil {
		return e.Conformance(t)
	}
	return e.New(t, containerpool.Config{})
}

// warmPool: the pool's containers serve runs faster than a cold start, and
// the pool refills.
func warmPool(t *testing.T, rt ContainerRuntime) {
	WaitWarm(t, rt, 2)
	ctx := context.Background()
	job := sandbox.Job{ID: "warm", Code: "print(1)", Timeout: 10 * time.Second}

	start := time.Now()
	res, err := rt.Run(ctx, job, nil)
	warm := time.Since(start)
	if err != nil || res.Stdout != "1\n" {
		t.Fatalf("warm run: %v %+v", err, res)
	}
	// Both warm containers are used up by two back-to-back runs...
	if _, err := rt.Run(ctx, job, nil); err != nil {
		t.Fatal(err)
	}
	// ...and the pool refills.
	WaitWarm(t, rt, 2)
	if st := rt.Stats(); st.Started < 4 || st.StartFailures != 0 || st.Warm != 2 {
		t.Fatalf("stats after two runs and a refill: %+v, want >=4 started, 0 failures, 2 warm", st)
	}

	// A cold start, for comparison.
	cold0 := time.Now()
	b, err := rt.NewBox(ctx, "cold", rt.Limits())
	if err != nil {
		t.Fatal(err)
	}
	cold := time.Since(cold0)
	rt.Discard(b)
	t.Logf("warm run %s, cold container start %s", warm, cold)
	if warm >= cold {
		t.Fatalf("warm run (%s) not faster than a cold start (%s)", warm, cold)
	}
}

// warmPoolReuse: jobs of one tenant run in one container, swept between
// jobs.
func warmPoolReuse(t *testing.T, rt ContainerRuntime) {
	WaitWarm(t, rt, 2)
	ctx := context.Background()
	seen := map[string]int{} // jobs by container (its host name)
	direct := rt.Stats().Direct
	for i := range 4 {
		if i > 0 {
			WaitArmed(t, rt, "t1") // else the job takes a warm container while this one re-arms
		}
		res, err := rt.Run(ctx, sandbox.Job{ID: "reuse", Tenant: "t1", Code: "import os, socket\nprint(socket.gethostname(), os.listdir('/tmp'))\nopen('/tmp/mark', 'w').write('x')", Timeout: 10 * time.Second}, nil)
		if err != nil {
			t.Fatal(err)
		}
		host, files, _ := strings.Cut(strings.TrimSpace(res.Stdout), " ")
		// The container is swept between jobs: no job sees another's file.
		if res.Status != sandbox.StatusSuccess || files != "[]" {
			t.Fatalf("job %d: %+v", i, res)
		}
		seen[host]++
	}
	// Trivial jobs leave nothing that retires a container: one served them all.
	if len(seen) != 1 || rt.Idle() != 1 {
		t.Fatalf("jobs by container %v, %d idle: want one container, kept for the namespace", seen, rt.Idle())
	}
	if st := rt.Stats(); st.Started < 2 || st.StartFailures != 0 {
		t.Fatalf("stats %+v", st)
	}
	// Each job found its container armed (WaitArmed), its Python process
	// waiting with the job's call channel: the exec went straight to it.
	if n := rt.Stats().Direct - direct; n != 4 {
		t.Fatalf("%d of 4 jobs sent straight to the waiting process, want all", n)
	}
}

// orphansRemoved: a new life of a worker removes the containers of its
// previous life, and only those.
func orphansRemoved[R ContainerRuntime](t *testing.T, e Engine[R]) {
	id := WorkerID(t)
	rt := e.New(t, containerpool.Config{WorkerID: id})
	orphan := e.Plant(t, rt, map[string]string{containerpool.LabelWorker: id})
	other := e.Plant(t, rt, map[string]string{containerpool.LabelWorker: id + "-other"})

	rt2 := e.New(t, containerpool.Config{WorkerID: id})
	if e.Exists(t, rt2, orphan) {
		t.Fatalf("orphan %s still exists", sandbox.ShortID(orphan))
	}
	if !e.Exists(t, rt2, other) {
		t.Fatalf("another worker's container %s was removed", sandbox.ShortID(other))
	}
}

// ownerlessReaped: containers left by a process of this host that is gone
// are found, whatever their worker id; a live owner's are not.
func ownerlessReaped[R ContainerRuntime](t *testing.T, e Engine[R]) {
	rt := e.New(t, containerpool.Config{})
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	plant := func(owner string) string {
		return e.Plant(t, rt, map[string]string{containerpool.LabelWorker: "someone-else", containerpool.LabelOwner: owner})
	}
	gone := plant(fmt.Sprintf("%s/%d/%d", sandbox.HostName, dead.Process.Pid, 12345))
	live := plant(sandbox.OwnerLabel)
	ids, err := rt.Ownerless(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ids, gone) || slices.Contains(ids, live) {
		t.Fatalf("ownerless = %v; want %s (dead owner) and not %s (this process)", ids, sandbox.ShortID(gone), sandbox.ShortID(live))
	}
}

// jobSizedSandbox: a job that asks for its own memory and CPUs runs in a
// container of that size (read from its cgroup), not a warm one of the
// default size; a job that asks for nothing gets the default.
func jobSizedSandbox[R ContainerRuntime](t *testing.T, e Engine[R]) {
	rt := e.New(t, containerpool.Config{Pool: 1})
	if !rt.Info().LimitsEnforced {
		e.Unavailable(t, "limits are not enforced by %s", rt.Info().Address)
	}
	WaitWarm(t, rt, 1)
	code := `import os
def first(*paths):
    for p in paths:
        if os.path.exists(p):
            return open(p).read().split()
mem = first("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
cpu = first("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us")
print(mem[0], cpu[0])`
	run := func(mem int64, cpus float64) string {
		res, err := rt.Run(context.Background(), sandbox.Job{ID: "sized", Code: code, Timeout: 30 * time.Second, Memory: mem, CPUs: cpus}, nil)
		if err != nil || res.Status != sandbox.StatusSuccess {
			t.Fatalf("run: %v %+v", err, res)
		}
		return strings.TrimSpace(res.Stdout)
	}
	before := rt.Stats().Started
	if got := run(1<<30, 2); got != "1073741824 200000" {
		t.Fatalf("a job of 1 GiB and 2 CPUs sees %q", got)
	}
	if rt.Stats().Started == before {
		t.Fatal("the sized job ran in a warm container of the default size")
	}
	if got := run(200<<20, 0); got != "209715200 100000" {
		t.Fatalf("a job of 200 MiB sees %q", got)
	}
	if got := run(0, 0); got != "536870912 100000" {
		t.Fatalf("a default job sees %q", got)
	}
}

// sessionLifecycle: SessionContainers, then Close removes what is left and
// refuses runs.
func sessionLifecycle[R ContainerRuntime](t *testing.T, e Engine[R]) {
	worker := WorkerID(t)
	rt := e.New(t, containerpool.Config{WorkerID: worker})
	ctx := context.Background()
	count := func() int {
		t.Helper()
		rt.WaitRemovals()
		ids, err := rt.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(ids)
	}
	SessionContainers(t, rt, count)
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	// Close may have stopped a service it started: ask apart.
	if left := e.Left(t, rt, worker); len(left) != 0 {
		t.Fatalf("containers left after Close: %v", left)
	}
	job := sandbox.Job{ID: "s", Code: "x = 1", Timeout: 10 * time.Second}
	if _, err := rt.RunInSession(ctx, "d", job, nil); !errors.Is(err, containerpool.ErrClosed) {
		t.Fatalf("RunInSession after Close: %v", err)
	}
	if _, err := rt.Run(ctx, job, nil); !errors.Is(err, containerpool.ErrClosed) {
		t.Fatalf("Run after Close: %v", err)
	}
}

// Bench measures Run of a trivial job on e's runtime: with a warm pool and a
// fresh container per run (RunWarm), runs of one namespace in a reused
// container (RunReused, and RunReusedPreload with the data stack preloaded),
// and a container started per run (RunCold, RunColdPreload), and the
// sandbox's share of a proxied call (Call, see BenchCall). BENCH_CPUS0 set
// runs without a CPU limit.
func Bench[R ContainerRuntime](b *testing.B, e Engine[R]) {
	for _, c := range []struct {
		name    string
		cfg     containerpool.Config
		tenant  string
		preload bool
	}{
		{"RunWarm", containerpool.Config{Pool: 2}, "", false},
		{"RunReused", containerpool.Config{Pool: 2}, "bench", false},
		{"RunReusedPreload", containerpool.Config{Pool: 2}, "bench", true},
		{"RunColdPreload", containerpool.Config{Reuse: containerpool.ReuseNone}, "", true},
		{"RunCold", containerpool.Config{}, "", false},
	} {
		b.Run(c.name, func(b *testing.B) {
			if c.preload {
				c.cfg.Preload = sandbox.DefaultPreload
			}
			if os.Getenv("BENCH_CPUS0") != "" {
				c.cfg.Limits = sandbox.DefaultLimits()
				c.cfg.Limits.CPUs = 0
			}
			BenchRun(b, e.New(b, c.cfg), c.cfg.Pool, c.tenant)
		})
	}
	b.Run("Call", func(b *testing.B) { BenchCall(b, e.New(b, containerpool.Config{Pool: 2})) })
}
