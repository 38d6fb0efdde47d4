package podman

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containers/podman/v5/pkg/bindings/containers"

	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
	"github.com/mcpexec/mcpexec/internal/sandbox/sandboxtest"
)

// unavailable skips the test, or fails it when MCPEXEC_REQUIRE_PODMAN=1 (CI).
func unavailable(tb testing.TB, format string, args ...any) {
	tb.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("MCPEXEC_REQUIRE_PODMAN") == "1" {
		tb.Fatalf("Podman sandbox required (MCPEXEC_REQUIRE_PODMAN=1) but unavailable: %s", msg)
	}
	tb.Skipf("Podman sandbox unavailable: %s (set MCPEXEC_REQUIRE_PODMAN=1 to fail instead)", msg)
}

// newRuntime starts a Runtime for one test with its own worker ID.
func newRuntime(tb testing.TB, cfg Config) *Runtime {
	tb.Helper()
	if _, err := exec.LookPath("podman"); err != nil {
		unavailable(tb, "podman is not installed")
	}
	if os.Getenv("MCPEXEC_IMAGE") != "" && cfg.Image == "" {
		cfg.Image = os.Getenv("MCPEXEC_IMAGE")
	}
	if cfg.WorkerID == "" {
		cfg.WorkerID = sandboxtest.WorkerID(tb)
	}
	if cfg.URI == "" {
		cfg.URI = os.Getenv("MCPEXEC_PODMAN")
	}
	return sandboxtest.Open(tb, func(ctx context.Context) (*Runtime, error) { return New(ctx, cfg) }, unavailable)
}

func TestConformance(t *testing.T) {
	// Forced on: Podman 4.x does not do it by default (see userNSMode). No
	// pool, so that containers come and go one at a time.
	rt := newRuntime(t, Config{UserNS: UserNSOn})
	info := rt.Info()
	t.Logf("podman %s at %s, rootless=%v cgroups=%s runtime=%s limits enforced=%v",
		info.ServerVersion, info.Address, info.Rootless, info.CgroupsVersion, info.OCIRuntime, info.LimitsEnforced)
	if !info.LimitsEnforced {
		unavailable(t, "Podman at %s does not enforce resource limits (rootless on cgroups v1): the isolation suite would fail", info.Address)
	}
	sandboxtest.Run(t, rt, sandboxtest.Options{Isolated: true})
}

func TestOrphansRemoved(t *testing.T) {
	id := sandboxtest.WorkerID(t)
	rt := newRuntime(t, Config{Config: containerpool.Config{WorkerID: id}})
	ctx := context.Background()
	create := func(worker string) string {
		t.Helper()
		s := rt.spec(containerpool.Spec{Dir: t.TempDir(), Job: "orphan", Limits: rt.cfg.Limits})
		s.Labels[LabelWorker] = worker
		s.Name = ""
		c, cancel := rt.callCtx(ctx, 30*time.Second)
		defer cancel()
		r, err := containers.CreateWithSpec(c, s, nil)
		if err != nil {
			t.Fatalf("create orphan: %v", err)
		}
		return r.ID
	}
	orphan := create(id)
	other := create(id + "-other")
	t.Cleanup(func() { _ = rt.remove(ctx, other) })

	// A new life of the same worker removes the orphan, and only it.
	rt2 := newRuntime(t, Config{Config: containerpool.Config{WorkerID: id}})
	c, cancel := rt2.callCtx(ctx, 30*time.Second)
	defer cancel()
	if ok, err := containers.Exists(c, orphan, nil); err != nil || ok {
		t.Fatalf("orphan %s still exists (err %v)", sandbox.ShortID(orphan), err)
	}
	if ok, err := containers.Exists(c, other, nil); err != nil || !ok {
		t.Fatalf("another worker's container %s was removed (err %v)", sandbox.ShortID(other), err)
	}
}

func TestNoContainerLeftAfterRun(t *testing.T) {
	rt := newRuntime(t, Config{})
	sandboxtest.NoContainerLeftAfterRun(t, rt, rt.Pool)
}

