// Package podman is a sandbox.Runtime that runs each job in a fresh, locked-down
// Podman container, talking to a Podman API socket through the Podman bindings.
//
// Every container runs the runner (sandbox.RunnerScript) as its only process. The
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
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/containers/podman/v5/libpod/define"
	"github.com/containers/podman/v5/pkg/bindings"
	"github.com/containers/podman/v5/pkg/bindings/containers"
	"github.com/containers/podman/v5/pkg/bindings/images"
	"github.com/containers/podman/v5/pkg/bindings/system"
	"github.com/containers/podman/v5/pkg/specgen"
	storagetypes "github.com/containers/storage/types"
	spec "github.com/opencontainers/runtime-spec/specs-go"

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
	// OCIRuntime is the OCI runtime Podman uses; default "runc" (crun refuses
	// cgroups v1/hybrid hosts).
	OCIRuntime string
	// Limits of each container. The zero value means sandbox.DefaultLimits().
	Limits sandbox.Limits
	// WorkerID labels this worker's containers; New removes the containers a
	// previous life with the same ID left behind. Default: the host name.
	WorkerID string
	// RunDir is the worker-private host directory under which each container
	// gets a directory with the runner and its socket (default DefaultRunDir()).
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
	// Logger receives warnings and pool errors; default slog.Default().
	Logger *slog.Logger
	// MaxFrame bounds a protocol frame; 0 means proxy.DefaultMaxFrame.
	MaxFrame int
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

	service     *exec.Cmd     // podman system service we started, or nil
	serviceDone chan struct{} // closed when service exits
	serviceDir  string

	seq       atomic.Uint64
	storageMu sync.Mutex // serialises creates and removals in user-namespace mode

	started       atomic.Uint64 // containers whose runner completed its handshake
	startFailures atomic.Uint64 // containers that failed to start

	mu       sync.Mutex // guards warm, starting, closed
	warm     []*box
	starting int
	closed   bool
	sessions *sandbox.Sessions[*box] // session containers; safe for concurrent use

	wake       chan struct{} // pokes the pool filler
	stop       chan struct{} // closed by Close
	fillerDone chan struct{}
	removals   sync.WaitGroup // background container removals
	closeOnce  sync.Once
	closeErr   error
}

var (
	_ sandbox.SessionRuntime = (*Runtime)(nil)
	_ sandbox.StartReporter  = (*Runtime)(nil)
	_ sandbox.Prober         = (*Runtime)(nil)
)

// ReportsStart implements sandbox.StartReporter.
func (r *Runtime) ReportsStart() {}

// Probe implements sandbox.Prober: it starts a container and removes it.
func (r *Runtime) Probe(ctx context.Context) error {
	b, err := r.acquire(ctx, "probe")
	if err != nil {
		return err
	}
	r.discard(b)
	return nil
}

// box is one started container whose runner completed its handshake.
type box struct {
	id  string
	dir string
	ln  net.Listener
	rc  *sandbox.RunnerConn
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
		cfg.RunDir = DefaultRunDir()
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
	}
	if r.log == nil {
		r.log = slog.Default()
	}
	r.sessions = &sandbox.Sessions[*box]{
		Start:     func(ctx context.Context) (*box, error) { return r.acquire(ctx, "session") },
		Drive:     r.drive,
		Reusable:  func(b *box) bool { return b.rc.Reusable() },
		Discard:   r.discard,
		ErrClosed: ErrClosed,
	}
	ok := false
	defer func() {
		if !ok {
			close(r.fillerDone)
			_ = r.Close()
		}
	}()

	base, err := privateDir(cfg.RunDir)
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
	return r, nil
}

