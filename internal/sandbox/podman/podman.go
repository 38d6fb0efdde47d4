// Package podman is a sandbox.Runtime that runs each job in a fresh, locked-down
// Podman container, talking to a Podman API socket through the Podman bindings.
//
// Every container runs the runner (sandbox.WriteRunner) as its only process. The
// runner connects back over a Unix socket in a host directory bind-mounted
// read-only at /mcpexec, says hello and waits for its job, so a warm pool of started
// containers makes a run cost one round trip instead of a container start.
//
// Containers have no network, a read-only root, size-capped noexec tmpfs /tmp and
// /workspace, no capabilities, no_new_privs, an unprivileged user, memory, pids and
// rlimit caps and only a fixed environment. Each container serves one job and is
// removed afterwards, unless the job belongs to a session: a session keeps its
// container (and the runner's Python globals) until EndSession; labels (mcpexec.managed, mcpexec.worker, mcpexec.job) let a
// restarted worker remove the orphans of its previous life.
//
// Build with -tags "remote exclude_graphdriver_btrfs exclude_graphdriver_devicemapper
// containers_image_openpgp" (CGO_ENABLED=0 works).
package podman

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	sandboximage "github.com/mcpexec/mcpexec/deploy/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
)

// DefaultImage is the image New uses when Config.Image is empty; deploy/sandbox
// builds it.
const DefaultImage = sandboximage.DefaultImage

// Labels put on every container this package creates (containerpool's).
const (
	LabelManaged = containerpool.LabelManaged
	LabelWorker  = containerpool.LabelWorker
	LabelJob     = containerpool.LabelJob
	// LabelOwner names the process that made the container (host, pid and
	// the pid's start time): a container whose owner is gone is reaped by any
	// Runtime on the host, whatever its worker id.
	LabelOwner = containerpool.LabelOwner
)

// Reuse modes (Config.Reuse).
const (
	ReuseNamespace = containerpool.ReuseNamespace
	ReuseNone      = containerpool.ReuseNone
)

// Timeouts of the container life cycle.
const (
	removeTimeout  = 30 * time.Second
	serviceTimeout = 15 * time.Second
)

// Config configures a Runtime.
type Config struct {
	// URI of the Podman API socket, e.g. unix:///run/podman/podman.sock. Empty:
	// the user's rootless socket ($XDG_RUNTIME_DIR/podman/podman.sock) when not
	// root, /run/podman/podman.sock when root; when none answers, New starts
	// `podman system service` itself and stops it on Close.
	URI string
	// Image of the sandbox; default DefaultImage.
	Image string
	// Rootfs, when set, is a host directory used as every container's root
	// file system (read-only) instead of Image: for hosts that cannot build
	// or import an image. It must hold python3.
	Rootfs string
	// OCIRuntime is the OCI runtime Podman uses; default "runc" (crun refuses
	// cgroups v1/hybrid hosts).
	OCIRuntime string
	// Limits of each container. The zero value means sandbox.DefaultLimits().
	Limits sandbox.Limits
	// WorkerID labels this worker's containers; New removes the containers a
	// previous life with the same ID left behind. Default: the host name.
	WorkerID string
	// RunDir is the worker-private host directory under which each container
	// gets a directory with the runner and its socket (default sandbox.DefaultRunDir()).
	// It is made 0700: no other local user can reach a runner's socket. Keep
	// it short: Unix socket paths must stay under 100 bytes.
	RunDir string
	// UserNS is the containers' user namespace mode: UserNSAuto (the default)
	// gives each container its own (Podman's --userns=auto) when the host has
	// subordinate ids for it and Podman is 5 or newer; UserNSOn whenever the
	// ids exist; UserNSHost never.
	UserNS string
	// Pool is how many started containers, runner connected and waiting, are kept
	// ready for jobs. 0 starts a container per job.
	Pool int
	// Reuse is ReuseNamespace (the default): a container whose job ended
	// cleanly serves the next job of the same namespace (tenant), each job in
	// a process of its own forked from the runner's pre-imported parent, the
	// container swept in between; or ReuseNone: a container per job.
	Reuse string
	// MaxUses retires a container after that many jobs (default 100).
	MaxUses int
	// MaxIdle bounds the containers kept idle for their namespace's next job,
	// in all (default 8) and per namespace (MaxIdlePerTenant, default 4);
	// the least recently used go first. IdleTTL retires an idle container
	// (default 2 minutes).
	MaxIdle          int
	MaxIdlePerTenant int
	IdleTTL          time.Duration
	// Logger receives warnings and pool errors; default slog.Default().
	Logger *slog.Logger
	// MaxFrame bounds a protocol frame; 0 means proxy.DefaultMaxFrame.
	MaxFrame int
	// Preload are the Python modules each container imports ahead of its
	// first job (containerpool.Config.Preload); nil preloads nothing.
	Preload []string
	// StorageRoot, when set, gives the containers their own Podman storage
	// (--root, and --runroot under it): the Runtime then always starts its
	// own service. The image must be in it.
	StorageRoot string
	// KeepExitCommand keeps conmon's exit command in a Podman service that New
	// starts itself. By default that service runs conmon through a wrapper that
	// drops it: the exit command is a `podman container cleanup` process at each
	// container exit (about 45 ms of CPU, mostly the start of the podman binary),
	// and is redundant here since the Runtime removes every container it started
	// (which cleans it up). Has no effect on a service it did not start.
	KeepExitCommand bool
}

