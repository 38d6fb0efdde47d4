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
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	sandboximage "github.com/mcpexec/mcpexec/deploy/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// DefaultImage is the image New uses when Config.Image is empty; deploy/sandbox
// builds it.
const DefaultImage = sandboximage.DefaultImage

// ErrNoImage is returned by New when the sandbox image does not exist.
var ErrNoImage = errors.New("not found")

// Labels put on every container this package creates.
const (
	LabelManaged = "mcpexec.managed"
	LabelWorker  = "mcpexec.worker"
	LabelJob     = "mcpexec.job"
	// LabelOwner names the process that made the container (host, pid and
	// the pid's start time): a container whose owner is gone is reaped by any
	// Runtime on the host, whatever its worker id.
	LabelOwner = "mcpexec.owner"
)

// Timeouts of the container life cycle.
const (
	handshakeTimeout = 30 * time.Second
	removeTimeout    = 30 * time.Second
	serviceTimeout   = 15 * time.Second
	// finishTimeout bounds the wait for a runner to exit by itself once its
	// connection is closed; a runner still running then is killed.
	finishTimeout = 2 * time.Second
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
	cfg    Config
	log    *slog.Logger
	conn   context.Context // bindings connection; never cancelled
	info   Info
	base   string // per-Runtime directory under RunDir
	labels map[string]string
	langs  []string              // what the image runs (checkImage)
	js     sandbox.JSExpectation // when new sandboxes keep a JavaScript executor ready

	svc *service // the podman service this Runtime started, or nil

	seq       atomic.Uint64
	storageMu sync.Mutex // serialises creates and removals in user-namespace mode

	started       atomic.Uint64 // containers whose runner completed its handshake
	startFailures atomic.Uint64 // containers that failed to start

	mu       sync.Mutex // guards warm, idle, idleCount, starting, closed
	warm     []*box
	idle     map[string][]*box // by tenant, least recently used first
	idleN    int
	starting int
	closed   bool

	sandbox.SessionMethods[*box] // session containers

	wake       chan struct{} // pokes the pool filler
	stop       chan struct{} // closed by Close
	fillerDone chan struct{}
	reaperDone chan struct{}  // closed when reapLoop returns
	removals   sync.WaitGroup // background container removals
	closeOnce  sync.Once
	closeErr   error
}

var (
	_ sandbox.SessionRuntime = (*Runtime)(nil)
	_ sandbox.StartReporter  = (*Runtime)(nil)
	_ sandbox.Prober         = (*Runtime)(nil)
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
func (r *Runtime) Probe(ctx context.Context) error {
	b, err := r.acquire(ctx, "probe", r.cfg.Limits)
	if err != nil {
		return err
	}
	r.discard(b)
	return nil
}

// box is one started container whose runner completed its handshake.
type box struct {
	tenant   string         // the namespace it served (reused boxes)
	uses     int            // jobs it ran
	idleFrom time.Time      // when it went idle
	limits   sandbox.Limits // its container's
	id       string
	dir      string
	ln       net.Listener
	rc       *sandbox.RunnerConn
}

// New connects to Podman, checks the image, removes this worker's orphans and
// starts the warm pool.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	if cfg.Image == "" {
		cfg.Image = DefaultImage
	}
	if cfg.OCIRuntime == "" {
		cfg.OCIRuntime = "runc"
	}
	if cfg.Limits == (sandbox.Limits{}) {
		cfg.Limits = sandbox.DefaultLimits()
	}
	if cfg.Limits.User == "" {
		cfg.Limits.User = "65534:65534"
	}
	if cfg.WorkerID == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			h = "worker"
		}
		cfg.WorkerID = h
	}
	if cfg.RunDir == "" {
		cfg.RunDir = sandbox.DefaultRunDir()
	}
	switch cfg.UserNS {
	case "":
		cfg.UserNS = UserNSAuto
	case UserNSAuto, UserNSOn, UserNSHost:
	default:
		return nil, fmt.Errorf("podman sandbox: user namespace mode %q: want %q, %q or %q", cfg.UserNS, UserNSAuto, UserNSOn, UserNSHost)
	}
	if cfg.Pool < 0 {
		cfg.Pool = 0
	}
	switch cfg.Reuse {
	case "":
		cfg.Reuse = ReuseNamespace
	case ReuseNamespace, ReuseNone:
	default:
		return nil, fmt.Errorf("podman sandbox: reuse mode %q: want %q or %q", cfg.Reuse, ReuseNamespace, ReuseNone)
	}
	if cfg.MaxUses <= 0 {
		cfg.MaxUses = 100
	}
	if cfg.MaxIdle <= 0 {
		cfg.MaxIdle = 8
	}
	if cfg.MaxIdlePerTenant <= 0 {
		cfg.MaxIdlePerTenant = 4
	}
	if cfg.IdleTTL <= 0 {
		cfg.IdleTTL = 2 * time.Minute
	}
	r := &Runtime{
		cfg: cfg,
		log: cfg.Logger,
		labels: map[string]string{
			LabelManaged: "true",
			LabelWorker:  cfg.WorkerID,
		},
		wake:       make(chan struct{}, 1),
		stop:       make(chan struct{}),
		fillerDone: make(chan struct{}),
		reaperDone: make(chan struct{}),
	}
	if r.log == nil {
		r.log = slog.Default()
	}
	r.Sessions = &sandbox.Sessions[*box]{
		Start:     func(ctx context.Context) (*box, error) { return r.acquire(ctx, "session", r.cfg.Limits) },
		Drive:     r.drive,
		Reusable:  func(b *box) bool { return b.rc.Reusable() },
		Discard:   r.discard,
		ErrClosed: ErrClosed,
	}
	ok := false
	defer func() {
		if !ok {
			close(r.fillerDone)
			close(r.reaperDone)
			_ = r.Close() // closing on the way out: a failure leaves nothing to do
		}
	}()

	base, err := sandbox.PrivateDir(cfg.RunDir)
	if err != nil {
		return nil, fmt.Errorf("podman sandbox: run dir: %w (choose another with --run-dir)", err)
	}
	r.base, r.info.RunDir = base, base
	if n := len(filepath.Join(base, "18446744073709551615", "s")); n >= 100 {
		return nil, fmt.Errorf("podman sandbox: run dir %q is too long for Unix socket paths (%d bytes, limit 100): choose a shorter --run-dir", cfg.RunDir, n)
	}

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
	if err := r.removeOrphans(ctx); err != nil {
		return nil, err
	}
	ok = true
	go r.fill()
	go r.reapLoop()
	return r, nil
}

