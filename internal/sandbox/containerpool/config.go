package containerpool

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	sandboximage "github.com/mcpexec/mcpexec/deploy/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// Reuse modes (Config.Reuse).
const (
	ReuseNamespace = "namespace"
	ReuseNone      = "none"
)

// DefaultMaxUses is how many jobs a reused container runs before it is
// retired. Each job's sweep checks the container; the retirement bounds
// what no sweep sees. A retired container's replacement costs a container
// start (~0.3 s of CPU here): every 100 jobs, that was a tenth of a warm
// job's CPU.
const DefaultMaxUses = 1000

// Timeouts of the container life cycle.
const (
	handshakeTimeout = 30 * time.Second
	// finishTimeout bounds the wait for a runner to exit by itself once its
	// connection is closed; a runner still running then is killed.
	finishTimeout = 2 * time.Second
)

// ErrClosed is what a Runtime's (and a Pool's) Run, RunInSession and Acquire
// return after Close, wrapped with the runtime's name ("podman sandbox:
// runtime is closed").
var ErrClosed = errors.New("runtime is closed")

// Config configures a container runtime: what the Podman and Docker
// runtimes share (their Configs embed it) and the Pool runs by.
type Config struct {
	// Image of the sandbox; default DefaultImage (deploy/sandbox builds it).
	Image string
	// Limits of each container. The zero value means sandbox.DefaultLimits(),
	// and an empty User 65534:65534.
	Limits sandbox.Limits
	// WorkerID labels this worker's containers; opening a runtime removes the
	// containers a previous life with the same ID left behind. Default: the
	// host name.
	WorkerID string
	// RunDir is the worker-private host directory under which each container
	// gets a directory with the runner and its socket (default
	// sandbox.DefaultRunDir()). It is made 0700: no other local user can reach
	// a runner's socket. Keep it short: Unix socket paths must stay under 100
	// bytes. The engine must see the same file system (a local engine).
	RunDir string
	// Pool is how many started containers, runner connected and waiting, are
	// kept ready for jobs. 0 (or negative) starts a container per job.
	Pool int
	// Reuse is ReuseNamespace (the default): a container whose job ended
	// cleanly serves the next job of the same namespace (tenant), each job in
	// a process of its own forked from the runner's pre-imported parent, the
	// container swept in between; or ReuseNone: a container per job.
	Reuse string
	// MaxUses retires a container after that many jobs (default
	// DefaultMaxUses).
	MaxUses int
	// MaxIdle bounds the containers kept idle for their namespace's next job,
	// in all (default: one per 512 MiB of the host's memory, from 8 to 32)
	// and per namespace (MaxIdlePerTenant, default 4); the least recently
	// used go first. IdleTTL retires an idle container (default 2 minutes).
	MaxIdle          int
	MaxIdlePerTenant int
	IdleTTL          time.Duration
	// MaxFrame bounds a protocol frame; 0 means proxy.DefaultMaxFrame.
	MaxFrame int
	// Preload are the Python modules each container's zygote imports before
	// its first job, so that a job importing them pays nothing (the forks
	// share their pages). Nil preloads nothing; sandbox.DefaultPreload is the
	// data stack. Modules the image lacks are skipped.
	Preload []string
	// Logger receives warnings and pool errors; default slog.Default().
	Logger *slog.Logger
}

// DefaultImage is the image of Config.Image's default.
const DefaultImage = sandboximage.DefaultImage

// SetDefaults fills in c's zero fields and checks Reuse and Preload; name
// starts its errors ("podman sandbox").
func (c *Config) SetDefaults(name string) error {
	if c.Image == "" {
		c.Image = DefaultImage
	}
	if c.Limits == (sandbox.Limits{}) {
		c.Limits = sandbox.DefaultLimits()
	}
	if c.Limits.User == "" {
		c.Limits.User = "65534:65534"
	}
	if c.WorkerID == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			h = "worker"
		}
		c.WorkerID = h
	}
	if c.RunDir == "" {
		c.RunDir = sandbox.DefaultRunDir()
	}
	c.Pool = max(c.Pool, 0)
	switch c.Reuse {
	case "":
		c.Reuse = ReuseNamespace
	case ReuseNamespace, ReuseNone:
	default:
		return fmt.Errorf("%s: reuse mode %q: want %q or %q", name, c.Reuse, ReuseNamespace, ReuseNone)
	}
	if c.MaxUses <= 0 {
		c.MaxUses = DefaultMaxUses
	}
	if c.MaxIdle <= 0 {
		c.MaxIdle = defaultMaxIdle()
	}
	if c.MaxIdlePerTenant <= 0 {
		c.MaxIdlePerTenant = 4
	}
	if c.IdleTTL <= 0 {
		c.IdleTTL = 2 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if err := sandbox.CheckPreload(c.Preload); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// defaultMaxIdle is MaxIdle's default: one idle container per 512 MiB of
// the host's memory (a container with the data stack preloaded holds ~100
// MiB), from 8 to 32. Eight was too few for 16 namespaces calling at once:
// each call evicted another namespace's container and started its own
// (~0.3 s of CPU here), and the worker ran 4-6 calls a second instead of
// 13 (BenchmarkConcurrency).
func defaultMaxIdle() int {
	var si syscall.Sysinfo_t
	if syscall.Sysinfo(&si) != nil {
		return 8
	}
	total := uint64(si.Totalram) * uint64(si.Unit)
	return int(min(max(total/(512<<20), 8), 32))
}

// privateDir makes the Pool's own directory under c.RunDir.
func (c *Config) privateDir(name string) (string, error) {
	base, err := sandbox.PrivateDir(c.RunDir)
	if err != nil {
		return "", fmt.Errorf("%s: run dir: %w (choose another with --run-dir)", name, err)
	}
	if n := len(filepath.Join(base, "18446744073709551615", "s")); n >= 100 {
		_ = os.RemoveAll(base) // unusable: nothing was made in it
		return "", fmt.Errorf("%s: run dir %q is too long for Unix socket paths (%d bytes, limit 100): choose a shorter --run-dir", name, c.RunDir, n)
	}
	return base, nil
}
