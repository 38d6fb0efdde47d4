package e2e

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/testutil"
)

// TestApprovalsOnPodmanWithReferenceServer: issue 25's case through a real
// fleet: the front-end binary (embedded broker, Podman worker, jobs API over
// HTTP) proxying the reference "everything" MCP server. A job's policy
// denies everything/echo (its code gets MCPError and goes on) and asks for
// everything/get-sum: the call is listed by GET /api/approvals, and
// approved after longer than the job's whole time limit, the job ends with
// the tool's answer (its wait was not charged to its timeout). A second job
// is denied the same way, with a reason, and handles the MCPError. The
// audit trail lists every call with its decision and who made it.
func TestApprovalsOnPodmanWithReferenceServer(t *testing.T) {
	modules := testutil.NodeModules(t)
	const token = "approvals-e2e-token-0123"
	fe := startAskingFrontend(t, "approvals-e2e", map[string]any{"everything": map[string]any{
		"command": "node", "args": []string{filepath.Join(modules, "node_modules/@modelcontextprotocol/server-everything/dist/index.js"), "stdio"}}},
		token, map[string]string{"everything/echo": "deny", "everything/get-sum": "ask"})
	base := "http://" + fe.addr
	code := `try:
    await call_tool("everything", "echo", {"message": "hi"})
except MCPError as e:
    print("MCPError:", e)
try:
    r = await call_tool("everything", "get-sum", {"a": 40, "b": 2})
    print("answer:", r)
except MCPError as e:
    print("MCPError:", e)`
	const limit = 3 // seconds: less than the wait for a person below
	submit := func(id string) {
		t.Helper()
		st, body := testutil.HTTPCall(t, token, "POST", base+"/api/jobs", map[string]any{"id": id, "code": code, "servers": []string{"everything"}, "timeout": limit})
		if st != http.StatusCreated {
			t.Fatalf("submit %s: %d %s", id, st, body)
		}
	}
	pending := func(id string) jobs.Approval {
		t.Helper()
		deadline := time.Now().Add(3 * time.Minute)
		for {
			st, body := testutil.HTTPCall(t, token, "GET", base+"/api/approvals", nil)
			var list struct {
				Approvals []jobs.Approval `json:"approvals"`
			}
			if st != http.StatusOK || json.Unmarshal(body, &list) != nil {
				t.Fatalf("list approvals: %d %s", st, body)
			}
			for _, ap := range list.Approvals {
				if ap.JobID == id {
					if ap.Server != "everything" || ap.Tool != "get-sum" || string(ap.Arguments) != `{"a":40,"b":2}` {
						t.Fatalf("listed %+v", ap)
					}
					return ap
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("job %s asked nothing within 3 minutes", id)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	result := func(id string) jobs.Record {
		t.Helper()
		for waited := time.Now(); ; {
			st, body := testutil.HTTPCall(t, token, "GET", base+"/api/jobs/"+id+"/wait?timeout=60s", nil)
			var rec jobs.Record
			if st != http.StatusOK || json.Unmarshal(body, &rec) != nil {
				t.Fatalf("wait %s: %d %s", id, st, body)
			}
			if rec.Status.Terminal() {
				return rec
			}
			if time.Since(waited) > 5*time.Minute {
				t.Fatalf("job %s still %s after 5 minutes", id, rec.Status)
			}
		}
	}
	denied := `MCPError: everything/echo is denied by namespace "asker"'s tool rule "everything/echo"`

	submit("approved")
	ap := pending("approved")
	time.Sleep(limit*time.Second + 2*time.Second) // a person takes longer than the job's whole limit
	if st, body := testutil.HTTPCall(t, token, "POST", base+"/api/approvals/"+ap.ID, map[string]any{"decision": "approve"}); st != http.StatusOK {
		t.Fatalf("approve: %d %s", st, body)
	}
	rec := result("approved")
	if rec.Status != jobs.StatusSuccess || !strings.Contains(rec.Result.Stdout, denied) || !strings.Contains(rec.Result.Stdout, "answer: The sum of 40 and 2 is 42") {
		t.Fatalf("approved job: %s %q %s", rec.Status, rec.Result.Stdout, rec.Result.Error)
	}

	submit("denied")
	ap = pending("denied")
	if st, body := testutil.HTTPCall(t, token, "POST", base+"/api/approvals/"+ap.ID, map[string]any{"decision": "deny", "reason": "not now"}); st != http.StatusOK {
		t.Fatalf("deny: %d %s", st, body)
	}
	rec = result("denied")
	if rec.Status != jobs.StatusSuccess || !strings.Contains(rec.Result.Stdout, "MCPError: everything/get-sum was denied by") || !strings.Contains(rec.Result.Stdout, "not now") {
		t.Fatalf("denied job: %s %q %s", rec.Status, rec.Result.Stdout, rec.Result.Error)
	}

	// The audit trail: each call, its decision, and who made it.
	for id, want := range map[string][]string{
		"approved": {"echo deny policy", "get-sum allow a jobs API caller"},
		"denied":   {"echo deny policy", "get-sum deny a jobs API caller"},
	} {
		var got []string
		deadline := time.Now().Add(time.Minute)
		for {
			st, body := testutil.HTTPCall(t, token, "GET", base+"/api/audit?job="+id, nil)
			var page struct {
				Entries []struct {
					Tool      string `json:"tool"`
					Decision  string `json:"decision"`
					DecidedBy string `json:"decided_by"`
				} `json:"entries"`
			}
			if st != http.StatusOK || json.Unmarshal(body, &page) != nil {
				t.Fatalf("audit of %s: %d %s", id, st, body)
			}
			got = got[:0]
			for _, e := range page.Entries {
				got = append(got, e.Tool+" "+e.Decision+" "+e.DecidedBy)
			}
			all := len(got) == len(want)
			for _, w := range want {
				all = all && strings.Contains(strings.Join(got, "\n"), w)
			}
			if all {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("audit of %s: %q, want entries with %q", id, got, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}
