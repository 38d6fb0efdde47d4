package proxyresp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

// grantEntry is a grant's record in the approvals bucket, beside the
// approvals: every front-end reads it, so a grant made on one holds on all.
// Its expiry is checked at every read (the bucket's TTL, longer than any
// grant, only clears it away).
type grantEntry struct {
	jobs.Grant
	Namespace string `json:"namespace"`
	JobKey    string `json:"job_key,omitempty"` // scope "job": the job's submission
}

// jobKey tells rj's submission apart from another of the same id.
func jobKey(rj *runningJob) string {
	return rj.job.ID + "@" + rj.job.SubmittedAt.UTC().Format(time.RFC3339Nano)
}

// grantID is the id of the grant of scope for server/tool (and the job
// jobKey, for scope "job"): one per tool and scope, so a later grant of
// the same replaces the earlier, and a namespace holds at most one per
// tool it was granted, plus one per job and tool.
func grantID(scope, jobKey, server, tool string) string {
	if scope != jobs.ScopeJob {
		jobKey = ""
	}
	sum := sha256.Sum256([]byte(scope + "\x00" + jobKey + "\x00" + server + "\x00" + tool))
	return hex.EncodeToString(sum[:approvalIDBytes])
}

// grantDecider is who decided a call a grant allowed, as the audit and the
// call's approval record it.
func grantDecider(g *jobs.Grant) string {
	return fmt.Sprintf("a grant by %s (scope %s, approval %s)", g.GrantedBy, g.Scope, g.Approval)
}

// grant records the grant that ans (an approval of scope "job" or
// "namespace") makes of ent's tool, and approves the calls it covers that
// are already waiting.
func (a *approvals) grant(ctx context.Context, kv jetstream.KeyValue, ent *approvalEntry, ans jobs.ApprovalAnswer, by string, now time.Time) (*jobs.Grant, error) {
	g := grantEntry{Namespace: ent.Namespace, Grant: jobs.Grant{Scope: ans.Scope, Server: ent.Server, Tool: ent.Tool,
		GrantedBy: by, Reason: ans.Reason, Approval: ent.ID, GrantedAt: now}}
	g.ID = grantID(ans.Scope, ent.JobKey, ent.Server, ent.Tool)
	if ans.Scope == jobs.ScopeJob {
		g.JobID, g.JobKey, g.ExpiresAt = ent.JobID, ent.JobKey, now.Add(jobs.JobGrantFor)
	} else {
		g.ExpiresAt = now.Add(time.Duration(ans.Minutes) * time.Minute)
	}
	data, _ := json.Marshal(g) // plain types always encode
	if _, err := kv.Put(ctx, a.sub.GrantKey(g.Namespace, g.ID), data); err != nil {
		return nil, err
	}
	a.approveCovered(ctx, kv, &g)
	return &g.Grant, nil
}

// covers reports whether g allows a call of server/tool by the job jobKey
// of namespace ns at now.
func (g *grantEntry) covers(ns, jobKey, server, tool string, now time.Time) bool {
	return g.Namespace == ns && g.Server == server && g.Tool == tool && now.Before(g.ExpiresAt) &&
		(g.Scope == jobs.ScopeNamespace || (g.Scope == jobs.ScopeJob && g.JobKey != "" && g.JobKey == jobKey))
}

// approveCovered approves the calls g covers that wait already (best
// effort: one answered meanwhile keeps its answer, and one missed asks on).
func (a *approvals) approveCovered(ctx context.Context, kv jetstream.KeyValue, g *grantEntry) {
	ents, err := a.entries(ctx, kv, g.Namespace)
	if err != nil {
		return
	}
	now := time.Now().UTC()
	for _, e := range ents {
		if e.ID == g.Approval || !e.waiting(now) || !g.covers(e.Namespace, e.JobKey, e.Server, e.Tool, now) {
			continue
		}
		e.State, e.DecidedBy, e.DecidedAt = approvalApproved, grantDecider(&g.Grant), &now
		data, _ := json.Marshal(e)
		_, _ = kv.Update(ctx, a.sub.ApprovalKey(e.Namespace, e.ID), data, e.rev) // answered meanwhile: that answer stands
	}
}