// connect finds (or starts) the Podman service and reads its description.
func (r *Runtime) connect(ctx context.Context) error {
	var uris []string
	if r.cfg.URI != "" {
		uris = []string{r.cfg.URI}
	} else {
		if os.Geteuid() != 0 {
			if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
				uris = append(uris, "unix://"+filepath.Join(d, "podman", "podman.sock"))
			}
		} else {
			uris = append(uris, "unix:///run/podman/podman.sock")
		}
	}
	var errs []error
	for _, u := range uris {
		if strings.HasPrefix(u, "unix://") {
			if _, err := os.Stat(strings.TrimPrefix(u, "unix://")); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", u, err))
				continue
			}
		}
		c, err := dial(ctx, u)
		if err == nil {
			r.conn, r.info.URI = c, u
			break
		}
		errs = append(errs, fmt.Errorf("%s: %w", u, err))
	}
	if r.conn == nil {
		if r.cfg.URI != "" {
			return fmt.Errorf("podman sandbox: cannot reach the Podman API at %s (start it with `podman system service --time=0 %s`, or leave the URI empty to let mcpexec start one): %w", r.cfg.URI, r.cfg.URI, errors.Join(errs...))
		}
		if err := r.startService(ctx); err != nil {
			return fmt.Errorf("podman sandbox: no Podman API socket answered (%v) and starting one failed: %w", errors.Join(errs...), err)
		}
	}

	info, err := system.Info(r.conn, nil)
	if err != nil {
		return fmt.Errorf("podman sandbox: podman info: %w", err)
	}
	r.info.Image = r.cfg.Image
	r.info.OCIRuntime = r.cfg.OCIRuntime
	r.info.Rootless = info.Host.Security.Rootless
	r.info.CgroupsVersion = info.Host.CgroupsVersion
	r.info.ServerVersion = info.Version.Version
	r.info.LimitsEnforced = !(info.Host.Security.Rootless && info.Host.CgroupsVersion == "v1")
	if !r.info.LimitsEnforced {
		r.log.Warn("podman sandbox: rootless Podman on cgroups v1 does not enforce memory, pids or CPU limits; "+
			"a job can exhaust the host's memory. Use rootful Podman (e.g. --podman unix:///run/podman/podman.sock as root) or a cgroups v2 host",
			"uri", r.info.URI, "cgroups", info.Host.CgroupsVersion)
	}
	return nil
}

// dial opens a bindings connection to uri, bounded by serviceTimeout.
func dial(ctx context.Context, uri string) (context.Context, error) {
	type res struct {
		c   context.Context
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := bindings.NewConnection(context.Background(), uri)
		ch <- res{c, err}
	}()
	select {
	case x := <-ch:
		return x.c, x.err
	case <-time.After(serviceTimeout):
		return nil, errors.New("no answer within " + serviceTimeout.String())
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// startService starts `podman system service` on a private socket and connects.
func (r *Runtime) startService(ctx context.Context) error {
	podman, err := exec.LookPath("podman")
	if err != nil {
		return errors.New("podman is not installed (apt-get install podman runc uidmap)")
	}
	dir, err := os.MkdirTemp("", "mcpexec-podman-")
	if err != nil {
		return err
	}
	r.serviceDir = dir
	sock := filepath.Join(dir, "podman.sock")
	uri := "unix://" + sock
	// No events: nothing here reads them, and each container would write six
	// (`podman events` does not show this service's containers).
	args := []string{"--events-backend", "none"}
	if !r.cfg.KeepExitCommand {
		if w, err := conmonWrapper(dir); err != nil {
			r.log.Debug("podman sandbox: keeping conmon's exit command", "reason", err)
		} else {
			args = append(args, "--conmon", w)
		}
	}
	args = append(args, "system", "service", "--time=0", uri)
	cmd := exec.Command(podman, args...)
	// conmon (Podman 4.3, cgroups v1) drops an empty "oom" file in its working
	// directory when a container is OOM-killed: keep that out of the caller's.
	cmd.Dir = dir
	stderr := &tailBuffer{max: 4096}
	cmd.Stderr = stderr
	// Own process group: a Ctrl-C meant for the worker must not kill the service
	// before the worker has removed its containers.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start podman system service: %w", err)
	}
	r.service = cmd
	r.serviceDone = make(chan struct{})
	go func() { _ = cmd.Wait(); close(r.serviceDone) }()

	deadline := time.Now().Add(serviceTimeout)
	for {
		if _, err := os.Stat(sock); err == nil {
			if c, err := bindings.NewConnection(context.Background(), uri); err == nil {
				r.conn, r.info.URI, r.info.StartedService = c, uri, true
				r.log.Info("podman sandbox: started podman system service", "uri", uri, "pid", cmd.Process.Pid)
				return nil
			}
		}
		select {
		case <-r.serviceDone:
			return fmt.Errorf("podman system service exited: %s", strings.TrimSpace(stderr.String()))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("podman system service did not answer on %s within %s", uri, serviceTimeout)
		}
	}
}

// conmonWrapperScript runs conmon without its exit command (see
// Config.KeepExitCommand); %s is conmon's path.
const conmonWrapperScript = `#!/bin/sh
# conmon for mcpexec's Podman service, without --exit-command: the worker removes
# each container itself, so the podman cleanup process at each exit is redundant.
skip=0
for a do
	shift
	if [ "$skip" = 1 ]; then skip=0; continue; fi
	case "$a" in
	--exit-command | --exit-command-arg) skip=1; continue ;;
	--exit-command=* | --exit-command-arg=*) continue ;;
	esac
	set -- "$@" "$a"
done
exec %s "$@"
`

// conmonWrapper writes the wrapper of the host's conmon into dir and checks
// that it runs.
func conmonWrapper(dir string) (string, error) {
	conmon, err := findConmon()
	if err != nil {
		return "", err
	}
	return writeConmonWrapper(dir, conmon)
}

// findConmon returns the path of conmon.
func findConmon() (string, error) {
	conmon := ""
	// Podman's own search order (containers.conf conmon_path), then PATH.
	for _, p := range []string{"/usr/libexec/podman/conmon", "/usr/local/libexec/podman/conmon", "/usr/local/lib/podman/conmon", "/usr/bin/conmon", "/usr/sbin/conmon", "/usr/local/bin/conmon", "/usr/local/sbin/conmon"} {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			conmon = p
			break
		}
	}
	if conmon == "" {
		p, err := exec.LookPath("conmon")
		if err != nil {
			return "", errors.New("conmon not found")
		}
		conmon = p
	}
	return conmon, nil
}

