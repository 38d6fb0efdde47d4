package sandboxflags

// This file lists the container engines and chooses one (--runtime auto or
// an engine's name).
import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
	"github.com/mcpexec/mcpexec/internal/sandbox/docker"
	"github.com/mcpexec/mcpexec/internal/sandbox/podman"
)

// Values of --runtime: auto, or an engine's name.
const (
	RuntimeAuto   = "auto"
	RuntimePodman = containerpool.Podman
	RuntimeDocker = containerpool.Docker
)

// Engine is a container engine --runtime chooses: how the flags open its
// runtime.
type Engine struct {
	// Name is the --runtime value (containerpool.Podman, containerpool.Docker).
	Name string
	// open opens the engine's runtime of cfg with the flags' options of the
	// engine, on the engine at host (Choice.DockerHost).
	open func(ctx context.Context, f *Flags, host string, cfg containerpool.Config) (Runtime, error)
	// load puts a freshly built image into the engine at host; nil: the
	// build puts it there.
	load func(ctx context.Context, image, host string) error
	// check refuses the flags the engine does not take.
	check func(f *Flags) error
}

// Runtime is an engine's runtime (a containerpool.Runtime).
type Runtime interface {
	sandbox.SessionRuntime
	Info() containerpool.Info
	Close() error
}

// Engines are the container engines --runtime names, in auto's order of
// preference.
var Engines = []Engine{
	{
		Name: RuntimePodman,
		open: func(ctx context.Context, f *Flags, _ string, cfg containerpool.Config) (Runtime, error) {
			return podman.New(ctx, podman.Config{Config: cfg, URI: f.Podman, Rootfs: f.Rootfs, OCIRuntime: f.OCIRuntime, UserNS: f.UserNS})
		},
		check: func(*Flags) error { return nil },
	},
	{
		Name: RuntimeDocker,
		open: func(ctx context.Context, f *Flags, host string, cfg containerpool.Config) (Runtime, error) {
			return docker.New(ctx, docker.Config{Config: cfg, Host: host, OCIRuntime: f.OCIRuntime})
		},
		load: LoadIntoDocker,
		check: func(f *Flags) error {
			if f.Rootfs != "" {
				return cli.Usagef("--rootfs is Podman's: the Docker runtime runs --image (load it with deploy/docker/start-dockerd.sh)")
			}
			if f.UserNS == "on" {
				return cli.Usagef("--userns on is Podman's: Docker gives containers no user namespace of their own (its --userns-remap is engine-wide)")
			}
			return nil
		},
	},
}

// engineNamed returns the engine named name, or false.
func engineNamed(name string) (Engine, bool) {
	for _, e := range Engines {
		if e.Name == name {
			return e, true
		}
	}
	return Engine{}, false
}

// MCPEXECDockerHost is the socket of the Docker engine that
// deploy/docker/start-dockerd.sh starts (auto tries it too).
const MCPEXECDockerHost = "unix:///run/mcpexec-docker.sock"

// pingTimeout bounds auto's wait for each Docker engine it tries.
const pingTimeout = 3 * time.Second

// checkRuntime validates --runtime and the flags that only one engine takes.
func (f *Flags) checkRuntime() error {
	if f.Runtime == RuntimeAuto {
		return nil
	}
	e, ok := engineNamed(f.Runtime)
	if !ok {
		names := []string{RuntimeAuto}
		for _, e := range Engines {
			names = append(names, e.Name)
		}
		return cli.Usagef("--runtime %q: want %s or %s", f.Runtime, strings.Join(names[:len(names)-1], ", "), names[len(names)-1])
	}
	return e.check(f)
}

// Choice is the runtime the flags pick on this host.
type Choice struct {
	Runtime    string // RuntimePodman or RuntimeDocker
	DockerHost string // the engine's address, for RuntimeDocker
	Reason     string // why, for logs and doctor
}

// Choose picks the runtime: the one --runtime names, or with auto Podman when
// the host has it (its CLI, or its API socket, or --podman), else a Docker
// engine that answers (--docker, $DOCKER_HOST, the default socket, then
// mcpexec's own engine), else Podman (whose error then says how to install
// it).
func (f *Flags) Choose(ctx context.Context) Choice {
	switch f.Runtime {
	case RuntimePodman:
		return Choice{Runtime: RuntimePodman, Reason: "--runtime podman"}
	case RuntimeDocker:
		return Choice{Runtime: RuntimeDocker, DockerHost: docker.HostOf(f.Docker), Reason: "--runtime docker"}
	}
	if why := podmanAvailable(f.Podman); why != "" {
		return Choice{Runtime: RuntimePodman, Reason: "auto: " + why}
	}
	var tried []string
	for _, h := range dockerCandidates(f.Docker) {
		pctx, cancel := context.WithTimeout(ctx, pingTimeout)
		v, err := docker.Ping(pctx, h)
		cancel()
		if err == nil {
			return Choice{Runtime: RuntimeDocker, DockerHost: h, Reason: fmt.Sprintf("auto: no Podman on this host; Docker %s answers at %s", v, h)}
		}
		tried = append(tried, h)
	}
	return Choice{Runtime: RuntimePodman, Reason: fmt.Sprintf("auto: neither Podman nor a Docker engine found (tried %s)", strings.Join(tried, ", "))}
}

// podmanAvailable says why Podman is usable here, or "" when it is not.
func podmanAvailable(uri string) string {
	if uri != "" {
		return "--podman " + uri
	}
	if p, err := exec.LookPath("podman"); err == nil {
		return "podman is installed (" + p + ")"
	}
	socks := []string{"/run/podman/podman.sock"}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		socks = append(socks, filepath.Join(d, "podman", "podman.sock"))
	}
	for _, s := range socks {
		if _, err := os.Stat(s); err == nil {
			return "Podman's API socket " + s + " exists"
		}
	}
	return ""
}

// dockerCandidates are the engine addresses auto tries, in order.
func dockerCandidates(flag string) []string {
	if flag != "" {
		return []string{flag}
	}
	var out []string
	for _, h := range []string{os.Getenv("DOCKER_HOST"), docker.DefaultHost, MCPEXECDockerHost} {
		if h != "" && !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	return out
}
