package jobsapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/jobsapi"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/submit"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/testutil/testenv"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// gate is a runtime whose jobs wait for release (or their cancellation).
type gate struct{ release chan struct{} }

func (g gate) Run(ctx context.Context, job sandbox.Job, _ sandbox.Host) (sandbox.Result, error) {
	if strings.HasPrefix(job.Code, "wait") {
		select {
		case <-g.release:
		case <-ctx.Done():
			return sandbox.Result{Status: sandbox.StatusError}, nil
		}
	}
	return sandbox.Result{Status: sandbox.StatusSuccess, Stdout: "ran " + job.Code}, nil
}
func (gate) Close() error { return nil }

type env struct {
	url     string
	release chan struct{}
}

// setup starts a broker, a worker on the gate runtime, and a front-end whose
// jobs API is served behind mcpserver's guard with two tokens (namespaces a, b).
func setup(t *testing.T, withWorker bool) env {
	t.Helper()
	q := queue.DefaultConfig()
	q.MaxQueued = 50
	b := testutil.Broker(t, "", q)
	g := gate{release: make(chan struct{})}
	t.Cleanup(func() { close(g.release) })
	if withWorker {
		wc := worker.DefaultConfig("w")
		wc.Queue = q
		wc.FetchWait = 200 * time.Millisecond
		wc.Grace = 100 * time.Millisecond
		testutil.Worker(t, b, g, wc)
	}
	fe := testutil.Frontend(t, b, "fe")
	api := jobsapi.New(jobsapi.Config{Backend: fe, Namespace: httpauth.Namespace})
	srv := mcpserver.New(fe, mcpserver.Options{})
	hs := httptest.NewServer(mcpserver.Handler(srv, mcpserver.HTTPOptions{API: api, Auth: httpauth.New(httpauth.Config{Tokens: map[string]string{"tok-a": "a", "tok-b": "b"}})}))
	t.Cleanup(hs.Close)
	return env{url: hs.URL, release: g.release}
}

func (e env) call(t *testing.T, token, method, path string, body any) (int, []byte) {
	t.Helper()
	return testutil.HTTPCall(t, token, method, e.url+path, body)
}

func decode[T any](t *testing.T, data []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("decode %s: %v", data, err)
	}
	return v
}

func TestJobsAPI(t *testing.T) {
	t.Parallel()
	e := setup(t, true)

	// Submit one, then the same again (no-op), then a conflicting one.
	st, body := e.call(t, "tok-a", "POST", "/api/jobs", map[string]any{"id": "api-1", "code": "print(1)", "labels": map[string]string{"batch": "x"}})
	if st != http.StatusCreated {
		t.Fatalf("submit: %d %s", st, body)
	}
	st, body = e.call(t, "tok-a", "POST", "/api/jobs", map[string]any{"id": "api-1", "code": "print(1)", "labels": map[string]string{"batch": "x"}})
	if it := decode[jobsapi.Item](t, body); st != http.StatusOK || !it.Existing {
		t.Fatalf("resubmit: %d %s", st, body)
	}
	st, body = e.call(t, "tok-a", "POST", "/api/jobs", map[string]any{"id": "api-1", "code": "print(2)"})
	if er := decode[jobsapi.ErrorResponse](t, body); st != http.StatusConflict || er.Error.Code != "conflict" || er.Job == nil {
		t.Fatalf("conflict: %d %s", st, body)
	}

	// Wait for it.
	st, body = e.call(t, "tok-a", "GET", "/api/jobs/api-1/wait?timeout=10s", nil)
	if rec := decode[jobs.Record](t, body); st != 200 || rec.Status != jobs.StatusSuccess || rec.Result.Stdout != "ran print(1)" || rec.Job.Namespace != "a" {
		t.Fatalf("wait: %d %s", st, body)
	}
	// Another namespace cannot see it.
	if st, body = e.call(t, "tok-b", "GET", "/api/jobs/api-1", nil); st != http.StatusNotFound {
		t.Fatalf("other namespace: %d %s", st, body)
	}
	if st, _ = e.call(t, "", "GET", "/api/jobs/api-1", nil); st != http.StatusUnauthorized {
		t.Fatalf("no token: %d", st)
	}

	// A batch: validated as a whole first.
	st, body = e.call(t, "tok-a", "POST", "/api/jobs", []map[string]any{{"code": "ok"}, {"code": ""}})
	if er := decode[jobsapi.ErrorResponse](t, body); st != 400 || !strings.Contains(er.Error.Message, "job 1") {
		t.Fatalf("bad batch: %d %s", st, body)
	}
	st, body = e.call(t, "tok-a", "POST", "/api/jobs", []map[string]any{{"id": "api-2", "code": "a", "labels": map[string]string{"batch": "x"}}, {"id": "api-3", "code": "wait"}})
	items := decode[[]jobsapi.Item](t, body)
	if st != 200 || len(items) != 2 || items[0].Job.ID != "api-2" || items[1].Status != jobs.StatusQueued {
		t.Fatalf("batch: %d %s", st, body)
	}
	e.call(t, "tok-a", "GET", "/api/jobs/api-2/wait?timeout=10s", nil)

	// Listing with filters and paging.
	st, body = e.call(t, "tok-a", "GET", "/api/jobs?label=batch=x&status=success&limit=1", nil)
	page := decode[jobsapi.ListResponse](t, body)
	if st != 200 || len(page.Jobs) != 1 || page.Jobs[0].Job.ID != "api-1" || page.Next == "" {
		t.Fatalf("list page 1: %d %s", st, body)
	}
	st, body = e.call(t, "tok-a", "GET", "/api/jobs?label=batch=x&status=success&limit=1&cursor="+page.Next, nil)
	page = decode[jobsapi.ListResponse](t, body)
	if st != 200 || len(page.Jobs) != 1 || page.Jobs[0].Job.ID != "api-2" {
		t.Fatalf("list page 2: %d %s", st, body)
	}
	if _, body = e.call(t, "tok-b", "GET", "/api/jobs", nil); len(decode[jobsapi.ListResponse](t, body).Jobs) != 0 {
		t.Fatalf("namespace b sees jobs: %s", body)
	}
	if st, _ = e.call(t, "tok-a", "GET", "/api/jobs?status=bogus", nil); st != 400 {
		t.Fatalf("bad status filter: %d", st)
	}

	// Cancel the running one; cancelling again is a conflict.
	testutilWaitStatus(t, e, "api-3", jobs.StatusRunning)
	st, body = e.call(t, "tok-a", "POST", "/api/jobs/api-3/cancel", nil)
	if rec := decode[jobs.Record](t, body); st != 200 || rec.Status != jobs.StatusCancelled {
		t.Fatalf("cancel: %d %s", st, body)
	}
	if st, _ = e.call(t, "tok-a", "POST", "/api/jobs/api-3/cancel", nil); st != http.StatusConflict {
		t.Fatalf("cancel again: %d", st)
	}
	if st, _ = e.call(t, "tok-a", "POST", "/api/jobs/nope/cancel", nil); st != http.StatusNotFound {
		t.Fatalf("cancel unknown: %d", st)
	}
	// Re-run it under a chosen id.
	st, body = e.call(t, "tok-a", "POST", "/api/jobs/api-3/retry", map[string]string{"id": "api-3-again"})
	if it := decode[jobsapi.Item](t, body); st != http.StatusCreated || it.Job.RetryOf != "api-3" || it.Job.ID != "api-3-again" {
		t.Fatalf("retry: %d %s", st, body)
	}
	if st, body = e.call(t, "tok-a", "GET", "/api/deadletters", nil); st != 200 {
		t.Fatalf("dead letters: %d %s", st, body)
	}
	if st, _ = e.call(t, "tok-a", "GET", "/api/jobs/bad%20id", nil); st != 400 {
		t.Fatalf("bad id: %d", st)
	}
	if st, _ = e.call(t, "tok-a", "POST", "/api/jobs", `{"code": "x", "bogus": 1}`); st != 400 {
		t.Fatalf("unknown field: %d", st)
	}
}