// writeConmonWrapper writes a wrapper of conmon into dir and checks that it
// runs (`WRAPPER --version`).
func writeConmonWrapper(dir, conmon string) (string, error) {
	if strings.ContainsAny(conmon, "'\"\\$`\n ") {
		return "", fmt.Errorf("conmon path %q needs quoting", conmon)
	}
	w := filepath.Join(dir, "conmon")
	if err := os.WriteFile(w, fmt.Appendf(nil, conmonWrapperScript, conmon), 0o755); err != nil {
		return "", err
	}
	// A noexec temp dir, or no /bin/sh: keep the real conmon.
	if out, err := exec.Command(w, "--version").CombinedOutput(); err != nil {
		return "", fmt.Errorf("%s --version: %w: %s", w, err, strings.TrimSpace(string(out)))
	}
	return w, nil
}

func (r *Runtime) checkImage(ctx context.Context) error {
	c, cancel := r.callCtx(ctx, 30*time.Second)
	defer cancel()
	ok, err := images.Exists(c, r.cfg.Image, nil)
	if err != nil {
		return fmt.Errorf("podman sandbox: check image %s: %w", r.cfg.Image, err)
	}
	if !ok {
		return fmt.Errorf("podman sandbox: image %s %w: build it with `sudo deploy/sandbox/build.sh %s` (or `make image`)", r.cfg.Image, ErrNoImage, r.cfg.Image)
	}
	return nil
}

// removeOrphans removes every managed container carrying this worker's label.
func (r *Runtime) removeOrphans(ctx context.Context) error {
	ids, err := r.list(ctx)
	if err != nil {
		return fmt.Errorf("podman sandbox: list orphan containers: %w", err)
	}
	for _, id := range ids {
		if err := r.remove(ctx, id); err != nil {
			return fmt.Errorf("podman sandbox: remove orphan container %.12s: %w", id, err)
		}
	}
	if len(ids) > 0 {
		r.log.Info("podman sandbox: removed orphan containers", "worker", r.cfg.WorkerID, "count", len(ids))
	}
	return nil
}

// list returns the IDs of all containers (any state) labelled with this worker.
func (r *Runtime) list(ctx context.Context) ([]string, error) {
	c, cancel := r.callCtx(ctx, 30*time.Second)
	defer cancel()
	opts := new(containers.ListOptions).WithAll(true).WithFilters(map[string][]string{
		"label": {LabelManaged + "=true", LabelWorker + "=" + r.cfg.WorkerID},
	})
	list, err := containers.List(c, opts)
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(list))
	for _, l := range list {
		// The label filters are ANDed, but be strict anyway.
		if l.Labels[LabelManaged] == "true" && l.Labels[LabelWorker] == r.cfg.WorkerID {
			ids = append(ids, l.ID)
		}
	}
	return ids, nil
}

