package jobsapi

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/mcpexec/mcpexec/internal/audit"
	"github.com/mcpexec/mcpexec/internal/httperr"
)

// AuditBackend is the audit trail's reader, an ability beside jobs.Service
// (*frontend.Frontend has it). A Backend without it answers GET /api/audit
// with 404.
type AuditBackend interface {
	AuditEntries(ctx context.Context, namespace string, q audit.Query) ([]audit.View, string, error)
}

// Bounds of GET /api/audit.
const (
	DefaultAuditLimit = 100
	MaxAuditLimit     = 1000
	maxAuditParam     = 256
)

// AuditResponse is the answer of GET /api/audit: the caller's namespace's
// entries, newest first, and the cursor of the next page ("" at the end).
type AuditResponse struct {
	Entries []audit.View `json:"entries"`
	Next    string       `json:"next,omitempty"`
}

func (a *api) audit(w http.ResponseWriter, r *http.Request) {
	be, ok := a.be.(AuditBackend)
	if !ok {
		writeError(w, http.StatusNotFound, "not_found", "this front-end keeps no audit trail", nil)
		return
	}
	p := r.URL.Query()
	q := audit.Query{Job: p.Get("job"), Server: p.Get("server"), Tool: p.Get("tool"), Decision: p.Get("decision"), Cursor: p.Get("cursor"), Limit: DefaultAuditLimit}
	for name, v := range map[string]string{"job": q.Job, "server": q.Server, "tool": q.Tool, "decision": q.Decision, "cursor": q.Cursor} {
		if len(v) > maxAuditParam {
			writeError(w, http.StatusBadRequest, "bad_filter", fmt.Sprintf("%s is %d bytes, at most %d", name, len(v), maxAuditParam), nil)
			return
		}
	}
	if s := p.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxAuditLimit {
			writeError(w, http.StatusBadRequest, "bad_limit", fmt.Sprintf("limit %.20q must be a whole number from 1 to %d", s, MaxAuditLimit), nil)
			return
		}
		q.Limit = n
	}
	entries, next, err := be.AuditEntries(r.Context(), a.cfg.Namespace(r.Context()), q)
	if err != nil {
		status, code, msg := httperr.Classify(err)
		writeError(w, status, code, msg, nil)
		return
	}
	httperr.WriteJSON(w, http.StatusOK, AuditResponse{Entries: entries, Next: next})
}
