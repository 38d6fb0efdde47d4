package jobsapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/jobsapi"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/submit"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/testutil/testenv"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// workflowEnv is a broker, a worker on the fake runtime ("sleep 20ms" takes
// that long, "sleep x" fails, "block" runs until cancelled) and a front-end
// serving the API for namespaces a and b.
func workflowEnv(t *testing.T) env {
	t.Helper()
	b := testutil.Broker(t, "", queue.DefaultConfig())
	wc := worker.DefaultConfig("w")
	wc.Slots = 8
	wc.Grace = 100 * time.Millisecond
	testutil.Worker(t, b, testutil.NewFakeRuntime(1000), wc)
	fe := testutil.Frontend(t, b, "fe")
	api := jobsapi.New(jobsapi.Config{Backend: fe, Namespace: httpauth.Namespace})
	hs := httptest.NewServer(mcpserver.Handler(mcpserver.New(fe, mcpserver.Options{}),
		mcpserver.HTTPOptions{API: api, Auth: httpauth.New(httpauth.Config{Tokens: map[string]string{"tok-a": "a", "tok-b": "b"}})}))
	t.Cleanup(hs.Close)
	return env{url: hs.URL}
}

// waitWorkflow polls GET /api/workflows/{id} until no job is left to run.
func waitWorkflow(t *testing.T, e env, id string) jobsapi.Workflow {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := e.call(t, "tok-a", "GET", "/api/workflows/"+id, nil)
		var wf jobsapi.Workflow
		if code != http.StatusOK || json.Unmarshal(body, &wf) != nil {
			t.Fatalf("get workflow: %d %s", code, body)
		}
		if wf.Status != "running" {
			return wf
		}
		if time.Now().After(deadline) {
			t.Fatalf("workflow %s still running: %v", id, wf.Counts)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func byID(wf jobsapi.Workflow) map[string]*jobs.Record {
	m := map[string]*jobs.Record{}
	for _, it := range wf.Jobs {
		m[it.Job.ID] = it.Record
	}
	return m
}

func TestWorkflowDiamond(t *testing.T) {
	e := workflowEnv(t)
	const fan = 40
	req := jobsapi.WorkflowRequest{ID: "diamond"}
	var mids []string
	// The join comes first in the request: the front-end orders submissions.
	req.Jobs = append(req.Jobs, jobsapi.JobRequest{ID: "join", Code: "join"})
	for i := range fan {
		id := fmt.Sprintf("mid-%02d", i)
		mids = append(mids, id)
		req.Jobs = append(req.Jobs, jobsapi.JobRequest{ID: id, Code: "sleep 20ms", After: []string{"root"}})
	}
	req.Jobs[0].After = mids
	req.Jobs = append(req.Jobs, jobsapi.JobRequest{ID: "root", Code: "sleep 50ms"})
	code, body := e.call(t, "tok-a", "POST", "/api/workflows", req)
	if code != http.StatusCreated {
		t.Fatalf("submit: %d %s", code, body)
	}
	var created jobsapi.Workflow
	_ = json.Unmarshal(body, &created)
	if created.ID != "diamond" || created.Counts["waiting"] != fan+1 || created.Counts["queued"] != 1 {
		t.Fatalf("created %+v", created.Counts)
	}
	wf := waitWorkflow(t, e, "diamond")
	if wf.Status != "success" || wf.Counts["success"] != fan+2 || len(wf.Jobs) != fan+2 {
		t.Fatalf("workflow %s %v", wf.Status, wf.Counts)
	}
	recs := byID(wf)
	root, join := recs["root"], recs["join"]
	for _, m := range mids {
		r := recs[m]
		if r.StartedAt.Before(*root.FinishedAt) || join.StartedAt.Before(*r.FinishedAt) {
			t.Fatalf("%s ran out of order: root finished %v, it ran %v..%v, join started %v", m, root.FinishedAt, r.StartedAt, r.FinishedAt, join.StartedAt)
		}
		if r.Job.Labels[jobsapi.WorkflowLabel] != "diamond" {
			t.Fatalf("labels %v", r.Job.Labels)
		}
	}
	// The same workflow again is the same workflow.
	if code, body := e.call(t, "tok-a", "POST", "/api/workflows", req); code != http.StatusOK {
		t.Fatalf("resubmit: %d %s", code, body)
	}
	// Another namespace has no such workflow.
	if code, _ := e.call(t, "tok-b", "GET", "/api/workflows/diamond", nil); code != http.StatusNotFound {
		t.Fatalf("namespace b sees a's workflow: %d", code)
	}
}

// A failed parent skips exactly its descendants through after; after_any
// children run whatever the parent's outcome.
func TestWorkflowFailureSkipsDescendants(t *testing.T) {
	e := workflowEnv(t)
	req := jobsapi.WorkflowRequest{ID: "fails", Jobs: []jobsapi.JobRequest{
		{ID: "a", Code: "ok"},
		{ID: "b", Code: "sleep x", After: []string{"a"}}, // fails
		{ID: "c", Code: "c", After: []string{"b"}},
		{ID: "d", Code: "d", After: []string{"c", "a"}},
		{ID: "cleanup", Code: "cleanup", AfterAny: []string{"b"}},
		{ID: "f", Code: "f", After: []string{"a"}},
		{ID: "g", Code: "g", After: []string{"cleanup"}, AfterAny: []string{"d"}},
	}}
	if code, body := e.call(t, "tok-a", "POST", "/api/workflows", req); code != http.StatusCreated {
		t.Fatalf("submit: %d %s", code, body)
	}
	wf := waitWorkflow(t, e, "fails")
	recs := byID(wf)
	want := map[string]jobs.Status{"a": "success", "b": "error", "c": "skipped", "d": "skipped", "cleanup": "success", "f": "success", "g": "success"}
	for id, st := range want {
		if recs[id].Status != st {
			t.Errorf("%s: %s, want %s (%+v)", id, recs[id].Status, st, recs[id].Result)
		}
	}
	if got := recs["c"].Result.Error; got != "parent b ended error" {
		t.Errorf("c's reason: %q", got)
	}
	if got := recs["d"].Result.Error; got != "parent c ended skipped" {
		t.Errorf("d's reason: %q", got)
	}
	if wf.Status != "failed" {
		t.Errorf("workflow status %s", wf.Status)
	}
}

func TestWorkflowRefusals(t *testing.T) {
	e := workflowEnv(t)
	for _, c := range []struct {
		name     string
		jobs     []jobsapi.JobRequest
		contains string
	}{
		{"cycle", []jobsapi.JobRequest{{ID: "x", Code: "1", After: []string{"z"}}, {ID: "y", Code: "1", After: []string{"x"}}, {ID: "z", Code: "1", AfterAny: []string{"y"}}}, "cycle: x → z → y → x"},
		{"unknown parent", []jobsapi.JobRequest{{ID: "x", Code: "1"}, {ID: "y", Code: "1", After: []string{"nope"}}}, "parent nope is not a job of this namespace"},
		{"self", []jobsapi.JobRequest{{ID: "x", Code: "1", After: []string{"x"}}}, "names itself"},
		{"twice", []jobsapi.JobRequest{{ID: "p", Code: "1"}, {ID: "x", Code: "1", After: []string{"p"}, AfterAny: []string{"p"}}}, "named twice"},
		{"bad id", []jobsapi.JobRequest{{ID: "x", Code: "1", After: []string{"../etc"}}}, "is not a job id"},
		{"invalid parent", []jobsapi.JobRequest{{ID: "p", Code: ""}, {ID: "x", Code: "1", After: []string{"p"}}}, "code is required"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, body := e.call(t, "tok-a", "POST", "/api/workflows", jobsapi.WorkflowRequest{ID: "wf-" + strings.ReplaceAll(c.name, " ", "-"), Jobs: c.jobs})
			if code != http.StatusBadRequest || !strings.Contains(string(body), c.contains) {
				t.Fatalf("%d %s, want 400 with %q", code, body, c.contains)
			}
			for _, j := range c.jobs {
				if code, _ := e.call(t, "tok-a", "GET", "/api/jobs/"+j.ID, nil); code != http.StatusNotFound {
					t.Fatalf("job %s of a refused workflow was submitted: %d", j.ID, code)
				}
			}
		})
	}
	// Another namespace's job is not a parent.
	if code, body := e.call(t, "tok-b", "POST", "/api/jobs", jobsapi.JobRequest{ID: "theirs", Code: "1"}); code != http.StatusCreated {
		t.Fatalf("%d %s", code, body)
	}
	if code, body := e.call(t, "tok-a", "POST", "/api/jobs", jobsapi.JobRequest{ID: "mine", Code: "1", After: []string{"theirs"}}); code != http.StatusBadRequest || !strings.Contains(string(body), "not a job of this namespace") {
		t.Fatalf("a parent of namespace b: %d %s", code, body)
	}
}

// A job waits for a running parent, can be cancelled while waiting, and a
// job submitted after its parent ended runs at once.
func TestWaitingJobs(t *testing.T) {
	e := workflowEnv(t)
	mustCode := func(code int, body []byte, want int) {
		t.Helper()
		if code != want {
			t.Fatalf("%d %s, want %d", code, body, want)
		}
	}
	code, body := e.call(t, "tok-a", "POST", "/api/jobs", jobsapi.JobRequest{ID: "blocker", Code: "block"})
	mustCode(code, body, http.StatusCreated)
	code, body = e.call(t, "tok-a", "POST", "/api/jobs", jobsapi.JobRequest{ID: "waits", Code: "1", After: []string{"blocker"}})
	mustCode(code, body, http.StatusCreated)
	var rec jobs.Record
	_ = json.Unmarshal(body, &rec)
	if rec.Status != jobs.StatusWaiting || rec.Job.After[0] != "blocker" {
		t.Fatalf("submitted %+v", rec)
	}
	code, body = e.call(t, "tok-a", "GET", "/api/jobs?status=waiting", nil)
	mustCode(code, body, http.StatusOK)
	if !strings.Contains(string(body), `"id":"waits"`) {
		t.Fatalf("waiting list %s", body)
	}
	code, body = e.call(t, "tok-a", "POST", "/api/jobs/waits/cancel", nil)
	mustCode(code, body, http.StatusOK)
	code, body = e.call(t, "tok-a", "POST", "/api/jobs/blocker/cancel", nil)
	mustCode(code, body, http.StatusOK)
	code, body = e.call(t, "tok-a", "POST", "/api/jobs", jobsapi.JobRequest{ID: "late", Code: "late", AfterAny: []string{"blocker", "waits"}})
	mustCode(code, body, http.StatusCreated)
	code, body = e.call(t, "tok-a", "GET", "/api/jobs/late/wait?timeout=10s", nil)
	mustCode(code, body, http.StatusOK)
	var late jobs.Record
	if _ = json.Unmarshal(body, &late); late.Status != jobs.StatusSuccess {
		t.Fatalf("late %+v", late)
	}
	code, body = e.call(t, "tok-a", "GET", "/api/jobs/waits", nil)
	mustCode(code, body, http.StatusOK)
	var waits jobs.Record
	if _ = json.Unmarshal(body, &waits); waits.Status != jobs.StatusCancelled || waits.StartedAt != nil {
		t.Fatalf("cancelled waiting job %+v", waits)
	}
}

// TestSubmitCommandAfter: `frontend submit` takes after in its JSONL, in any
// line order, with batches of one; a cycle in the file is refused before
// anything is submitted.
func TestSubmitCommandAfter(t *testing.T) {
	e := workflowEnv(t)
	in := `{"id": "last", "code": "3", "after": ["middle"]}
{"id": "middle", "code": "sleep x", "after_any": ["first"]}
{"id": "first", "code": "1"}
{"id": "never", "code": "4", "after": ["middle"]}
`
	reqs, err := submit.ReadJobs(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	var out, status bytes.Buffer
	c := submit.Config{URL: e.url, Token: "tok-a", Batch: 1, Concurrency: 2, Wait: 5 * time.Second}
	sum, err := c.Submit(testenv.Context(t, 3*time.Minute), reqs, &out, &status)
	if err != nil || sum.Done != 4 || sum.Succeeded != 1 {
		t.Fatalf("submit: %+v %v\n%s", sum, err, out.String())
	}
	got := map[string]jobs.Status{}
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		rec := decode[jobs.Record](t, []byte(l))
		got[rec.Job.ID] = rec.Status
	}
	if got["first"] != "success" || got["middle"] != "error" || got["last"] != "skipped" || got["never"] != "skipped" {
		t.Fatalf("results %v", got)
	}
	cyclic, _ := submit.ReadJobs(strings.NewReader("{\"id\": \"p\", \"code\": \"1\", \"after\": [\"q\"]}\n{\"id\": \"q\", \"code\": \"1\", \"after\": [\"p\"]}\n"))
	if _, err := c.Submit(context.Background(), cyclic, &out, &status); err == nil || !strings.Contains(err.Error(), "cycle") {
		t.Fatalf("cycle: %v", err)
	}
	if code, _ := e.call(t, "tok-a", "GET", "/api/jobs/p", nil); code != http.StatusNotFound {
		t.Fatalf("a job of a cyclic file was submitted: %d", code)
	}
}

// BenchmarkWorkflowEdges measures what an edge costs on one broker with a
// fake runtime (jobs end at once): along a chain of 20 jobs, the time from a
// parent's end to its child's start (release latency, per edge); across a
// fan-out of 200, the time from the root's end to the last child's start,
// divided by the edges.
func BenchmarkWorkflowEdges(b *testing.B) {
	br := testutil.Broker(b, "", queue.DefaultConfig())
	wc := worker.DefaultConfig("w")
	wc.Slots = 16
	testutil.Worker(b, br, testutil.NewFakeRuntime(1), wc)
	fe := testutil.Frontend(b, br, "fe")
	const chain, fan = 20, 200
	var perChainEdge, perFanEdge []time.Duration
	for n := range b.N {
		var js []*jobs.Job
		for i := range chain {
			j := &jobs.Job{ID: fmt.Sprintf("c%d-%d", n, i), Code: "ok"}
			if i > 0 {
				j.After = []string{fmt.Sprintf("c%d-%d", n, i-1)}
			}
			js = append(js, j)
		}
		root := fmt.Sprintf("r%d", n)
		js = append(js, &jobs.Job{ID: root, Code: "ok"})
		for i := range fan {
			js = append(js, &jobs.Job{ID: fmt.Sprintf("f%d-%d", n, i), Code: "ok", After: []string{root}})
		}
		for _, s := range fe.SubmitWorkflow(context.Background(), js, "bench") {
			if s.Err != nil {
				b.Fatal(s.Err)
			}
		}
		recs := map[string]*jobs.Record{}
		for _, j := range js {
			rec, err := fe.Wait(context.Background(), "bench", j.ID)
			if err != nil || rec.Status != jobs.StatusSuccess {
				b.Fatalf("%s: %v %+v", j.ID, err, rec)
			}
			recs[j.ID] = rec
		}
		for i := 1; i < chain; i++ {
			p, c := recs[fmt.Sprintf("c%d-%d", n, i-1)], recs[fmt.Sprintf("c%d-%d", n, i)]
			perChainEdge = append(perChainEdge, c.StartedAt.Sub(*p.FinishedAt))
		}
		var last time.Time
		for i := range fan {
			if s := *recs[fmt.Sprintf("f%d-%d", n, i)].StartedAt; s.After(last) {
				last = s
			}
		}
		perFanEdge = append(perFanEdge, last.Sub(*recs[root].FinishedAt)/fan)
	}
	slices.Sort(perChainEdge)
	slices.Sort(perFanEdge)
	b.ReportMetric(float64(perChainEdge[len(perChainEdge)/2].Microseconds())/1000, "chain-edge-p50-ms")
	b.ReportMetric(float64(perFanEdge[len(perFanEdge)/2].Microseconds())/1000, "fanout-edge-ms")
}

// TestWorkflowSkipFirst: a state service whose first decision is a skip
// (no release before it) records it: the skip carries its proof.
func TestWorkflowSkipFirst(t *testing.T) {
	e := workflowEnv(t)
	req := jobsapi.WorkflowRequest{ID: "skip-first", Jobs: []jobsapi.JobRequest{
		{ID: "a", Code: "sleep x"}, {ID: "b", Code: "b", After: []string{"a"}},
	}}
	if code, body := e.call(t, "tok-a", "POST", "/api/workflows", req); code != http.StatusCreated {
		t.Fatalf("submit: %d %s", code, body)
	}
	if recs := byID(waitWorkflow(t, e, "skip-first")); recs["b"].Status != jobs.StatusSkipped {
		t.Fatalf("b: %+v", recs["b"])
	}
}
