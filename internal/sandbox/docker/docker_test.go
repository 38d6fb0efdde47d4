package docker

import (
	"context"
	"fmt"
	"maps"
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

// dockerEngine is Docker for sandboxtest.Exercise: the engine at
// $MCPEXEC_DOCKER (else $DOCKER_HOST, else the default socket).
var dockerEngine = sandboxtest.Engine[*Runtime]{
	Open: func(ctx context.Context, tb testing.TB, cfg containerpool.Config) (*Runtime, error) {
		return open(ctx, tb, Config{Config: cfg})
	},
	Unavailable: unavailable,
	Plant: func(t *testing.T, rt *Runtime, labels map[string]string) string {
		t.Helper()
		s := rt.spec(containerpool.Spec{Dir: t.TempDir(), Job: "planted", Limits: rt.cfg.Limits, Secret: "x"})
		maps.Copy(s.config.Labels, labels)
		r, err := rt.cli.ContainerCreate(context.Background(), s.config, s.host, s.net, nil, "")
		if err != nil {
			t.Fatalf("create a container: %v", err)
		}
		t.Cleanup(func() { _ = rt.remove(context.Background(), r.ID) })
		return r.ID
	},
	Exists: func(t *testing.T, rt *Runtime, id string) bool {
		t.Helper()
		_, err := rt.cli.ContainerInspect(context.Background(), id)
		if err != nil && !client.IsErrNotFound(err) {
			t.Fatal(err)
		}
		return err == nil
	},
	Left: func(t *testing.T, rt *Runtime, worker string) []string {
		t.Helper()
		c, err := client.NewClientWithOpts(client.WithHost(rt.cfg.Host), client.WithAPIVersionNegotiation())
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = c.Close() }() // a look-up connection: nothing to do on a failed close
		list, err := c.ContainerList(context.Background(), container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", containerpool.LabelWorker+"="+worker))})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, l := range list {
			ids = append(ids, l.ID)
		}
		return ids
	},
	HostNames: []string{"host.docker.internal", "172.17.0.1"},
}

// open opens a Runtime of cfg for tb on the engine at $MCPEXEC_DOCKER (else
// $DOCKER_HOST, else the default socket).
func open(ctx context.Context, tb testing.TB, cfg Config) (*Runtime, error) {
	if cfg.Host == "" {
		cfg.Host = testutil.DockerHost()
	}
	if cfg.Logger == nil {
		cfg.Logger = testutil.Logger(tb)
	}
	return New(ctx, cfg)
}

// newRuntime starts a Runtime for one test with its own worker ID.
func newRuntime(tb testing.TB) *Runtime {
	tb.Helper()
	return dockerEngine.New(tb, containerpool.Config{})
}

// TestContainerRuntime runs the container runtimes' suite on Docker.
func TestContainerRuntime(t *testing.T) { sandboxtest.Exercise(t, dockerEngine) }

// BenchmarkContainerRuntime: go test -bench ContainerRuntime/RunWarm
// -benchtime 20x.
func BenchmarkContainerRuntime(b *testing.B) { sandboxtest.Bench(b, dockerEngine) }

func TestSpecLockdown(t *testing.T) {
	rt := newRuntime(t)
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

func TestUnreachableEngine(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := New(ctx, Config{Config: containerpool.Config{RunDir: t.TempDir()}, Host: "unix://" + t.TempDir() + "/none.sock"})
	if err == nil || !strings.Contains(err.Error(), "cannot reach the Docker engine") {
		t.Fatalf("New on a missing socket: %v", err)
	}
}

// TestRunnerDirInert: Docker's bind mounts take no noexec, nosuid or nodev
// (Podman mounts /mcpexec with all three), so the runner's directory must
// hold nothing they would stop: no file with an exec, setuid or setgid bit,
// no device, and no way to add one (read-only, and root's).
func TestRunnerDirInert(t *testing.T) {
	rt := newRuntime(t)
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