// TestDataStack: the data image's libraries are preloaded, DataFrames display
// compactly, and a container keeps serving its namespace with them loaded.
func TestDataStack(t *testing.T) {
	sandboxtest.DataStack(t, newRuntime(t, Config{Config: containerpool.Config{Pool: 1, Preload: sandbox.DefaultPreload}}))
}

func TestRunnerExitReported(t *testing.T) {
	sandboxtest.RunnerExitReported(t, newRuntime(t, Config{}))
}

func TestMemoryLimitMessage(t *testing.T) {
	limits := sandbox.DefaultLimits()
	limits.Memory = 96 << 20
	rt := newRuntime(t, Config{Config: containerpool.Config{Limits: limits}})
	if !rt.Info().LimitsEnforced {
		unavailable(t, "limits are not enforced by %s", rt.Info().Address)
	}
	sandboxtest.MemoryLimitMessage(t, rt)
}

func TestWarmPool(t *testing.T) {
	rt := newRuntime(t, Config{Config: containerpool.Config{Pool: 2}})
	sandboxtest.WaitWarm(t, rt, 2)
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
	sandboxtest.WaitWarm(t, rt, 2)
	if st := rt.Stats(); st.Started < 4 || st.StartFailures != 0 || st.Warm != 2 {
		t.Fatalf("stats after two runs and a refill: %+v, want >=4 started, 0 failures, 2 warm", st)
	}

	// A cold start, for comparison.
	cold0 := time.Now()
	b, err := rt.Pool.NewBox(ctx, "cold", rt.cfg.Limits)
	if err != nil {
		t.Fatal(err)
	}
	cold := time.Since(cold0)
	rt.Pool.Discard(b)
	t.Logf("warm run %s, cold container start %s", warm, cold)
	if warm >= cold {
		t.Fatalf("warm run (%s) not faster than a cold start (%s)", warm, cold)
	}
}

func TestHostLoopbackUnreachable(t *testing.T) {
	sandboxtest.HostLoopbackUnreachable(t, newRuntime(t, Config{}), "127.0.0.1", "localhost", "host.containers.internal", "10.88.0.1")
}

func TestSpecIsLockedDown(t *testing.T) {
	rt := &Runtime{cfg: Config{Config: containerpool.Config{Image: "img", Limits: sandbox.DefaultLimits(), WorkerID: "w"}, OCIRuntime: "runc"}}
	s := rt.spec(containerpool.Spec{Dir: "/d", Job: "job1", Seq: 1, Limits: rt.cfg.Limits})
	if !*s.ReadOnlyFilesystem || *s.ReadWriteTmpfs || !*s.NoNewPrivileges || !slices.Equal(s.CapDrop, []string{"ALL"}) {
		t.Fatalf("spec not locked down: %+v", s)
	}
	if len(s.Env) != 3 || s.Env["HOME"] != "/tmp" || *s.HTTPProxy || *s.EnvHost {
		t.Fatalf("env %v", s.Env)
	}
	if *s.ResourceLimits.Memory.Limit != 512<<20 || *s.ResourceLimits.Memory.Swap != 512<<20 || s.ResourceLimits.Pids.Limit != 128 {
		t.Fatalf("resources %+v", s.ResourceLimits)
	}
	if s.Labels[LabelJob] != "job1" || s.Labels[LabelWorker] != "w" || s.Labels[LabelManaged] != "true" {
		t.Fatalf("labels %v", s.Labels)
	}
	for _, m := range s.Mounts {
		if m.Type == "tmpfs" && !slices.Contains(m.Options, "noexec") {
			t.Fatalf("tmpfs %s without noexec", m.Destination)
		}
	}
}

func benchRun(b *testing.B, pool int, tenant string) {
	benchRunWith(b, Config{Config: containerpool.Config{Pool: pool}}, tenant)
}

func benchRunWith(b *testing.B, cfg Config, tenant string) {
	pool := cfg.Pool
	if os.Getenv("BENCH_CPUS0") != "" {
		cfg.Limits = sandbox.DefaultLimits()
		cfg.Limits.CPUs = 0
	}
	sandboxtest.BenchRun(b, newRuntime(b, cfg), pool, tenant)
}

