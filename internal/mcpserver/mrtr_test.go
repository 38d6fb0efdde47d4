package mcpserver_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/testutil/testenv"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// TestInputRequiredRun: a synchronous run_python of a 2026-07-28 client that
// declared elicitation returns input_required when a call of its job parks,
// with a form elicitation keyed by the approval id and a requestState; the
// retry with the answer decides the call and waits for the same job. Retries
// with a forged, foreign or stale state, or answers to calls it was not
// asked, decide nothing and say what to do.
func TestInputRequiredRun(t *testing.T) {
	b := testutil.Broker(t, "", queue.DefaultConfig())
	testutil.Worker(t, b, testutil.NewFakeRuntime(64), worker.DefaultConfig("w1"))
	d := &approvalsDouble{Frontend: testutil.Frontend(t, b, "fe1"), pending: map[string]map[string]jobs.Approval{}, decided: map[string][3]string{}}
	url := serveTasksWith(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run := func(token string, extra map[string]any) modernReply {
		p := map[string]any{"name": "run_python", "arguments": map[string]any{"code": "block"}}
		for k, v := range extra {
			p[k] = v
		}
		return modernReq{token: token, method: "tools/call", elicits: true, params: p}.post(t, url)
	}
	// The calls that wait run on goroutines of their own, whose t.Fatal ends
	// only that goroutine: their answers are received with a bound.
	first := make(chan modernReply, 1)
	go func() { first <- run("token-alpha", nil) }()
	var job string
	for waited := time.Now(); job == ""; {
		if time.Since(waited) > time.Minute {
			t.Fatal("the blocking job was not running within a minute")
		}
		recs, _, err := d.List(ctx, "alpha", jobs.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.Status == jobs.StatusRunning {
				job = r.Job.ID
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	d.park("alpha", jobs.Approval{ID: "ap-1", JobID: job, Server: "ts", Tool: "add", Arguments: json.RawMessage(`{"a":1,"b":2}`), Rule: "ts/add", AskedAt: time.Now()})
	d.park("alpha", jobs.Approval{ID: "ap-other", JobID: "another-job", Server: "ts", Tool: "add", AskedAt: time.Now()})
	got := testenv.Receive(t, first, 3*time.Minute, "the first call").ok(t)
	asks, _ := got["inputRequests"].(map[string]any)
	ask, _ := asks["ap-1"].(map[string]any)
	params, _ := ask["params"].(map[string]any)
	state, _ := got["requestState"].(string)
	if got["resultType"] != "input_required" || len(asks) != 1 || ask["method"] != "elicitation/create" ||
		!strings.Contains(params["message"].(string), `ts/add with {"a":1,"b":2}`) || state == "" {
		t.Fatalf("first answer %v", got)
	}
	approve := map[string]any{"action": "accept", "content": map[string]any{"approve": true, "reason": "fine"}}
	toolError := func(r modernReply, contains string) {
		t.Helper()
		res := r.ok(t)
		content, _ := res["content"].([]any)
		if res["isError"] != true || len(content) == 0 || !strings.Contains(content[0].(map[string]any)["text"].(string), contains) {
			t.Fatalf("want a tool error containing %q, got %v", contains, res)
		}
	}
	// Forged states, another namespace's, and answers to calls not asked.
	toolError(run("token-alpha", map[string]any{"requestState": "forged", "inputResponses": map[string]any{"ap-1": approve}}), "requestState is not one this server issued")
	toolError(run("token-alpha", map[string]any{"requestState": "mcpexec-run.1." + strings.Repeat("A", 9000)}), "requestState is not one this server issued")
	toolError(run("token-beta", map[string]any{"requestState": state, "inputResponses": map[string]any{"ap-1": approve}}), "not found")
	d.mu.Lock()
	if len(d.decided) != 0 {
		t.Fatalf("decided by forged retries: %v", d.decided)
	}
	d.mu.Unlock()

	// The retry with the answer decides the call, then waits for the job;
	// an answer to a call it was not asked about is ignored.
	retry := make(chan modernReply, 1)
	go func() {
		retry <- run("token-alpha", map[string]any{"requestState": state, "inputResponses": map[string]any{"ap-1": approve, "ap-other": approve}})
	}()
	for waited := time.Now(); ; {
		if time.Since(waited) > time.Minute {
			t.Fatal("the retry did not decide the call within a minute")
		}
		d.mu.Lock()
		dec, n := d.decided["ap-1"], len(d.decided)
		d.mu.Unlock()
		if n > 0 {
			if dec != [3]string{"approve", mcpserver.ElicitedBy, "fine"} || n != 1 {
				t.Fatalf("decided %v", d.decided)
			}
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case r := <-retry:
		t.Fatalf("the retry returned before its job ended: %s", r.raw)
	case <-time.After(300 * time.Millisecond):
	}
	if err := d.Cancel(ctx, "alpha", job, "the test"); err != nil {
		t.Fatal(err)
	}
	res := testenv.Receive(t, retry, 3*time.Minute, "the retry").ok(t)
	if res["resultType"] == "input_required" || !strings.Contains(string(mustJSON(t, res)), "cancelled") {
		t.Fatalf("the retry's result %v", res)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
