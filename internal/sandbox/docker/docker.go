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
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/docker/docker/client"

	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
)

// DefaultImage is the image New uses when Config.Image is empty: the one
// deploy/sandbox builds, loaded into Docker (deploy/docker/start-dockerd.sh).
const DefaultImage = containerpool.DefaultImage

// Timeouts of the container life cycle.
const (
	removeTimeout  = 30 * time.Second
	connectTimeout = 15 * time.Second
)

// name starts the runtime's log messages and errors.
const name = "docker sandbox"

// Config configures a Runtime: the container runtime's settings and
// Docker's own.
type Config struct {
	containerpool.Config
	// Host is the Docker Engine API address, e.g. unix:///var/run/docker.sock.
	// Empty: $DOCKER_HOST, else unix:///var/run/docker.sock.
	Host string
	// OCIRuntime is the engine's runtime for the containers (HostConfig.Runtime);
	// empty: the engine's default (runc).
	OCIRuntime string
}

// Info describes the Docker engine of a Runtime.
type Info = containerpool.Info

// Runtime runs jobs in Docker containers: a containerpool.Runtime whose
// engine is Docker. It is safe for concurrent use.
type Runtime struct {
	*containerpool.Runtime
	cfg Config
	log *slog.Logger
	cli *client.Client
}

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
	cfg.Host = HostOf(cfg.Host)
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
func (r *Runtime) connect(ctx context.Context, info *Info) error {
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
	di, err := c.Info(cctx)
	if err != nil {
		return fmt.Errorf("docker sandbox: docker info: %w", err)
	}
	info.Engine = containerpool.Docker
	info.Address = r.cfg.Host
	info.APIVersion = c.ClientVersion()
	info.ServerVersion = di.ServerVersion
	if di.CgroupVersion != "" {
		info.CgroupsVersion = "v" + di.CgroupVersion // as Podman says it
	}
	info.CgroupDriver = di.CgroupDriver
	info.OCIRuntime = di.DefaultRuntime
	if r.cfg.OCIRuntime != "" {
		if _, ok := di.Runtimes[r.cfg.OCIRuntime]; !ok {
			return fmt.Errorf("docker sandbox: the engine at %s has no runtime %q (it has %v)", r.cfg.Host, r.cfg.OCIRuntime, slices.Sorted(maps.Keys(di.Runtimes)))
		}
		info.OCIRuntime = r.cfg.OCIRuntime
	}
	info.Image = r.cfg.Image
	info.UserNSNote = "Docker gives containers no user namespace of their own (its --userns-remap is engine-wide)"
	for _, o := range di.SecurityOptions {
		switch {
		case strings.Contains(o, "name=rootless"):
			info.Rootless = true
		case strings.Contains(o, "name=seccomp"):
			info.Seccomp = !strings.Contains(o, "profile=unconfined")
		}
	}
	l := r.cfg.Limits
	for _, m := range []struct {
		want, have bool
		name       string
	}{
		{l.Memory > 0, di.MemoryLimit, "memory"},
		{l.Memory > 0, di.SwapLimit, "swap"},
		{l.Pids > 0, di.PidsLimit, "pids"},
		{l.CPUs > 0, di.CPUCfsQuota, "cpu"},
	} {
		if m.want && !m.have {
			info.Missing = append(info.Missing, m.name)
		}
	}
	info.LimitsEnforced = len(info.Missing) == 0
	if !info.LimitsEnforced {
		r.log.Warn("docker sandbox: the engine does not enforce some limits; a job can exhaust the host's resources",
			"host", info.Address, "missing", info.Missing, "cgroups", di.CgroupVersion)
	}
	return nil
}

// checkImage checks that the image is there and learns which languages its
// sandboxes run.
func (r *Runtime) checkImage(ctx context.Context) ([]string, error) {
	langs := []string{sandbox.Python}
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	img, err := r.cli.ImageInspect(c, r.cfg.Image)
	if client.IsErrNotFound(err) {
		return nil, fmt.Errorf("docker sandbox: image %s %w: build it with `sudo deploy/sandbox/build.sh %s` and load it into Docker with `sudo deploy/docker/start-dockerd.sh %s` (podman save %s | docker load)",
			r.cfg.Image, sandbox.ErrNoImage, r.cfg.Image, r.cfg.Image, r.cfg.Image)
	}
	if err != nil {
		return nil, fmt.Errorf("docker sandbox: inspect image %s: %w", r.cfg.Image, err)
	}
	if img.Config != nil {
		langs = sandbox.AddLabelledLanguages(langs, img.Config.Labels[sandbox.LanguagesLabel])
	}
	return langs, nil
}

// Config returns the runtime's configuration, defaults filled in.
func (r *Runtime) Config() Config { return r.cfg }