// BenchmarkRunWarm: run with a warm pool, a fresh container per run (go
// test -bench RunWarm -benchtime 20x).
func BenchmarkRunWarm(b *testing.B) { benchRun(b, 2, "") }

// BenchmarkRunReused: runs of one namespace back to back, each in a process
// forked in a reused container.
func BenchmarkRunReused(b *testing.B) { benchRun(b, 2, "bench") }

// BenchmarkRunReusedPreload: the same with the data stack preloaded in each
// container's zygote: what a fork of a larger parent costs.
func BenchmarkRunReusedPreload(b *testing.B) {
	benchRunWith(b, Config{Config: containerpool.Config{Pool: 2, Preload: sandbox.DefaultPreload}}, "bench")
}

// BenchmarkRunColdPreload: a container started per run (as BenchmarkRunCold)
// with the data stack preloaded: what preloading adds to a container's start.
func BenchmarkRunColdPreload(b *testing.B) {
	benchRunWith(b, Config{Config: containerpool.Config{Reuse: ReuseNone, Preload: sandbox.DefaultPreload}}, "")
}

// BenchmarkRunCold: a container started per run.
func BenchmarkRunCold(b *testing.B) { benchRun(b, 0, "") }

func TestMissingImage(t *testing.T) {
	newRuntime(t, Config{}) // skips when Podman is unavailable
	_, err := New(context.Background(), Config{Config: containerpool.Config{Image: "localhost/mcpexec-no-such-image:x", WorkerID: sandboxtest.WorkerID(t)}, URI: os.Getenv("MCPEXEC_PODMAN")})
	if err == nil || !strings.Contains(err.Error(), "build.sh") {
		t.Fatalf("error %v, want one that says how to build the image", err)
	}
	t.Log(err)
}

func TestSessionContainerLifecycle(t *testing.T) {
	rt := newRuntime(t, Config{})
	ctx := context.Background()
	count := func() int {
		t.Helper()
		rt.Pool.WaitRemovals()
		ids, err := rt.Pool.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(ids)
	}
	sandboxtest.SessionContainers(t, rt, count)
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	// Close may have stopped the Podman service it started: ask the CLI.
	out, err := exec.Command("podman", "ps", "-aq", "--filter", "label="+LabelWorker+"="+rt.cfg.WorkerID).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "" {
		t.Fatalf("containers left after Close: %q (err %v)", out, err)
	}
	if _, err := rt.RunInSession(ctx, "d", sandbox.Job{ID: "s", Code: "x = 1"}, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("RunInSession after Close: %v", err)
	}
}

