package jobsapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/mcpexec/mcpexec/internal/httperr"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

// Approvals is what the approval routes need of a front-end;
// *frontend.Frontend is one. Every method works within one namespace.
type Approvals interface {
	Approvals(ctx context.Context, namespace string) ([]jobs.Approval, error)
	DecideApproval(ctx context.Context, namespace, id, decision, by, reason string) (jobs.Approval, error)
}

// ApprovalsResponse is the body of GET /api/approvals.
type ApprovalsResponse struct {
	Approvals []jobs.Approval `json:"approvals"`
}

// DecisionRequest is the body of POST /api/approvals/{id}.
type DecisionRequest struct {
	Decision string `json:"decision"`
	Reason   string `json:"reason,omitempty"`
}

// DecisionResponse answers POST /api/approvals/{id}: the call, and the
// answer recorded.
type DecisionResponse struct {
	jobs.Approval
	Decision  string `json:"decision"`
	DecidedBy string `json:"decided_by"`
	Reason    string `json:"reason,omitempty"`
}

// maxDecisionBody bounds the body of POST /api/approvals/{id}.
const maxDecisionBody = 16 << 10

// approvalRoutes adds the approval routes to mux.
func (a *api) approvalRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/approvals", a.listApprovals)
	mux.HandleFunc("POST /api/approvals/{id}", a.decideApproval)
	mux.HandleFunc("GET /api/approvals/events", a.approvalEvents)
}

// ApprovalFollower is the optional ability to stream approvals as they are
// asked and answered; *frontend.Frontend has it.
type ApprovalFollower interface {
	FollowApprovals(ctx context.Context, namespace string, fn func(jobs.ApprovalEvent) error) error
}

// approvalEvents serves GET /api/approvals/events: a Server-Sent Events
// stream of the namespace's approvals, "approval_asked" when a call is
// parked and "approval_answered" when it stops waiting (approved, denied,
// timed out or withdrawn), from the moment it is opened (GET
// /api/approvals gives the ones already waiting).
func (a *api) approvalEvents(w http.ResponseWriter, r *http.Request) {
	ap := a.approvalsBackend(w)
	if ap == nil {
		return
	}
	fol, ok := ap.(ApprovalFollower)
	if !ok {
		writeError(w, http.StatusNotImplemented, "unsupported", "this front-end does not stream approvals", nil)
		return
	}
	ns := a.cfg.Namespace(r.Context())
	release, ok := a.streams.Take(ns)
	if !ok {
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusTooManyRequests, "too_many_streams", fmt.Sprintf("namespace %q already has %d event streams open on this front-end, or the front-end serves %d: close one", ns, MaxNSStreams, MaxEventStreams), nil)
		return
	}
	defer release()
	serveSSE(r.Context(), w, "mcpexec approvals", func(ctx context.Context, emit func(jobs.ApprovalEvent) error) error {
		return fol.FollowApprovals(ctx, ns, emit)
	}, func(ev jobs.ApprovalEvent) string { return "event: " + ev.Kind + "\n" })
}

// approvalsBackend is the configured Approvals, else the Backend when it is
// one, else nil.
func (a *api) approvalsBackend(w http.ResponseWriter) Approvals {
	if a.cfg.Approvals != nil {
		return a.cfg.Approvals
	}
	if ap, ok := a.be.(Approvals); ok {
		return ap
	}
	writeError(w, http.StatusNotImplemented, "unsupported", "this front-end does not serve approvals", nil)
	return nil
}

func (a *api) listApprovals(w http.ResponseWriter, r *http.Request) {
	ap := a.approvalsBackend(w)
	if ap == nil {
		return
	}
	list, err := ap.Approvals(r.Context(), a.cfg.Namespace(r.Context()))
	if err != nil {
		status, code, msg := httperr.Classify(err)
		writeError(w, status, code, msg, nil)
		return
	}
	httperr.WriteJSON(w, http.StatusOK, ApprovalsResponse{Approvals: list})
}

func (a *api) decideApproval(w http.ResponseWriter, r *http.Request) {
	ap := a.approvalsBackend(w)
	if ap == nil {
		return
	}
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
		writeError(w, http.StatusBadRequest, "bad_json", "the body must be {\"decision\": \"approve\" | \"deny\", \"reason\": \"...\"}: "+err.Error(), nil)
		return
	}
	ns := a.cfg.Namespace(r.Context())
	by := fmt.Sprintf("a jobs API caller of namespace %q", jobs.NamespaceOf(ns))
	got, err := ap.DecideApproval(r.Context(), ns, r.PathValue("id"), q.Decision, by, q.Reason)
	if err != nil {
		status, code, msg := httperr.Classify(err)
		writeError(w, status, code, msg, nil)
		return
	}
	httperr.WriteJSON(w, http.StatusOK, DecisionResponse{Approval: got, Decision: q.Decision, DecidedBy: by, Reason: q.Reason})
}
