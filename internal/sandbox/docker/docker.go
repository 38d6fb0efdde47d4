// Package docker is a sandbox.Runtime that runs each job in a fresh, locked-down
// Docker container, talking to the Docker Engine API through Docker's official
// Go client (API version negotiated: Docker 20.10, API 1.41, and later).
//
// It is the Podman runtime's twin: the same runner (sandbox.WriteRunner) is a
// container's only process and connects back over a Unix socket in a host
// directory bind-mounted read-only at /mcpexec; the same lockdown (no network,
// read-only root, size-capped noexec tmpfs /tmp, /workspace and /dev/shm, no
// capabilities, no_new_privs, the default seccomp profile, an unprivileged
// user, memory, swap, pids, CPU and rlimit caps, a fixed environment); the
// same warm pool, reuse of a container for its namespace's next job, and
// sessions; the same labels (mcpexec.managed, mcpexec.worker, mcpexec.job,
// mcpexec.owner) by which a restarted worker removes what its previous life
// left behind.
//
// What Docker does not offer per container: a user namespace of its own (the
// engine's --userns-remap is engine-wide). Sandboxed code still runs as an
// unprivileged user with no capabilities.
package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/client"

	sandboximage "github.com/mcpexec/mcpexec/deploy/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
)

// DefaultImage is the image New uses when Config.Image is empty: the one
// deploy/sandbox builds, loaded into Docker (deploy/docker/start-dockerd.sh).
const DefaultImage = sandboximage.DefaultImage

// ErrClosed is returned by Run and RunInSession after Close.
var ErrClosed = errors.New("docker sandbox: runtime is closed")

// Labels put on every container this package creates (containerpool's, as
// the Podman runtime's).
const (
	LabelManaged = containerpool.LabelManaged
	LabelWorker  = containerpool.LabelWorker
	LabelJob     = containerpool.LabelJob
	// LabelOwner names the process that made the container
	// (sandbox.OwnerLabel): a container whose owner is gone is reaped by any
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
	connectTimeout = 15 * time.Second
)

// Config configures a Runtime.
type Config struct {
	// Host is the Docker Engine API address, e.g. unix:///var/run/docker.sock.
	// Empty: $DOCKER_HOST, else unix:///var/run/docker.sock.
	Host string
	// Image of the sandbox; default DefaultImage.
	Image string
	// OCIRuntime is the engine's runtime for the containers (HostConfig.Runtime);
	// empty: the engine's default (runc).
	OCIRuntime string
	// Limits of each container. The zero value means sandbox.DefaultLimits().
	Limits sandbox.Limits
	// WorkerID labels this worker's containers; New removes the containers a
	// previous life with the same ID left behind. Default: the host name.
	WorkerID string
	// RunDir is the worker-private host directory under which each container
	// gets a directory with the runner and its socket (default
	// sandbox.DefaultRunDir()). It is made 0700. Keep it short: Unix socket
	// paths must stay under 100 bytes. The engine must see the same file
	// system (a local engine).
	RunDir string
	// Pool is how many started containers, runner connected and waiting, are
	// kept ready for jobs. 0 starts a container per job.
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
	// IdleTTL retires an idle container (default 2 minutes).
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
}

// Info describes the Docker engine of a Runtime.
type Info struct {
	Host           string // API address
	ServerVersion  string // Docker version of the engine
	APIVersion     string // API version negotiated with it
	Rootless       bool
	CgroupsVersion string // "1" or "2"
	CgroupDriver   string
	OCIRuntime     string // the engine's default runtime
	Image          string
	// LimitsEnforced is false when the engine cannot apply memory, swap,
	// pids or CPU limits (it says so in its info); Missing lists which.
	LimitsEnforced bool
	Missing        []string
	// Seccomp is true when the engine applies a seccomp profile.
	Seccomp bool
	// RunDir is the worker-private directory of the runners' sockets.
	RunDir string
}

