package proxyresp_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/jobsapi"
)

// TestApprovalGrants: an approval widened to the job lets that job's later
// calls of the tool through unasked, but no other job's; one widened to
// the namespace for N minutes lets every job's through, on every
// front-end, until it is revoked. The audit names the grant, and who made
// it, as the decider. Answers that widen wrongly, and another namespace's
// token, are refused.
func TestApprovalGrants(t *testing.T) {
	t.Parallel()
	f := newApprovalFleet(t, frontend.Policy{}, rulesA)
	const loop = `for i in range(3):
    print((await mcp_ts.add(a=i, b=1))["sum"])`

	f.submit(t, "tok-a", "g1", "", loop)
	ap := f.pending(t, 1, "tok-a", 1, "g1")[0]
	for _, c := range []struct {
		body any
		want string
	}{
		{map[string]any{"decision": "approve", "scope": "forever"}, `scope \"forever\": want \"call\" (the default), \"job\" or \"namespace\"`},
		{map[string]any{"decision": "deny", "scope": "job"}, `a denial answers its one call only`},
		{map[string]any{"decision": "approve", "scope": "namespace"}, `minutes 0: a namespace grant lasts 1 to 120 minutes`},
		{map[string]any{"decision": "approve", "scope": "namespace", "minutes": 121}, `minutes 121: a namespace grant lasts 1 to 120 minutes`},
		{map[string]any{"decision": "approve", "scope": "namespace", "minutes": -5}, `minutes -5`},
		{map[string]any{"decision": "approve", "scope": "job", "minutes": 5}, `minutes is for scope \"namespace\" only`},
		{map[string]any{"decision": "approve", "scope": "namespace", "minutes": "5"}, `cannot unmarshal string`},
		{map[string]any{"decision": "approve", "scope": "namespace", "minutes": 1e12}, `minutes 1000000000000: a namespace grant`},
		{map[string]any{"decision": "approve", "scope": "namespace", "minutes": 1e30}, `cannot unmarshal number`},
	} {
		if st, body := f.call(t, 0, "tok-a", "POST", "/api/approvals/"+ap.ID, c.body); st != http.StatusBadRequest || !strings.Contains(string(body), c.want) {
			t.Errorf("%v: %d %s, want 400 with %s", c.body, st, body, c.want)
		}
	}
	// Another namespace cannot widen a's approval either: the same 404 as a
	// guessed id.
	if st, body := f.call(t, 0, "tok-b", "POST", "/api/approvals/"+ap.ID, map[string]any{"decision": "approve", "scope": "namespace", "minutes": 120}); st != http.StatusNotFound {
		t.Fatalf("b widens a's approval: %d %s", st, body)
	}
	st, body := f.call(t, 0, "tok-a", "POST", "/api/approvals/"+ap.ID, map[string]any{"decision": "approve", "scope": "job", "reason": "a loop"})
	res := decodeJSON[jobsapi.DecisionResponse](t, body)
	if st != http.StatusOK || res.Scope != "job" || res.Grant == nil || res.Grant.Scope != "job" || res.Grant.JobID != "g1" || res.Grant.Tool != "add" || res.Grant.Approval != ap.ID {
		t.Fatalf("approve for the job: %d %s", st, body)
	}
	// The job's two later calls go through unasked: nobody answers them.
	if rec := f.result(t, "tok-a", "g1"); rec.Status != jobs.StatusSuccess || rec.Result.Stdout != "1\n2\n3\n" {
		t.Fatalf("g1: %s %q %s", rec.Status, rec.Result.Stdout, rec.Result.Stderr)
	}
	jobGrant := fmt.Sprintf(`ts/add allow a grant by a jobs API caller of namespace "a" (scope job, approval %s)`, ap.ID)
	f.auditHas(t, "g1", `ts/add allow a jobs API caller of namespace "a"`, jobGrant)

	// Another job is asked again: a job grant is its job's alone.
	f.submit(t, "tok-a", "g2", "", loop)
	ap2 := f.pending(t, 0, "tok-a", 1, "g2")[0]
	st, body = f.call(t, 1, "tok-a", "POST", "/api/approvals/"+ap2.ID, map[string]any{"decision": "approve", "scope": "namespace", "minutes": 30})
	res = decodeJSON[jobsapi.DecisionResponse](t, body)
	if st != http.StatusOK || res.Grant == nil || res.Grant.Scope != "namespace" || res.Grant.JobID != "" || res.Grant.ExpiresAt.Sub(res.Grant.GrantedAt).Minutes() != 30 {
		t.Fatalf("approve for the namespace: %d %s", st, body)
	}
	nsGrant := res.Grant.ID
	if rec := f.result(t, "tok-a", "g2"); rec.Status != jobs.StatusSuccess || rec.Result.Stdout != "1\n2\n3\n" {
		t.Fatalf("g2: %s %q %s", rec.Status, rec.Result.Stdout, rec.Result.Stderr)
	}
	// A third job asks nobody (the grant was made on the other front-end).
	f.submit(t, "tok-a", "g3", "", loop)
	if rec := f.result(t, "tok-a", "g3"); rec.Status != jobs.StatusSuccess || rec.Result.Stdout != "1\n2\n3\n" {
		t.Fatalf("g3: %s %q %s", rec.Status, rec.Result.Stdout, rec.Result.Stderr)
	}
	f.auditHas(t, "g3", fmt.Sprintf(`ts/add allow a grant by a jobs API caller of namespace "a" (scope namespace, approval %s)`, ap2.ID))

	// The grants in force, the latest to end first; b sees none and cannot revoke a's.
	st, body = f.call(t, 1, "tok-a", "GET", "/api/approvals/grants", nil)
	if gs := decodeJSON[jobsapi.GrantsResponse](t, body).Grants; st != http.StatusOK || len(gs) != 2 || gs[0].Scope != "job" || gs[1].ID != nsGrant {
		t.Fatalf("grants: %d %s", st, body)
	}
	if st, body := f.call(t, 0, "tok-b", "GET", "/api/approvals/grants", nil); st != http.StatusOK || strings.TrimSpace(string(body)) != `{"grants":[]}` {
		t.Fatalf("b's grants: %d %s", st, body)
	}
	for _, c := range []struct{ tok, id string }{{"tok-b", nsGrant}, {"tok-a", strings.Repeat("cd", 16)}, {"tok-a", "x.y"}} {
		want := fmt.Sprintf(`{"error":{"code":"not_found","message":"no such grant \"%s\""}}`, c.id)
		if st, body := f.call(t, 0, c.tok, "DELETE", "/api/approvals/grants/"+c.id, nil); st != http.StatusNotFound || strings.TrimSpace(string(body)) != want {
			t.Fatalf("%s revokes %s: %d %s", c.tok, c.id, st, body)
		}
	}
	// Revoked, the namespace's calls ask again.
	if st, body := f.call(t, 0, "tok-a", "DELETE", "/api/approvals/grants/"+nsGrant, nil); st != http.StatusOK {
		t.Fatalf("revoke: %d %s", st, body)
	}
	f.submit(t, "tok-a", "g4", "", `try:
    await mcp_ts.add(a=1, b=1)
except MCPError as e:
    print("MCPError:", e)`)
	ap4 := f.pending(t, 1, "tok-a", 1, "g4")[0]
	if st, body := f.call(t, 1, "tok-a", "POST", "/api/approvals/"+ap4.ID, map[string]any{"decision": "deny", "reason": "revoked"}); st != http.StatusOK {
		t.Fatalf("deny: %d %s", st, body)
	}
	if rec := f.result(t, "tok-a", "g4"); rec.Status != jobs.StatusSuccess || !strings.Contains(rec.Result.Stdout, "MCPError: ts/add was denied by") {
		t.Fatalf("g4: %s %q %s", rec.Status, rec.Result.Stdout, rec.Result.Stderr)
	}
}
