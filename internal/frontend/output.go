package frontend

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
)

// WatchOutput calls fn with each live output chunk workers publish for
// namespace ns's job id (best effort: core NATS), until stop is called.
// Subscribe before submitting the job so no chunk is missed. Any worker host
// may publish on the output subject: only chunks whose proof checks under the
// job's capability (those of the worker given the job) reach fn. Start must
// have returned (it reads the proxy key).
func (f *Frontend) WatchOutput(ns, id string, fn func(stream, data string)) (stop func(), err error) {
	id = jobs.ScopedID(jobs.NamespaceOf(ns), id)
	if f.key == nil {
		return nil, fmt.Errorf("%w: watch output of %s before the front-end started", ErrUnavailable, id)
	}
	capability := jobs.Capability(f.key, id)
	sub, err := f.nc.Subscribe(f.cfg.Subjects.Output(id), func(m *nats.Msg) {
		chunk, err := queue.DecodeOutput(m.Data)
		if err == nil && jobs.CheckOutput(capability, id, chunk) {
			fn(chunk.Stream, chunk.Data)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("watch output of %s: %w", id, err)
	}
	// Whatever a worker publishes, a slow watcher holds a bounded backlog
	// (the rest is dropped: live output is best effort).
	_ = sub.SetPendingLimits(1024, 8<<20) // only fails on a closed subscription
	// Make sure the broker has the subscription before the job can run.
	_ = f.nc.FlushTimeout(2 * time.Second)
	return func() { _ = sub.Unsubscribe() }, nil
}