// Info describes the Podman connection of a Runtime.
type Info struct {
	URI            string // API socket
	StartedService bool   // the Runtime started `podman system service` itself
	ServerVersion  string // Podman version of the service
	Rootless       bool
	CgroupsVersion string // "v1" or "v2"
	OCIRuntime     string
	Image          string
	// LimitsEnforced is false when Podman cannot apply memory, pids and CPU
	// limits (rootless Podman on cgroups v1).
	LimitsEnforced bool
	// UserNS is true when each container gets its own user namespace;
	// UserNSNote says why not otherwise.
	UserNS     bool
	UserNSNote string
	// RunDir is the worker-private directory of the runners' sockets.
	RunDir string
}

// Runtime runs jobs in Podman containers. It is safe for concurrent use.
type Runtime struct {
	cfg   Config
	log   *slog.Logger
	conn  context.Context // bindings connection; never cancelled
	info  Info
	langs []string            // what the image runs (checkImage)
	pool  *containerpool.Pool // its containers; nil only while New fails early

	svc *service // the podman service this Runtime started, or nil

	storageMu sync.Mutex // serialises creates and removals in user-namespace mode

	closeOnce sync.Once
	closeErr  error
}

var (
	_ sandbox.SessionRuntime = (*Runtime)(nil)
	_ sandbox.StartReporter  = (*Runtime)(nil)
	_ sandbox.Prober         = (*Runtime)(nil)
	_ sandbox.StatsReporter  = (*Runtime)(nil)
)

// Config returns the runtime's configuration, defaults filled in.
func (r *Runtime) Config() Config { return r.cfg }

// ServicePID is the pid of the Podman service this Runtime started (0: it
// uses one it did not start).
func (r *Runtime) ServicePID() int {
	if r.svc == nil {
		return 0
	}
	return r.svc.pid()
}

// ReportsStart implements sandbox.StartReporter.
func (r *Runtime) ReportsStart() {}

// Probe implements sandbox.Prober: it starts a container and removes it.
func (r *Runtime) Probe(ctx context.Context) error { return r.pool.Probe(ctx) }

