package containerpool

import (
	"context"
	"strings"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// Labels put on every container a Pool's engine creates.
const (
	LabelManaged = "mcpexec.managed"
	LabelWorker  = "mcpexec.worker"
	LabelJob     = "mcpexec.job"
	// LabelOwner names the process that made the container
	// (sandbox.OwnerLabel): a container whose owner is gone is reaped by any
	// Pool on the host, whatever its worker id.
	LabelOwner = "mcpexec.owner"
)

// Engine is a container engine's part of a runtime: the calls in which the
// Podman and Docker runtimes differ. Its methods are called concurrently.
type Engine interface {
	// Create creates and starts the container of s. It returns the
	// container's id once it is created, also when the start then fails, so
	// that the Pool removes it.
	Create(ctx context.Context, s Spec) (id string, err error)
	// Remove kills and removes a container, whatever its state; a container
	// that is gone already is no error. It runs to its own time limit even
	// when ctx ends.
	Remove(ctx context.Context, id string) error
	// List returns the managed containers (LabelManaged=true), in any state,
	// that carry the labels given as "key=value" too.
	List(ctx context.Context, labels ...string) ([]Container, error)
	// ExitNote describes a container that stopped, for error messages: ""
	// when it runs or cannot be inspected, else " (container exited with
	// code N…)".
	ExitNote(id string) string
	// Lost explains in res why b's runner went away mid-job (the container
	// exited, was killed for memory, …).
	Lost(b *Box, res sandbox.Result) sandbox.Result
}

// Spec is what an Engine needs to create a container beyond its own
// configuration.
type Spec struct {
	Dir    string         // the host directory bind-mounted read-only at /mcpexec
	Job    string         // the LabelJob label
	Seq    uint64         // the container's number in this process (its name)
	Limits sandbox.Limits // the container's
	Secret string         // the runner's (sandbox.SecretEnv)
	// SpareJavaScript starts the runner with --spare-javascript
	// (sandbox.JSExpectation).
	SpareJavaScript bool
	// Preload are the modules the runner's zygote imports before its first
	// job (the runner's --preload; Config.Preload).
	Preload []string
	// PreloadLazy, with Preload, has the runner import them at its first
	// job that names one of them instead (--preload-lazy;
	// sandbox.DataExpectation).
	PreloadLazy bool
}

// Container is a container as Engine.List returns it.
type Container struct {
	ID     string
	Labels map[string]string
}

// Command is the container's command for s: the runner as PID 1.
func (s Spec) Command() []string {
	cmd := []string{"python3", "-I", "-B", "-u", "/mcpexec/runner.py", "/mcpexec/s", "--reset"}
	if s.SpareJavaScript {
		cmd = append(cmd, "--spare-javascript")
	}
	if len(s.Preload) > 0 {
		cmd = append(cmd, "--preload="+strings.Join(s.Preload, ","))
		if s.PreloadLazy {
			cmd = append(cmd, "--preload-lazy")
		}
	}
	return cmd
}
