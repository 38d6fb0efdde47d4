package proxyresp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/toolrules"
)

// ApprovalLimits bound a namespace's calls waiting for approval.
type ApprovalLimits struct {
	// Timeout is how long a call waits for an answer (default
	// DefaultApprovalTimeout). The job's clock stops meanwhile; a worker
	// that cannot stop it (one that sent a request that does not Park)
	// bounds the wait by the job's time limit too.
	Timeout time.Duration
	// PerJob and PerNamespace cap the calls waiting at once (defaults
	// DefaultMaxPendingPerJob, DefaultMaxPendingPerNamespace).
	PerJob, PerNamespace int
}

// Approval defaults.
const (
	DefaultApprovalTimeout        = 10 * time.Minute
	DefaultMaxPendingPerJob       = 8
	DefaultMaxPendingPerNamespace = 64
)

func (l ApprovalLimits) or() ApprovalLimits {
	if l.Timeout <= 0 {
		l.Timeout = DefaultApprovalTimeout
	}
	if l.PerJob <= 0 {
		l.PerJob = DefaultMaxPendingPerJob
	}
	if l.PerNamespace <= 0 {
		l.PerNamespace = DefaultMaxPendingPerNamespace
	}
	return l
}

// CallDecision is how a proxied tool call was decided: its verdict under the
// namespace's rules, the rule, and, for one that asked, the approval and who
// answered it.
type CallDecision struct {
	Verdict toolrules.Verdict
	Rule    string
	// Approval is the id of the approval asked, if one was.
	Approval string
	// Grant is the id of the grant that allowed the call without asking.
	Grant string
	// Outcome is the final word: "allow" (rules), "granted", "approved",
	// "denied", "timed_out", "withdrawn", "over_cap" or "unavailable".
	Outcome   string
	DecidedBy string
}

// authorize decides a tool call by the namespace's tool rules: it returns
// nil error when the call may proceed, and an error naming the rule (or the
// approval's answer) when it may not. A call whose verdict is "ask" is
// parked until a person answers it through the jobs API, it times out, or
// the job ends.
func (r *Responder) authorize(ctx context.Context, rj *runningJob, server, tool string, args map[string]any) (CallDecision, error) {
	p := r.policyFor(rj.namespace())
	d := p.Tools.Decide(server, tool, func() (toolrules.Hints, error) { return r.hints(ctx, server, tool) })
	cd := CallDecision{Verdict: d.Verdict, Rule: d.Rule, Outcome: string(d.Verdict)}
	switch d.Verdict {
	case toolrules.Allow:
		return cd, nil
	case toolrules.Deny:
		cd.DecidedBy = "policy"
		return cd, fmt.Errorf("%s/%s is denied by namespace %q's tool rule %q", server, tool, rj.namespace(), d.Rule)
	}
	return r.approvals.ask(ctx, rj, p.Approvals.or(), server, tool, d.Rule, args, cd)
}

// hints are tool's MCP annotations on server.
func (r *Responder) hints(ctx context.Context, server, tool string) (toolrules.Hints, error) {
	ts, err := r.tools().Tools(ctx, server)
	if err != nil {
		return toolrules.Hints{}, err
	}
	for _, t := range ts {
		if t.Name == tool {
			return toolrules.Hints{ReadOnly: t.Annotations.ReadOnlyHint, Destructive: t.Annotations.DestructiveHint}, nil
		}
	}
	return toolrules.Hints{}, nil // no such tool: the server will say so
}

