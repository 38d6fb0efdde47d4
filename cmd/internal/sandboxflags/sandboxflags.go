// Package sandboxflags holds the sandbox flags shared by `worker` and `frontend`
// (embedded mode) and opens the runtime they describe (Podman or Docker, or
// whichever the host has), building the sandbox image first when it is missing.
package sandboxflags

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	sandboximage "github.com/mcpexec/mcpexec/deploy/sandbox"
	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
	"github.com/mcpexec/mcpexec/internal/sandbox/docker"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// Flags are the sandbox settings.
type Flags struct {
	// Runtime is auto, podman or docker (Runtime* constants).
	Runtime    string
	Docker     string
	Image      string
	Rootfs     string
	RunDir     string
	UserNS     string
	Podman     string
	OCIRuntime string
	Pool       int
	Reuse      string
	MaxUses    int
	Memory     string
	Pids       int64
	CPUs       float64
	User       string
	TmpfsSize  string
	BuildImage bool
	// OutputCap is the bytes kept of each of stdout and stderr per job.
	OutputCap string
	// SessionIdle ends a session after this long without a job.
	SessionIdle time.Duration
	// MaxSessions caps the sessions one worker holds.
	MaxSessions int
	// Preload are the modules each sandbox imports ahead of its first job.
	Preload string
}

// Aliases are the seed project's environment names, honoured too.
var Aliases = map[string][]string{
	"runtime":        {"MCP_BRIDGE_RUNTIME"},
	"image":          {"MCP_BRIDGE_IMAGE"},
	"memory":         {"MCP_BRIDGE_MEMORY"},
	"pids":           {"MCP_BRIDGE_PIDS"},
	"cpus":           {"MCP_BRIDGE_CPUS"},
	"container-user": {"MCP_BRIDGE_CONTAINER_USER"},
	"timeout":        {"MCP_BRIDGE_TIMEOUT"},
	"max-timeout":    {"MCP_BRIDGE_MAX_TIMEOUT"},
}

// Register defines the flags on fs.
func Register(fs *flag.FlagSet) *Flags {
	f := &Flags{}
	d := sandbox.DefaultLimits()
	fs.StringVar(&f.Runtime, "runtime", RuntimeAuto, "container runtime of the sandboxes: auto (Podman when the host has it, else a Docker engine that answers), podman or docker")
	fs.StringVar(&f.Docker, "docker", "", "Docker Engine API address for --runtime docker (default $DOCKER_HOST, else unix:///var/run/docker.sock; auto also tries "+MCPEXECDockerHost+")")
	fs.StringVar(&f.Image, "image", containerpool.DefaultImage, "sandbox image")
	fs.StringVar(&f.Rootfs, "rootfs", "", "a host directory (with python3) used read-only as every sandbox's root file system, instead of --image (Podman only)")
	fs.StringVar(&f.RunDir, "run-dir", sandbox.DefaultRunDir(), "worker-private directory (made 0700) of the runners' sockets")
	fs.StringVar(&f.UserNS, "userns", podman.UserNSAuto, "a user namespace per sandbox (Podman only): auto (when the host has subordinate ids and Podman is 5+), on (whenever the ids exist), host (never)")
	fs.StringVar(&f.Podman, "podman", "", "Podman API socket URI (default: the user's socket, else /run/podman/podman.sock, else start one)")
	fs.StringVar(&f.OCIRuntime, "oci-runtime", "runc", "OCI runtime Podman (or Docker) uses (runc works on cgroups v1 hosts; crun does not)")
	fs.IntVar(&f.Pool, "pool", 2, "warm sandboxes kept started and waiting")
	fs.StringVar(&f.Reuse, "reuse", containerpool.ReuseNamespace, "namespace: a sandbox serves the next job of the same namespace (each job in a fresh process, the sandbox swept in between); none: a sandbox per job")
	fs.IntVar(&f.MaxUses, "reuse-max-jobs", containerpool.DefaultMaxUses, "jobs a reused sandbox runs before it is retired")
	fs.StringVar(&f.Memory, "memory", "512m", "memory limit of a sandbox (e.g. 512m, 1g)")
	fs.Int64Var(&f.Pids, "pids", d.Pids, "process limit of a sandbox")
	fs.Float64Var(&f.CPUs, "cpus", d.CPUs, "CPU limit of a sandbox (0: none)")
	fs.StringVar(&f.User, "container-user", d.User, "uid:gid the code runs as")
	fs.StringVar(&f.TmpfsSize, "tmpfs-size", "64m", "size of each of /tmp and /workspace")
	fs.BoolVar(&f.BuildImage, "build-image", true, "build the sandbox image when it is missing (needs root and debootstrap)")
	fs.StringVar(&f.OutputCap, "output-cap", "1m", "bytes kept of each of a job's stdout and stderr (the rest is dropped and the result says so)")
	fs.DurationVar(&f.SessionIdle, "session-idle", worker.DefaultSessionIdle, "end a session (and remove its sandbox) after this long without a job")
	fs.StringVar(&f.Preload, "preload", strings.Join(sandbox.DefaultPreload, ","), "Python modules each sandbox imports in a process that the jobs naming them are forked from, so they pay nothing for them: before its first job once the worker has run such a job in the last 30 minutes, else at its first such job (comma-separated; none: nothing; modules the image lacks are skipped)")
	fs.IntVar(&f.MaxSessions, "max-sessions", worker.DefaultMaxSessions, "sessions one worker holds at most")
	return f
}

