package proxyresp_test

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/jobsapi"
	"github.com/mcpexec/mcpexec/internal/mcpclients"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/toolrules"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// approvalFleet is a broker, a worker on the process runtime, and two
// front-ends proxying the test server "ts", each serving the jobs API with
// tokens tok-a (namespace a) and tok-b (namespace b).
type approvalFleet struct {
	b    *broker.Broker
	urls [2]string
	fes  [2]*frontend.Frontend
}

func newApprovalFleet(t *testing.T, def frontend.Policy, policies map[string]frontend.Policy) *approvalFleet {
	t.Helper()
	b := testutil.Broker(t, "", queue.DefaultConfig())
	testutil.Worker(t, b, testutil.ProcessRuntime(t), worker.DefaultConfig("w1"))
	pool := testutil.Pool(t, mcpclients.Config{}, testutil.TestServerDef(t, "ts", nil))
	f := &approvalFleet{b: b}
	for i, id := range []string{"fe1", "fe2"} {
		fe := testutil.FrontendWith(t, b, frontend.Config{ID: id, Tools: pool, Policy: def, Policies: policies})
		f.fes[i] = fe
		api := jobsapi.New(jobsapi.Config{Backend: fe, Namespace: httpauth.Namespace})
		hs := httptest.NewServer(mcpserver.Handler(mcpserver.New(fe, mcpserver.Options{}), mcpserver.HTTPOptions{API: api, Auth: httpauth.New(httpauth.Config{Tokens: map[string]string{"tok-a": "a", "tok-b": "b", "tok-c": "c", "tok-d": "d"}})}))
		t.Cleanup(hs.Close)
		f.urls[i] = hs.URL
	}
	return f
}

// call sends a jobs API request to front-end i.
func (f *approvalFleet) call(t *testing.T, i int, token, method, path string, body any) (int, []byte) {
	t.Helper()
	return testutil.HTTPCall(t, token, method, f.urls[i]+path, body)
}

// approvalEvents follows namespace token's approval events on front-end i.
func (f *approvalFleet) approvalEvents(t *testing.T, i int, token string) <-chan jobs.ApprovalEvent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", f.urls[i]+"/api/approvals/events", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("approval events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	out := make(chan jobs.ApprovalEvent, 16)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); _ = resp.Body.Close(); <-done })
	go func() {
		defer close(done)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			var ev jobs.ApprovalEvent
			if json.Unmarshal([]byte(data), &ev) == nil {
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}

func decodeJSON[T any](t *testing.T, data []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("decode %s: %v", data, err)
	}
	return v
}

// submit submits a job of namespace token's through front-end 0.
func (f *approvalFleet) submit(t *testing.T, token, id, lang, code string) {
	t.Helper()
	f.submitTimeout(t, token, id, lang, code, 60)
}

// submitTimeout is submit with a time limit of timeout seconds.
func (f *approvalFleet) submitTimeout(t *testing.T, token, id, lang, code string, timeout int) {
	t.Helper()
	job := map[string]any{"id": id, "code": code, "servers": []string{"ts"}, "timeout": timeout}
	if lang != "" {
		job["language"] = lang
	}
	if st, body := f.call(t, 0, token, "POST", "/api/jobs", job); st != http.StatusCreated {
		t.Fatalf("submit %s: %d %s", id, st, body)
	}
}

// result waits for job id's end and returns its record.
func (f *approvalFleet) result(t *testing.T, token, id string) *jobs.Record {
	t.Helper()
	for waited := time.Now(); ; {
		st, body := f.call(t, 1, token, "GET", "/api/jobs/"+id+"/wait?timeout=60s", nil)
		rec := decodeJSON[jobs.Record](t, body)
		if st != http.StatusOK {
			t.Fatalf("wait %s: %d %s", id, st, body)
		}
		if rec.Status.Terminal() {
			return &rec
		}
		if time.Since(waited) > 5*time.Minute {
			t.Fatalf("job %s still %s after 5 minutes", id, rec.Status)
		}
	}
}

