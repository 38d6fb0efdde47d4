package podman

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containers/podman/v5/pkg/bindings/containers"

	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
	"github.com/mcpexec/mcpexec/internal/sandbox/sandboxtest"
	"github.com/mcpexec/mcpexec/internal/testutil/testenv"
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

// open opens a Runtime of cfg on the Podman service $MCPEXEC_PODMAN names
// (else the one New finds or starts).
func open(ctx context.Context, cfg Config) (*Runtime, error) {
	if _, err := exec.LookPath("podman"); err != nil {
		return nil, errors.New("podman is not installed")
	}
	if cfg.URI == "" {
		cfg.URI = os.Getenv("MCPEXEC_PODMAN")
	}
	return New(ctx, cfg)
}

// podmanEngine is Podman for sandboxtest.Exercise.
var podmanEngine = sandboxtest.Engine[*Runtime]{
	Open: func(ctx context.Context, _ testing.TB, cfg containerpool.Config) (*Runtime, error) {
		return open(ctx, Config{Config: cfg})
	},
	// Forced on: Podman 4.x does not do it by default (see userNSMode). No
	// pool, so that containers come and go one at a time.
	Conformance: func(tb testing.TB) *Runtime { return newRuntime(tb, Config{UserNS: UserNSOn}) },
	Unavailable: unavailable,
	Plant: func(t *testing.T, rt *Runtime, labels map[string]string) string {
		t.Helper()
		s := rt.spec(containerpool.Spec{Dir: t.TempDir(), Job: "planted", Limits: rt.cfg.Limits})
		maps.Copy(s.Labels, labels)
		s.Name = ""
		c, cancel := rt.callCtx(context.Background(), 30*time.Second)
		defer cancel()
		r, err := containers.CreateWithSpec(c, s, nil)
		if err != nil {
			t.Fatalf("create a container: %v", err)
		}
		t.Cleanup(func() { _ = rt.remove(context.Background(), r.ID) })
		return r.ID
	},
	Exists: func(t *testing.T, rt *Runtime, id string) bool {
		t.Helper()
		c, cancel := rt.callCtx(context.Background(), 30*time.Second)
		defer cancel()
		ok, err := containers.Exists(c, id, nil)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	},
	// Close may have stopped the Podman service it started: ask the CLI.
	Left: func(t *testing.T, rt *Runtime, worker string) []string {
		t.Helper()
		args := []string{"ps", "-aq", "--filter", "label=" + containerpool.LabelWorker + "=" + worker}
		if root := rt.cfg.StorageRoot; root != "" {
			args = append(StorageFlags(root), args...)
		}
		cmd, cancel := testenv.Command(testenv.CLITimeout, "podman", args...)
		defer cancel()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("podman ps: %v %s", err, out)
		}
		return strings.Fields(string(out))
	},
	HostNames: []string{"host.containers.internal", "10.88.0.1"},
}

// newRuntime starts a Runtime for one test with its own worker ID.
func newRuntime(tb testing.TB, cfg Config) *Runtime {
	tb.Helper()
	if os.Getenv("MCPEXEC_IMAGE") != "" && cfg.Image == "" {
		cfg.Image = os.Getenv("MCPEXEC_IMAGE")
	}
	if cfg.WorkerID == "" {
		cfg.WorkerID = sandboxtest.WorkerID(tb)
	}
	return sandboxtest.Open(tb, func(ctx context.Context) (*Runtime, error) { return open(ctx, cfg) }, unavailable)
}

// TestContainerRuntime runs the container runtimes' suite on Podman.
func TestContainerRuntime(t *testing.T) { sandboxtest.Exercise(t, podmanEngine) }

