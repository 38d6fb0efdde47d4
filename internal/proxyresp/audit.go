package proxyresp

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/mcpexec/mcpexec/internal/audit"
	"github.com/mcpexec/mcpexec/internal/auditlog"
	"github.com/mcpexec/mcpexec/internal/mcpclients"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

// Auditor records the audit entries of proxied tool calls; *auditlog.Writer
// is one. Record must not hold the call up (beyond a full queue's wait).
type Auditor interface {
	Record(auditlog.Call)
}

var _ Auditor = (*auditlog.Writer)(nil)

// AuditorFunc is a function that is an Auditor.
type AuditorFunc func(auditlog.Call)

// Record implements Auditor.
func (f AuditorFunc) Record(c auditlog.Call) { f(c) }

// toolCall is one call_tool as the audit records it: what was decided about
// it, by whom, and when it began. callTool fills the decision; the deferred
// audit records the entry whatever the call's end.
type toolCall struct {
	start     time.Time
	callID    string // the entry's id ("": the writer picks one)
	attempt   int
	decision  string // audit.DecisionAllow unless refused
	decidedBy string // audit.DecidedByPolicy today; approvals name who answered
}

// newToolCall begins the audit of a call: allowed by the namespace's policy
// until something says otherwise.
func newToolCall(ctx context.Context) *toolCall {
	ref, _ := ctx.Value(callRefKey{}).(callRef)
	return &toolCall{start: time.Now(), callID: ref.id, attempt: ref.attempt, decision: audit.DecisionAllow, decidedBy: audit.DecidedByPolicy}
}

// deny records that the call was refused, by whom.
func (c *toolCall) deny(by string) { c.decision, c.decidedBy = audit.DecisionDeny, by }

// decided records the tool rules' decision on the call (authorize's answer):
// allowed or denied by the policy, or by the person who answered its
// approval; a call refused without an answer (timed out, over a cap, the
// bucket unavailable) is denied by that outcome.
func (c *toolCall) decided(cd CallDecision, err error) {
	by := cmp.Or(cd.DecidedBy, audit.DecidedByPolicy)
	if cd.Approval != "" && cd.DecidedBy == "" {
		by = cd.Outcome
	}
	if err != nil {
		c.deny(cmp.Or(by, cd.Outcome))
		return
	}
	c.decision, c.decidedBy = audit.DecisionAllow, by
}

// callRefKey carries, in a call's context, its callRef.
type callRefKey struct{}

// callRef is what the audit needs of the request: the call's attempt, and
// its entry id (the job, attempt and the worker's call id hashed, so the
// same across the worker's retries; "" without a call id).
type callRef struct {
	id      string
	attempt int
}

func withCallRef(ctx context.Context, job string, attempt int, callID string) context.Context {
	ref := callRef{attempt: attempt}
	if callID != "" {
		ref.id = auditID(job, attempt, callID)
	}
	return context.WithValue(ctx, callRefKey{}, ref)
}

func auditID(job string, attempt int, callID string) string {
	sum := sha256.Sum256([]byte("audit\x00" + job + "\x00" + strconv.Itoa(attempt) + "\x00" + callID))
	return hex.EncodeToString(sum[:16])
}

// audit records c's entry: the span of the call gets its decision, the
// Auditor (when set) the entry. args are digested by the Auditor, off the
// call's path.
func (r *Responder) audit(ctx context.Context, rj *runningJob, c *toolCall, server, tool string, args map[string]any, err error) {
	trace.SpanFromContext(ctx).SetAttributes(tracing.AttrDecision.String(c.decision), tracing.AttrDecidedBy.String(c.decidedBy))
	if r.cfg.Audit == nil {
		return
	}
	e := audit.Entry{
		ID: c.callID, JobID: rj.job.ID, Attempt: c.attempt, Namespace: rj.namespace(), Caller: rj.job.SubmittedBy,
		Server: audit.Clip(server, audit.MaxNameBytes), Tool: audit.Clip(tool, audit.MaxNameBytes),
		Decision: c.decision, DecidedBy: c.decidedBy, Outcome: audit.OutcomeOK,
		DurationMS: float64(time.Since(c.start).Microseconds()) / 1000, At: time.Now().UTC(), Frontend: r.cfg.ID,
	}
	var te *mcpclients.ToolError
	switch {
	case err == nil:
	case errors.As(err, &te):
		e.Outcome, e.Error = audit.OutcomeToolError, audit.Clip(err.Error(), audit.MaxErrorBytes)
	default:
		e.Outcome, e.Error = audit.OutcomeError, audit.Clip(err.Error(), audit.MaxErrorBytes)
	}
	r.cfg.Audit.Record(auditlog.Call{Entry: e, Args: args, Redactor: r.policyFor(e.Namespace).Redact})
}
