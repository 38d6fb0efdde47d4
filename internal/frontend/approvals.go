package frontend

import (
	"context"
	"fmt"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/proxyresp"
	"github.com/mcpexec/mcpexec/internal/toolrules"
)

// compiledRules are the tool rules of every namespace the configuration
// names, and of the others, compiled once.
type compiledRules struct {
	def *toolrules.Rules
	ns  map[string]*toolrules.Rules
}

func compileRules(def Policy, policies map[string]Policy) (compiledRules, error) {
	var c compiledRules
	var err error
	if c.def, err = def.ToolRules(); err != nil {
		return c, fmt.Errorf("default policy: %w", err)
	}
	c.ns = map[string]*toolrules.Rules{}
	for ns, p := range policies {
		if c.ns[jobs.NamespaceOf(ns)], err = p.ToolRules(); err != nil {
			return c, fmt.Errorf("namespace %q: %w", ns, err)
		}
	}
	return c, nil
}

func (c compiledRules) forNS(ns string) *toolrules.Rules {
	if r, ok := c.ns[jobs.NamespaceOf(ns)]; ok {
		return r
	}
	return c.def
}

// approvalLimits are p's bounds of calls waiting for approval.
func (p Policy) approvalLimits() proxyresp.ApprovalLimits {
	return proxyresp.ApprovalLimits{Timeout: time.Duration(p.ApprovalTimeout) * time.Second,
		PerJob: p.MaxPendingApprovalsPerJob, PerNamespace: p.MaxPendingApprovals}
}

// Approvals returns namespace ns's proxied calls waiting for a person's
// approval, wherever in the fleet they are parked.
func (f *Frontend) Approvals(ctx context.Context, ns string) ([]proxyresp.Approval, error) {
	return f.resp.Approvals(ctx, ns)
}

// DecideApproval answers namespace ns's approval id ("approve" or "deny");
// by says who answered. See proxyresp.Responder.DecideApproval.
func (f *Frontend) DecideApproval(ctx context.Context, ns, id, decision, by, reason string) (proxyresp.Approval, error) {
	return f.resp.DecideApproval(ctx, ns, id, decision, by, reason)
}

// FollowApprovals calls fn with each approval of namespace ns asked or
// answered from now on, until ctx ends or fn fails.
func (f *Frontend) FollowApprovals(ctx context.Context, ns string, fn func(jobs.ApprovalEvent) error) error {
	return f.resp.FollowApprovals(ctx, ns, fn)
}

// AnswerApproval answers namespace ns's approval id with ans, which may
// widen an approval into a grant; by says who answered. See
// proxyresp.Responder.AnswerApproval.
func (f *Frontend) AnswerApproval(ctx context.Context, ns, id string, ans jobs.ApprovalAnswer, by string) (proxyresp.Approval, *jobs.Grant, error) {
	return f.resp.AnswerApproval(ctx, ns, id, ans, by)
}

// Grants returns namespace ns's grants in force.
func (f *Frontend) Grants(ctx context.Context, ns string) ([]jobs.Grant, error) {
	return f.resp.Grants(ctx, ns)
}

// RevokeGrant ends namespace ns's grant id.
func (f *Frontend) RevokeGrant(ctx context.Context, ns, id string) error {
	return f.resp.RevokeGrant(ctx, ns, id)
}
