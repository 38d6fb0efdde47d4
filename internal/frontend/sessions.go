package frontend

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/state"
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

// liveSessions returns the keys of namespace ns's sessions that are not
// ended (of entries with their proof).
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
		if ent, err := queue.DecodeSessionEntry(e.Value()); err == nil && !ent.Ended && ent.Proven(f.key, key) {
			out[key] = true
		}
	}
	return out, nil
}

// Session is one session of a namespace as its owner sees it.
type Session struct {
	Name   string    `json:"name"`
	Worker string    `json:"worker"`
	Since  time.Time `json:"since"`
	Ended  bool      `json:"ended,omitempty"` // a tombstone: its next job is told it ended
}

// maxListedSessions bounds the sessions Sessions reads.
const maxListedSessions = 1000

// Sessions returns namespace ns's sessions (at most 1,000), ended ones
// included while their tombstones last.
func (f *Frontend) Sessions(ctx context.Context, ns string) ([]Session, error) {
	ns = jobs.NamespaceOf(ns)
	kv, err := f.client.JetStream().KeyValue(ctx, f.cfg.Subjects.SessionsBucket())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: open sessions bucket: %w", ErrUnavailable, err)
	}
	lister, err := kv.ListKeysFiltered(ctx, queue.SessionKey(ns, "*"))
	if err != nil {
		return nil, fmt.Errorf("%w: list sessions of %s: %w", ErrUnavailable, ns, err)
	}
	out := []Session{}
	for key := range lister.Keys() {
		if len(out) == maxListedSessions {
			_ = lister.Stop() // enough: the rest are not shown
			break
		}
		e, err := kv.Get(ctx, key)
		if err != nil {
			continue // gone meanwhile
		}
		// Any worker host may write the bucket: only entries of a worker
		// given a job of the session count.
		if ent, err := queue.DecodeSessionEntry(e.Value()); err == nil && queue.SessionKey(ns, ent.Session) == key && ent.Proven(f.key, key) {
			out = append(out, Session{Name: ent.Session, Worker: ent.Worker, Since: ent.Since, Ended: ent.Ended})
		}
	}
	return out, nil
}

// EndSession ends namespace ns's session name: the worker holding it
// discards its sandbox (after a job of it that is running) and its next job
// is told it ended. ErrNotFound when the namespace holds no such live
// session.
func (f *Frontend) EndSession(ctx context.Context, ns, name string) error {
	ns = jobs.NamespaceOf(ns)
	if !jobs.ValidUserID(name) {
		return state.ErrNotFound
	}
	ss, err := f.Sessions(ctx, ns)
	if err != nil {
		return err
	}
	for _, s := range ss {
		if s.Name == name && !s.Ended && jobs.ValidID(s.Worker) {
			if queue.EndSession(ctx, f.nc, f.cfg.Subjects, s.Worker, queue.SessionKey(ns, name)) {
				return nil
			}
			break
		}
	}
	return fmt.Errorf("%w: no live session %s in this namespace", state.ErrNotFound, name)
}