// Info describes the Podman connection.
func (r *Runtime) Info() Info { return r.info }

// callCtx returns a context carrying the bindings connection that ends when ctx
// ends or after d.
func (r *Runtime) callCtx(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	c, cancel := context.WithTimeout(r.conn, d)
	stop := context.AfterFunc(ctx, cancel)
	return c, func() { stop(); cancel() }
}

// remove kills and removes a container, whatever its state.
func (r *Runtime) remove(ctx context.Context, id string) error {
	c, cancel := r.callCtx(context.WithoutCancel(ctx), removeTimeout)
	defer cancel()
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		// Podman 4.3 fails a forced removal of a container that exits on its own
		// while being killed ("container state improper"); the next try succeeds.
		r.lockStorage()
		_, err = containers.Remove(c, id, new(containers.RemoveOptions).WithForce(true).WithTimeout(0).WithIgnore(true))
		r.unlockStorage()
		if err == nil || c.Err() != nil {
			break
		}
		time.Sleep(time.Duration(attempt+1) * 100 * time.Millisecond)
	}
	return err
}

// discard closes a box and removes its container in the background.
func (r *Runtime) discard(b *box) {
	r.removals.Add(1)
	go func() {
		defer r.removals.Done()
		// Closing the connection makes the runner exit by itself (within
		// milliseconds, even mid-job): the removal then finds a stopped container
		// and needs no kill (a runc process and a SIGKILL fewer). A runner that
		// does not exit in time is killed by the forced removal.
		b.rc.Finish(finishTimeout)
		if err := r.remove(context.Background(), b.id); err != nil {
			r.log.Error("podman sandbox: remove container", "id", shortID(b.id), "err", err)
		}
		b.ln.Close()
		_ = os.RemoveAll(b.dir)
	}()
}

var unsafeName = regexp.MustCompile(`[^a-zA-Z0-9_.-]+`)

// start creates and starts a container and waits for its runner's hello.
func (r *Runtime) start(ctx context.Context, jobLabel string) (_ *box, err error) {
	n := r.seq.Add(1)
	dir := filepath.Join(r.base, strconv.FormatUint(n, 10))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create container dir: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // umask
		return nil, err
	}
	b := &box{dir: dir}
	defer func() {
		if err == nil {
			r.started.Add(1)
		} else {
			r.startFailures.Add(1)
		}
		if err != nil {
			if b.ln != nil {
				b.ln.Close()
			}
			if b.id != "" {
				_ = r.remove(ctx, b.id)
			}
			_ = os.RemoveAll(dir)
		}
	}()
	if err := os.WriteFile(filepath.Join(dir, "runner.py"), sandbox.RunnerScript, 0o444); err != nil {
		return nil, fmt.Errorf("write runner: %w", err)
	}
	sock := filepath.Join(dir, "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("listen for runner: %w", err)
	}
	b.ln = ln
	if err := os.Chmod(sock, 0o777); err != nil { // the container's user must connect
		return nil, err
	}

	secret := sandbox.NewSecret()
	s := r.spec(dir, jobLabel, n)
	s.Env[sandbox.SecretEnv] = secret
	c, cancel := r.callCtx(ctx, 60*time.Second)
	defer cancel()
	r.lockStorage()
	created, err := containers.CreateWithSpec(c, s, nil)
	r.unlockStorage()
	if err != nil {
		return nil, fmt.Errorf("create container: %w", err)
	}
	b.id = created.ID
	for _, w := range created.Warnings {
		r.log.Warn("podman sandbox: create container", "warning", w)
	}
	if err := containers.Start(c, b.id, nil); err != nil {
		return nil, fmt.Errorf("start container: %w", err)
	}

	hctx, hcancel := context.WithTimeout(ctx, handshakeTimeout)
	defer hcancel()
	if b.rc, err = sandbox.AcceptRunner(hctx, ln, r.cfg.MaxFrame, secret); err != nil {
		return nil, fmt.Errorf("container %s: %w%s", shortID(b.id), err, r.exitNote(b.id))
	}
	return b, nil
}

