package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman/podmantest"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/testutil/testenv"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// failsafeJobs is the batch each fault test pushes through the fleet.
const failsafeJobs = 200

// fault is one way a worker's runtime breaks, and how it is repaired.
type fault struct {
	name   string
	setup  func(t *testing.T, cfg *podman.Config) // before worker A's runtime opens
	inject func(t *testing.T, rt *podman.Runtime)
	repair func(t *testing.T, rt *podman.Runtime)
}

// TestWorkersFailSafe runs a batch through a fleet of two Podman workers and
// breaks the runtime of one (A) under it: every job must still succeed (B
// takes the work), A must stop pulling while broken and resume once repaired,
// and no container may be left behind.
func TestWorkersFailSafe(t *testing.T) {
	if testing.Short() {
		t.Skip("fault tests through Podman")
	}
	image := os.Getenv("MCPEXEC_IMAGE")
	if image == "" {
		image = podman.DefaultImage
	}
	podmanCmd := func(t *testing.T, args ...string) string {
		t.Helper()
		cmd, cancel := testenv.Command(testenv.CLITimeout, "podman", args...)
		defer cancel()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("podman %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	requireRoot := func(t *testing.T) {
		if os.Geteuid() != 0 {
			testutil.SkipOrFail(t, "this fault needs root (mount)")
		}
	}
	faults := []fault{
		{
			// A's own storage: a service killed mid-write may damage the
			// storage it holds (image names have been seen to go).
			name: "PodmanServiceKilled",
			setup: func(t *testing.T, cfg *podman.Config) {
				requireRoot(t)
				cfg.StorageRoot = privateStorage(t, mountTmpfs(t, "600m"), image)
			},
			inject: func(t *testing.T, rt *podman.Runtime) { mustKill(t, rt.ServicePID()) },
			repair: func(*testing.T, *podman.Runtime) {}, // the runtime restarts it
		},
		{
			name: "ImageRemoved",
			setup: func(t *testing.T, cfg *podman.Config) {
				cfg.Image = "localhost/mcpexec-sandbox:fault-" + strings.ToLower(randomID())
				podmanCmd(t, "tag", image, cfg.Image)
				// untag with no name after the image removes every name of it.
				t.Cleanup(func() {
					cmd, cancel := testenv.Command(testenv.CLITimeout, "podman", "untag", cfg.Image, cfg.Image)
					defer cancel()
					_ = cmd.Run() // best effort: a tag left behind harms no test
				})
			},
			inject: func(t *testing.T, rt *podman.Runtime) { podmanCmd(t, "untag", rt.Info().Image, rt.Info().Image) },
			repair: func(t *testing.T, rt *podman.Runtime) { podmanCmd(t, "tag", image, rt.Info().Image) },
		},
		{
			name: "RunDirUnwritable",
			setup: func(t *testing.T, cfg *podman.Config) {
				requireRoot(t)
				cfg.RunDir = mountTmpfs(t, "16m")
			},
			// A read-only file system over the run dir: a remount of the
			// tmpfs itself is refused as busy while any process of the
			// fleet (a runner, the podman service) holds a file of it open
			// for writing, which can last.
			inject: func(t *testing.T, rt *podman.Runtime) { mountReadOnly(t, rt.Info().RunDir) },
			repair: func(t *testing.T, rt *podman.Runtime) { unmount(t, rt.Info().RunDir) },
		},
		{
			name: "ContainerDiskFull",
			setup: func(t *testing.T, cfg *podman.Config) {
				requireRoot(t)
				cfg.StorageRoot = privateStorage(t, mountTmpfs(t, "600m"), image)
			},
			inject: func(t *testing.T, rt *podman.Runtime) {
				// Fill what is left: no container can be made.
				f := filepath.Join(rt.Config().StorageRoot, "filler")
				_ = exec.Command("dd", "if=/dev/zero", "of="+f, "bs=1M", "count=1000").Run() // stops at ENOSPC
			},
			repair: func(t *testing.T, rt *podman.Runtime) {
				if err := os.Remove(filepath.Join(rt.Config().StorageRoot, "filler")); err != nil {
					t.Fatal(err)
				}
			},
		},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) { runFault(t, f) })
	}
}

