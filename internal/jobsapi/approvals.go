package jobsapi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/mcpexec/mcpexec/internal/httperr"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

// ApprovalsResponse is the body of GET /api/approvals.
type ApprovalsResponse struct {
	Approvals []jobs.Approval `json:"approvals"`
}

// DecisionRequest is the body of POST /api/approvals/{id}: "decision", an
// optional "reason", and, to widen an approval, "scope" ("job" or
// "namespace" with "minutes").
type DecisionRequest = jobs.ApprovalAnswer

// DecisionResponse answers POST /api/approvals/{id}: the call, the answer
// recorded, and the grant an answer of scope "job" or "namespace" made.
type DecisionResponse struct {
	jobs.Approval
	Decision  string      `json:"decision"`
	Scope     string      `json:"scope"`
	DecidedBy string      `json:"decided_by"`
	Reason    string      `json:"reason,omitempty"`
	Grant     *jobs.Grant `json:"grant,omitempty"`
}

// GrantsResponse is the body of GET /api/approvals/grants.
type GrantsResponse struct {
	Grants []jobs.Grant `json:"grants"`
}

// maxDecisionBody bounds the body of POST /api/approvals/{id}.
const maxDecisionBody = 16 << 10

// approvalRoutes adds the approval routes to mux.
func (a *api) approvalRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/approvals", a.listApprovals)
	mux.HandleFunc("POST /api/approvals/{id}", a.decideApproval)
	mux.HandleFunc("GET /api/approvals/events", a.approvalEvents)
	mux.HandleFunc("GET /api/approvals/grants", a.listGrants)
	mux.HandleFunc("DELETE /api/approvals/grants/{id}", a.revokeGrant)
}

// approvalEvents serves GET /api/approvals/events: a Server-Sent Events
// stream of the namespace's approvals, "approval_asked" when a call is
// parked and "approval_answered" when it stops waiting (approved, denied,
// timed out or withdrawn), from the moment it is opened (GET
// /api/approvals gives the ones already waiting).
func (a *api) approvalEvents(w http.ResponseWriter, r *http.Request) {
	ns := a.cfg.Namespace(r.Context())
	release, ok := a.streams.Take(ns)
	if !ok {
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusTooManyRequests, "too_many_streams", fmt.Sprintf("namespace %q already has %d event streams open on this front-end, or the front-end serves %d: close one", ns, MaxNSStreams, MaxEventStreams), nil)
		return
	}
	defer release()
	serveSSE(r.Context(), w, "mcpexec approvals", func(ctx context.Context, emit func(jobs.ApprovalEvent) error) error {
		return a.be.FollowApprovals(ctx, ns, emit)
	}, func(ev jobs.ApprovalEvent) string { return "event: " + ev.Kind + "\n" })
}

func (a *api) listApprovals(w http.ResponseWriter, r *http.Request) {
	list, err := a.be.Approvals(r.Context(), a.cfg.Namespace(r.Context()))
	if err != nil {
		status, code, msg := httperr.Classify(err)
		writeError(w, status, code, msg, nil)
		return
	}
	httperr.WriteJSON(w, http.StatusOK, ApprovalsResponse{Approvals: list})
}

func (a *api) decideApproval(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxDecisionBody))
	if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
		writeError(w, http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("the body is over %d bytes: send {\"decision\", \"reason\"} with a short reason", tooLarge.Limit), nil)
		return
	}
	var q DecisionRequest
	if err == nil {
		err = decodeStrict(body, &q)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_json", "the body must be {\"decision\": \"approve\" | \"deny\", \"reason\": \"...\", \"scope\": \"call\" | \"job\" | \"namespace\", \"minutes\": n}: "+err.Error(), nil)
		return
	}
	if err := q.Validate(); err != nil {
		writeError(w, http.StatusBadRequest, "bad_answer", err.Error(), nil)
		return
	}
	ns := a.cfg.Namespace(r.Context())
	by := fmt.Sprintf("a jobs API caller of namespace %q", jobs.NamespaceOf(ns))
	got, grant, err := a.be.AnswerApproval(r.Context(), ns, r.PathValue("id"), q, by)
	if err != nil {
		status, code, msg := httperr.Classify(err)
		writeError(w, status, code, msg, nil)
		return
	}
	httperr.WriteJSON(w, http.StatusOK, DecisionResponse{Approval: got, Decision: q.Decision, Scope: cmp.Or(q.Scope, jobs.ScopeCall), DecidedBy: by, Reason: q.Reason, Grant: grant})
}

func (a *api) listGrants(w http.ResponseWriter, r *http.Request) {
	list, err := a.be.Grants(r.Context(), a.cfg.Namespace(r.Context()))
	if err != nil {
		status, code, msg := httperr.Classify(err)
		writeError(w, status, code, msg, nil)
		return
	}
	httperr.WriteJSON(w, http.StatusOK, GrantsResponse{Grants: list})
}

func (a *api) revokeGrant(w http.ResponseWriter, r *http.Request) {
	if err := a.be.RevokeGrant(r.Context(), a.cfg.Namespace(r.Context()), r.PathValue("id")); err != nil {
		status, code, msg := httperr.Classify(err)
		writeError(w, status, code, msg, nil)
		return
	}
	httperr.WriteJSON(w, http.StatusOK, map[string]bool{"revoked": true})
}
