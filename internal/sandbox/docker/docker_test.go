package docker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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

// newRuntime starts a Runtime for one test with its own worker ID, on the
// engine at $MCPEXEC_DOCKER (else $DOCKER_HOST, else the default socket).
func newRuntime(tb testing.TB, cfg Config) *Runtime {
	tb.Helper()
	if cfg.Image == "" {
		cfg.Image = os.Getenv("MCPEXEC_IMAGE")
	}
	if cfg.WorkerID == "" {
		cfg.WorkerID = sandboxtest.WorkerID(tb)
	}
	if cfg.Host == "" {
		cfg.Host = testutil.DockerHost()
	}
	if cfg.Logger == nil {
		cfg.Logger = testutil.Logger(tb)
	}
	return sandboxtest.Open(tb, func(ctx context.Context) (*Runtime, error) { return New(ctx, cfg) }, unavailable)
}

func TestConformance(t *testing.T) {
	rt := newRuntime(t, Config{})
	info := rt.Info()
	t.Logf("docker %s (API %s) at %s, rootless=%v cgroups=%s driver=%s runtime=%s seccomp=%v limits enforced=%v %v",
		info.ServerVersion, info.APIVersion, info.Address, info.Rootless, info.CgroupsVersion, info.CgroupDriver, info.OCIRuntime, info.Seccomp, info.LimitsEnforced, info.Missing)
	if !info.LimitsEnforced {
		unavailable(t, "the engine at %s does not enforce %v limits: the isolation suite would fail", info.Address, info.Missing)
	}
	sandboxtest.Run(t, rt, sandboxtest.Options{Isolated: true})
}

func TestConformanceWarmPool(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	// The warm pool and namespace reuse: jobs of one tenant in one container.
	rt := newRuntime(t, Config{Config: containerpool.Config{Pool: 2}})
	sandboxtest.WaitWarm(t, rt, 2)
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

func TestOrphansRemoved(t *testing.T) {
	id := sandboxtest.WorkerID(t)
	rt := newRuntime(t, Config{Config: containerpool.Config{WorkerID: id}})
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
	rt2 := newRuntime(t, Config{Config: containerpool.Config{WorkerID: id}})
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
	s.config.Labels[LabelWorker] = sandboxtest.WorkerID(t) + "-gone"
	s.config.Labels[LabelOwner] = sandbox.HostName + "/999999999/1" // no such process
	r, err := rt.cli.ContainerCreate(ctx, s.config, s.host, s.net, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.remove(ctx, r.ID) })
	ids, err := rt.Pool.Ownerless(ctx)
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
	b, err := rt.Pool.Acquire(ctx, "alive", rt.cfg.Limits)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Pool.Discard(b)
	ids, _ = rt.Pool.Ownerless(ctx)
	for _, id := range ids {
		if id == b.ID() {
			t.Fatal("a live owner's container is taken for ownerless")
		}
	}
}

func TestNoContainerLeftAfterRun(t *testing.T) {
	rt := newRuntime(t, Config{Config: containerpool.Config{Reuse: ReuseNone}})
	sandboxtest.NoContainerLeftAfterRun(t, rt, rt.Pool)
}

func TestSpecLockdown(t *testing.T) {
	rt := newRuntime(t, Config{})
	ctx := context.Background()
	b, err := rt.Pool.Acquire(ctx, "spec", rt.cfg.Limits)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Pool.Discard(b)
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
		// The data image's own settings for matplotlib (no secret) come
		// with its ENV.
		case "PATH", "HOME", "PYTHONDONTWRITEBYTECODE", sandbox.SecretEnv, "MPLCONFIGDIR", "MPLBACKEND":
		default:
			t.Errorf("environment variable %s", k)
		}
	}
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
	_, err := New(ctx, Config{Config: containerpool.Config{RunDir: t.TempDir()}, Host: "unix://" + t.TempDir() + "/none.sock"})
	if err == nil || !strings.Contains(err.Error(), "cannot reach the Docker engine") {
		t.Fatalf("New on a missing socket: %v", err)
	}
}

func TestMissingImage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := New(ctx, Config{Config: containerpool.Config{Image: "localhost/mcpexec-no-such-image:latest", WorkerID: sandboxtest.WorkerID(t), Logger: testutil.Logger(t)}, Host: testutil.DockerHost()})
	if err != nil && strings.Contains(err.Error(), "cannot reach") {
		unavailable(t, "%v", err)
	}
	if !errors.Is(err, sandbox.ErrNoImage) {
		t.Fatalf("New with a missing image: %v", err)
	}
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
	c, err := client.NewClientWithOpts(client.WithHost(rt.cfg.Host), client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }() // the test is over
	list, err := c.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", LabelWorker+"="+rt.cfg.WorkerID))})
	if err != nil || len(list) != 0 {
		t.Fatalf("containers left after Close: %d (err %v)", len(list), err)
	}
	job := sandbox.Job{ID: "s", Code: "x = 1", Timeout: 10 * time.Second}
	if _, err := rt.RunInSession(ctx, "d", job, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("RunInSession after Close: %v", err)
	}
	if _, err := rt.Run(ctx, job, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Run after Close: %v", err)
	}
}

func benchRun(b *testing.B, pool int, tenant string) {
	sandboxtest.BenchRun(b, newRuntime(b, Config{Config: containerpool.Config{Pool: pool}}), pool, tenant)
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
	sandboxtest.HostLoopbackUnreachable(t, newRuntime(t, Config{}), "127.0.0.1", "localhost", "host.docker.internal", "172.17.0.1")
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

// TestJavaScriptSpareOutOfReach: see sandboxtest.JavaScriptSpareOutOfReach.
func TestJavaScriptSpareOutOfReach(t *testing.T) {
	sandboxtest.JavaScriptSpareOutOfReach(t, newRuntime(t, Config{Config: containerpool.Config{Pool: 1}}))
}
