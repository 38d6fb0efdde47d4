package podman

// This file is the locked-down container specification.
import (
	"fmt"
	"os"
	"regexp"
	"strconv"

	"github.com/containers/podman/v5/pkg/specgen"

	storagetypes "github.com/containers/storage/types"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
	spec "github.com/opencontainers/runtime-spec/specs-go"
)

var unsafeName = regexp.MustCompile(`[^a-zA-Z0-9_.-]+`)

// spec is the locked-down container specification (without the runner's
// secret).
func (r *Runtime) spec(sp containerpool.Spec) *specgen.SpecGenerator {
	dir, l := sp.Dir, sp.Limits
	t, f := true, false
	s := specgen.NewSpecGenerator(r.cfg.Image, false)
	if r.cfg.Rootfs != "" {
		s = specgen.NewSpecGenerator(r.cfg.Rootfs, true)
	}
	s.Name = fmt.Sprintf("mcpexec-%s-%d-%d", unsafeName.ReplaceAllString(r.cfg.WorkerID, "_"), os.Getpid(), sp.Seq)
	s.Command = sp.Command()
	s.Entrypoint = []string{}
	s.OCIRuntime = r.cfg.OCIRuntime
	s.Labels = map[string]string{containerpool.LabelManaged: "true", containerpool.LabelWorker: r.cfg.WorkerID, containerpool.LabelJob: sp.Job, containerpool.LabelOwner: sandbox.OwnerLabel}
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
	if r.userNS {
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
