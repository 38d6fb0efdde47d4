package containerpool

// This file is the container runtime: a Pool over an Engine, opened and
// closed with the engine's connection.
import (
	"context"
	"os"
	"sync"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// Connector is the part of an Engine that opens and closes its connection.
type Connector interface {
	// Connect reaches the engine, checks the image, and fills in info's
	// engine fields (RunDir is set already). It returns the languages the
	// image's sandboxes run.
	Connect(ctx context.Context, info *Info) (languages []string, err error)
	// Release closes the engine's connection, after the Pool's containers are
	// removed, also when Connect failed. While the engine can still be
	// reached it first calls leftovers, which removes the containers of this
	// worker that are left (a start that failed half-way, a crash of ours),
	// and returns its error.
	Release(leftovers func() error) error
}

// Info describes the engine of a Runtime.
type Info struct {
	Engine         string // "podman" or "docker"
	Address        string // the engine's API address (socket URI)
	StartedService bool   // the Runtime started the engine's service itself (Podman)
	ServerVersion  string // the engine's version
	APIVersion     string // the API version negotiated with it (Docker)
	Rootless       bool
	CgroupsVersion string // "v1" or "v2"
	CgroupDriver   string // Docker's cgroup driver
	OCIRuntime     string
	Image          string
	// LimitsEnforced is false when the engine cannot apply memory, pids and
	// CPU limits (rootless Podman on cgroups v1; a Docker engine that says
	// so); Missing lists which where the engine tells.
	LimitsEnforced bool
	Missing        []string
	// Seccomp is true when the engine says it applies a seccomp profile
	// (Docker).
	Seccomp bool
	// UserNS is true when each container gets its own user namespace;
	// UserNSNote says why not otherwise.
	UserNS     bool
	UserNSNote string
	// RunDir is the worker-private directory of the runners' sockets.
	RunDir string
}

// Runtime runs jobs in containers of an Engine: the sandbox.Runtime of the
// Podman and Docker runtimes. Its Pool runs the jobs. It is safe for
// concurrent use.
type Runtime struct {
	*Pool
	conn  Connector
	info  Info
	langs []string

	closeOnce sync.Once
	closeErr  error
}

var (
	_ sandbox.SessionRuntime   = (*Runtime)(nil)
	_ sandbox.StartReporter    = (*Runtime)(nil)
	_ sandbox.Prober           = (*Runtime)(nil)
	_ sandbox.LanguageReporter = (*Runtime)(nil)
	_ sandbox.StatsReporter    = (*Runtime)(nil)
)

// Open connects eng, checks the image, removes this worker's orphans and
// starts the warm pool. cfg has its defaults (Config.SetDefaults); name
// starts log messages and errors ("podman sandbox").
func Open(ctx context.Context, name string, cfg Config, eng interface {
	Engine
	Connector
}) (*Runtime, error) {
	if err := cfg.SetDefaults(name); err != nil {
		return nil, err
	}
	r := &Runtime{conn: eng}
	var err error
	if r.Pool, err = New(name, cfg, eng); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = r.Close() // closing on the way out: a failure leaves nothing to do
		}
	}()
	r.info.RunDir = r.Pool.Dir()
	if r.langs, err = eng.Connect(ctx, &r.info); err != nil {
		return nil, err
	}
	if err := r.Pool.RemoveOrphans(ctx); err != nil {
		return nil, err
	}
	ok = true
	r.Pool.Start()
	return r, nil
}

// Info describes the engine.
func (r *Runtime) Info() Info { return r.info }

// Languages implements sandbox.LanguageReporter: what the image runs.
func (r *Runtime) Languages() []string { return r.langs }

// ReportsStart implements sandbox.StartReporter.
func (r *Runtime) ReportsStart() {}

// Close removes every container of this Runtime and releases the engine. It
// is idempotent.
func (r *Runtime) Close() error {
	r.closeOnce.Do(func() {
		r.Pool.Close()
		r.closeErr = r.conn.Release(r.Pool.RemoveLeftovers)
		_ = os.RemoveAll(r.Pool.Dir()) // best effort: what is left is removed at the next start
	})
	return r.closeErr
}
