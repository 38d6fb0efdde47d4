package frontend

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// WatchOutput calls fn with each live output chunk workers publish for
// namespace ns's job id (best effort: core NATS), until stop is called.
// Subscribe before submitting the job so no chunk is missed.
func (f *Frontend) WatchOutput(ns, id string, fn func(stream, data string)) (stop func(), err error) {
	id = jobs.ScopedID(jobs.NamespaceOf(ns), id)
	sub, err := f.nc.Subscribe(f.cfg.Subjects.Output(id), func(m *nats.Msg) {
		var chunk struct {
			Stream string `json:"stream"`
			Data   string `json:"data"`
		}
		if json.Unmarshal(m.Data, &chunk) == nil && chunk.Data != "" {
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