func TestQueueFullAndDeadLetterRetry(t *testing.T) {
	t.Parallel()
	e := setup(t, false)
	var batch []map[string]any
	for range 50 {
		batch = append(batch, map[string]any{"code": "x"})
	}
	if st, body := e.call(t, "tok-a", "POST", "/api/jobs", batch); st != 200 {
		t.Fatalf("fill: %d %s", st, body)
	}
	st, body := e.call(t, "tok-a", "POST", "/api/jobs", map[string]any{"id": "full-1", "code": "x"})
	if er := decode[jobsapi.ErrorResponse](t, body); st != http.StatusServiceUnavailable || er.Error.Code != "queue_full" || er.Job.Status != jobs.StatusRejected {
		t.Fatalf("full: %d %s", st, body)
	}
	testutilWaitStatus(t, e, "full-1", jobs.StatusRejected)
	st, body = e.call(t, "tok-a", "GET", "/api/deadletters", nil)
	if page := decode[jobsapi.ListResponse](t, body); st != 200 || len(page.Jobs) != 1 || page.Jobs[0].Job.ID != "full-1" {
		t.Fatalf("dead letters: %d %s", st, body)
	}
}

// TestSubmitCommand pushes a JSONL file through the API with the submit
// command's logic and reads back one result line per job.
func TestSubmitCommand(t *testing.T) {
	t.Parallel()
	e := setup(t, true)
	in := "{\"id\": \"s-1\", \"code\": \"one\"}\n\n{\"code\": \"two\", \"labels\": {\"k\": \"v\"}}\n"
	reqs, err := submit.ReadJobs(strings.NewReader(in))
	if err != nil || len(reqs) != 2 || reqs[1].ID == "" {
		t.Fatalf("read: %+v %v", reqs, err)
	}
	var out, status bytes.Buffer
	c := submit.Config{URL: e.url, Token: "tok-a", Batch: 1, Concurrency: 2, Wait: 5 * time.Second, Progress: 10 * time.Millisecond}
	sum, err := c.Submit(testenv.Context(t, 3*time.Minute), reqs, &out, &status)
	if err != nil || sum.Succeeded != 2 || sum.Failed != 0 {
		t.Fatalf("submit: %+v %v", sum, err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(status.String(), "done 2") {
		t.Fatalf("output %q status %q", out.String(), status.String())
	}
	for _, l := range lines {
		if rec := decode[jobs.Record](t, []byte(l)); rec.Status != jobs.StatusSuccess {
			t.Fatalf("result line %s", l)
		}
	}
	if _, err := submit.ReadJobs(strings.NewReader("{\"cod\": 1}\n")); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("bad line: %v", err)
	}
}

func testutilWaitStatus(t *testing.T, e env, id string, want jobs.Status) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, body := e.call(t, "tok-a", "GET", "/api/jobs/"+id, nil)
		var rec jobs.Record
		if json.Unmarshal(body, &rec) == nil && rec.Status == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s: want %s, last %s", id, want, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
