package docker

// This file is the locked-down container specification: the Podman runtime's
// (internal/sandbox/podman/spec.go) in the Engine API's terms.
import (
	"fmt"
	"os"
	"regexp"
	"strconv"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/network"

	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
)

var unsafeName = regexp.MustCompile(`[^a-zA-Z0-9_.-]+`)

// logMax bounds what the engine keeps of a container's own output (the
// runner's; the code's goes over the socket): one file of this size.
const logMax = "1m"

// spec is what ContainerCreate takes.
type spec struct {
	name   string
	config *container.Config
	host   *container.HostConfig
	net    *network.NetworkingConfig
}

// spec returns the locked-down container specification of sp.
func (r *Runtime) spec(sp containerpool.Spec) spec {
	dir, l := sp.Dir, sp.Limits
	cfg := &container.Config{
		Image:      r.cfg.Image,
		Cmd:        sp.Command(),
		Entrypoint: []string{},
		User:       l.User,
		WorkingDir: "/workspace",
		// Only these: nothing of the host's environment reaches the container.
		Env: []string{
			"PATH=/usr/local/bin:/usr/bin:/bin",
			"HOME=/tmp",
			"PYTHONDONTWRITEBYTECODE=1",
			sandbox.SecretEnv + "=" + sp.Secret,
		},
		Labels: map[string]string{
			containerpool.LabelManaged: "true",
			containerpool.LabelWorker:  r.cfg.WorkerID,
			containerpool.LabelJob:     sp.Job,
			containerpool.LabelOwner:   sandbox.OwnerLabel,
		},
		NetworkDisabled: true,
		Tty:             false,
		OpenStdin:       false,
		AttachStdin:     false,
	}

	tmpfs := "rw,noexec,nosuid,nodev,mode=1777"
	if l.TmpfsSize > 0 {
		tmpfs = "size=" + strconv.FormatInt(l.TmpfsSize, 10) + "," + tmpfs
	}
	f := false
	hc := &container.HostConfig{
		NetworkMode:    "none",
		ReadonlyRootfs: true,
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges"},
		Tmpfs:          map[string]string{"/tmp": tmpfs, "/workspace": tmpfs},
		Mounts: []mount.Mount{{
			// Docker's bind options have no noexec, nosuid or nodev (and
			// runc's read-only remount drops them from the source): the
			// directory holds only the runner's files (0444, root's) and its
			// socket, on a read-only mount, so there is nothing there they
			// would stop (TestRunnerDirInert).
			Type: mount.TypeBind, Source: dir, Target: "/mcpexec", ReadOnly: true,
			BindOptions: &mount.BindOptions{Propagation: mount.PropagationRPrivate},
		}},
		// The runner is PID 1 (its signal handling relies on it).
		Init:       &f,
		IpcMode:    "private",
		PidMode:    "",
		Privileged: false,
		LogConfig:  container.LogConfig{Type: "json-file", Config: map[string]string{"max-size": logMax, "max-file": "1"}},
		// Removed by the Runtime, after it read the exit code of a lost one.
		AutoRemove:    false,
		Runtime:       r.cfg.OCIRuntime,
		RestartPolicy: container.RestartPolicy{Name: container.RestartPolicyDisabled},
	}
	if l.TmpfsSize > 0 {
		hc.ShmSize = l.TmpfsSize // /dev/shm: noexec,nosuid,nodev by Docker
	}
	if l.Memory > 0 {
		hc.Memory, hc.MemorySwap = l.Memory, l.Memory // no swap beyond memory
	}
	if l.Pids > 0 {
		p := l.Pids
		hc.PidsLimit = &p
	}
	if l.CPUs > 0 {
		hc.NanoCPUs = int64(l.CPUs * 1e9)
	}
	if l.NoFile > 0 {
		hc.Ulimits = append(hc.Ulimits, &container.Ulimit{Name: "nofile", Soft: int64(l.NoFile), Hard: int64(l.NoFile)})
	}
	if l.NProc > 0 {
		hc.Ulimits = append(hc.Ulimits, &container.Ulimit{Name: "nproc", Soft: int64(l.NProc), Hard: int64(l.NProc)})
	}
	return spec{
		name:   fmt.Sprintf("mcpexec-%s-%d-%d", unsafeName.ReplaceAllString(r.cfg.WorkerID, "_"), os.Getpid(), sp.Seq),
		config: cfg,
		host:   hc,
		net:    &network.NetworkingConfig{},
	}
}