// granted returns the grant that allows a call of server/tool by the job
// jobKey of namespace ns now, or nil: the job's grant first, then the
// namespace's. A grant that cannot be read allows nothing.
func (a *approvals) granted(ctx context.Context, kv jetstream.KeyValue, ns, jobKey, server, tool string) *jobs.Grant {
	now := time.Now()
	for _, scope := range []string{jobs.ScopeJob, jobs.ScopeNamespace} {
		e, err := kv.Get(ctx, a.sub.GrantKey(ns, grantID(scope, jobKey, server, tool)))
		if err != nil {
			continue
		}
		var g grantEntry
		if json.Unmarshal(e.Value(), &g) == nil && g.Scope == scope && g.covers(ns, jobKey, server, tool, now) {
			return &g.Grant
		}
	}
	return nil
}

// Grants returns namespace ns's grants in force, the latest to end first.
func (a *approvals) Grants(ctx context.Context, ns string) ([]jobs.Grant, error) {
	ns = jobs.NamespaceOf(ns)
	kv, err := a.bucket(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	ents, err := readEntries(ctx, kv, a.sub.GrantKeys(ns), func(key string, _ jetstream.KeyValueEntry, g *grantEntry) bool {
		return g.Namespace == ns && a.sub.GrantKey(ns, g.ID) == key && now.Before(g.ExpiresAt)
	})
	if err != nil {
		return nil, &errs.Error{Kind: errs.Unavailable, Msg: "list grants", Err: err}
	}
	out := make([]jobs.Grant, 0, len(ents))
	for _, g := range ents {
		out = append(out, g.Grant)
	}
	slices.SortFunc(out, func(x, y jobs.Grant) int { return y.ExpiresAt.Compare(x.ExpiresAt) })
	return out, nil
}

// errNoGrant is the answer for an id that is not one of the caller's
// namespace's grants in force, whether or not it exists elsewhere.
func errNoGrant(id string) error {
	return errs.New(errs.NotFound, fmt.Sprintf("no such grant %q", errs.Clip(id, 40)))
}

// Revoke ends namespace ns's grant id now: the calls it covered ask again.
func (a *approvals) Revoke(ctx context.Context, ns, id string) error {
	ns = jobs.NamespaceOf(ns)
	if !validApprovalID(id) {
		return errNoGrant(id)
	}
	kv, err := a.bucket(ctx)
	if err != nil {
		return err
	}
	key := a.sub.GrantKey(ns, id)
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return errNoGrant(id)
	}
	if err != nil {
		return &errs.Error{Kind: errs.Unavailable, Msg: "read grant", Err: err}
	}
	var g grantEntry
	if json.Unmarshal(e.Value(), &g) != nil || g.Namespace != ns || g.ID != id || !time.Now().Before(g.ExpiresAt) {
		return errNoGrant(id)
	}
	if err := kv.Delete(ctx, key); err != nil {
		return &errs.Error{Kind: errs.Unavailable, Msg: "revoke grant", Err: err}
	}
	if err := a.sync(ctx); err != nil {
		return &errs.Error{Kind: errs.Unavailable, Msg: "grant " + id + " was revoked, but the revocation is not yet on disk (a power cut now could undo it): read GET /api/grants to see whether it stands", Err: err}
	}
	return nil
}

// Grants returns namespace ns's grants in force (answers to approvals that
// allow a job's, or the namespace's, later calls of a tool).
func (r *Responder) Grants(ctx context.Context, ns string) ([]jobs.Grant, error) {
	return r.approvals.Grants(ctx, ns)
}

// RevokeGrant ends namespace ns's grant id; an id that is not one of ns's
// grants in force is NotFound.
func (r *Responder) RevokeGrant(ctx context.Context, ns, id string) error {
	return r.approvals.Revoke(ctx, ns, id)
}