// BenchmarkContainerRuntime: go test -bench ContainerRuntime/RunWarm
// -benchtime 20x.
func BenchmarkContainerRuntime(b *testing.B) { sandboxtest.Bench(b, podmanEngine) }

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
	if s.Labels[containerpool.LabelJob] != "job1" || s.Labels[containerpool.LabelWorker] != "w" || s.Labels[containerpool.LabelManaged] != "true" {
		t.Fatalf("labels %v", s.Labels)
	}
	for _, m := range s.Mounts {
		if m.Type == "tmpfs" && !slices.Contains(m.Options, "noexec") {
			t.Fatalf("tmpfs %s without noexec", m.Destination)
		}
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

// TestServiceReplacedWhenItHangs: a Podman service the Runtime started that
// stops answering (stopped here with SIGSTOP: a service whose locks are
// wedged answers nothing either) is killed and started again, and the
// Runtime's calls and jobs go through again without a new Runtime.
func TestServiceReplacedWhenItHangs(t *testing.T) {
	if os.Getenv("MCPEXEC_PODMAN") != "" {
		t.Skip("MCPEXEC_PODMAN names a service this test did not start")
	}
	rt := newRuntime(t, Config{ServiceHungAfter: 3 * time.Second})
	pid := rt.ServicePID()
	if pid == 0 {
		t.Skip("a Podman service was already running: the Runtime did not start one")
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) // it is gone when the test passes
	stopped := time.Now()
	for rt.ServicePID() == pid {
		if time.Since(stopped) > time.Minute {
			t.Fatal("the stopped service was not replaced within a minute")
		}
		time.Sleep(100 * time.Millisecond)
	}
	replaced := time.Since(stopped)
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("the hung service (pid %d) was left running: %v", pid, err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		err := rt.probe(context.Background())
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new service did not answer within a minute: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	res, err := rt.Run(context.Background(), sandbox.Job{ID: "after-hang", Code: "print('back')", Timeout: 20 * time.Second}, nil)
	if err != nil || res.Stdout != "back\n" {
		t.Fatalf("a job after the service was replaced: %v %+v", err, res)
	}
	t.Logf("the stopped service was replaced %s after it stopped", replaced.Round(time.Millisecond))
}

// TestReuseWithinNamespace: a container serves the next job of the same
// namespace, each job in a fresh process, with nothing of the last job
// visible (files in every writable place, a POSIX message queue,
// environment, Python globals, modules, builtins); a job that leaves a
// process or a System V IPC object behind retires its container; another
// namespace never gets it.
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
	sandboxtest.WaitArmed(t, rt, "a")
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
	sandboxtest.WaitArmed(t, rt, "a")
	left := strings.Fields(run("a", who+"import subprocess\nsubprocess.Popen(['sleep', '60'], start_new_session=True)"))
	if left[0] != first[0] {
		t.Fatalf("the third job of a ran in another container")
	}
	after := strings.SplitN(run("a", check), "\n", 2)
	if strings.Fields(after[0])[0] == first[0] || after[1] != "[] 3" {
		t.Fatalf("after a job left a process: %q (container %s)", after, first[0])
	}
	// A job that leaves a System V shared memory segment (it outlives its
	// process) retires its container.
	sandboxtest.WaitArmed(t, rt, "a")
	shm := strings.Fields(run("a", who+`import ctypes
libc = ctypes.CDLL(None, use_errno=True)
if libc.shmget(0, 4096, 0o1000 | 0o600) < 0:  # IPC_PRIVATE, IPC_CREAT
    raise OSError(ctypes.get_errno(), "shmget")`))
	// Had its sweep passed it, that container would re-arm within
	// milliseconds, and the next job would go to it (the most recently
	// used armed): wait for that, or for 2 s (a retired one never arms).
	for deadline := time.Now().Add(2 * time.Second); rt.Armed("a") != rt.Idle() && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	afterShm := strings.SplitN(run("a", check), "\n", 2)
	if strings.Fields(afterShm[0])[0] == shm[0] || afterShm[1] != "[] 3" {
		t.Fatalf("after a job left a shared memory segment: %q (container %s)", afterShm, shm[0])
	}
	// A container answers a job before its sweep: a job sent right after one
	// that leaves a process behind runs, in another container, whether it
	// reached the retiring one before or after the sweep.
	for i := range 5 {
		leaver := strings.Fields(run("a", who+"import subprocess\nsubprocess.Popen(['sleep', '60'], start_new_session=True)"))
		next := strings.SplitN(run("a", check), "\n", 2)
		if strings.Fields(next[0])[0] == leaver[0] || next[1] != "[] 3" {
			t.Fatalf("round %d: after a job left a process: %q (container %s)", i, next, leaver[0])
		}
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
	create, cancel := testenv.Command(testenv.CLITimeout, "podman", "create", "--name", name, image, "true")
	defer cancel()
	if out, err := create.CombinedOutput(); err != nil {
		t.Fatalf("podman create: %v %s", err, out)
	}
	defer func() {
		rm, cancel := testenv.Command(testenv.CLITimeout, "podman", "rm", "-f", name)
		defer cancel()
		_ = rm.Run() // best effort: the container only held the exported files
	}()
	export, cancelExport := testenv.Command(testenv.CLITimeout, "sh", "-c", "podman export "+name+" | tar -x -C "+dir)
	defer cancelExport()
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
	// The image's Node.js is found in the exported tree too.
	if !slices.Contains(sandbox.Languages(rt), sandbox.JavaScript) {
		t.Fatalf("a rootfs exported from %s runs %v, not JavaScript", image, sandbox.Languages(rt))
	}
	res, err = rt.Run(context.Background(), sandbox.Job{ID: "rootfs-js", Language: sandbox.JavaScript, Code: `console.log(process.getuid())`, Timeout: 30 * time.Second}, nil)
	if err != nil || res.Status != sandbox.StatusSuccess || res.Stdout != "65534\n" {
		t.Fatalf("JavaScript in the rootfs: %v %+v", err, res)
	}
	if _, err := New(context.Background(), Config{Config: containerpool.Config{WorkerID: sandboxtest.WorkerID(t)}, Rootfs: t.TempDir(), URI: os.Getenv("MCPEXEC_PODMAN")}); err == nil || !strings.Contains(err.Error(), "usr/bin/python3") {
		t.Fatalf("an empty rootfs: %v", err)
	}
}

// TestWatchKillsOnlyASilentService: the watchdog leaves a service that
// answers, even with errors, and kills one whose probes time out.
func TestWatchKillsOnlyASilentService(t *testing.T) {
	var silent atomic.Bool
	s := &service{path: "sleep", args: []string{"60"}, dir: t.TempDir(), log: slog.New(slog.DiscardHandler),
		stop: make(chan struct{}), hungAfter: 400 * time.Millisecond}
	s.quit, s.quitNow = context.WithCancel(context.Background())
	defer s.quitNow()
	s.probe = func(ctx context.Context) error {
		if silent.Load() {
			<-ctx.Done()
			return ctx.Err()
		}
		return errors.New("500: internal error") // an answer
	}
	if err := s.launch(); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done }) // already dead when the test passes
	exited := make(chan bool, 1)
	go func() { exited <- s.watch(done) }()
	select {
	case <-done:
		t.Fatal("a service that answers with errors was killed")
	case <-time.After(5 * s.hungAfter):
	}
	silent.Store(true)
	select {
	case byExit := <-exited:
		if !byExit {
			t.Fatal("watch returned as if at shutdown")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a silent service was not killed")
	}
	if code := cmd.ProcessState.ExitCode(); code != -1 {
		t.Fatalf("the service exited by itself (%d), not by the watchdog's kill", code)
	}
}
