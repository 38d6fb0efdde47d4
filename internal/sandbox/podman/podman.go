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
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
)

// DefaultImage is the image New uses when Config.Image is empty; deploy/sandbox
// builds it.
const DefaultImage = containerpool.DefaultImage

// Timeouts of the container life cycle.
const (
	removeTimeout  = 30 * time.Second
	serviceTimeout = 15 * time.Second
)

// name starts the runtime's log messages and errors.
const name = "podman sandbox"

// Config configures a Runtime: the container runtime's settings and
// Podman's own.
type Config struct {
	containerpool.Config
	// URI of the Podman API socket, e.g. unix:///run/podman/podman.sock. Empty:
	// the user's rootless socket ($XDG_RUNTIME_DIR/podman/podman.sock) when not
	// root, /run/podman/podman.sock when root; when none answers, New starts
	// `podman system service` itself and stops it on Close.
	URI string
	// Rootfs, when set, is a host directory used as every container's root
	// file system (read-only) instead of Image: for hosts that cannot build
	// or import an image. It must hold python3.
	Rootfs string
	// OCIRuntime is the OCI runtime Podman uses; default "runc" (crun refuses
	// cgroups v1/hybrid hosts).
	OCIRuntime string
	// UserNS is the containers' user namespace mode: UserNSAuto (the default)
	// gives each container its own (Podman's --userns=auto) when the host has
	// subordinate ids for it and Podman is 5 or newer; UserNSOn whenever the
	// ids exist; UserNSHost never.
	UserNS string
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
	// ServiceHungAfter is how long a Podman service that New started itself
	// may leave every probe unanswered (a list of the containers, which waits
	// for their locks) before it is killed and started again, as a service
	// that died is; 0 means DefaultServiceHungAfter. Has no effect on a
	// service it did not start.
	ServiceHungAfter time.Duration
}

// DefaultServiceHungAfter is Config.ServiceHungAfter's default: well above
// the longest call of a healthy service (a container's start under load
// takes seconds).
const DefaultServiceHungAfter = 2 * time.Minute

// Info describes the Podman connection of a Runtime.
type Info = containerpool.Info

// Runtime runs jobs in Podman containers: a containerpool.Runtime whose
// engine is Podman. It is safe for concurrent use.
type Runtime struct {
	*containerpool.Runtime
	cfg    Config
	log    *slog.Logger
	conn   context.Context // bindings connection; never cancelled
	userNS bool            // each container has its own user namespace (Info.UserNS)
	// startLocked: a container's start holds storageMu too (Podman 4 in
	// user-namespace mode; see lockStorage).
	startLocked bool

	svc *service // the podman service this Runtime started, or nil

	storageMu sync.Mutex // serialises creates and removals in user-namespace mode
}

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

// New connects to Podman, checks the image, removes this worker's orphans and
// starts the warm pool.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
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
	if err := cfg.SetDefaults(name); err != nil {
		return nil, err
	}
	r := &Runtime{cfg: cfg, log: cfg.Logger}
	rt, err := containerpool.Open(ctx, name, cfg.Config, (*engine)(r))
	if err != nil {
		return nil, err
	}
	r.Runtime = rt
	return r, nil
}