// exitNote describes a container that stopped, for error messages.
func (r *Runtime) exitNote(id string) string {
	c, cancel := r.callCtx(context.Background(), 5*time.Second)
	defer cancel()
	data, err := containers.Inspect(c, id, nil)
	if err != nil || data.State == nil || data.State.Running {
		return ""
	}
	note := fmt.Sprintf(" (container exited with code %d", data.State.ExitCode)
	if data.State.Error != "" {
		note += ": " + data.State.Error
	}
	return note + ")"
}

// spec is the locked-down container specification.
func (r *Runtime) spec(dir, jobLabel string, n uint64) *specgen.SpecGenerator {
	l := r.cfg.Limits
	t, f := true, false
	s := specgen.NewSpecGenerator(r.cfg.Image, false)
	s.Name = fmt.Sprintf("mcpexec-%s-%d-%d", unsafeName.ReplaceAllString(r.cfg.WorkerID, "_"), os.Getpid(), n)
	s.Command = []string{"python3", "-I", "-B", "-u", "/mcpexec/runner.py", "/mcpexec/s"}
	s.Entrypoint = []string{}
	s.OCIRuntime = r.cfg.OCIRuntime
	s.Labels = map[string]string{LabelManaged: "true", LabelWorker: r.cfg.WorkerID, LabelJob: jobLabel}
	s.Env = map[string]string{
		"PATH":                    "/usr/local/bin:/usr/bin:/bin",
		"HOME":                    "/tmp",
		"PYTHONDONTWRITEBYTECODE": "1",
	}
	s.EnvHost = &f
	s.HTTPProxy = &f
	s.UnsetEnvAll = &t
	s.WorkDir = "/workspace"
	s.User = l.User
	s.Terminal = &f
	s.Stdin = &f

	s.NetNS = specgen.Namespace{NSMode: specgen.NoNetwork}
	if r.info.UserNS {
		// What `podman run --userns=auto` sends: a fresh range of the
		// "containers" subordinate ids for this container.
		s.UserNS = specgen.Namespace{NSMode: specgen.Auto}
		s.IDMappings = &storagetypes.IDMappingOptions{AutoUserNs: true}
	}
	s.ReadOnlyFilesystem = &t
	s.ReadWriteTmpfs = &f
	s.CapDrop = []string{"ALL"}
	s.NoNewPrivileges = &t
	s.SeccompPolicy = "default"

	tmpfs := []string{"noexec", "nosuid", "nodev", "mode=1777"}
	if l.TmpfsSize > 0 {
		tmpfs = append([]string{"size=" + strconv.FormatInt(l.TmpfsSize, 10)}, tmpfs...)
	}
	s.Mounts = []spec.Mount{
		{Destination: "/mcpexec", Type: "bind", Source: dir, Options: []string{"ro", "nosuid", "nodev", "noexec"}},
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: tmpfs},
		{Destination: "/workspace", Type: "tmpfs", Source: "tmpfs", Options: tmpfs},
	}

	res := &spec.LinuxResources{}
	if l.Memory > 0 {
		m, sw := l.Memory, l.Memory
		res.Memory = &spec.LinuxMemory{Limit: &m, Swap: &sw}
	}
	if l.Pids > 0 {
		res.Pids = &spec.LinuxPids{Limit: l.Pids}
	}
	if l.CPUs > 0 {
		period := uint64(100_000)
		quota := int64(l.CPUs * float64(period))
		res.CPU = &spec.LinuxCPU{Period: &period, Quota: &quota}
	}
	if res.Memory != nil || res.Pids != nil || res.CPU != nil {
		s.ResourceLimits = res
	}
	if l.NoFile > 0 {
		s.Rlimits = append(s.Rlimits, spec.POSIXRlimit{Type: "nofile", Hard: l.NoFile, Soft: l.NoFile})
	}
	if l.NProc > 0 {
		s.Rlimits = append(s.Rlimits, spec.POSIXRlimit{Type: "nproc", Hard: l.NProc, Soft: l.NProc})
	}
	return s
}

// take returns a warm box, or nil.
func (r *Runtime) take() *box {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.warm) == 0 {
		return nil
	}
	b := r.warm[0]
	r.warm = r.warm[1:]
	r.poke()
	return b
}