// pending lists namespace token's approvals through front-end i until n
// are waiting while job runs, and returns them.
func (f *approvalFleet) pending(t *testing.T, i int, token string, n int, job string) []jobs.Approval {
	t.Helper()
	for waited := time.Now(); ; {
		if time.Since(waited) > 3*time.Minute {
			t.Fatalf("fewer than %d approvals of namespace %s listed within 3 minutes", n, token)
		}
		if _, body := f.call(t, i, token, "GET", "/api/jobs/"+job, nil); n > 0 {
			if rec := decodeJSON[jobs.Record](t, body); rec.Status.Terminal() {
				t.Fatalf("job %s ended (%s) with fewer than %d approvals asked: %+v", job, rec.Status, n, rec.Result)
			}
		}
		st, body := f.call(t, i, token, "GET", "/api/approvals", nil)
		if st != http.StatusOK {
			t.Fatalf("list approvals: %d %s", st, body)
		}
		got := decodeJSON[jobsapi.ApprovalsResponse](t, body).Approvals
		if len(got) >= n {
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// rulesA: the test server's tools carry mcp-go's default annotations
// (destructiveHint true), so tool_defaults.destructive decides ts/echo.
var rulesA = map[string]frontend.Policy{"a": {Tools: map[string]string{"ts/fail": "deny", "ts/add": "ask"},
	ToolDefaults: &toolrules.Defaults{Destructive: "allow"}}}

// TestToolRulesAndApprovals: the end-to-end case through two
// front-ends of one fleet. A job of namespace a is denied ts/fail (its code
// catches MCPError and goes on), calls ts/echo (allowed by the annotation
// defaults), and asks for ts/add: the call is listed by the other
// front-end, approved there, and the job ends with the tool's answer. A
// second job's ask is denied with a reason, which its code handles. The
// same rules hold for JavaScript.
func TestToolRulesAndApprovals(t *testing.T) {
	t.Parallel()
	f := newApprovalFleet(t, frontend.Policy{}, rulesA)
	events := f.approvalEvents(t, 1, "tok-a")
	f.submit(t, "tok-a", "asks", "", `try:
    await mcp_ts.fail(message="x")
except MCPError as e:
    print("MCPError:", e)
print(await mcp_ts.echo(text="by annotations"))
r = await mcp_ts.add(a=2, b=3)
print("sum", r["sum"])`)
	list := f.pending(t, 1, "tok-a", 1, "asks")
	ap := list[0]
	if len(list) != 1 || ap.JobID != "asks" || ap.Server != "ts" || ap.Tool != "add" || string(ap.Arguments) != `{"a":2,"b":3}` || ap.Rule != "ts/add" || len(ap.ID) != 32 || ap.AskedAt.IsZero() {
		t.Fatalf("listed: %+v", list)
	}
	// b sees none of a's.
	if got := f.pending(t, 0, "tok-b", 0, "asks"); len(got) != 0 {
		t.Fatalf("b lists a's approvals: %+v", got)
	}
	st, body := f.call(t, 1, "tok-a", "POST", "/api/approvals/"+ap.ID, map[string]any{"decision": "approve", "reason": "fine"})
	if st != http.StatusOK || !strings.Contains(string(body), `"decision":"approve"`) {
		t.Fatalf("approve: %d %s", st, body)
	}
	// The event stream told of the call asked, and of its answer.
	for _, want := range []string{
		jobs.ApprovalAsked + " pending   " + ap.ID,
		jobs.ApprovalAnswered + " approved a jobs API caller of namespace \"a\" fine " + ap.ID,
	} {
		var ev jobs.ApprovalEvent
		select {
		case ev = <-events:
		case <-time.After(time.Minute):
			t.Fatalf("no %s event within a minute", want)
		}
		if got := strings.Join([]string{ev.Kind, ev.State, ev.DecidedBy, ev.Reason, ev.ID}, " "); got != want || ev.Tool != "add" {
			t.Fatalf("event %+v, want %s", ev, want)
		}
	}
	rec := f.result(t, "tok-a", "asks")
	want := "MCPError: ts/fail is denied by namespace \"a\"'s tool rule \"ts/fail\"\nby annotations\nsum 5"
	if rec.Status != jobs.StatusSuccess || strings.TrimSpace(rec.Result.Stdout) != want {
		t.Fatalf("job: %s\n%s\nwant:\n%s\nstderr: %s", rec.Status, rec.Result.Stdout, want, rec.Result.Stderr)
	}
	// The first answer won: a second one is a conflict, and says so.
	st, body = f.call(t, 0, "tok-a", "POST", "/api/approvals/"+ap.ID, map[string]any{"decision": "deny"})
	if st != http.StatusConflict || !strings.Contains(string(body), "already answered (approved by a jobs API caller of namespace") {
		t.Fatalf("second answer: %d %s", st, body)
	}

	f.submit(t, "tok-a", "denied", "", `try:
    await call_tool("ts", "add", {"a": 1, "b": 1})
except MCPError as e:
    print("MCPError:", e)
print("went on")`)
	ap = f.pending(t, 0, "tok-a", 1, "denied")[0]
	if st, body := f.call(t, 0, "tok-a", "POST", "/api/approvals/"+ap.ID, map[string]any{"decision": "deny", "reason": "not today"}); st != http.StatusOK {
		t.Fatalf("deny: %d %s", st, body)
	}
	rec = f.result(t, "tok-a", "denied")
	want = fmt.Sprintf("MCPError: ts/add was denied by a jobs API caller of namespace \"a\" (approval %s, tool rule \"ts/add\"): not today\nwent on", ap.ID)
	if rec.Status != jobs.StatusSuccess || strings.TrimSpace(rec.Result.Stdout) != want {
		t.Fatalf("denied job: %s\n%s\nwant:\n%s", rec.Status, rec.Result.Stdout, want)
	}

	// The audit trail names each call's decision and who made it.
	f.auditHas(t, "asks", `ts/fail deny policy`, `ts/echo allow policy`, `ts/add allow a jobs API caller of namespace "a"`)
	f.auditHas(t, "denied", `ts/add deny a jobs API caller of namespace "a"`)

	// JavaScript jobs go by the same rules (the responder knows no language).
	f.submit(t, "tok-a", "js", "javascript", `try { await mcp_ts.fail({message: "x"}) } catch (e) { console.log(e instanceof MCPError, e.message) }
console.log((await mcp_ts.add({a: 4, b: 4})).sum)`)
	ap = f.pending(t, 1, "tok-a", 1, "js")[0]
	if st, body := f.call(t, 1, "tok-a", "POST", "/api/approvals/"+ap.ID, map[string]any{"decision": "approve"}); st != http.StatusOK {
		t.Fatalf("approve js: %d %s", st, body)
	}
	rec = f.result(t, "tok-a", "js")
	want = "true ts/fail is denied by namespace \"a\"'s tool rule \"ts/fail\"\n8"
	if rec.Status != jobs.StatusSuccess || strings.TrimSpace(rec.Result.Stdout) != want {
		t.Fatalf("js job: %s\n%s\nwant:\n%s\n%s", rec.Status, rec.Result.Stdout, want, rec.Result.Stderr)
	}
}

// TestApprovalStopsTheClock: a job whose call waits for a person longer
// than its whole time limit is not timed out for it, in either language;
// once the call is answered its clock runs again, and code that then runs
// past what is left of the limit is timed out, the message saying how long
// its calls waited.
func TestApprovalStopsTheClock(t *testing.T) {
	t.Parallel()
	f := newApprovalFleet(t, frontend.Policy{}, rulesA)
	const limit = 3 // seconds
	for _, c := range []struct{ lang, code string }{
		{"", `r = await mcp_ts.add(a=2, b=3)
print("sum", r["sum"])`},
		{"javascript", `const r = await mcp_ts.add({a: 2, b: 3})
console.log("sum", r.sum)`},
	} {
		id := "slow-answer-" + cmp.Or(c.lang, "python")
		f.submitTimeout(t, "tok-a", id, c.lang, c.code, limit)
		ap := f.pending(t, 0, "tok-a", 1, id)[0]
		time.Sleep(limit*time.Second + 2*time.Second) // longer than the job's whole limit
		if st, body := f.call(t, 1, "tok-a", "POST", "/api/approvals/"+ap.ID, map[string]any{"decision": "approve"}); st != http.StatusOK {
			t.Fatalf("approve %s: %d %s", id, st, body)
		}
		if rec := f.result(t, "tok-a", id); rec.Status != jobs.StatusSuccess || strings.TrimSpace(rec.Result.Stdout) != "sum 5" {
			t.Fatalf("%s: %s %q %s", id, rec.Status, rec.Result.Stdout, rec.Result.Error)
		}
	}

	// The control: after the answer the clock runs again.
	f.submitTimeout(t, "tok-a", "runs-on", "", `import time
await mcp_ts.add(a=1, b=1)
print("answered", flush=True)
time.sleep(30)`, limit)
	ap := f.pending(t, 0, "tok-a", 1, "runs-on")[0]
	time.Sleep(2 * time.Second)
	if st, body := f.call(t, 0, "tok-a", "POST", "/api/approvals/"+ap.ID, map[string]any{"decision": "approve"}); st != http.StatusOK {
		t.Fatalf("approve: %d %s", st, body)
	}
	rec := f.result(t, "tok-a", "runs-on")
	if rec.Status != jobs.StatusTimeout || !strings.Contains(rec.Result.Stdout, "answered") ||
		!strings.Contains(rec.Result.Error, "timed out after 3s of running (its calls also waited") {
		t.Fatalf("runs-on: %s %q %q", rec.Status, rec.Result.Stdout, rec.Result.Error)
	}
}

// TestApprovalAttacks: each way an approval is received, from the
// attacker's side.
func TestApprovalAttacks(t *testing.T) {
	t.Parallel()
	f := newApprovalFleet(t, frontend.Policy{}, map[string]frontend.Policy{
		"a": {Tools: map[string]string{"ts/add": "ask"}},
		"c": {Tools: map[string]string{"ts/add": "ask"}, ApprovalTimeout: 1, MaxPendingApprovalsPerJob: 2, MaxPendingApprovals: 3},
		"d": {Tools: map[string]string{"ts/add": "ask"}, ApprovalTimeout: 60, MaxPendingApprovalsPerJob: 2, MaxPendingApprovals: 3},
	})
	// 10 MB of arguments never leave the sandbox: the frame limit ends the
	// job before any front-end sees the call.
	f.submit(t, "tok-a", "huge", "", `await call_tool("ts", "add", {"a": 1, "b": 1, "pad": "x" * (10 << 20)})`)
	if rec := f.result(t, "tok-a", "huge"); rec.Status != jobs.StatusError || !strings.Contains(rec.Result.Error, "over the 8392704-byte limit") {
		t.Fatalf("10 MB of arguments: %s %+v", rec.Status, rec.Result)
	}
	if got := f.pending(t, 0, "tok-a", 0, "huge"); len(got) != 0 {
		t.Fatalf("10 MB call parked: %+v", got)
	}
	f.submit(t, "tok-a", "victim", "", `print("first", (await mcp_ts.add(a=1, b=1))["sum"])
try:
    await mcp_ts.add(a=2, b=2)
except MCPError as e:
    print("second:", e)
try:
    await call_tool("ts", "add", {"a": 1, "b": 1, "pad": "x" * (6 << 20)})
except MCPError as e:
    print("big:", str(e)[:38])`)
	first := f.pending(t, 0, "tok-a", 1, "victim")[0]
	notFound := func(tok, id, why string) {
		t.Helper()
		st, body := f.call(t, 1, tok, "POST", "/api/approvals/"+id, map[string]any{"decision": "approve"})
		if want := fmt.Sprintf(`{"error":{"code":"not_found","message":"no such approval \"%s\""}}`, id); st != http.StatusNotFound || strings.TrimSpace(string(body)) != want {
			t.Fatalf("%s: %d %s, want 404 %s", why, st, body, want)
		}
	}
	// Another namespace's token learns nothing: the answer is the one for a
	// guessed id, word for word.
	notFound("tok-b", first.ID, "b answers a's approval")
	notFound("tok-a", strings.Repeat("ab", 16), "a guessed id")
	notFound("tok-a", "not-an-id", "a malformed id")
	if st, body := f.call(t, 1, "tok-a", "POST", "/api/approvals/"+first.ID, map[string]any{"decision": "maybe"}); st != http.StatusBadRequest {
		t.Fatalf("decision maybe: %d %s", st, body)
	}
	if st, body := f.call(t, 1, "tok-a", "POST", "/api/approvals/"+first.ID, `{"decision": "approve", "extra": 1}`); st != http.StatusBadRequest {
		t.Fatalf("unknown field: %d %s", st, body)
	}
	if st, body := f.call(t, 1, "tok-a", "POST", "/api/approvals/"+first.ID, map[string]any{"decision": "approve", "reason": strings.Repeat("r", 20_000)}); st != http.StatusRequestEntityTooLarge {
		t.Fatalf("huge reason: %d %s", st, body)
	}
	if st, body := f.call(t, 1, "tok-a", "POST", "/api/approvals/"+first.ID, map[string]any{"decision": "approve"}); st != http.StatusOK {
		t.Fatalf("approve: %d %s", st, body)
	}
	// The second call is a new approval: the first's id, replayed, answers
	// nothing (409), and the second still waits.
	second := f.pending(t, 1, "tok-a", 1, "victim")[0]
	if second.ID == first.ID || second.Arguments == nil || string(second.Arguments) != `{"a":2,"b":2}` {
		t.Fatalf("second: %+v", second)
	}
	if st, body := f.call(t, 0, "tok-a", "POST", "/api/approvals/"+first.ID, map[string]any{"decision": "approve"}); st != http.StatusConflict || !strings.Contains(string(body), "already answered") {
		t.Fatalf("replayed approval: %d %s", st, body)
	}
	if got := f.pending(t, 0, "tok-a", 1, "victim"); len(got) != 1 || got[0].ID != second.ID {
		t.Fatalf("after the replay: %+v", got)
	}
	if st, body := f.call(t, 0, "tok-a", "POST", "/api/approvals/"+second.ID, map[string]any{"decision": "deny", "reason": "replay test"}); st != http.StatusOK {
		t.Fatalf("deny: %d %s", st, body)
	}
	// 6 MiB of arguments: the listing shows 4 KiB of them, their size and
	// digest.
	var big jobs.Approval
	for waited := time.Now(); big.ID == "" || big.ID == second.ID; {
		if time.Since(waited) > 3*time.Minute {
			t.Fatal("the 6 MiB call was not listed within 3 minutes")
		}
		big = f.pending(t, 0, "tok-a", 1, "victim")[0]
	}
	st, body := f.call(t, 0, "tok-a", "GET", "/api/approvals", nil)
	if st != http.StatusOK || len(body) > 2*jobs.MaxApprovalArgs || !big.ArgumentsTruncated || big.ArgumentsBytes < 6<<20 || len(big.ArgumentsSHA256) != 64 {
		t.Fatalf("listing of a 6 MiB call: %d bytes, %+v", len(body), big.ArgumentsBytes)
	}
	if st, body := f.call(t, 0, "tok-a", "POST", "/api/approvals/"+big.ID, map[string]any{"decision": "deny"}); st != http.StatusOK {
		t.Fatalf("deny big: %d %s", st, body)
	}
	rec := f.result(t, "tok-a", "victim")
	want := fmt.Sprintf("first 2\nsecond: ts/add was denied by a jobs API caller of namespace \"a\" (approval %s, tool rule \"ts/add\"): replay test\nbig: ts/add was denied by a jobs API caller", second.ID)
	if got := strings.TrimSpace(rec.Result.Stdout); rec.Status != jobs.StatusSuccess || got != want {
		t.Fatalf("victim: %s\n%s\nwant:\n%s\n%s", rec.Status, got, want, rec.Result.Stderr)
	}

	// A job flooding asks: two wait (the job's cap), the others are refused
	// at once; nobody answers, so the two time out after a second, and an
	// answer then is told so. (On a loaded machine a call may reach the
	// front-end after the first two timed out, and wait in turn: no call is
	// ever answered by the tool, and at least one waits.)
	f.submit(t, "tok-c", "flood", "", `import asyncio
rs = await asyncio.gather(*[mcp_ts.add(a=i, b=0) for i in range(6)], return_exceptions=True)
over = sum("already has" in str(r) and "calls waiting for approval" in str(r) for r in rs)
timed = sum("nobody answered approval" in str(r) for r in rs)
print(over, timed, [str(r) for r in rs if "already" not in str(r) and "nobody" not in str(r)])`)
	parked := f.pending(t, 1, "tok-c", 1, "flood")[0]
	rec = f.result(t, "tok-c", "flood")
	var over, timed int
	var rest string
	if _, err := fmt.Sscanf(rec.Result.Stdout, "%d %d %s", &over, &timed, &rest); err != nil || rec.Status != jobs.StatusSuccess || over+timed != 6 || timed < 1 || rest != "[]" {
		t.Fatalf("flood: %s %q %s (%v)", rec.Status, rec.Result.Stdout, rec.Result.Stderr, err)
	}
	st, body = f.call(t, 1, "tok-c", "POST", "/api/approvals/"+parked.ID, map[string]any{"decision": "approve"})
	if st != http.StatusConflict || !strings.Contains(string(body), "timed out at") {
		t.Fatalf("answer after the timeout: %d %s", st, body)
	}
	// Two jobs of one namespace: the namespace's cap (3) holds across them.
	// Namespace d's asks wait a minute, so the four calls meet however slow
	// the machine: three wait, the fourth is refused at once, and the three
	// are denied once listed.
	for _, id := range []string{"ns-1", "ns-2"} {
		f.submit(t, "tok-d", id, "", `import asyncio
rs = await asyncio.gather(*[mcp_ts.add(a=i, b=0) for i in range(2)], return_exceptions=True)
print(sum("namespace \"d\" already has 3 calls waiting" in str(r) for r in rs), sum("was denied by" in str(r) for r in rs))`)
	}
	var waiting []jobs.Approval
	for deadline := time.Now().Add(time.Minute); len(waiting) < 3; time.Sleep(50 * time.Millisecond) {
		st, body := f.call(t, 0, "tok-d", "GET", "/api/approvals", nil)
		if st == http.StatusOK {
			waiting = decodeJSON[struct{ Approvals []jobs.Approval }](t, body).Approvals
		}
		if len(waiting) > 3 || time.Now().After(deadline) {
			t.Fatalf("namespace d's waiting calls: %d %s", st, body)
		}
	}
	for _, ap := range waiting {
		if st, body := f.call(t, 1, "tok-d", "POST", "/api/approvals/"+ap.ID, map[string]any{"decision": "deny"}); st != http.StatusOK {
			t.Fatalf("deny %s: %d %s", ap.ID, st, body)
		}
	}
	over, denied := 0, 0
	for _, id := range []string{"ns-1", "ns-2"} {
		rec := f.result(t, "tok-d", id)
		var o, d int
		if _, err := fmt.Sscanf(rec.Result.Stdout, "%d %d", &o, &d); err != nil {
			t.Fatalf("%s: %q %s", id, rec.Result.Stdout, rec.Result.Stderr)
		}
		over, denied = over+o, denied+d
	}
	if over != 1 || denied != 3 {
		t.Fatalf("namespace cap: %d over, %d denied; want 1 and 3", over, denied)
	}
}

// auditHas waits until the audit trail of job lists a call for each of want
// ("server/tool decision decided_by").
func (f *approvalFleet) auditHas(t *testing.T, job string, want ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, body := f.call(t, 0, "tok-a", "GET", "/api/audit?job="+job, nil)
		var page struct {
			Entries []struct {
				Server    string `json:"server"`
				Tool      string `json:"tool"`
				Decision  string `json:"decision"`
				DecidedBy string `json:"decided_by"`
			} `json:"entries"`
		}
		got := map[string]bool{}
		if st == http.StatusOK && json.Unmarshal(body, &page) == nil {
			for _, e := range page.Entries {
				got[e.Server+"/"+e.Tool+" "+e.Decision+" "+e.DecidedBy] = true
			}
		}
		missing := 0
		for _, w := range want {
			if !got[w] {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("audit of %s: %d %s, want %q", job, st, body, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// elicitor answers each elicitation with approve, and records the messages.
type elicitor struct {
	approve bool
	asked   chan string
}

func (e *elicitor) Elicit(_ context.Context, req mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	e.asked <- req.Params.Message
	res := &mcp.ElicitationResult{}
	res.Action = mcp.ElicitationResponseActionAccept
	res.Content = map[string]any{"approve": e.approve, "reason": "asked the user"}
	return res, nil
}

// TestApprovalByElicitation: a synchronous run_python of a 2025-11-25
// client that declared elicitation is asked about its job's parked call,
// and its answer decides it: accepted with approve, the code gets the
// tool's answer in the same call; with approve false, the code handles
// MCPError. The audit names who decided.
func TestApprovalByElicitation(t *testing.T) {
	t.Parallel()
	f := newApprovalFleet(t, frontend.Policy{}, rulesA)
	hs := httptest.NewServer(mcpserver.Handler(mcpserver.New(f.fes[0], mcpserver.Options{Namespace: httpauth.Namespace, Servers: func() []string { return []string{"ts"} }}),
		mcpserver.HTTPOptions{Auth: httpauth.New(httpauth.Config{Tokens: map[string]string{"tok-a": "a"}})}))
	t.Cleanup(hs.Close)
	for _, approve := range []bool{true, false} {
		el := &elicitor{approve: approve, asked: make(chan string, 4)}
		tr, err := transport.NewStreamableHTTP(hs.URL+"/mcp", transport.WithHTTPTimeout(2*time.Minute),
			transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer tok-a"}))
		if err != nil {
			t.Fatal(err)
		}
		c := client.NewClient(tr, client.WithElicitationHandler(el))
		t.Cleanup(func() { _ = c.Close() }) // the test is over with it
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		init := mcp.InitializeRequest{}
		init.Params.ProtocolVersion = "2025-11-25"
		init.Params.ClientInfo = mcp.Implementation{Name: "elicitor", Version: "0"}
		init.Params.Capabilities.Elicitation = &mcp.ElicitationCapability{}
		if _, err := c.Initialize(ctx, init); err != nil {
			t.Fatal(err)
		}
		res := testutil.CallTool(t, c, mcpserver.ToolName, map[string]any{"code": `try:
    r = await mcp_ts.add(a=20, b=22)
    print("sum", r["sum"])
except MCPError as e:
    print("MCPError:", e)`, "timeout": 60, "servers": []string{"ts"}})
		out := strings.TrimSpace(testutil.Text(res))
		var msg string
		select {
		case msg = <-el.asked:
		default:
			t.Fatalf("approve=%v: the client was never asked; the call gave %s", approve, out)
		}
		if !strings.Contains(msg, "ts/add") || !strings.Contains(msg, `{"a":20,"b":22}`) {
			t.Fatalf("asked %q", msg)
		}
		want := "sum 42"
		if !approve {
			want = "MCPError: ts/add was denied by " + mcpserver.ElicitedBy
		}
		if res.IsError || !strings.Contains(out, want) {
			t.Fatalf("approve=%v: %s, want %q", approve, out, want)
		}
	}
}