// ConfigureWorker validates the worker-side flags (also checked by Limits) and
// sets them on cfg.
func (f *Flags) ConfigureWorker(cfg *worker.Config) error {
	n, err := f.outputCap()
	if err != nil {
		return err
	}
	cfg.OutputCap, cfg.SessionIdle, cfg.MaxSessions = int(n), f.SessionIdle, f.MaxSessions
	return nil
}

// outputCap validates the worker-side flags and returns the output cap.
func (f *Flags) outputCap() (int64, error) {
	n, err := ParseBytes(f.OutputCap)
	if err != nil || n < 1 || n > 16<<20 {
		return 0, cli.Usagef("--output-cap %q: want a size between 1 and 16m, e.g. 1m", f.OutputCap)
	}
	if f.SessionIdle < time.Second {
		return 0, cli.Usagef("--session-idle %s: want at least 1s, e.g. 300s", f.SessionIdle)
	}
	if f.MaxSessions < 1 {
		return 0, cli.Usagef("--max-sessions must be at least 1, got %d", f.MaxSessions)
	}
	return n, nil
}

// Limits validates the flags and returns the sandbox limits.
func (f *Flags) Limits() (sandbox.Limits, error) {
	l := sandbox.DefaultLimits()
	var err error
	if l.Memory, err = ParseBytes(f.Memory); err != nil {
		return l, cli.Usagef("--memory %q: %v", f.Memory, err)
	}
	if l.TmpfsSize, err = ParseBytes(f.TmpfsSize); err != nil {
		return l, cli.Usagef("--tmpfs-size %q: %v", f.TmpfsSize, err)
	}
	if f.Pids < 0 || f.CPUs < 0 || f.Pool < 0 || f.MaxUses < 1 {
		return l, cli.Usagef("--pids, --cpus and --pool must not be negative, --reuse-max-jobs at least 1")
	}
	if f.Reuse != containerpool.ReuseNamespace && f.Reuse != containerpool.ReuseNone {
		return l, cli.Usagef("--reuse %q: want %s or %s", f.Reuse, containerpool.ReuseNamespace, containerpool.ReuseNone)
	}
	if parts := strings.Split(f.User, ":"); len(parts) != 2 || !isNum(parts[0]) || !isNum(parts[1]) {
		return l, cli.Usagef("--container-user %q: want numeric uid:gid, e.g. 65534:65534", f.User)
	}
	if _, err := f.outputCap(); err != nil {
		return l, err
	}
	if _, err := sandbox.ParsePreload(f.Preload); err != nil {
		return l, cli.Usagef("--preload %q: %v", f.Preload, err)
	}
	if err := f.checkRuntime(); err != nil {
		return l, err
	}
	l.Pids, l.CPUs, l.User = f.Pids, f.CPUs, f.User
	return l, nil
}

func isNum(s string) bool { _, err := strconv.ParseUint(s, 10, 32); return err == nil }

// ParseBytes parses sizes like 512m, 1g, 65536k or a plain byte count.
func ParseBytes(s string) (int64, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "k"):
		mult, s = 1<<10, s[:len(s)-1]
	case strings.HasSuffix(s, "m"):
		mult, s = 1<<20, s[:len(s)-1]
	case strings.HasSuffix(s, "g"):
		mult, s = 1<<30, s[:len(s)-1]
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, errors.New("want a size such as 512m, 1g or a byte count")
	}
	return n * mult, nil
}