// poke wakes the pool filler.
func (r *Runtime) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// fill keeps cfg.Pool warm containers ready until Close. It starts up to
// cfg.Pool containers at once: a batch of jobs drains the pool as fast as the
// worker's slots take containers, and one start at a time would leave the slots
// starting containers themselves.
func (r *Runtime) fill() {
	defer close(r.fillerDone)
	if r.cfg.Pool == 0 {
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	results := make(chan error, r.cfg.Pool) // each start's outcome
	backoff := time.Duration(0)
	for {
		r.mu.Lock()
		need := !r.closed && len(r.warm)+r.starting < r.cfg.Pool
		if need {
			r.starting++
		}
		r.mu.Unlock()
		if need {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := r.fillOne()
				select {
				case results <- err:
				case <-r.stop:
				}
			}()
			continue
		}
		select {
		case <-r.stop:
			return
		case <-r.wake:
		case err := <-results:
			if err == nil {
				backoff = 0
				continue
			}
			select {
			case <-r.stop:
				return
			default:
			}
			backoff = min(max(2*backoff, time.Second), 30*time.Second)
			r.log.Error("podman sandbox: start warm container", "err", err, "retry_in", backoff)
			select {
			case <-r.stop:
				return
			case <-time.After(backoff):
			}
		}
	}
}

// fillOne starts one warm container (r.starting counts it already) and adds it
// to the pool.
func (r *Runtime) fillOne() error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-r.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	b, err := r.start(ctx, "pool")
	r.mu.Lock()
	r.starting--
	keep := err == nil && !r.closed
	if keep {
		r.warm = append(r.warm, b)
	}
	r.mu.Unlock()
	if err == nil && !keep {
		r.discard(b)
	}
	return err
}

// ErrClosed is returned by Run and RunInSession after Close.
var ErrClosed = errors.New("podman sandbox: runtime is closed")

// Run implements sandbox.Runtime.
func (r *Runtime) Run(ctx context.Context, job sandbox.Job, host sandbox.Host) (sandbox.Result, error) {
	b, err := r.acquire(ctx, job.ID)
	if err != nil {
		return sandbox.Result{}, err
	}
	res, err := r.drive(ctx, b, job, host)
	r.discard(b)
	return res, err
}

// acquire returns a warm box, or starts one labelled with label.
func (r *Runtime) acquire(ctx context.Context, label string) (*box, error) {
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if b := r.take(); b != nil {
		return b, nil
	}
	if label == "" {
		label = "job"
	}
	b, err := r.start(ctx, label)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("podman sandbox: %w", context.Cause(ctx))
		}
		return nil, fmt.Errorf("podman sandbox: %w", err)
	}
	return b, nil
}

// drive runs job on b within the job's time limit. The caller decides whether b
// may serve again (b.rc.Reusable) or must be discarded.
func (r *Runtime) drive(ctx context.Context, b *box, job sandbox.Job, host sandbox.Host) (sandbox.Result, error) {
	if job.Timeout <= 0 {
		job.Timeout = 30 * time.Second
	}
	if err := sandbox.BeforeExec(job); err != nil {
		return sandbox.Result{}, err
	}
	runCtx, cancel := context.WithTimeoutCause(ctx, job.Timeout, sandbox.ErrTimeout)
	defer cancel()
	res, err := b.rc.Drive(runCtx, job, host)
	if errors.Is(err, sandbox.ErrRunnerLost) {
		res = r.lost(b, res)
		err = nil
	}
	// The code's process killed by SIGKILL: from inside the container only the
	// kernel's OOM killer does that (the code cannot signal the runner, PID 1).
	if err == nil && res.ExitCode == 137 && !b.rc.Reusable() && r.cfg.Limits.Memory > 0 {
		res.Error = fmt.Sprintf("the sandbox hit its memory limit (%s) and the code's process was killed", formatBytes(r.cfg.Limits.Memory))
	}
	return res, err
}

// RunInSession implements sandbox.SessionRuntime.
func (r *Runtime) RunInSession(ctx context.Context, key string, job sandbox.Job, host sandbox.Host) (sandbox.Result, error) {
	return r.sessions.Run(ctx, key, job, host)
}

// HasSession implements sandbox.SessionRuntime.
func (r *Runtime) HasSession(key string) bool { return r.sessions.Has(key) }

// EndSession implements sandbox.SessionRuntime. A job of the session that is
// running finishes first; its container is removed afterwards.
func (r *Runtime) EndSession(key string) error {
	r.sessions.End(key)
	return nil
}

