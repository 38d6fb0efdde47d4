package podman

// This file removes containers left behind and explains lost ones.
import (
	"context"
	"fmt"
	"time"

	"github.com/containers/podman/v5/libpod/define"
	"github.com/containers/podman/v5/pkg/bindings/containers"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// removeOrphans removes every managed container carrying this worker's label,
// and every one whose owner process on this host is gone.
func (r *Runtime) removeOrphans(ctx context.Context) error {
	ids, err := r.list(ctx)
	if err != nil {
		return fmt.Errorf("podman sandbox: list orphan containers: %w", err)
	}
	dead, err := r.ownerless(ctx)
	if err != nil {
		return fmt.Errorf("podman sandbox: list orphan containers: %w", err)
	}
	ids = append(ids, dead...)
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
		r.log.Warn("podman sandbox: inspect lost container", "id", sandbox.ShortID(b.id), "err", err)
		return res
	}
	code := int(data.State.ExitCode)
	r.log.Debug("podman sandbox: runner lost", "id", sandbox.ShortID(b.id), "exit_code", code, "oom_killed", data.State.OOMKilled)
	// Podman 4.3 on cgroups v1 does not set OOMKilled. A SIGKILL (137) cannot come
	// from the code itself: the runner is PID 1 of its PID namespace, which ignores
	// signals it has no handler for when they come from inside. So with a memory
	// limit, 137 is the kernel's OOM killer (or an operator).
	if data.State.OOMKilled || (code == 137 && r.cfg.Limits.Memory > 0) {
		res.ExitCode = 137
		res.Error = fmt.Sprintf("the sandbox hit its memory limit (%s) and was killed", sandbox.FormatBytes(r.cfg.Limits.Memory))
		return res
	}
	res.ExitCode = code
	res.Error = fmt.Sprintf("sandbox exited unexpectedly (exit code %d)", code)
	return res
}

// reapEvery is how often a Runtime looks for containers whose owner is gone.
const reapEvery = time.Minute

// reapLoop removes, every reapEvery, the containers of owners that are gone
// (a worker killed with SIGKILL leaves its containers behind).
func (r *Runtime) reapLoop() {
	defer close(r.reaperDone)
	t := time.NewTicker(reapEvery)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		r.retireIdle()
		ids, err := r.ownerless(context.Background())
		if err != nil {
			r.log.Warn("podman sandbox: look for containers left behind", "err", err)
			continue
		}
		for _, id := range ids {
			if err := r.remove(context.Background(), id); err != nil {
				r.log.Warn("podman sandbox: remove a container left behind", "id", sandbox.ShortID(id), "err", err)
			}
		}
		if len(ids) > 0 {
			r.log.Info("podman sandbox: removed containers whose worker is gone", "count", len(ids))
		}
	}
}

// ownerless returns the managed containers made on this host by a process
// that is gone.
func (r *Runtime) ownerless(ctx context.Context) ([]string, error) {
	c, cancel := r.callCtx(ctx, 30*time.Second)
	defer cancel()
	list, err := containers.List(c, new(containers.ListOptions).WithAll(true).WithFilters(map[string][]string{
		"label": {LabelManaged + "=true"},
	}))
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, l := range list {
		if host, alive, ok := sandbox.OwnerAlive(l.Labels[LabelOwner]); ok && host == sandbox.HostName && !alive {
			ids = append(ids, l.ID)
		}
	}
	return ids, nil
}
