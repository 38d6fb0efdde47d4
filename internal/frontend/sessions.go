package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
)

// checkSessions applies each namespace's session cap to the jobs that would
// start a new session: errs[i] is js[i]'s refusal (wrapping ErrOverCap), or
// nil. Jobs of sessions that exist, and jobs already refused (no namespace
// set), pass.
func (f *Frontend) checkSessions(ctx context.Context, js []*jobs.Job) []error {
	errs := make([]error, len(js))
	live := map[string]map[string]bool{} // namespace -> session keys in use
	for i, j := range js {
		if j.Session == "" || j.Namespace == "" {
			continue
		}
		p := f.policyFor(j.Namespace)
		if p.MaxSessions == 0 {
			continue
		}
		keys, ok := live[j.Namespace]
		if !ok {
			var err error
			if keys, err = f.liveSessions(ctx, j.Namespace); err != nil {
				errs[i] = fmt.Errorf("%w: %w", ErrUnavailable, err)
				continue
			}
			live[j.Namespace] = keys
		}
		key := queue.SessionKey(j.Namespace, j.Session)
		if keys[key] {
			continue
		}
		if len(keys) >= p.MaxSessions {
			errs[i] = fmt.Errorf("%w: namespace %q holds %d sessions (cap %d): end one (sessions end after their idle timeout), or run the job without a session",
				ErrOverCap, j.Namespace, len(keys), p.MaxSessions)
			continue
		}
		keys[key] = true
	}
	return errs
}

// liveSessions returns the keys of namespace ns's sessions that are not ended.
func (f *Frontend) liveSessions(ctx context.Context, ns string) (map[string]bool, error) {
	kv, err := f.client.JetStream().KeyValue(ctx, f.cfg.Subjects.SessionsBucket())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return map[string]bool{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open sessions bucket: %w", err)
	}
	lister, err := kv.ListKeysFiltered(ctx, queue.SessionKey(ns, "*"))
	if err != nil {
		return nil, fmt.Errorf("list sessions of %s: %w", ns, err)
	}
	out := map[string]bool{}
	for key := range lister.Keys() {
		e, err := kv.Get(ctx, key)
		if err != nil {
			continue // gone meanwhile
		}
		var ent queue.SessionEntry
		if json.Unmarshal(e.Value(), &ent) == nil && !ent.Ended {
			out[key] = true
		}
	}
	return out, nil
}