// Stats implements sandbox.StatsReporter.
func (r *Runtime) Stats() sandbox.Stats {
	return sandbox.Stats{Started: r.started.Load(), StartFailures: r.startFailures.Load(), Warm: r.Warm()}
}

var _ sandbox.StatsReporter = (*Runtime)(nil)

// Warm returns how many started containers wait in the pool.
func (r *Runtime) Warm() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.warm)
}

// lost explains why a container's runner went away mid-job.
func (r *Runtime) lost(b *box, res sandbox.Result) sandbox.Result {
	res.Status = sandbox.StatusError
	res.ExitCode = -1
	res.Error = "sandbox exited unexpectedly"
	c, cancel := r.callCtx(context.Background(), 10*time.Second)
	defer cancel()
	// The socket closes as the process dies; the container's state follows
	// shortly. Poll Inspect rather than Wait: Podman 4.3's Wait returns only once
	// the container is cleaned up ("exited"), and without conmon's exit command
	// (Config.KeepExitCommand) nothing cleans it up before its removal; a
	// "stopped" container already has its exit code.
	var data *define.InspectContainerData
	var err error
	for {
		data, err = containers.Inspect(c, b.id, nil)
		if err != nil || data.State == nil || !data.State.Running {
			break
		}
		select {
		case <-c.Done():
		case <-time.After(50 * time.Millisecond):
			continue
		}
		break
	}
	if err != nil || data.State == nil || data.State.Running {
		r.log.Warn("podman sandbox: inspect lost container", "id", shortID(b.id), "err", err)
		return res
	}
	code := int(data.State.ExitCode)
	r.log.Debug("podman sandbox: runner lost", "id", shortID(b.id), "exit_code", code, "oom_killed", data.State.OOMKilled)
	// Podman 4.3 on cgroups v1 does not set OOMKilled. A SIGKILL (137) cannot come
	// from the code itself: the runner is PID 1 of its PID namespace, which ignores
	// signals it has no handler for when they come from inside. So with a memory
	// limit, 137 is the kernel's OOM killer (or an operator).
	if data.State.OOMKilled || (code == 137 && r.cfg.Limits.Memory > 0) {
		res.ExitCode = 137
		res.Error = fmt.Sprintf("the sandbox hit its memory limit (%s) and was killed", formatBytes(r.cfg.Limits.Memory))
		return res
	}
	res.ExitCode = code
	res.Error = fmt.Sprintf("sandbox exited unexpectedly (exit code %d)", code)
	return res
}

// Close removes every container of this Runtime and stops the Podman service it
// started. It is idempotent.
func (r *Runtime) Close() error {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		r.closed = true
		warm := r.warm
		r.warm = nil
		r.mu.Unlock()
		r.sessions.Close()
		close(r.stop)
		<-r.fillerDone
		for _, b := range warm {
			r.discard(b)
		}
		r.removals.Wait()
		if r.conn != nil {
			// Anything left (a start that failed half-way, a crash of ours).
			if ids, err := r.list(context.Background()); err == nil {
				for _, id := range ids {
					if err := r.remove(context.Background(), id); err != nil {
						r.closeErr = errors.Join(r.closeErr, fmt.Errorf("remove container %s: %w", shortID(id), err))
					}
				}
			}
		}
		if r.service != nil {
			_ = r.service.Process.Signal(syscall.SIGTERM)
			select {
			case <-r.serviceDone:
			case <-time.After(10 * time.Second):
				_ = r.service.Process.Kill()
				<-r.serviceDone
			}
		}
		if r.serviceDir != "" {
			_ = os.RemoveAll(r.serviceDir)
		}
		if r.base != "" {
			_ = os.RemoveAll(r.base)
		}
	})
	return r.closeErr
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func formatBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// lockStorage serialises the calls that change Podman's container storage
// when containers get their own user namespaces: Podman 4.3's service
// deadlocks (its storage and userns locks held, every later call waiting)
// when --userns=auto containers are created and removed in parallel.
func (r *Runtime) lockStorage() {
	if r.info.UserNS {
		r.storageMu.Lock()
	}
}

func (r *Runtime) unlockStorage() {
	if r.info.UserNS {
		r.storageMu.Unlock()
	}
}
