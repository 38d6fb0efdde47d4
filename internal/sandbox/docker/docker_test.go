package docker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
	"github.com/mcpexec/mcpexec/internal/sandbox/sandboxtest"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// unavailable skips the test, or fails it when MCPEXEC_REQUIRE_DOCKER=1 (make
// test, CI).
func unavailable(tb testing.TB, format string, args ...any) {
	tb.Helper()
	testutil.SkipOrFailDocker(tb, "Docker sandbox unavailable: "+format, args...)
}

func workerID(tb testing.TB) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := strings.NewReplacer("/", "-", " ", "-").Replace(tb.Name())
	return "test-" + name + "-" + hex.EncodeToString(b)
}

// newRuntime starts a Runtime for one test with its own worker ID, on the
// engine at $MCPEXEC_DOCKER (else $DOCKER_HOST, else the default socket).
func newRuntime(tb testing.TB, cfg Config) *Runtime {
	tb.Helper()
	if cfg.Image == "" {
		cfg.Image = os.Getenv("MCPEXEC_IMAGE")
	}
	if cfg.WorkerID == "" {
		cfg.WorkerID = workerID(tb)
	}
	if cfg.Host == "" {
		cfg.Host = testutil.DockerHost()
	}
	if cfg.Logger == nil {
		cfg.Logger = testutil.Logger(tb)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rt, err := New(ctx, cfg)
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

func TestConformance(t *testing.T) {
	rt := newRuntime(t, Config{})
	info := rt.Info()
	t.Logf("docker %s (API %s) at %s, rootless=%v cgroups=%s driver=%s runtime=%s seccomp=%v limits enforced=%v %v",
		info.ServerVersion, info.APIVersion, info.Host, info.Rootless, info.CgroupsVersion, info.CgroupDriver, info.OCIRuntime, info.Seccomp, info.LimitsEnforced, info.Missing)
	if !info.LimitsEnforced {
		unavailable(t, "the engine at %s does not enforce %v limits: the isolation suite would fail", info.Host, info.Missing)
	}
	sandboxtest.Run(t, rt, sandboxtest.Options{Isolated: true})
}

func TestConformanceWarmPool(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	// The warm pool and namespace reuse: jobs of one tenant in one container.
	rt := newRuntime(t, Config{Pool: 2})
	waitWarm(t, rt, 2)
	ctx := context.Background()
	seen := map[string]int{} // jobs by container (its host name)
	for i := 0; i < 4; i++ {
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
}

// waitWarm waits until the pool holds n containers.
func waitWarm(tb testing.TB, rt *Runtime, n int) {
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

func TestOrphansRemoved(t *testing.T) {
	id := workerID(t)
	rt := newRuntime(t, Config{WorkerID: id})
	ctx := context.Background()
	create := func(worker string) string {
		t.Helper()
		s := rt.spec(containerpool.Spec{Dir: t.TempDir(), Job: "orphan", Limits: rt.cfg.Limits, Secret: "x"})
		s.config.Labels[LabelWorker] = worker
		r, err := rt.cli.ContainerCreate(ctx, s.config, s.host, s.net, nil, "")
		if err != nil {
			t.Fatalf("create orphan: %v", err)
		}
		return r.ID
	}
	orphan := create(id)
	other := create(id + "-other")
	t.Cleanup(func() { _ = rt.remove(ctx, other) })

	// A new life of the same worker removes the orphan, and only it.
	rt2 := newRuntime(t, Config{WorkerID: id})
	if _, err := rt2.cli.ContainerInspect(ctx, orphan); !client.IsErrNotFound(err) {
		t.Fatalf("orphan %s still exists (err %v)", sandbox.ShortID(orphan), err)
	}
	if _, err := rt2.cli.ContainerInspect(ctx, other); err != nil {
		t.Fatalf("another worker's container %s was removed (err %v)", sandbox.ShortID(other), err)
	}
}

func TestOwnerlessReaped(t *testing.T) {
	rt := newRuntime(t, Config{})
	ctx := context.Background()
	s := rt.spec(containerpool.Spec{Dir: t.TempDir(), Job: "ownerless", Limits: rt.cfg.Limits, Secret: "x"})
	s.config.Labels[LabelWorker] = workerID(t) + "-gone"
	s.config.Labels[LabelOwner] = sandbox.HostName + "/999999999/1" // no such process
	r, err := rt.cli.ContainerCreate(ctx, s.config, s.host, s.net, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.remove(ctx, r.ID) })
	ids, err := rt.pool.Ownerless(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, id := range ids {
		found = found || id == r.ID
	}
	if !found {
		t.Fatalf("a container whose owner is gone is not reaped: %v", ids)
	}
	// This process's own containers are not.
	b, err := rt.pool.Acquire(ctx, "alive", rt.cfg.Limits)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.pool.Discard(b)
	ids, _ = rt.pool.Ownerless(ctx)
	for _, id := range ids {
		if id == b.ID() {
			t.Fatal("a live owner's container is taken for ownerless")
		}
	}
}

func TestNoContainerLeftAfterRun(t *testing.T) {
	rt := newRuntime(t, Config{Reuse: ReuseNone})
	ctx := context.Background()
	for _, code := range []string{"print(1)", "while True: pass", "import os\nos._exit(9)"} {
		res, err := rt.Run(ctx, sandbox.Job{ID: "left", Code: code, Timeout: 2 * time.Second}, nil)
		if err != nil {
			t.Fatalf("Run(%q): %v", code, err)
		}
		t.Logf("%q: %s exit %d %s", code, res.Status, res.ExitCode, res.Error)
	}
	rt.pool.WaitRemovals()
	ids, err := rt.pool.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 0 {
		t.Fatalf("%d containers left after runs: %v", len(ids), ids)
	}
	ents, _ := os.ReadDir(rt.pool.Dir())
	if len(ents) != 0 {
		t.Fatalf("%d container dirs left in %s", len(ents), rt.pool.Dir())
	}
}

func TestSpecLockdown(t *testing.T) {
	rt := newRuntime(t, Config{})
	ctx := context.Background()
	b, err := rt.pool.Acquire(ctx, "spec", rt.cfg.Limits)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.pool.Discard(b)
	c, err := rt.cli.ContainerInspect(ctx, b.ID())
	if err != nil {
		t.Fatal(err)
	}
	h, l := c.HostConfig, rt.cfg.Limits
	switch {
	case string(h.NetworkMode) != "none":
		t.Errorf("network %q", h.NetworkMode)
	case !h.ReadonlyRootfs:
		t.Error("root is writable")
	case len(h.CapDrop) != 1 || h.CapDrop[0] != "ALL" || len(h.CapAdd) != 0:
		t.Errorf("capabilities drop %v add %v", h.CapDrop, h.CapAdd)
	case h.Privileged:
		t.Error("privileged")
	case h.Memory != l.Memory || h.MemorySwap != l.Memory:
		t.Errorf("memory %d swap %d, want %d", h.Memory, h.MemorySwap, l.Memory)
	case h.PidsLimit == nil || *h.PidsLimit != l.Pids:
		t.Errorf("pids %v", h.PidsLimit)
	case h.NanoCPUs != int64(l.CPUs*1e9):
		t.Errorf("cpus %d", h.NanoCPUs)
	case c.Config.User != l.User:
		t.Errorf("user %q", c.Config.User)
	}
	if !strings.Contains(strings.Join(h.SecurityOpt, ","), "no-new-privileges") {
		t.Errorf("security options %v", h.SecurityOpt)
	}
	for _, p := range []string{"/tmp", "/workspace"} {
		o := h.Tmpfs[p]
		for _, want := range []string{"noexec", "nosuid", "nodev", fmt.Sprintf("size=%d", l.TmpfsSize)} {
			if !strings.Contains(o, want) {
				t.Errorf("tmpfs %s options %q lack %s", p, o, want)
			}
		}
	}
	for _, e := range c.Config.Env {
		k, _, _ := strings.Cut(e, "=")
		switch k {
		case "PATH", "HOME", "PYTHONDONTWRITEBYTECODE", sandbox.SecretEnv:
		default:
			t.Errorf("environment variable %s", k)
		}
	}
}

func TestRunnerExitReported(t *testing.T) {
	rt := newRuntime(t, Config{})
	res, err := rt.Run(context.Background(), sandbox.Job{ID: "exit", Code: "import os\nprint('bye', flush=True)\nos._exit(5)", Timeout: 10 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != sandbox.StatusError || res.ExitCode != 5 || res.Error != "the code's process exited with code 5" || res.Stdout != "bye\n" {
		t.Fatalf("result %+v", res)
	}
}

func TestMemoryLimitMessage(t *testing.T) {
	limits := sandbox.DefaultLimits()
	limits.Memory = 96 << 20
	rt := newRuntime(t, Config{Limits: limits})
	if !rt.Info().LimitsEnforced {
		unavailable(t, "limits are not enforced by %s", rt.Info().Host)
	}
	res, err := rt.Run(context.Background(), sandbox.Job{ID: "oom", Code: "b = []\nwhile True:\n    b.append(bytearray(8 << 20))", Timeout: 30 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("result: %s exit %d error %q stderr %q", res.Status, res.ExitCode, res.Error, res.Stderr)
	if res.Status != sandbox.StatusError {
		t.Fatalf("status %s", res.Status)
	}
	if res.ExitCode == 137 && !strings.Contains(res.Error, "memory limit (96 MiB)") {
		t.Fatalf("OOM kill reported as %q", res.Error)
	}
	if res.ExitCode != 137 && !strings.Contains(res.Stderr, "MemoryError") {
		t.Fatalf("neither an OOM kill nor a MemoryError: %+v", res)
	}
}

func TestPerJobLimits(t *testing.T) {
	rt := newRuntime(t, Config{})
	code := `print(open("/sys/fs/cgroup/memory/memory.limit_in_bytes").read().strip() if __import__("os").path.exists("/sys/fs/cgroup/memory/memory.limit_in_bytes") else open("/sys/fs/cgroup/memory.max").read().strip())`
	res, err := rt.Run(context.Background(), sandbox.Job{ID: "mem", Code: code, Memory: 200 << 20, Timeout: 10 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != sandbox.StatusSuccess || strings.TrimSpace(res.Stdout) != fmt.Sprint(200<<20) {
		t.Fatalf("a job of 200 MiB sees %+v", res)
	}
}

func TestUnreachableEngine(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := New(ctx, Config{Host: "unix://" + t.TempDir() + "/none.sock", RunDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "cannot reach the Docker engine") {
		t.Fatalf("New on a missing socket: %v", err)
	}
}

func TestMissingImage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := New(ctx, Config{Host: testutil.DockerHost(), Image: "localhost/mcpexec-no-such-image:latest", WorkerID: workerID(t), Logger: testutil.Logger(t)})
	if err != nil && strings.Contains(err.Error(), "cannot reach") {
		unavailable(t, "%v", err)
	}
	if !errors.Is(err, ErrNoImage) {
		t.Fatalf("New with a missing image: %v", err)
	}
}

func TestSessionContainerLifecycle(t *testing.T) {
	rt := newRuntime(t, Config{})
	ctx := context.Background()
	count := func() int {
		t.Helper()
		rt.pool.WaitRemovals()
		ids, err := rt.pool.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(ids)
	}
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
	// Close removes live sessions' containers.
	if _, err := rt.RunInSession(ctx, "c", job, nil); err != nil {
		t.Fatal(err)
	}
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	c, err := client.NewClientWithOpts(client.WithHost(rt.cfg.Host), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }() // the test is over
	list, err := c.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", LabelWorker+"="+rt.cfg.WorkerID))})
	if err != nil || len(list) != 0 {
		t.Fatalf("containers left after Close: %d (err %v)", len(list), err)
	}
	if _, err := rt.RunInSession(ctx, "d", job, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("RunInSession after Close: %v", err)
	}
	if _, err := rt.Run(ctx, job, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Run after Close: %v", err)
	}
}

func benchRun(b *testing.B, pool int, tenant string) {
	rt := newRuntime(b, Config{Pool: pool})
	if pool > 0 {
		waitWarm(b, rt, pool)
	}
	ctx := context.Background()
	job := sandbox.Job{ID: "bench", Code: "print(1)", Timeout: 10 * time.Second, Tenant: tenant}
	var ds []time.Duration
	b.ResetTimer()
	for b.Loop() {
		if pool > 0 && tenant == "" {
			b.StopTimer()
			waitWarm(b, rt, pool) // measure the warm path only: no refill competes for the CPUs
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

// BenchmarkRunWarm: run with a warm pool, a fresh container per run (go test
// -bench RunWarm -benchtime 20x).
func BenchmarkRunWarm(b *testing.B) { benchRun(b, 2, "") }

// BenchmarkRunReused: runs of one namespace back to back, each in a process
// forked in a reused container.
func BenchmarkRunReused(b *testing.B) { benchRun(b, 2, "bench") }

// BenchmarkRunCold: a container started per run.
func BenchmarkRunCold(b *testing.B) { benchRun(b, 0, "") }

// TestRunnerDirInert: Docker's bind mounts take no noexec, nosuid or nodev
// (Podman mounts /mcpexec with all three), so the runner's directory must
// hold nothing they would stop: no file with an exec, setuid or setgid bit,
// no device, and no way to add one (read-only, and root's).
func TestRunnerDirInert(t *testing.T) {
	rt := newRuntime(t, Config{})
	code := `import os, stat, errno
bad = []
for name in os.listdir("/mcpexec"):
    st = os.lstat("/mcpexec/" + name)
    m = st.st_mode
    if stat.S_ISCHR(m) or stat.S_ISBLK(m) or m & (stat.S_ISUID | stat.S_ISGID):
        bad.append(name + " is special")
    if stat.S_ISREG(m) and (m & 0o111 or os.access("/mcpexec/" + name, os.X_OK)):
        bad.append(name + " is executable")
    if not stat.S_ISSOCK(m) and os.access("/mcpexec/" + name, os.W_OK):
        bad.append(name + " is writable")
st = os.stat("/mcpexec")
if st.st_uid == os.getuid():
    bad.append("/mcpexec is ours")
try:
    open("/mcpexec/x", "w")
    bad.append("/mcpexec takes new files")
except OSError as e:
    if e.errno not in (errno.EROFS, errno.EACCES):
        bad.append("creating a file: %s" % e)
opts = [l.split()[3] for l in open("/proc/self/mounts") if l.split()[1] == "/mcpexec"]
if not opts or "ro" not in opts[0].split(","):
    bad.append("/mcpexec is not mounted read-only: %s" % opts)
print(bad)`
	res, err := rt.Run(context.Background(), sandbox.Job{ID: "inert", Code: code, Timeout: 10 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != sandbox.StatusSuccess || res.Stdout != "[]\n" {
		t.Fatalf("the runner's directory is not inert: %+v", res)
	}
}

// TestHostLoopbackUnreachable: network none keeps the host's loopback out of
// reach (and the names Docker gives the host).
func TestHostLoopbackUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }() // the test is over
	got := make(chan struct{}, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close() // the test only counts connections
			got <- struct{}{}
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	rt := newRuntime(t, Config{})
	code := fmt.Sprintf(`import socket
for host in ("127.0.0.1", "localhost", "host.docker.internal", "172.17.0.1"):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((host, %d))
        print("CONNECTED", host)
    except OSError as e:
        print("blocked", host, e)`, port)
	res, err := rt.Run(context.Background(), sandbox.Job{ID: "loop", Code: code, Timeout: 20 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res.Stdout)
	if res.Status != sandbox.StatusSuccess || strings.Contains(res.Stdout, "CONNECTED") {
		t.Fatalf("result %+v", res)
	}
	select {
	case <-got:
		t.Fatal("the host listener accepted a connection from the sandbox")
	default:
	}
}

// TestRunDirPrivate: the runners' sockets live in 0700 directories.
func TestRunDirPrivate(t *testing.T) {
	rt := newRuntime(t, Config{})
	info := rt.Info()
	for _, d := range []string{filepath.Dir(info.RunDir), info.RunDir} {
		if st, err := os.Stat(d); err != nil || st.Mode().Perm() != 0o700 {
			t.Fatalf("run dir %s: %v, want mode 0700", d, err)
		}
	}
}

// TestJavaScriptSpareOutOfReach: the JavaScript executor a reused container
// starts ahead is out of the reach of the jobs before it.
func TestJavaScriptSpareOutOfReach(t *testing.T) {
	rt := newRuntime(t, Config{Pool: 1})
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
	// the job's own; the uptime says whether the executor was started ahead.
	const jsProbe = `const fs = require("fs")
console.log(require("os").hostname())
const others = fs.readdirSync("/proc").filter((p) => /^\d+$/.test(p)).map(Number).filter((p) => ![1, process.pid, process.ppid].includes(p))
for (const p of others) { try { process.kill(p, "SIGKILL") } catch {} }
console.log(others.length, process.uptime() > 0.5 ? "ahead" : "started now")`
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
	for i := range 3 {
		time.Sleep(time.Second)
		host, out := run(sandbox.JavaScript, jsProbe)
		if host != first || out != "0 ahead" {
			t.Fatalf("javascript job %d: container %s (first %s), other processes and start: %q", i, host, first, out)
		}
	}
}
