package containerpool

// This file removes containers left behind.
import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// RemoveOrphans removes every managed container carrying this worker's
// label, and every one whose owner process on this host is gone.
func (p *Pool) RemoveOrphans(ctx context.Context) error {
	ids, err := p.List(ctx)
	if err != nil {
		return fmt.Errorf("%s: list orphan containers: %w", p.name, err)
	}
	dead, err := p.Ownerless(ctx)
	if err != nil {
		return fmt.Errorf("%s: list orphan containers: %w", p.name, err)
	}
	ids = append(ids, dead...)
	for _, id := range ids {
		if err := p.eng.Remove(ctx, id); err != nil {
			return fmt.Errorf("%s: remove orphan container %.12s: %w", p.name, id, err)
		}
	}
	if len(ids) > 0 {
		p.log.Info(p.name+": removed orphan containers", "worker", p.cfg.WorkerID, "count", len(ids))
	}
	return nil
}

// RemoveLeftovers removes every container of this worker that is left (a
// start that failed half-way, a crash of ours): for Close, after the Pool's.
func (p *Pool) RemoveLeftovers() error {
	ids, err := p.List(context.Background())
	if err != nil {
		// An engine that does not answer: the next life's RemoveOrphans and
		// the other Pools' reapers remove what is left.
		return nil
	}
	var errs error
	for _, id := range ids {
		if err := p.eng.Remove(context.Background(), id); err != nil {
			errs = errors.Join(errs, fmt.Errorf("remove container %s: %w", sandbox.ShortID(id), err))
		}
	}
	return errs
}

// List returns the IDs of all containers (any state) labelled with this
// worker.
func (p *Pool) List(ctx context.Context) ([]string, error) {
	list, err := p.eng.List(ctx, LabelWorker+"="+p.cfg.WorkerID)
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(list))
	for _, l := range list {
		// The label filters are ANDed, but be strict anyway.
		if l.Labels[LabelManaged] == "true" && l.Labels[LabelWorker] == p.cfg.WorkerID {
			ids = append(ids, l.ID)
		}
	}
	return ids, nil
}

// Ownerless returns the managed containers made on this host by a process
// that is gone.
func (p *Pool) Ownerless(ctx context.Context) ([]string, error) {
	list, err := p.eng.List(ctx)
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

// reapEvery is how often a Pool looks for containers whose owner is gone.
const reapEvery = time.Minute

// reapLoop removes, every reapEvery, the containers of owners that are gone
// (a worker killed with SIGKILL leaves its containers behind), and retires
// idle containers past their time.
func (p *Pool) reapLoop() {
	defer close(p.reaperDone)
	t := time.NewTicker(reapEvery)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		p.retireIdle()
		ids, err := p.Ownerless(context.Background())
		if err != nil {
			p.log.Warn(p.name+": look for containers left behind", "err", err)
			continue
		}
		for _, id := range ids {
			if err := p.eng.Remove(context.Background(), id); err != nil {
				p.log.Warn(p.name+": remove a container left behind", "id", sandbox.ShortID(id), "err", err)
			}
		}
		if len(ids) > 0 {
			p.log.Info(p.name+": removed containers whose worker is gone", "count", len(ids))
		}
	}
}