func runFault(t *testing.T, f fault) {
	reapOrphanRuncInits(t)
	q := queue.DefaultConfig()
	b := testutil.Broker(t, "", q)
	cfgA := podman.Config{Config: containerpool.Config{Pool: 2, WorkerID: "fault-a-" + randomID()}}
	if f.setup != nil {
		f.setup(t, &cfgA)
	}
	rtA := podmantest.New(t, cfgA)
	rtB := podmantest.New(t, podman.Config{Config: containerpool.Config{Pool: 2, WorkerID: "fault-b-" + randomID()}})
	wcfg := func(id string) worker.Config {
		c := worker.DefaultConfig(id)
		c.Queue, c.Slots, c.RetryDelay, c.FetchWait = q, 2, 200*time.Millisecond, 500*time.Millisecond
		return c
	}
	wA := testutil.Worker(t, b, rtA, wcfg(cfgA.WorkerID))
	testutil.Worker(t, b, rtB, wcfg("b"))
	fe := testutil.Frontend(t, b, "fe")
	ctx := context.Background()

	js := make([]*jobs.Job, failsafeJobs)
	for i := range js {
		js[i] = &jobs.Job{ID: fmt.Sprintf("j%03d", i), Code: fmt.Sprintf("print(%d)", i), MaxAttempts: 2, Timeout: 60}
	}
	for _, s := range fe.SubmitMany(ctx, js, "f") {
		if s.Err != nil {
			t.Fatal(s.Err)
		}
	}
	// Break A once the batch is flowing.
	waitDone(t, b, 20, time.Minute)
	f.inject(t, rtA)
	injected := time.Now()
	var sickAfter time.Duration
	var sickSaid string
	for time.Since(injected) < 20*time.Second && sickAfter == 0 {
		if err := wA.Health(); err != nil {
			sickAfter, sickSaid = time.Since(injected), err.Error()
		}
		time.Sleep(20 * time.Millisecond)
	}
	f.repair(t, rtA)
	repaired := time.Now()
	recs := waitAllDone(t, b, failsafeJobs, 5*time.Minute)
	counts := map[jobs.Status]int{}
	byWorker := map[string]int{}
	for _, r := range recs {
		counts[r.Status]++
		byWorker[r.Worker]++
		if r.Status != jobs.StatusSuccess {
			t.Errorf("job %s ended %s: %+v", r.Job.ID, r.Status, r.Result)
		}
	}
	var recoveredAfter time.Duration
	for time.Since(repaired) < 90*time.Second {
		if wA.Health() == nil {
			recoveredAfter = time.Since(repaired)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if sickAfter > 0 && recoveredAfter == 0 {
		t.Errorf("worker A did not take jobs again within 90 s of the repair: %v", wA.Health())
	}
	t.Logf("%s: %d jobs: %v; by worker %v; worker A stopped pulling %s after the fault (healthz said %q), took jobs again %s after the repair",
		f.name, len(recs), counts, byWorker, sickAfter.Round(time.Millisecond), sickSaid, recoveredAfter.Round(time.Millisecond))
	// No container may be left behind once the runtimes close.
	for _, rt := range []*podman.Runtime{rtA, rtB} {
		if err := rt.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}
	for _, rt := range []*podman.Runtime{rtA, rtB} {
		args := []string{"ps", "-a", "-q", "--filter", "label=" + containerpool.LabelWorker + "=" + rt.Config().WorkerID}
		if root := rt.Config().StorageRoot; root != "" {
			args = append(podman.StorageFlags(root), args...)
		}
		cmd, cancel := testenv.Command(testenv.CLITimeout, "podman", args...)
		out, err := cmd.Output()
		cancel()
		if err != nil || strings.TrimSpace(string(out)) != "" {
			t.Errorf("containers of %s left behind: %q %v", rt.Config().WorkerID, out, err)
		}
	}
}

// waitDone waits until n jobs of the batch have succeeded.
func waitDone(t *testing.T, b *broker.Broker, n int, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if c, _ := b.Store().FinishedCount(); c >= n {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("fewer than %d jobs finished within %s", n, limit)
}

// waitAllDone waits until the n jobs of namespace f's batch are terminal.
func waitAllDone(t *testing.T, b *broker.Broker, n int, limit time.Duration) []*jobs.Record {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = jobs.ScopedID("f", fmt.Sprintf("j%03d", i))
	}
	deadline := time.Now().Add(limit)
	for {
		recs, err := b.Store().Jobs(ids)
		done := 0
		for _, r := range recs {
			if r.Status.Terminal() {
				done++
			}
		}
		if err == nil && done == n {
			return recs
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d jobs terminal after %s (err %v)", done, n, limit, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// privateStorage loads image into a Podman storage of its own in root.
func privateStorage(t *testing.T, root, image string) string {
	t.Helper()
	archive := filepath.Join(t.TempDir(), "image.tar")
	for _, args := range [][]string{{"save", "-o", archive, image}, append(podman.StorageFlags(root), "load", "-i", archive)} {
		cmd, cancel := testenv.Command(testenv.CLITimeout, "podman", args...)
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("podman %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	// No `system reset` at the end: it also empties the host's shared
	// libpod tmpdir. The tmpfs goes, and with it the storage.
	return root
}

// reapOrphanRuncInits kills, when the test ends, the processes a killed
// Podman service left during it: orphaned `runc init`s (a service killed
// while it created a container leaves its runc init waiting forever, and
// Podman 4.3 can then wedge the next test that shares the storage), and the
// conmon monitors of the fault tests' private storage with their runc inits.
func reapOrphanRuncInits(t *testing.T) {
	before := leftovers()
	t.Cleanup(func() {
		for pid := range leftovers() {
			if !before[pid] {
				_ = syscall.Kill(pid, syscall.SIGKILL) // it may have gone already
			}
		}
	})
}

// leftovers returns the pids of `runc init` processes whose parent is gone
// (adopted by pid 1), of orphaned conmons of the fault tests' storage, and of
// the runc inits under those.
func leftovers() map[int]bool {
	type proc struct {
		cmd  []byte
		ppid int
	}
	procs := map[int]proc{}
	paths, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range paths {
		cmd, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		dir := filepath.Dir(p)
		stat, err := os.ReadFile(filepath.Join(dir, "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) < 2 || fields[0] == "Z" {
			continue
		}
		pid, err1 := strconv.Atoi(filepath.Base(dir))
		ppid, err2 := strconv.Atoi(fields[1])
		if err1 == nil && err2 == nil {
			procs[pid] = proc{cmd: bytes.TrimRight(cmd, "\x00"), ppid: ppid}
		}
	}
	isRuncInit := func(p proc) bool { return bytes.HasSuffix(p.cmd, []byte("runc\x00init")) }
	out := map[int]bool{}
	for pid, p := range procs {
		switch {
		case isRuncInit(p) && p.ppid == 1:
			out[pid] = true
		case p.ppid == 1 && bytes.Contains(p.cmd, []byte("conmon")) && bytes.Contains(p.cmd, []byte("mcpexec-fault-")):
			out[pid] = true
		}
	}
	for pid, p := range procs {
		if isRuncInit(p) && out[p.ppid] && !isRuncInit(procs[p.ppid]) {
			out[pid] = true
		}
	}
	return out
}

func mustKill(t *testing.T, pid int) {
	t.Helper()
	if pid == 0 {
		testutil.SkipOrFail(t, "the runtime uses a Podman service it did not start (MCPEXEC_PODMAN?)")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
}

// mountTmpfs mounts a tmpfs of size on a new directory, unmounted at the end.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "mcpexec-fault-")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		testutil.SkipOrFail(t, "mount a tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		_ = exec.Command("umount", "-l", dir).Run()
		_ = os.RemoveAll(dir)
	})
	return dir
}

// mountReadOnly mounts an empty read-only tmpfs over dir: nothing can be
// made in it until unmount.
func mountReadOnly(t *testing.T, dir string) {
	t.Helper()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount a read-only tmpfs over %s: %v: %s", dir, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() }) // repaired already, or the test failed: either way it goes
}

func unmount(t *testing.T, dir string) {
	t.Helper()
	if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
		t.Fatalf("umount %s: %v: %s", dir, err, out)
	}
}

func randomID() string { return jobs.NewID()[18:] }

// TestLeftoversFound: the reaper of the fault tests recognises an orphaned
// conmon of their storage (here a stand-in: a process named like one, adopted
// by pid 1).
func TestLeftoversFound(t *testing.T) {
	cmd := exec.Command("bash", "-c", `(exec -a "conmon -n mcpexec-fault-probe" sleep 30 &) ; exit 0`)
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var found int
		for pid := range leftovers() {
			if cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); bytes.Contains(cmdline, []byte("mcpexec-fault-probe")) {
				found = pid
			}
		}
		if found != 0 {
			_ = syscall.Kill(found, syscall.SIGKILL) // the stand-in's job is done
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("an orphaned conmon of the fault tests' storage was not found")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
