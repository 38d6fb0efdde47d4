package containerpool

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// Reuse modes (Config.Reuse).
const (
	ReuseNamespace = "namespace"
	ReuseNone      = "none"
)

// Timeouts of the container life cycle.
const (
	handshakeTimeout = 30 * time.Second
	// finishTimeout bounds the wait for a runner to exit by itself once its
	// connection is closed; a runner still running then is killed.
	finishTimeout = 2 * time.Second
)

// Config configures a Pool. The runtimes' Configs document the fields they
// pass on.
type Config struct {
	// Name starts the Pool's log messages and errors ("podman sandbox").
	Name string
	// ErrClosed is what Run, RunInSession and Acquire return after Close.
	ErrClosed error
	// Limits of each container. The zero value means sandbox.DefaultLimits(),
	// and an empty User 65534:65534.
	Limits sandbox.Limits
	// WorkerID labels this worker's containers (default: the host name).
	WorkerID string
	// RunDir is the worker-private directory under which the Pool makes its
	// own (default sandbox.DefaultRunDir()).
	RunDir string
	// Pool is how many started containers are kept ready (negative: 0).
	Pool int
	// Reuse is ReuseNamespace (the default) or ReuseNone.
	Reuse string
	// MaxUses retires a container after that many jobs (default 100).
	MaxUses int
	// MaxIdle (default 8) and MaxIdlePerTenant (default 4) bound the
	// containers kept idle; IdleTTL (default 2 minutes) retires them.
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
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// SetDefaults fills in c's zero fields and checks Reuse.
func (c *Config) SetDefaults() error {
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
		return fmt.Errorf("%s: reuse mode %q: want %q or %q", c.Name, c.Reuse, ReuseNamespace, ReuseNone)
	}
	if c.MaxUses <= 0 {
		c.MaxUses = 100
	}
	if c.MaxIdle <= 0 {
		c.MaxIdle = 8
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
		return fmt.Errorf("%s: %w", c.Name, err)
	}
	if c.ErrClosed == nil {
		c.ErrClosed = errors.New(c.Name + ": runtime is closed")
	}
	return nil
}

// privateDir makes the Pool's own directory under c.RunDir.
func (c *Config) privateDir() (string, error) {
	base, err := sandbox.PrivateDir(c.RunDir)
	if err != nil {
		return "", fmt.Errorf("%s: run dir: %w (choose another with --run-dir)", c.Name, err)
	}
	if n := len(filepath.Join(base, "18446744073709551615", "s")); n >= 100 {
		_ = os.RemoveAll(base) // unusable: nothing was made in it
		return "", fmt.Errorf("%s: run dir %q is too long for Unix socket paths (%d bytes, limit 100): choose a shorter --run-dir", c.Name, c.RunDir, n)
	}
	return base, nil
}
