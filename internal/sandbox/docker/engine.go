package docker

// This file is the Runtime's containerpool.Engine: its Docker Engine API
// calls.
import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/sandbox/containerpool"
)

// engine is the Runtime as its pool's containerpool.Engine.
type engine Runtime

var _ containerpool.Engine = (*engine)(nil)

// Connect implements containerpool.Connector: it opens the client, reads the
// engine's description and checks the image.
func (e *engine) Connect(ctx context.Context, info *Info) ([]string, error) {
	r := (*Runtime)(e)
	if err := r.connect(ctx, info); err != nil {
		return nil, err
	}
	return r.checkImage(ctx)
}

// Release implements containerpool.Connector: it closes the client.
func (e *engine) Release(leftovers func() error) error {
	if e.cli == nil {
		return nil
	}
	return errors.Join(leftovers(), e.cli.Close())
}

// remove kills and removes a container, whatever its state; a container that
// is gone already is no error.
func (r *Runtime) remove(ctx context.Context, id string) error {
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeTimeout)
	defer cancel()
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		err = r.cli.ContainerRemove(c, id, container.RemoveOptions{Force: true, RemoveVolumes: true})
		if err == nil || client.IsErrNotFound(err) {
			return nil
		}
		if c.Err() != nil {
			break
		}
		// "removal of container ... is already in progress" and the like.
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
	c, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	created, err := r.cli.ContainerCreate(c, s.config, s.host, s.net, nil, s.name)
	if err != nil {
		return "", fmt.Errorf("create container: %w", err)
	}
	for _, w := range created.Warnings {
		// A limit the engine cannot apply (Info.Missing says which).
		r.log.Warn("docker sandbox: create container", "warning", w)
	}
	if err := r.cli.ContainerStart(c, created.ID, container.StartOptions{}); err != nil {
		return created.ID, fmt.Errorf("start container: %w", err)
	}
	return created.ID, nil
}

// listManaged returns the managed containers (any state), with extra label
// filters.
func (r *Runtime) listManaged(ctx context.Context, labels ...string) ([]container.Summary, error) {
	c, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	f := filters.NewArgs(filters.Arg("label", containerpool.LabelManaged+"=true"))
	for _, l := range labels {
		f.Add("label", l)
	}
	return r.cli.ContainerList(c, container.ListOptions{All: true, Filters: f})
}

// List implements containerpool.Engine.
func (e *engine) List(ctx context.Context, labels ...string) ([]containerpool.Container, error) {
	list, err := (*Runtime)(e).listManaged(ctx, labels...)
	if err != nil {
		return nil, err
	}
	cs := make([]containerpool.Container, 0, len(list))
	for _, l := range list {
		cs = append(cs, containerpool.Container{ID: l.ID, Labels: l.Labels})
	}
	return cs, nil
}

// ExitNote implements containerpool.Engine.
func (e *engine) ExitNote(id string) string {
	r := (*Runtime)(e)
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	data, err := r.cli.ContainerInspect(c, id)
	if err != nil || data.ContainerJSONBase == nil || data.State == nil || data.State.Running {
		return ""
	}
	return containerpool.ExitNote(data.State.ExitCode, data.State.Error)
}

// Lost implements containerpool.Engine.
func (e *engine) Lost(b *containerpool.Box, res sandbox.Result) sandbox.Result {
	r := (*Runtime)(e)
	res = containerpool.Lost(res)
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The socket closes as the process dies; the container's state follows
	// shortly.
	var st *container.State
	for {
		data, err := r.cli.ContainerInspect(c, b.ID())
		if err != nil {
			r.log.Warn("docker sandbox: inspect lost container", "id", sandbox.ShortID(b.ID()), "err", err)
			return res
		}
		if data.ContainerJSONBase != nil && data.State != nil && !data.State.Running {
			st = data.State
			break
		}
		select {
		case <-c.Done():
			r.log.Warn("docker sandbox: lost container still running", "id", sandbox.ShortID(b.ID()))
			return res
		case <-time.After(50 * time.Millisecond):
		}
	}
	code := st.ExitCode
	r.log.Debug("docker sandbox: runner lost", "id", sandbox.ShortID(b.ID()), "exit_code", code, "oom_killed", st.OOMKilled)
	return containerpool.Exited(res, code, st.OOMKilled, b.Limits().Memory)
}