// New connects to Podman, checks the image, removes this worker's orphans and
// starts the warm pool.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	if cfg.Image == "" {
		cfg.Image = DefaultImage
	}
	if cfg.OCIRuntime == "" {
		cfg.OCIRuntime = "runc"
	}
	switch cfg.UserNS {
	case "":
		cfg.UserNS = UserNSAuto
	case UserNSAuto, UserNSOn, UserNSHost:
	default:
		return nil, fmt.Errorf("podman sandbox: user namespace mode %q: want %q, %q or %q", cfg.UserNS, UserNSAuto, UserNSOn, UserNSHost)
	}
	pc, err := cfg.poolConfig()
	if err != nil {
		return nil, err
	}
	r := &Runtime{cfg: cfg, log: pc.Logger}
	ok := false
	defer func() {
		if !ok {
			_ = r.Close() // closing on the way out: a failure leaves nothing to do
		}
	}()
	if r.pool, err = containerpool.New(pc, (*engine)(r)); err != nil {
		return nil, err
	}
	r.info.RunDir = r.pool.Dir()

	if err := r.connect(ctx); err != nil {
		return nil, err
	}
	r.info.UserNS, r.info.UserNSNote = userNSMode(r.cfg.UserNS, r.info.Rootless, r.info.ServerVersion)
	if r.cfg.UserNS == UserNSOn && !r.info.UserNS {
		return nil, fmt.Errorf("podman sandbox: --userns on: %s", r.info.UserNSNote)
	}
	if !r.info.UserNS {
		r.log.Warn("podman sandbox: containers share the host's user namespace", "why", r.info.UserNSNote)
	}
	if err := r.checkImage(ctx); err != nil {
		return nil, err
	}
	if err := r.pool.RemoveOrphans(ctx); err != nil {
		return nil, err
	}
	ok = true
	r.pool.Start()
	return r, nil
}

// poolConfig fills in the defaults of cfg's fields that configure the pool
// and returns the pool's Config.
func (cfg *Config) poolConfig() (containerpool.Config, error) {
	pc := containerpool.Config{
		Name: "podman sandbox", ErrClosed: ErrClosed, Logger: cfg.Logger, MaxFrame: cfg.MaxFrame, Preload: cfg.Preload,
		Limits: cfg.Limits, WorkerID: cfg.WorkerID, RunDir: cfg.RunDir, Pool: cfg.Pool, Reuse: cfg.Reuse,
		MaxUses: cfg.MaxUses, MaxIdle: cfg.MaxIdle, MaxIdlePerTenant: cfg.MaxIdlePerTenant, IdleTTL: cfg.IdleTTL,
	}
	err := pc.SetDefaults()
	cfg.Limits, cfg.WorkerID, cfg.RunDir, cfg.Pool, cfg.Reuse = pc.Limits, pc.WorkerID, pc.RunDir, pc.Pool, pc.Reuse
	cfg.MaxUses, cfg.MaxIdle, cfg.MaxIdlePerTenant, cfg.IdleTTL = pc.MaxUses, pc.MaxIdle, pc.MaxIdlePerTenant, pc.IdleTTL
	return pc, err
}

// Info describes the Podman connection.
func (r *Runtime) Info() Info { return r.info }

// ErrClosed is returned by Run and RunInSession after Close.
var ErrClosed = errors.New("podman sandbox: runtime is closed")

// Run implements sandbox.Runtime.
func (r *Runtime) Run(ctx context.Context, job sandbox.Job, host sandbox.Host) (sandbox.Result, error) {
	return r.pool.Run(ctx, job, host)
}

// RunInSession implements sandbox.SessionRuntime.
func (r *Runtime) RunInSession(ctx context.Context, key string, job sandbox.Job, host sandbox.Host) (sandbox.Result, error) {
	return r.pool.RunInSession(ctx, key, job, host)
}

// HasSession implements sandbox.SessionRuntime.
func (r *Runtime) HasSession(key string) bool { return r.pool.HasSession(key) }

// EndSession implements sandbox.SessionRuntime. A job of the session that is
// running finishes first; its container is removed afterwards.
func (r *Runtime) EndSession(key string) error { return r.pool.EndSession(key) }

// Stats implements sandbox.StatsReporter.
func (r *Runtime) Stats() sandbox.Stats { return r.pool.Stats() }

// Warm returns how many started containers wait in the pool.
func (r *Runtime) Warm() int { return r.pool.Warm() }

// Idle returns how many containers wait for their namespace's next job.
func (r *Runtime) Idle() int { return r.pool.Idle() }

// Close removes every container of this Runtime and stops the Podman service it
// started. It is idempotent.
func (r *Runtime) Close() error {
	r.closeOnce.Do(func() {
		if r.pool == nil { // New failed before it connected
			return
		}
		r.pool.Close()
		if r.conn != nil {
			// Anything left (a start that failed half-way, a crash of ours).
			r.closeErr = r.pool.RemoveLeftovers()
		}
		if r.svc != nil {
			r.svc.shutdown()
		}
		_ = os.RemoveAll(r.pool.Dir()) // best effort: what is left is removed at the next start
	})
	return r.closeErr
}