// Info describes the Podman connection.
func (r *Runtime) Info() Info { return r.info }

// ErrClosed is returned by Run and RunInSession after Close.
var ErrClosed = errors.New("podman sandbox: runtime is closed")

// Run implements sandbox.Runtime.
func (r *Runtime) Run(ctx context.Context, job sandbox.Job, host sandbox.Host) (sandbox.Result, error) {
	r.js.Saw(job)
	l := r.limitsFor(job)
	reuse := r.cfg.Reuse == ReuseNamespace && job.Tenant != "" && l == r.cfg.Limits
	var b *box
	if reuse {
		b = r.takeIdle(job.Tenant)
	}
	if b == nil {
		var err error
		if b, err = r.acquire(ctx, job.ID, l); err != nil {
			return sandbox.Result{}, err
		}
	}
	job.Fresh = true
	res, err := r.drive(ctx, b, job, host)
	b.uses++
	if reuse && err == nil && res.Status != sandbox.StatusTimeout && b.rc.Resets() && b.rc.Idle() && b.uses < r.cfg.MaxUses {
		b.tenant = job.Tenant
		r.putIdle(b)
		return res, nil
	}
	r.discard(b)
	return res, err
}

// drive runs job on b within the job's time limit. The caller decides whether b
// may serve again (b.rc.Reusable) or must be discarded.
func (r *Runtime) drive(ctx context.Context, b *box, job sandbox.Job, host sandbox.Host) (sandbox.Result, error) {
	res, err := b.rc.Exec(ctx, job, host)
	if errors.Is(err, sandbox.ErrRunnerLost) {
		res = r.lost(b, res)
		err = nil
	}
	// The code's process killed by SIGKILL: from inside the container only the
	// kernel's OOM killer does that (the code cannot signal the runner, PID 1).
	if err == nil && res.ExitCode == 137 && !b.rc.Reusable() && b.limits.Memory > 0 {
		res.Error = fmt.Sprintf("the sandbox hit its memory limit (%s) and the code's process was killed", sandbox.FormatBytes(b.limits.Memory))
	}
	return res, err
}

// limitsFor returns the limits of job's sandbox: the configured ones, with
// the job's own memory and CPUs when it asks for them.
func (r *Runtime) limitsFor(job sandbox.Job) sandbox.Limits {
	l := r.cfg.Limits
	if job.Memory > 0 {
		l.Memory = job.Memory
	}
	if job.CPUs > 0 {
		l.CPUs = job.CPUs
	}
	return l
}

// RunInSession implements sandbox.SessionRuntime, noting a JavaScript job
// as Run does.
func (r *Runtime) RunInSession(ctx context.Context, key string, job sandbox.Job, host sandbox.Host) (sandbox.Result, error) {
	r.js.Saw(job)
	return r.SessionMethods.RunInSession(ctx, key, job, host)
}

// Close removes every container of this Runtime and stops the Podman service it
// started. It is idempotent.
func (r *Runtime) Close() error {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		r.closed = true
		warm := r.warm
		r.warm = nil
		for _, bs := range r.idle {
			warm = append(warm, bs...)
		}
		r.idle, r.idleN = nil, 0
		r.mu.Unlock()
		r.Sessions.Close()
		close(r.stop)
		<-r.fillerDone
		<-r.reaperDone
		for _, b := range warm {
			r.discard(b)
		}
		r.removals.Wait()
		if r.conn != nil {
			// Anything left (a start that failed half-way, a crash of ours).
			if ids, err := r.list(context.Background()); err == nil {
				for _, id := range ids {
					if err := r.remove(context.Background(), id); err != nil {
						r.closeErr = errors.Join(r.closeErr, fmt.Errorf("remove container %s: %w", sandbox.ShortID(id), err))
					}
				}
			}
		}
		if r.svc != nil {
			r.svc.shutdown()
		}
		if r.base != "" {
			_ = os.RemoveAll(r.base) // best effort: what is left is removed at the next start
		}
	})
	return r.closeErr
}
