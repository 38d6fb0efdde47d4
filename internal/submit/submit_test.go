package submit_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/jobsapi"
	"github.com/mcpexec/mcpexec/internal/mcpclients"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/submit"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/testutil/testenv"
	"github.com/mcpexec/mcpexec/internal/toolrules"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// TestSubmitShowsApprovals: a batch whose jobs call a tool the namespace's
// rules ask about prints, while it waits, which job waits for which call
// and the commands that answer it; answering as printed lets one job
// finish with the tool's answer and makes the other's code handle
// MCPError, and the answers are printed too. The token is never printed,
// and another namespace's run prints nothing of these approvals.
func TestSubmitShowsApprovals(t *testing.T) {
	b := testutil.Broker(t, "", queue.DefaultConfig())
	testutil.Worker(t, b, testutil.ProcessRuntime(t), worker.DefaultConfig("w"))
	pool := testutil.Pool(t, mcpclients.Config{}, testutil.TestServerDef(t, "ts", nil))
	fe := testutil.FrontendWith(t, b, frontend.Config{ID: "fe", Tools: pool, Policies: map[string]frontend.Policy{
		"a": {Tools: map[string]string{"ts/add": "ask"}, ToolDefaults: &toolrules.Defaults{Destructive: "allow"}}}})
	api := jobsapi.New(jobsapi.Config{Backend: fe, Namespace: httpauth.Namespace})
	hs := httptest.NewServer(mcpserver.Handler(mcpserver.New(fe, mcpserver.Options{}), mcpserver.HTTPOptions{API: api, Auth: httpauth.New(httpauth.Config{Tokens: map[string]string{"secret-token-of-a": "a", "secret-token-of-b": "b"}})}))
	t.Cleanup(hs.Close)

	// Namespace b runs a job at the same time: its run must print nothing
	// of a's approvals.
	var bStatus testenv.Buffer
	bDone := make(chan error, 1)
	bCtx := testenv.Context(t, 3*time.Minute)
	go func() {
		c := submit.Config{URL: hs.URL, Token: "secret-token-of-b", Batch: 10, Concurrency: 4, Wait: 5 * time.Second}
		_, err := c.Submit(bCtx, []jobsapi.JobRequest{{ID: "b-job", Code: "import time\ntime.sleep(1)\nprint('b')"}}, &bytes.Buffer{}, &bStatus)
		bDone <- err
	}()

	var status testenv.Buffer
	var out bytes.Buffer
	c := submit.Config{URL: hs.URL, Token: "secret-token-of-a", Batch: 10, Concurrency: 4, Wait: 5 * time.Second}
	reqs := []jobsapi.JobRequest{
		{ID: "approve-me", Code: "r = await mcp_ts.add(a=2, b=3)\nprint('sum', r['sum'])", Servers: []string{"ts"}, Timeout: 120},
		{ID: "deny-me", Code: "try:\n    await mcp_ts.add(a=1, b=1)\nexcept MCPError as e:\n    print('MCPError:', e)", Servers: []string{"ts"}, Timeout: 120},
	}
	type result struct {
		sum submit.Summary
		err error
	}
	done := make(chan result, 1)
	ctx := testenv.Context(t, 3*time.Minute)
	go func() {
		sum, err := c.Submit(ctx, reqs, &out, &status)
		done <- result{sum, err}
	}()
	// Each job's approval is printed with the command that answers it.
	asked := regexp.MustCompile(`job (\S+) waits for approval ([0-9a-f]{32}): ts/add (\{.*\}) \(tool rule "ts/add"; denied unless answered by`)
	approve := regexp.MustCompile(`approve: curl -sS -H "Authorization: Bearer \$MCPEXEC_TOKEN" -H 'Content-Type: application/json' -d '\{"decision": "approve"\}' (\S+)`)
	var got map[string]string // job → approval id
	urls := map[string]bool{}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		text := status.String()
		got = map[string]string{}
		for _, m := range asked.FindAllStringSubmatch(text, -1) {
			got[m[1]] = m[2]
		}
		for _, m := range approve.FindAllStringSubmatch(text, -1) {
			urls[m[1]] = true
		}
		if len(got) == 2 && len(urls) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the approvals were not printed within a minute:\n%s", text)
		}
	}
	for job, id := range got {
		if want := hs.URL + "/api/approvals/" + id; !urls[want] {
			t.Fatalf("no approve command for %s (%s):\n%s", job, want, status.String())
		}
	}
	// Answer as printed (the token from the environment).
	answer := func(id, body string) {
		t.Helper()
		if st, resp := testutil.HTTPCall(t, "secret-token-of-a", "POST", hs.URL+"/api/approvals/"+id, json.RawMessage(body)); st != http.StatusOK {
			t.Fatalf("answer %s: %d %s", id, st, resp)
		}
	}
	answer(got["approve-me"], `{"decision": "approve"}`)
	answer(got["deny-me"], `{"decision": "deny", "reason": "not in this batch"}`)
	var res result
	select {
	case res = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("the run did not end:\n%s", status.String())
	}
	if res.err != nil || res.sum.Succeeded != 2 {
		t.Fatalf("run: %+v %v\n%s", res.sum, res.err, status.String())
	}
	recs := map[string]jobs.Record{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var rec jobs.Record
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		recs[rec.Job.ID] = rec
	}
	if r := recs["approve-me"]; r.Result == nil || r.Result.Stdout != "sum 5\n" {
		t.Errorf("approved job: %+v", r.Result)
	}
	if r := recs["deny-me"]; r.Result == nil || !strings.Contains(r.Result.Stdout, "MCPError: ts/add was denied by") || !strings.Contains(r.Result.Stdout, "not in this batch") {
		t.Errorf("denied job: %+v", r.Result)
	}
	text := status.String()
	for _, want := range []string{
		"job approve-me: approval " + got["approve-me"] + " (ts/add) approved by a jobs API caller of namespace \"a\"\n",
		"job deny-me: approval " + got["deny-me"] + " (ts/add) denied by a jobs API caller of namespace \"a\": not in this batch\n",
		`{"a":2,"b":3}`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the status lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "secret-token") {
		t.Errorf("the token was printed:\n%s", text)
	}
	if err := testenv.Receive(t, bDone, 3*time.Minute, "namespace b's run"); err != nil || strings.Contains(bStatus.String(), "approval") {
		t.Errorf("namespace b's run: %v\n%s", err, bStatus.String())
	}
}
