package docker

// This file removes containers left behind and explains lost ones.
import (
	"context"
	"fmt"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// removeOrphans removes every managed container carrying this worker's label,
// and every one whose owner process on this host is gone.
func (r *Runtime) removeOrphans(ctx context.Context) error {
	ids, err := r.list(ctx)
	if err != nil {
		return fmt.Errorf("docker sandbox: list orphan containers: %w", err)
	}
	dead, err := r.ownerless(ctx)
	if err != nil {
		return fmt.Errorf("docker sandbox: list orphan containers: %w", err)
	}
	ids = append(ids, dead...)
	for _, id := range ids {
		if err := r.remove(ctx, id); err != nil {
			return fmt.Errorf("docker sandbox: remove orphan container %.12s: %w", id, err)
		}
	}
	if len(ids) > 0 {
		r.log.Info("docker sandbox: removed orphan containers", "worker", r.cfg.WorkerID, "count", len(ids))
	}
	return nil
}

// listManaged returns the managed containers (any state), with extra label
// filters.
func (r *Runtime) listManaged(ctx context.Context, labels ...string) ([]container.Summary, error) {
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	f := filters.NewArgs(filters.Arg("label", LabelManaged+"=true"))
	for _, l := range labels {
		f.Add("label", l)
	}
	return r.cli.ContainerList(c, container.ListOptions{All: true, Filters: f})
}

// list returns the IDs of all containers (any state) labelled with this worker.
func (r *Runtime) list(ctx context.Context) ([]string, error) {
	list, err := r.listManaged(ctx, LabelWorker+"="+r.cfg.WorkerID)
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

// ownerless returns the managed containers made on this host by a process
// that is gone.
func (r *Runtime) ownerless(ctx context.Context) ([]string, error) {
	list, err := r.listManaged(ctx)
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

// exitNote describes a container that stopped, for error messages.
func (r *Runtime) exitNote(id string) string {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	data, err := r.cli.ContainerInspect(c, id)
	if err != nil || data.ContainerJSONBase == nil || data.State == nil || data.State.Running {
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
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The socket closes as the process dies; the container's state follows
	// shortly.
	var st *container.State
	for {
		data, err := r.cli.ContainerInspect(c, b.id)
		if err != nil {
			r.log.Warn("docker sandbox: inspect lost container", "id", sandbox.ShortID(b.id), "err", err)
			return res
		}
		if data.ContainerJSONBase != nil && data.State != nil && !data.State.Running {
			st = data.State
			break
		}
		select {
		case <-c.Done():
			r.log.Warn("docker sandbox: lost container still running", "id", sandbox.ShortID(b.id))
			return res
		case <-time.After(50 * time.Millisecond):
		}
	}
	code := st.ExitCode
	r.log.Debug("docker sandbox: runner lost", "id", sandbox.ShortID(b.id), "exit_code", code, "oom_killed", st.OOMKilled)
	// A SIGKILL (137) cannot come from the code itself: the runner is PID 1 of
	// its PID namespace, which ignores signals it has no handler for when they
	// come from inside. So with a memory limit, 137 is the kernel's OOM killer
	// (or an operator).
	if st.OOMKilled || (code == 137 && b.limits.Memory > 0) {
		res.ExitCode = 137
		res.Error = fmt.Sprintf("the sandbox hit its memory limit (%s) and was killed", sandbox.FormatBytes(b.limits.Memory))
		return res
	}
	res.ExitCode = code
	res.Error = fmt.Sprintf("sandbox exited unexpectedly (exit code %d)", code)
	return res
}

// reapEvery is how often a Runtime looks for containers whose owner is gone.
const reapEvery = time.Minute

// reapLoop removes, every reapEvery, the containers of owners that are gone
// (a worker killed with SIGKILL leaves its containers behind), and retires
// idle containers past their time.
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
			r.log.Warn("docker sandbox: look for containers left behind", "err", err)
			continue
		}
		for _, id := range ids {
			if err := r.remove(context.Background(), id); err != nil {
				r.log.Warn("docker sandbox: remove a container left behind", "id", sandbox.ShortID(id), "err", err)
			}
		}
		if len(ids) > 0 {
			r.log.Info("docker sandbox: removed containers whose worker is gone", "count", len(ids))
		}
	}
}