// Runtime runs jobs in Docker containers. It is safe for concurrent use.
type Runtime struct {
	cfg   Config
	log   *slog.Logger
	cli   *client.Client
	info  Info
	langs []string
	pool  *containerpool.Pool // its containers; nil only while New fails early

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

// DefaultHost is the engine address used when neither Config.Host nor
// $DOCKER_HOST gives one.
const DefaultHost = client.DefaultDockerHost

// HostOf returns the engine address a Config with Host uri uses.
func HostOf(uri string) string {
	switch {
	case uri != "":
		return uri
	case os.Getenv(client.EnvOverrideHost) != "":
		return os.Getenv(client.EnvOverrideHost)
	}
	return DefaultHost
}

// New connects to the Docker engine, checks the image, removes this worker's
// orphans and starts the warm pool.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	if cfg.Image == "" {
		cfg.Image = DefaultImage
	}
	cfg.Host = HostOf(cfg.Host)
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
		Name: "docker sandbox", ErrClosed: ErrClosed, Logger: cfg.Logger, MaxFrame: cfg.MaxFrame, Preload: cfg.Preload,
		Limits: cfg.Limits, WorkerID: cfg.WorkerID, RunDir: cfg.RunDir, Pool: cfg.Pool, Reuse: cfg.Reuse,
		MaxUses: cfg.MaxUses, MaxIdle: cfg.MaxIdle, MaxIdlePerTenant: cfg.MaxIdlePerTenant, IdleTTL: cfg.IdleTTL,
	}
	err := pc.SetDefaults()
	cfg.Limits, cfg.WorkerID, cfg.RunDir, cfg.Pool, cfg.Reuse = pc.Limits, pc.WorkerID, pc.RunDir, pc.Pool, pc.Reuse
	cfg.MaxUses, cfg.MaxIdle, cfg.MaxIdlePerTenant, cfg.IdleTTL = pc.MaxUses, pc.MaxIdle, pc.MaxIdlePerTenant, pc.IdleTTL
	return pc, err
}

// Ping reports whether the engine at host (HostOf) answers, and its version.
func Ping(ctx context.Context, host string) (string, error) {
	c, err := client.NewClientWithOpts(client.WithHost(HostOf(host)), client.WithAPIVersionNegotiation())
	if err != nil {
		return "", err
	}
	defer func() { _ = c.Close() }() // a probe connection: nothing to do on a failed close
	v, err := c.ServerVersion(ctx)
	if err != nil {
		return "", err
	}
	return v.Version, nil
}

// LoadImage loads an image archive (`docker save` or `podman save --format
// docker-archive` output) into the engine at host: how the sandbox image
// reaches Docker without a registry.
func LoadImage(ctx context.Context, host string, archive io.Reader) error {
	c, err := client.NewClientWithOpts(client.WithHost(HostOf(host)), client.WithAPIVersionNegotiation())
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }() // a probe connection: nothing to do on a failed close
	resp, err := c.ImageLoad(ctx, archive, client.ImageLoadWithQuiet(true))
	if err != nil {
		return fmt.Errorf("docker load: %w", err)
	}
	defer func() { _ = resp.Body.Close() }() // read to the end or abandoned: nothing to do on a failed close
	// The engine reports errors in the stream: read it all.
	out, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("docker load: %w", err)
	}
	if strings.Contains(string(out), `"error"`) {
		return fmt.Errorf("docker load: %s", strings.TrimSpace(string(out)))
	}
	return nil
}

