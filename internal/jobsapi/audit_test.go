package jobsapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/mcpexec/mcpexec/internal/audit"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/jobsapi"
	"github.com/mcpexec/mcpexec/internal/mcpclients"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/tracing"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// auditCode calls three tools: one with secrets in its arguments, one that
// fails (a tool error the code catches), and one with 8 MB of arguments.
const auditCode = `print(await mcp_ts.echo(text='hi ghp_abcdefgh12345678', password='hunter2', ssn='078-05-1120'))
try:
    await mcp_ts.fail(message='boom')
except MCPError:
    print('caught')
print(await mcp_ts.add(a=1, b=2, blob='x' * 8_000_000))
`

// TestAuditListsEveryCall: a Python job (process sandbox) calls a real
// stdio MCP server through the front-end; GET /api/audit lists each call,
// newest first, with its caller, digest, redacted preview and outcome; 10 MB
// of arguments are digested and clipped; filters and cursors work; another
// namespace's token sees none of it.
func TestAuditListsEveryCall(t *testing.T) {
	t.Parallel()
	b := testutil.Broker(t, "", queue.DefaultConfig())
	testutil.Worker(t, b, testutil.ProcessRuntime(t), worker.DefaultConfig("w"))
	pool := testutil.Pool(t, mcpclients.Config{}, testutil.TestServerDef(t, "ts", nil))
	def := frontend.DefaultPolicy()
	spans := tracing.NewRecorder(1000, 0)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) }) // in memory: nothing to lose
	fe := testutil.FrontendWith(t, b, frontend.Config{ID: "fe", Tools: pool, Policy: def, Tracing: tp,
		Policies: map[string]frontend.Policy{"a": frontend.Policy{Redact: &audit.Redaction{Names: []string{"ssn"}, Patterns: []string{`ghp_[A-Za-z0-9]+`}}}.Inherit(def)}})
	api := jobsapi.New(jobsapi.Config{Backend: fe, Namespace: httpauth.Namespace})
	hs := httptest.NewServer(mcpserver.Handler(mcpserver.New(fe, mcpserver.Options{}),
		mcpserver.HTTPOptions{API: api, Auth: httpauth.New(httpauth.Config{Tokens: map[string]string{"tok-a": "a", "tok-b": "b"}})}))
	t.Cleanup(hs.Close)
	e := env{url: hs.URL}

	st, body := e.call(t, "tok-a", "POST", "/api/jobs", map[string]any{"id": "calls", "code": auditCode, "servers": []string{"ts"}, "timeout": 60})
	if st != http.StatusCreated {
		t.Fatalf("submit: %d %s", st, body)
	}
	st, body = e.call(t, "tok-a", "GET", "/api/jobs/calls/wait?timeout=60s", nil)
	rec := decode[jobs.Record](t, body)
	if st != 200 || rec.Status != jobs.StatusSuccess || !strings.HasPrefix(rec.Result.Stdout, "hi ghp_abcdefgh12345678\ncaught\n") || !strings.Contains(rec.Result.Stdout, "sum") {
		t.Fatalf("job: %d %s", st, body)
	}
	if !strings.HasPrefix(rec.Job.SubmittedBy, "token:") || strings.Contains(rec.Job.SubmittedBy, "tok-a") {
		t.Fatalf("submitted_by %q", rec.Job.SubmittedBy)
	}
	// Entries are written asynchronously: wait until the three are listed.
	var got jobsapi.AuditResponse
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st, body = e.call(t, "tok-a", "GET", "/api/audit?job=calls", nil)
		got = decode[jobsapi.AuditResponse](t, body)
		if st == 200 && len(got.Entries) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("audit: %d %s", st, body)
		}
	}
	add, fail, echo := got.Entries[0], got.Entries[1], got.Entries[2]
	for i, v := range got.Entries {
		if v.JobID != "calls" || v.Namespace != "a" || v.Server != "ts" || v.Attempt != 1 || v.Decision != audit.DecisionAllow ||
			v.DecidedBy != audit.DecidedByPolicy || v.Caller != rec.Job.SubmittedBy || v.Frontend != "fe" || v.Proof != "" || v.Index == 0 || len(v.Hash) != 64 {
			t.Errorf("entry %d: %+v", i, v)
		}
	}
	if echo.Tool != "echo" || echo.Outcome != audit.OutcomeOK || echo.Index+1 != fail.Index || fail.Index+1 != add.Index || fail.Prev != echo.Hash {
		t.Errorf("echo entry %+v", echo)
	}
	for _, secret := range []string{"hunter2", "078-05-1120", "ghp_abcdefgh12345678"} {
		if strings.Contains(string(body), secret) {
			t.Errorf("the audit shows %q: %s", secret, echo.Args)
		}
	}
	if !strings.Contains(echo.Args, `"text":"hi [redacted]"`) {
		t.Errorf("echo preview %s", echo.Args)
	}
	if fail.Tool != "fail" || fail.Outcome != audit.OutcomeToolError || !strings.Contains(fail.Error, "boom") {
		t.Errorf("fail entry %+v", fail)
	}
	if add.Tool != "add" || add.Outcome != audit.OutcomeOK || add.ArgsBytes < 8_000_000 || len(add.Args) > audit.PreviewBytes || !add.ArgsClipped || len(add.ArgsSHA256) != 64 {
		t.Errorf("add entry: %d bytes, preview %d, clipped %v", add.ArgsBytes, len(add.Args), add.ArgsClipped)
	}
	if len(body) > 16<<10 {
		t.Errorf("the answer holds %d bytes: the 8 MB argument was stored", len(body))
	}
	// Filters and a cursor of one entry per page.
	_, body = e.call(t, "tok-a", "GET", "/api/audit?tool=fail&decision=allow", nil)
	if r := decode[jobsapi.AuditResponse](t, body); len(r.Entries) != 1 || r.Entries[0].Tool != "fail" {
		t.Errorf("tool filter: %s", body)
	}
	cursor, pages := "", 0
	for ; pages < 10; pages++ {
		_, body = e.call(t, "tok-a", "GET", "/api/audit?limit=1&cursor="+cursor, nil)
		r := decode[jobsapi.AuditResponse](t, body)
		if len(r.Entries) > 1 {
			t.Fatalf("page of %d", len(r.Entries))
		}
		if r.Next == "" {
			break
		}
		cursor = r.Next
	}
	if pages != 2 && pages != 3 {
		t.Errorf("3 entries in %d pages", pages+1)
	}
	if st, _ = e.call(t, "tok-a", "GET", "/api/audit?limit=5000", nil); st != http.StatusBadRequest {
		t.Errorf("limit 5000: %d", st)
	}
	// Another namespace sees none of it, by job id, filter or cursor.
	for _, q := range []string{"", "?job=calls", "?server=ts", "?cursor=4", "?tool=echo"} {
		st, body = e.call(t, "tok-b", "GET", "/api/audit"+q, nil)
		if r := decode[jobsapi.AuditResponse](t, body); st != 200 || len(r.Entries) != 0 || r.Next != "" {
			t.Errorf("b lists %q: %d %s", q, st, body)
		}
	}
	if st, _ = e.call(t, "", "GET", "/api/audit", nil); st != http.StatusUnauthorized {
		t.Errorf("no token: %d", st)
	}
	// The front-end's span of each call names server, tool and decision.
	seen := map[string]bool{}
	for _, s := range spans.Trace(rec.TraceID) {
		if s.Name == tracing.SpanProxyHandle && s.Attrs[string(tracing.AttrMethod)] == "call_tool" {
			a := s.Attrs
			if a[string(tracing.AttrServer)] != "ts" || a[string(tracing.AttrDecision)] != audit.DecisionAllow || a[string(tracing.AttrDecidedBy)] != audit.DecidedByPolicy {
				t.Errorf("span attributes %v", a)
			}
			seen[a[string(tracing.AttrTool)]] = true
		}
	}
	if !seen["echo"] || !seen["fail"] || !seen["add"] {
		t.Errorf("call spans of tools %v", seen)
	}
}
