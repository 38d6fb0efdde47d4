package doctor

// This file holds each container engine's words in the sandbox checks.
import (
	"fmt"
	"strings"

	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
)

// engine is what the sandbox checks say of one container engine.
type engine struct {
	title    string // "Podman"
	apiFix   string // the fix of an engine that cannot be reached
	fixes    fixes
	rootful  Check                                              // the mode check of a rootful engine that enforces limits
	unlimits func(info containerpool.Info) string               // the mode check's detail where limits are not enforced
	noUserNS func(info containerpool.Info) Check                // the user namespace check where sandboxes share the host's
	noImage  func(image, address string) Check                  // the image check of a missing image
	startFix func(info containerpool.Info, image string) string // the fix of a sandbox that does not start
}

const fixLimits = "run the worker where Podman enforces limits: rootful Podman (run the worker as root, --podman unix:///run/podman/podman.sock) or rootless Podman on a cgroups v2 host with the memory, pids and cpu controllers delegated to the user"

const fixDockerLimits = "run the worker against a Docker engine that enforces limits: a rootful engine (sudo deploy/docker/start-dockerd.sh) on a host whose cgroups have the memory (with swap accounting), pids and cpu controllers"

// engines are the container engines' words, by containerpool engine name.
var engines = map[string]engine{
	containerpool.Podman: {
		title:  "Podman",
		apiFix: "install Podman (apt-get install podman runc uidmap) and start its API: `podman system service --time=0` (rootless: as the worker's user; rootful: as root, socket /run/podman/podman.sock), or pass --podman URI",
		fixes: fixes{engine: "Podman", limits: fixLimits,
			seccomp: "install Podman's default seccomp profile (containers-common, /usr/share/containers/seccomp.json)",
			env:     "check containers.conf [containers] env and env_host"},
		rootful: Check{Status: Warn,
			Detail: "rootful Podman: limits are enforced, but the worker and Podman run as root (sandboxed code still runs as an unprivileged user with no capabilities)",
			Fix:    "for defence in depth run the worker as a dedicated user with rootless Podman on a cgroups v2 host (rootless on cgroups v1 cannot enforce limits)"},
		unlimits: func(info containerpool.Info) string {
			return fmt.Sprintf("%s Podman on cgroups %s: memory, pids and CPU limits are NOT enforced", rootMode(info.Rootless), info.CgroupsVersion)
		},
		noUserNS: func(info containerpool.Info) Check {
			return Check{Status: Warn, Detail: "sandboxes share the host's user namespace: " + info.UserNSNote,
				Fix: "sandboxed code still runs as an unprivileged user with no capabilities; a user namespace per sandbox adds a second wall"}
		},
		noImage: func(image, _ string) Check { return missingImage(image) },
		startFix: func(info containerpool.Info, image string) string {
			return "run `podman run --rm --runtime " + info.OCIRuntime + " " + image + " python3 -c 'print(1)'` to see Podman's own error; on cgroups v1 hosts use --oci-runtime runc"
		},
	},
	containerpool.Docker: {
		title:  "Docker",
		apiFix: "install Docker (apt-get install docker.io) and start an engine: sudo deploy/docker/start-dockerd.sh (socket /run/mcpexec-docker.sock), then pass --docker unix:///run/mcpexec-docker.sock; or point --docker (DOCKER_HOST) at a running engine",
		fixes: fixes{engine: "Docker", limits: fixDockerLimits,
			seccomp: "run the engine with its default seccomp profile (no --seccomp-profile unconfined; Docker built with seccomp)",
			env:     "check the image's ENV (docker image inspect)"},
		rootful: Check{Status: Warn,
			Detail: "rootful Docker: limits are enforced, but the engine runs as root (sandboxed code still runs as an unprivileged user with no capabilities)",
			Fix:    "for defence in depth use Podman (rootless on a cgroups v2 host), which also gives each sandbox its own user namespace"},
		unlimits: func(info containerpool.Info) string {
			return fmt.Sprintf("the engine does not enforce these limits: %s", strings.Join(info.Missing, ", "))
		},
		noUserNS: func(containerpool.Info) Check {
			return Check{Status: Warn, Detail: "Docker gives sandboxes no user namespace of their own (only the engine-wide --userns-remap)",
				Fix: "sandboxed code still runs as an unprivileged user with no capabilities; --runtime podman gives each sandbox its own user namespace, a second wall"}
		},
		noImage: func(image, _ string) Check {
			return Check{Name: "sandbox image", Status: Fail, Detail: image + " is missing in Docker",
				Fix: fmt.Sprintf("build it and load it: sudo deploy/sandbox/build.sh %s && sudo deploy/docker/start-dockerd.sh %s (podman save %s | docker load; the worker does it itself with --build-image)", image, image, image)}
		},
		startFix: func(info containerpool.Info, image string) string {
			return "run `docker -H " + info.Address + " run --rm --network none " + image + " python3 -c 'print(1)'` to see Docker's own error"
		},
	},
}