// ask parks a call for approval and waits for its answer.
func (a *approvals) ask(ctx context.Context, rj *runningJob, lim ApprovalLimits, server, tool, rule string, args map[string]any, cd CallDecision) (CallDecision, error) {
	ns := rj.namespace()
	name := server + "/" + tool
	kv, err := a.bucket(ctx)
	if err != nil {
		cd.Outcome = "unavailable"
		return cd, fmt.Errorf("%s needs a person's approval (tool rule %q), but %w", name, rule, err)
	}
	now := time.Now().UTC()
	ent := approvalEntry{Namespace: ns, Frontend: a.id, State: approvalPending}
	ent.ID, ent.Server, ent.Tool, ent.Rule, ent.AskedAt = newApprovalID(), server, tool, rule, now
	ent.JobKey = jobKey(rj)
	if g := a.granted(ctx, kv, ns, ent.JobKey, server, tool); g != nil {
		// An earlier answer widened into a grant covers this call.
		cd.Outcome, cd.Grant, cd.DecidedBy = "granted", g.ID, grantDecider(g)
		return cd, nil
	}
	ent.JobID, _ = jobs.UnscopedID(ns, rj.job.ID)
	ent.Arguments, ent.ArgumentsTruncated, ent.ArgumentsBytes, ent.ArgumentsSHA256 = shownArgs(args)
	ent.ExpiresAt = now.Add(lim.Timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(ent.ExpiresAt) {
		ent.ExpiresAt = dl.UTC()
	}
	release, err := a.reserve(ns, rj.job.ID, lim)
	if err != nil {
		cd.Outcome = "over_cap"
		return cd, fmt.Errorf("%s needs a person's approval (tool rule %q), but %w", name, rule, err)
	}
	defer release()
	key := a.sub.ApprovalKey(ns, ent.ID)
	rev, err := a.park(ctx, kv, lim, key, &ent)
	if err != nil {
		cd.Outcome = "over_cap"
		if !errors.Is(err, errOverCap) {
			cd.Outcome = "unavailable"
		}
		return cd, fmt.Errorf("%s needs a person's approval (tool rule %q), but %w", name, rule, err)
	}
	cd.Approval = ent.ID
	if g := a.granted(ctx, kv, ns, ent.JobKey, server, tool); g != nil {
		// A grant made while this call was being recorded: the answer that
		// made it approved the calls it saw waiting, and this one may have
		// come just too late to be seen.
		next := ent
		at := time.Now().UTC()
		next.State, next.DecidedBy, next.DecidedAt = approvalApproved, grantDecider(g), &at
		data, _ := json.Marshal(next)
		_, _ = kv.Update(ctx, key, data, rev) // answered meanwhile: await reads that answer
	}
	// The job's clock stands still while the call waits (its worker's, and
	// this call's own).
	waited := proxy.Waiting(ctx, time.Until(ent.ExpiresAt))
	got, err := a.await(ctx, kv, key, rev, ent)
	waited()
	cd.Outcome, cd.DecidedBy = got.State, got.DecidedBy
	if err != nil {
		return cd, err
	}
	switch got.State {
	case approvalApproved:
		return cd, nil
	case approvalDenied:
		msg := fmt.Sprintf("%s was denied by %s (approval %s, tool rule %q)", name, got.DecidedBy, ent.ID, rule)
		if got.Reason != "" {
			msg += ": " + got.Reason
		}
		return cd, errors.New(msg)
	case approvalTimedOut:
		return cd, fmt.Errorf("%s was denied: nobody answered approval %s within %s (approval_timeout; tool rule %q)", name, ent.ID, got.ExpiresAt.Sub(got.AskedAt).Round(time.Second), rule)
	}
	return cd, fmt.Errorf("%s was not approved: approval %s is %s", name, ent.ID, got.State)
}

// waited is how long job's calls have waited for approval, answered or
// not, as the approvals bucket of namespace ns tells (0 when it cannot be
// read): the time the job's clock stood still.
func (a *approvals) waited(ctx context.Context, ns, job string) time.Duration {
	kv, err := a.bucket(ctx)
	if err != nil {
		return 0
	}
	ents, err := a.entries(ctx, kv, ns)
	if err != nil {
		return 0
	}
	id, _ := jobs.UnscopedID(ns, job)
	now := time.Now()
	var d time.Duration
	for _, e := range ents {
		if e.JobID != id {
			continue
		}
		end := now
		if e.DecidedAt != nil {
			end = *e.DecidedAt
		}
		if !e.ExpiresAt.IsZero() && e.ExpiresAt.Before(end) {
			end = e.ExpiresAt // a front-end that died with it waiting
		}
		d += max(end.Sub(e.AskedAt), 0)
	}
	return d
}

var errOverCap = errors.New("over the cap of calls waiting for approval")

// park counts the calls waiting and records ent as one more, unless a cap
// is reached. Calls parked on this front-end are counted one at a time; for
// those of several front-ends at the same instant, each counts again after
// recording its own, and the ones past a cap (in the order of asking, which
// all see alike) withdraw: the caps hold across the fleet.
func (a *approvals) park(ctx context.Context, kv jetstream.KeyValue, lim ApprovalLimits, key string, ent *approvalEntry) (uint64, error) {
	a.parkMu.Lock()
	defer a.parkMu.Unlock()
	if err := a.underCaps(ctx, kv, lim, ent, 0); err != nil {
		return 0, err
	}
	data, _ := json.Marshal(ent) // plain types always encode
	rev, err := kv.Create(ctx, key, data)
	if err != nil {
		return 0, fmt.Errorf("record the approval: %w", err)
	}
	if err := a.underCaps(ctx, kv, lim, ent, rev); err != nil {
		next := *ent
		next.State = approvalWithdrawn
		data, _ := json.Marshal(next)
		_, _ = kv.Update(ctx, key, data, rev) // answered meanwhile: it is refused all the same
		return 0, err
	}
	return rev, nil
}

// underCaps checks that ent may wait under lim, counting the calls waiting
// before it. Once ent is recorded at revision rev (0: not yet), only the
// entries recorded before it count: the bucket's revisions order the
// records of every front-end, so of two calls recorded at once the later
// one always sees the earlier (ordering by the front-ends' clocks let both
// pass, and a namespace capped at 3 had 4 waiting).
func (a *approvals) underCaps(ctx context.Context, kv jetstream.KeyValue, lim ApprovalLimits, ent *approvalEntry, rev uint64) error {
	ents, err := a.entries(ctx, kv, ent.Namespace)
	if err != nil {
		return err
	}
	now := time.Now()
	inNS, inJob := 0, 0
	for _, e := range ents {
		if !e.waiting(now) || e.ID == ent.ID {
			continue
		}
		if rev > 0 && e.rev > rev {
			continue // recorded after ent: its own check counts ent
		}
		inNS++
		if e.JobID == ent.JobID {
			inJob++
		}
	}
	switch {
	case inJob >= lim.PerJob:
		return fmt.Errorf("%w: job %s already has %d calls waiting for approval, the most namespace %q's policy allows (max_pending_approvals_per_job): await them first", errOverCap, ent.JobID, inJob, ent.Namespace)
	case inNS >= lim.PerNamespace:
		return fmt.Errorf("%w: namespace %q already has %d calls waiting for approval, the most its policy allows (max_pending_approvals): answer some first", errOverCap, ent.Namespace, inNS)
	}
	return nil
}

// settleWait bounds the write that settles an approval whose call stopped
// waiting (its job ended).
const settleWait = 3 * time.Second

// await waits for the answer of the approval at key (revision rev), and
// settles it as timed out at its expiry, or withdrawn when ctx ends first.
func (a *approvals) await(ctx context.Context, kv jetstream.KeyValue, key string, rev uint64, ent approvalEntry) (approvalEntry, error) {
	w, err := kv.Watch(ctx, key)
	if err != nil {
		return ent, fmt.Errorf("watch approval %s: %w", ent.ID, err)
	}
	defer func() { _ = w.Stop() }() // a watch of a closed connection is gone anyway
	updates := w.Updates()
	timer := time.NewTimer(time.Until(ent.ExpiresAt))
	defer timer.Stop()
	poll := time.NewTicker(5 * time.Second) // should the watch miss an update
	defer poll.Stop()
	settle := func(c context.Context, state string) (approvalEntry, bool) {
		next := ent
		now := time.Now().UTC()
		next.State, next.DecidedAt = state, &now
		data, _ := json.Marshal(next)
		if _, err := kv.Update(c, key, data, rev); err != nil {
			return ent, false // answered meanwhile (or the bucket is unreachable)
		}
		return next, true
	}
	read := func(c context.Context) (approvalEntry, bool) {
		e, err := kv.Get(c, key)
		if err != nil {
			return ent, false
		}
		var got approvalEntry
		if json.Unmarshal(e.Value(), &got) != nil || got.ID != ent.ID {
			return ent, false
		}
		rev = e.Revision()
		return got, got.State != approvalPending
	}
	for {
		select {
		case e, ok := <-updates:
			if !ok {
				updates = nil // the poll goes on
				continue
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var got approvalEntry
			if json.Unmarshal(e.Value(), &got) != nil || got.ID != ent.ID {
				continue
			}
			rev = e.Revision()
			if got.State != approvalPending {
				return got, nil
			}
		case <-poll.C:
			if got, done := read(ctx); done {
				return got, nil
			}
		case <-timer.C:
			if got, ok := settle(ctx, approvalTimedOut); ok {
				return got, nil
			}
			if got, done := read(ctx); done {
				return got, nil
			}
			return ent, fmt.Errorf("approval %s timed out and could not be settled: denied", ent.ID)
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleWait)
			got, ok := settle(sctx, approvalWithdrawn)
			if !ok {
				got, _ = read(sctx)
			}
			cancel()
			if got.State == approvalApproved {
				got.State = approvalWithdrawn // too late to make the call
			}
			return got, fmt.Errorf("%s/%s was still waiting for approval %s when the job's time ran out or it ended: %w", ent.Server, ent.Tool, ent.ID, ctx.Err())
		}
	}
}