func TestConmonWrapperDropsExitCommand(t *testing.T) {
	dir := t.TempDir()
	fake := dir + "/fake-conmon"
	if err := os.WriteFile(fake, []byte("#!/bin/sh\nfor a do echo \"[$a]\"; done\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := writeConmonWrapper(dir, fake)
	if err != nil {
		t.Skipf("wrapper does not run here: %v", err)
	}
	out, err := exec.Command(w, "--api-version", "1", "-c", "id", "--exit-dir", "/run/x",
		"--exit-command", "/usr/bin/podman", "--exit-command-arg", "--root", "--exit-command-arg", "",
		"--exit-command-arg", "a b", "--exit-command=x", "--log-level", "warning", "arg with space").Output()
	if err != nil {
		t.Fatal(err)
	}
	want := "[--api-version]\n[1]\n[-c]\n[id]\n[--exit-dir]\n[/run/x]\n[--log-level]\n[warning]\n[arg with space]\n"
	if string(out) != want {
		t.Fatalf("conmon got\n%s\nwant\n%s", out, want)
	}
}

// TestIsolationOfTheHost: each container has its own user namespace (where
// the host has subordinate ids; make deps adds them) and the runners' sockets
// live in a directory no other local user can enter.
func TestIsolationOfTheHost(t *testing.T) {
	// Forced on: Podman 4.x does not do it by default (see userNSMode). No
	// pool, so that containers come and go one at a time.
	rt := newRuntime(t, Config{UserNS: UserNSOn})
	info := rt.Info()
	st, err := os.Stat(filepath.Dir(info.RunDir))
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("run dir %s: %v %v, want mode 0700", filepath.Dir(info.RunDir), st.Mode(), err)
	}
	if st, err := os.Stat(info.RunDir); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("runtime dir %s: %v, want mode 0700", info.RunDir, err)
	}
	if !info.UserNS {
		t.Fatalf("containers share the host's user namespace: %s", info.UserNSNote)
	}
	// Two live containers, made one after the other: a session's, and a
	// plain run's.
	srt := sandbox.SessionRuntime(rt)
	t.Cleanup(func() { _ = srt.EndSession("uns") })
	uidMap := "print(open('/proc/self/uid_map').read().split())"
	first, err := srt.RunInSession(context.Background(), "uns", sandbox.Job{ID: "uns1", Code: uidMap, Timeout: 20 * time.Second}, nil)
	if err != nil || first.Status != sandbox.StatusSuccess {
		t.Fatalf("%v %+v", err, first)
	}
	second, err := rt.Run(context.Background(), sandbox.Job{ID: "uns2", Code: uidMap, Timeout: 20 * time.Second}, nil)
	if err != nil || second.Status != sandbox.StatusSuccess {
		t.Fatalf("%v %+v", err, second)
	}
	maps := make(chan string, 2)
	maps <- first.Stdout
	maps <- second.Stdout
	close(maps)
	a, b := <-maps, <-maps
	if a == b || strings.Contains(a, "'4294967295'") {
		t.Fatalf("uid maps %q and %q: want a distinct range per container", a, b)
	}
}

