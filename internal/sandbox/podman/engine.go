package podman

// This file is the Runtime's containerpool.Engine: its Podman calls.
import (
	"context"
	"fmt"
	"time"

	"github.com/containers/podman/v5/libpod/define"
	"github.com/containers/podman/v5/pkg/bindings/containers"

	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
)

// engine is the Runtime as its pool's containerpool.Engine.
type engine Runtime

var _ containerpool.Engine = (*engine)(nil)

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

// Remove implements containerpool.Engine.
func (e *engine) Remove(ctx context.Context, id string) error { return (*Runtime)(e).remove(ctx, id) }

// Create implements containerpool.Engine.
func (e *engine) Create(ctx context.Context, sp containerpool.Spec) (string, error) {
	r := (*Runtime)(e)
	s := r.spec(sp)
	s.Env[sandbox.SecretEnv] = sp.Secret
	c, cancel := r.callCtx(ctx, 60*time.Second)
	defer cancel()
	r.lockStorage()
	created, err := containers.CreateWithSpec(c, s, nil)
	if r.startLocked {
		defer r.unlockStorage() // through the start below
	} else {
		r.unlockStorage()
	}
	if err != nil {
		return "", fmt.Errorf("create container: %w", err)
	}
	for _, w := range created.Warnings {
		r.log.Warn("podman sandbox: create container", "warning", w)
	}
	if err := containers.Start(c, created.ID, nil); err != nil {
		return created.ID, fmt.Errorf("start container: %w", err)
	}
	return created.ID, nil
}

// Connect implements containerpool.Connector: it finds (or starts) the
// Podman service, chooses the user namespace mode and checks the image.
func (e *engine) Connect(ctx context.Context, info *Info) ([]string, error) {
	r := (*Runtime)(e)
	if err := r.connect(ctx, info); err != nil {
		return nil, err
	}
	info.UserNS, info.UserNSNote = userNSMode(r.cfg.UserNS, info.Rootless, info.ServerVersion)
	if r.cfg.UserNS == UserNSOn && !info.UserNS {
		return nil, fmt.Errorf("podman sandbox: --userns on: %s", info.UserNSNote)
	}
	if !info.UserNS {
		r.log.Warn("podman sandbox: containers share the host's user namespace", "why", info.UserNSNote)
	}
	r.userNS = info.UserNS
	r.startLocked = info.UserNS && majorVersion(info.ServerVersion) < 5
	return r.checkImage(ctx)
}

// Release implements containerpool.Connector: it stops the Podman service
// the Runtime started.
func (e *engine) Release(leftovers func() error) error {
	var err error
	if e.conn != nil {
		err = leftovers()
	}
	if e.svc != nil {
		e.svc.shutdown()
	}
	return err
}

// lockStorage serialises the calls that change Podman's container storage
// when containers get their own user namespaces: Podman 4.3's service
// deadlocks (its storage and userns locks held, every later call waiting)
// when --userns=auto containers are created and removed in parallel.
//
// A start (which mounts the container's storage) can meet the same fate: a
// CI run of the conformance suite (--userns on, Podman 4.3.1) hung with one
// container left "Created", none of its start done, while the removals of
// two others waited, and every later call after them. With Podman 4, a start
// in user-namespace mode holds the lock too (startLocked); the service's
// watchdog (service.watch) replaces a service wedged all the same.
func (r *Runtime) lockStorage() {
	if r.userNS {
		r.storageMu.Lock()
	}
}

func (r *Runtime) unlockStorage() {
	if r.userNS {
		r.storageMu.Unlock()
	}
}

// List implements containerpool.Engine.
func (e *engine) List(ctx context.Context, labels ...string) ([]containerpool.Container, error) {
	c, cancel := (*Runtime)(e).callCtx(ctx, 30*time.Second)
	defer cancel()
	list, err := containers.List(c, new(containers.ListOptions).WithAll(true).WithFilters(map[string][]string{
		"label": append([]string{containerpool.LabelManaged + "=true"}, labels...),
	}))
	if err != nil {
		return nil, err
	}
	cs := make([]containerpool.Container, 0, len(list))
	for _, l := range list {
		cs = append(cs, containerpool.Container{ID: l.ID, Labels: l.Labels})
	}
	return cs, nil
}

// probe lists the Runtime's containers: the service answers it only when it
// can take their locks.
func (r *Runtime) probe(ctx context.Context) error {
	_, err := (*engine)(r).List(ctx, containerpool.LabelWorker+"="+r.cfg.WorkerID)
	return err
}

// ExitNote implements containerpool.Engine.
func (e *engine) ExitNote(id string) string {
	c, cancel := (*Runtime)(e).callCtx(context.Background(), 5*time.Second)
	defer cancel()
	data, err := containers.Inspect(c, id, nil)
	if err != nil || data.State == nil || data.State.Running {
		return ""
	}
	return containerpool.ExitNote(int(data.State.ExitCode), data.State.Error)
}

// Lost implements containerpool.Engine.
func (e *engine) Lost(b *containerpool.Box, res sandbox.Result) sandbox.Result {
	r := (*Runtime)(e)
	res = containerpool.Lost(res)
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
		data, err = containers.Inspect(c, b.ID(), nil)
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
		r.log.Warn("podman sandbox: inspect lost container", "id", sandbox.ShortID(b.ID()), "err", err)
		return res
	}
	code := int(data.State.ExitCode)
	r.log.Debug("podman sandbox: runner lost", "id", sandbox.ShortID(b.ID()), "exit_code", code, "oom_killed", data.State.OOMKilled)
	// Podman 4.3 on cgroups v1 does not set OOMKilled: Exited takes a 137
	// with a memory limit for the OOM killer. The limit is the box's own
	// (a job may set it), as the Docker runtime reports it.
	return containerpool.Exited(res, code, data.State.OOMKilled, b.Limits().Memory)
}