// connect opens the client, negotiates the API version and reads the
// engine's description.
func (r *Runtime) connect(ctx context.Context) error {
	c, err := client.NewClientWithOpts(client.WithHost(r.cfg.Host), client.WithAPIVersionNegotiation())
	if err != nil {
		return fmt.Errorf("docker sandbox: engine address %s: %w", r.cfg.Host, err)
	}
	r.cli = c
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if _, err := c.Ping(cctx); err != nil {
		return fmt.Errorf("docker sandbox: cannot reach the Docker engine at %s (start it: sudo deploy/docker/start-dockerd.sh, then --docker unix:///run/mcpexec-docker.sock; or pass --docker URI): %w", r.cfg.Host, err)
	}
	info, err := c.Info(cctx)
	if err != nil {
		return fmt.Errorf("docker sandbox: docker info: %w", err)
	}
	r.info.Host = r.cfg.Host
	r.info.APIVersion = c.ClientVersion()
	r.info.ServerVersion = info.ServerVersion
	r.info.CgroupsVersion = info.CgroupVersion
	r.info.CgroupDriver = info.CgroupDriver
	r.info.OCIRuntime = info.DefaultRuntime
	if r.cfg.OCIRuntime != "" {
		if _, ok := info.Runtimes[r.cfg.OCIRuntime]; !ok {
			return fmt.Errorf("docker sandbox: the engine at %s has no runtime %q (it has %v)", r.cfg.Host, r.cfg.OCIRuntime, slices.Sorted(maps.Keys(info.Runtimes)))
		}
		r.info.OCIRuntime = r.cfg.OCIRuntime
	}
	r.info.Image = r.cfg.Image
	for _, o := range info.SecurityOptions {
		switch {
		case strings.Contains(o, "name=rootless"):
			r.info.Rootless = true
		case strings.Contains(o, "name=seccomp"):
			r.info.Seccomp = !strings.Contains(o, "profile=unconfined")
		}
	}
	l := r.cfg.Limits
	for _, m := range []struct {
		want, have bool
		name       string
	}{
		{l.Memory > 0, info.MemoryLimit, "memory"},
		{l.Memory > 0, info.SwapLimit, "swap"},
		{l.Pids > 0, info.PidsLimit, "pids"},
		{l.CPUs > 0, info.CPUCfsQuota, "cpu"},
	} {
		if m.want && !m.have {
			r.info.Missing = append(r.info.Missing, m.name)
		}
	}
	r.info.LimitsEnforced = len(r.info.Missing) == 0
	if !r.info.LimitsEnforced {
		r.log.Warn("docker sandbox: the engine does not enforce some limits; a job can exhaust the host's resources",
			"host", r.info.Host, "missing", r.info.Missing, "cgroups", info.CgroupVersion)
	}
	return nil
}

// checkImage checks that the image is there and learns which languages its
// sandboxes run.
func (r *Runtime) checkImage(ctx context.Context) error {
	r.langs = []string{sandbox.Python}
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	img, err := r.cli.ImageInspect(c, r.cfg.Image)
	if client.IsErrNotFound(err) {
		return fmt.Errorf("docker sandbox: image %s %w: build it with `sudo deploy/sandbox/build.sh %s` and load it into Docker with `sudo deploy/docker/start-dockerd.sh %s` (podman save %s | docker load)",
			r.cfg.Image, sandbox.ErrNoImage, r.cfg.Image, r.cfg.Image, r.cfg.Image)
	}
	if err != nil {
		return fmt.Errorf("docker sandbox: inspect image %s: %w", r.cfg.Image, err)
	}
	if img.Config != nil {
		r.langs = sandbox.AddLabelledLanguages(r.langs, img.Config.Labels[sandbox.LanguagesLabel])
	}
	return nil
}

// Info describes the Docker engine.
func (r *Runtime) Info() Info { return r.info }

// Config returns the runtime's configuration, defaults filled in.
func (r *Runtime) Config() Config { return r.cfg }

// Languages implements sandbox.LanguageReporter: Python, and JavaScript when
// the image has Node.js.
func (r *Runtime) Languages() []string { return r.langs }

// ReportsStart implements sandbox.StartReporter.
func (r *Runtime) ReportsStart() {}

// Probe implements sandbox.Prober: it starts a container and removes it.
func (r *Runtime) Probe(ctx context.Context) error { return r.pool.Probe(ctx) }

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

// Close removes every container of this Runtime. It is idempotent.
func (r *Runtime) Close() error {
	r.closeOnce.Do(func() {
		if r.pool == nil { // New failed before it connected
			return
		}
		r.pool.Close()
		if r.cli != nil {
			// Anything left (a start that failed half-way, a crash of ours).
			r.closeErr = errors.Join(r.pool.RemoveLeftovers(), r.cli.Close())
		}
		_ = os.RemoveAll(r.pool.Dir()) // best effort: what is left is removed at the next start
	})
	return r.closeErr
}