// TestServiceRestartedWhenItDies: the Podman service a Runtime started is
// started again when it is killed, and jobs run again without a new Runtime.
func TestServiceRestartedWhenItDies(t *testing.T) {
	if os.Getenv("MCPEXEC_PODMAN") != "" {
		t.Skip("MCPEXEC_PODMAN names a service this test did not start")
	}
	rt := newRuntime(t, Config{})
	pid := rt.ServicePID()
	if pid == 0 {
		t.Skip("a Podman service was already running: the Runtime did not start one")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	deadline := killed.Add(60 * time.Second)
	for {
		res, err := rt.Run(context.Background(), sandbox.Job{ID: "after-kill", Code: "print('back')", Timeout: 20 * time.Second}, nil)
		if err == nil && res.Stdout == "back\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no job ran within 60 s of the service's death: %v %+v", err, res)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if rt.ServicePID() == pid {
		t.Fatal("the service's pid did not change")
	}
	t.Logf("jobs ran again %s after the service was killed", time.Since(killed).Round(time.Millisecond))
}

// TestReapsContainersOfDeadOwners: containers left by a process of this host
// that is gone are found, whatever their worker id; a live owner's are not.
func TestReapsContainersOfDeadOwners(t *testing.T) {
	rt := newRuntime(t, Config{})
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	image := rt.Info().Image
	mk := func(owner string) string {
		out, err := exec.Command("podman", "create", "--runtime", "runc", "--label", LabelManaged+"=true",
			"--label", LabelWorker+"=someone-else", "--label", LabelOwner+"="+owner, image, "true").Output()
		if err != nil {
			t.Fatalf("podman create: %v", err)
		}
		id := strings.TrimSpace(string(out))
		t.Cleanup(func() { _ = exec.Command("podman", "rm", "-f", id).Run() })
		return id
	}
	gone := mk(fmt.Sprintf("%s/%d/%d", sandbox.HostName, dead.Process.Pid, 12345))
	live := mk(sandbox.OwnerLabel)
	ids, err := rt.Pool.Ownerless(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ids, gone) || slices.Contains(ids, live) {
		t.Fatalf("ownerless = %v; want %s (dead owner) and not %s (this process)", ids, sandbox.ShortID(gone), sandbox.ShortID(live))
	}
}

// TestJobSizedSandbox: a job that asks for its own memory and CPUs runs in
// a container of that size (read from its cgroup), not a warm one of the
// default size; a job that asks for nothing gets the default.
func TestJobSizedSandbox(t *testing.T) {
	rt := newRuntime(t, Config{Config: containerpool.Config{Pool: 1}})
	if !rt.Info().LimitsEnforced {
		unavailable(t, "limits are not enforced by %s", rt.Info().Address)
	}
	sandboxtest.WaitWarm(t, rt, 1)
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
	if got := run(0, 0); got != "536870912 100000" {
		t.Fatalf("a default job sees %q", got)
	}
}

// TestReuseWithinNamespace: a container serves the next job of the same
// namespace, each job in a fresh process, with nothing of the last job
// visible (files in every writable place, a POSIX message queue,
// environment, Python globals, modules, builtins); a job that leaves a
// process behind retires its container; another namespace never gets it.
// The writable places are the supervisor's list (WRITABLE), and the next
// job checks that the list names every place in the container its user can
// write: a new writable mount fails here until the sweep empties it.
func TestReuseWithinNamespace(t *testing.T) {
	rt := newRuntime(t, Config{Config: containerpool.Config{Pool: 1}})
	run := func(tenant, code string) string {
		t.Helper()
		res, err := rt.Run(context.Background(), sandbox.Job{ID: "reuse", Tenant: tenant, Code: code, Timeout: 30 * time.Second}, nil)
		if err != nil || res.Status != sandbox.StatusSuccess {
			t.Fatalf("run: %v %+v", err, res)
		}
		return strings.TrimSpace(res.Stdout)
	}
	const who = "import os, socket\nprint(socket.gethostname(), os.getpid())\n"
	// The list the sweep empties, as the supervisor (imported by the
	// runner before it forked this job's process) holds it.
	const writable = "WRITABLE = sys.modules['mcpexec_supervisor'].WRITABLE\n"
	const dirty = who + `import os, sys, builtins, json, ctypes
` + writable + `for top in WRITABLE:
    os.close(os.open(top + "/left", os.O_CREAT | os.O_WRONLY, 0o600))
for p in ("/tmp/x", "/workspace/y", "/dev/shm/z"):
    open(p, "w").write("left")
# A POSIX message queue with a message in it, for the next job to read.
rt = ctypes.CDLL("librt.so.1", use_errno=True)
q = rt.mq_open(b"/left", os.O_CREAT | os.O_WRONLY, 0o600, None)
if q < 0 or rt.mq_send(q, b"secret", 6, 0) != 0:
    raise OSError(ctypes.get_errno(), "mq_open/mq_send")
os.makedirs("/tmp/d/e", exist_ok=True)
open("/tmp/d/e/f", "w").write("left")
os.chmod("/tmp/d/e", 0)
try:  # fill /tmp to its last byte
    with open("/tmp/fill", "wb") as f:
        while True:
            f.write(b"x" * (1 << 20))
except OSError:
    pass
os.environ["LEFT"] = "1"
builtins.LEFT = 1
json.LEFT = 1
sys.modules["left"] = json
LEFT = 1`
	const check = who + `import os, sys, builtins, json, ctypes, stat
` + writable + `seen = [p for p in ("/tmp/x", "/workspace/y", "/dev/shm/z", "/tmp/d", "/tmp/fill") if os.path.exists(p)]
seen += [top + "/" + n for top in WRITABLE for n in os.listdir(top)]
rt = ctypes.CDLL("librt.so.1", use_errno=True)
if rt.mq_open(b"/left", os.O_RDONLY, 0, None) >= 0:
    seen.append("mq /left")
# Every place this user can write (outside /proc, which is per process) is
# in the list.
for root, dirs, files in os.walk("/"):
    if root == "/":
        dirs[:] = [d for d in dirs if d not in ("proc",)]
    for n in dirs + files:
        p = os.path.join(root, n)
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)) and os.access(p, os.W_OK) and p not in WRITABLE:
            seen.append("unlisted " + p)
seen += [n for n in ("LEFT",) if n in os.environ]
seen += [n for n, o in (("builtins", builtins), ("json", json)) if hasattr(o, "LEFT")]
seen += [m for m in ("left",) if m in sys.modules]
seen += [g for g in ("LEFT",) if g in globals()]
open("/tmp/room", "wb").write(b"x" * (8 << 20))  # /tmp has room again
os.remove("/tmp/room")
procs = [p for p in os.listdir("/proc") if p.isdigit()]
print(seen, len(procs))`
	first := strings.Fields(run("a", dirty))
	out := strings.SplitN(run("a", check), "\n", 2)
	second := strings.Fields(out[0])
	if second[0] != first[0] {
		t.Fatalf("the second job of namespace a ran in another container (%s, then %s)", first[0], second[0])
	}
	if second[1] == first[1] {
		t.Fatalf("both jobs ran in process %s", first[1])
	}
	// Visible: nothing of the last job; processes: the supervisor, the
	// zygote, this job's.
	if out[1] != "[] 3" {
		t.Fatalf("the next job saw %q", out[1])
	}
	// A job that leaves a process running retires its container.
	left := strings.Fields(run("a", who+"import subprocess\nsubprocess.Popen(['sleep', '60'], start_new_session=True)"))
	if left[0] != first[0] {
		t.Fatalf("the third job of a ran in another container")
	}
	after := strings.SplitN(run("a", check), "\n", 2)
	if strings.Fields(after[0])[0] == first[0] || after[1] != "[] 3" {
		t.Fatalf("after a job left a process: %q (container %s)", after, first[0])
	}
	// Another namespace never gets a's container.
	for range 3 {
		if b := strings.Fields(run("b", who))[0]; b == first[0] || b == strings.Fields(after[0])[0] {
			t.Fatalf("namespace b ran in a's container %s", b)
		}
	}
	if rt.Idle() == 0 {
		t.Fatal("no container waits for its namespace's next job")
	}
}

// TestRootfs: with Rootfs, containers use a host directory as their root
// file system, read-only, and jobs run in it as in the image.
func TestRootfs(t *testing.T) {
	newRuntime(t, Config{}) // skips when Podman is unavailable
	image := os.Getenv("MCPEXEC_IMAGE")
	if image == "" {
		image = DefaultImage
	}
	dir := t.TempDir()
	name := "mcpexec-rootfs-" + sandboxtest.WorkerID(t)
	if out, err := exec.Command("podman", "create", "--name", name, image, "true").CombinedOutput(); err != nil {
		t.Fatalf("podman create: %v %s", err, out)
	}
	defer func() { _ = exec.Command("podman", "rm", "-f", name).Run() }() // best effort: the container only held the exported files
	export := exec.Command("sh", "-c", "podman export "+name+" | tar -x -C "+dir)
	if out, err := export.CombinedOutput(); err != nil {
		t.Fatalf("export the image: %v %s", err, out)
	}
	rt := newRuntime(t, Config{Rootfs: dir})
	res, err := rt.Run(context.Background(), sandbox.Job{ID: "rootfs", Code: `import os
try:
    open("/etc/written", "w")
except OSError as e:
    print("ro", e.errno)
print(os.getuid())`, Timeout: 30 * time.Second}, nil)
	if err != nil || res.Status != sandbox.StatusSuccess || res.Stdout != "ro 30\n65534\n" {
		t.Fatalf("%v %+v", err, res)
	}
	if _, err := os.Stat(filepath.Join(dir, "etc", "written")); err == nil {
		t.Fatal("the job wrote into the host's root directory")
	}
	if _, err := New(context.Background(), Config{Config: containerpool.Config{WorkerID: sandboxtest.WorkerID(t)}, Rootfs: t.TempDir(), URI: os.Getenv("MCPEXEC_PODMAN")}); err == nil || !strings.Contains(err.Error(), "usr/bin/python3") {
		t.Fatalf("an empty rootfs: %v", err)
	}
}

// TestJavaScriptSpareOutOfReach: see sandboxtest.JavaScriptSpareOutOfReach.
func TestJavaScriptSpareOutOfReach(t *testing.T) {
	sandboxtest.JavaScriptSpareOutOfReach(t, newRuntime(t, Config{Config: containerpool.Config{Pool: 1}}))
}
