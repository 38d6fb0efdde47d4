package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/mcpexec/mcpexec/internal/audit"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/state"
)

// AuditEntries lists namespace ns's audit entries newest first, one page of
// at most q.Limit, and the cursor of the next page. Job ids (in q and in the
// entries) are the namespace's own; no other namespace's entry is ever read:
// the state service is asked for ns's chain only.
func (f *Frontend) AuditEntries(ctx context.Context, ns string, q audit.Query) ([]audit.View, string, error) {
	ns = jobs.NamespaceOf(ns)
	flt := state.AuditFilter{Namespace: ns, Server: q.Server, Tool: q.Tool, Decision: q.Decision, Cursor: q.Cursor, Limit: q.Limit}
	if q.Job != "" {
		flt.Job = jobs.ScopedID(ns, q.Job)
	}
	recs, next, err := f.state.AuditList(ctx, flt)
	if err != nil {
		if errors.Is(err, state.ErrUnavailable) {
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return nil, "", err
	}
	out := make([]audit.View, 0, len(recs))
	for _, r := range recs {
		v := audit.View{Index: r.Index, Hash: r.Hash, Prev: r.Prev}
		if err := json.Unmarshal(r.Entry, &v.Entry); err != nil || v.Namespace != ns {
			continue // the state service filters by namespace; never show another's
		}
		v.Proof = ""
		if id, ok := jobs.UnscopedID(ns, v.JobID); ok {
			v.JobID = id
		}
		out = append(out, v)
	}
	return out, next, nil
}