// Open opens the runtime Choose picks; when the image is missing and
// BuildImage is set it builds the image with the embedded recipe first (and
// puts it into the engine where the build does not: Docker).
func (f *Flags) Open(ctx context.Context, workerID string, log *slog.Logger) (sandbox.Runtime, error) {
	limits, err := f.Limits()
	if err != nil {
		return nil, err
	}
	ch := f.Choose(ctx)
	log.Info("sandbox runtime", "runtime", ch.Runtime, "why", ch.Reason)
	e, _ := engineNamed(ch.Runtime) // Choose picks an engine of Engines
	cfg := f.PoolConfig(workerID, limits, log)
	rt, err := e.open(ctx, f, ch.DockerHost, cfg)
	if errors.Is(err, sandbox.ErrNoImage) && f.BuildImage {
		log.Info("sandbox image missing: building it (about a minute)", "image", f.Image, "runtime", e.Name)
		if berr := BuildImage(ctx, f.Image); berr != nil {
			return nil, fmt.Errorf("%w; building it failed: %w", err, berr)
		}
		if e.load != nil {
			if lerr := e.load(ctx, f.Image, ch.DockerHost); lerr != nil {
				return nil, fmt.Errorf("%w; loading it failed: %w", err, lerr)
			}
		}
		rt, err = e.open(ctx, f, ch.DockerHost, cfg)
	}
	if err != nil {
		return nil, err
	}
	info := rt.Info()
	log.Info(e.Name+" sandbox ready", "address", info.Address, "version", info.ServerVersion, "api", info.APIVersion, "rootless", info.Rootless,
		"cgroups", info.CgroupsVersion, "oci_runtime", info.OCIRuntime, "image", info.Image,
		"limits_enforced", info.LimitsEnforced, "warm_pool", f.Pool, "reuse", f.Reuse)
	if !info.LimitsEnforced {
		log.Warn("sandbox resource limits are NOT all enforced on this host: a job can exhaust the host's resources",
			"runtime", e.Name, "missing", info.Missing, "rootless", info.Rootless, "cgroups", info.CgroupsVersion)
	}
	return rt, nil
}

// OpenChoice opens the runtime of ch with cfg and the flags' engine options,
// building no image: for doctor.
func (f *Flags) OpenChoice(ctx context.Context, ch Choice, cfg containerpool.Config) (Runtime, error) {
	e, _ := engineNamed(ch.Runtime) // Choose picks an engine of Engines
	return e.open(ctx, f, ch.DockerHost, cfg)
}

// PoolConfig is the container runtime's configuration the flags describe,
// whatever the engine.
func (f *Flags) PoolConfig(workerID string, limits sandbox.Limits, log *slog.Logger) containerpool.Config {
	preload, _ := sandbox.ParsePreload(f.Preload) // checked by Limits
	return containerpool.Config{
		Image: f.Image, Limits: limits, WorkerID: workerID, Pool: f.Pool, Logger: log,
		RunDir: f.RunDir, Reuse: f.Reuse, MaxUses: f.MaxUses, Preload: preload,
	}
}

// LoadIntoDocker copies image from Podman's storage (where the build recipe
// puts it) into the Docker engine at host.
func LoadIntoDocker(ctx context.Context, image, host string) error {
	cmd := exec.CommandContext(ctx, "podman", "save", "--format", "docker-archive", image)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("podman save: %w", err)
	}
	lerr := docker.LoadImage(ctx, host, out)
	_, _ = io.Copy(io.Discard, out) // let podman finish when the load failed early
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("podman save %s: %w: %s", image, err, strings.TrimSpace(stderr.String()))
	}
	return lerr
}

// BuildImage runs the embedded build recipe for image, its output on stderr.
func BuildImage(ctx context.Context, image string) error {
	tmp, err := os.CreateTemp("", "mcpexec-build-*.sh")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // a temporary file: the system cleans up what is left
	if _, err := tmp.Write(sandboximage.BuildScript); err != nil {
		_ = tmp.Close() // the write failed already: that is the error to report
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	// Its output also goes to a progress file doctor reads while it runs.
	out := io.Writer(os.Stderr)
	progress := sandbox.BuildProgressPath(image)
	if pf, err := os.OpenFile(progress, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644); err == nil {
		defer func() { _ = pf.Close(); _ = os.Remove(progress) }() // the build is over: nothing left to report
		_, _ = fmt.Fprintf(pf, "pid %d\n", os.Getpid())            // a progress file is a courtesy: the build goes on without it
		out = io.MultiWriter(os.Stderr, pf)
	}
	cmd := exec.CommandContext(ctx, "bash", tmp.Name(), image)
	cmd.Stdout, cmd.Stderr = out, out
	return cmd.Run()
}
