package jobsapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/jobsapi"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// TestTenantsDoNotMeet: the attack of issue 9 (submitting another
// namespace's job id answered 409 with that job's record) and its relatives.
func TestTenantsDoNotMeet(t *testing.T) {
	t.Parallel()
	e := setup(t, true)
	st, body := e.call(t, "tok-a", "POST", "/api/jobs", map[string]any{"id": "secret-job", "code": "print('a private')", "labels": map[string]string{"team": "a"}})
	if st != http.StatusCreated {
		t.Fatalf("a submits: %d %s", st, body)
	}
	// b uses the same id: a job of its own, not a conflict and not a's record.
	st, body = e.call(t, "tok-b", "POST", "/api/jobs", map[string]any{"id": "secret-job", "code": "print('b')"})
	if st != http.StatusCreated || strings.Contains(string(body), "a private") || strings.Contains(string(body), "team") {
		t.Fatalf("b submits the same id: %d %s", st, body)
	}
	for _, tok := range []string{"tok-a", "tok-b"} {
		st, body = e.call(t, tok, "GET", "/api/jobs/secret-job/wait?timeout=10s", nil)
		rec := decode[jobs.Record](t, body)
		want := map[string]string{"tok-a": "ran print('a private')", "tok-b": "ran print('b')"}[tok]
		if st != 200 || rec.Result == nil || rec.Result.Stdout != want || rec.Job.ID != "secret-job" {
			t.Fatalf("%s waits: %d %s", tok, st, body)
		}
	}
	// Listings and their cursors hold only the caller's jobs.
	for i := range 5 {
		e.call(t, "tok-a", "POST", "/api/jobs", map[string]any{"id": "a-" + string(rune('0'+i)), "code": "x"})
	}
	cursor, seen := "", 0
	for page := 0; page < 10; page++ {
		st, body = e.call(t, "tok-b", "GET", "/api/jobs?limit=1&cursor="+cursor, nil)
		lr := decode[jobsapi.ListResponse](t, body)
		if st != 200 || strings.Contains(string(body), "a-") || strings.Contains(string(body), "a private") {
			t.Fatalf("b lists: %d %s", st, body)
		}
		seen += len(lr.Jobs)
		if lr.Next == "" {
			break
		}
		cursor = lr.Next
	}
	if seen != 1 {
		t.Fatalf("b saw %d jobs, want its 1", seen)
	}
	// A cursor naming a's id is only a position among b's own ids.
	st, body = e.call(t, "tok-b", "GET", "/api/jobs?cursor=a-0", nil)
	if lr := decode[jobsapi.ListResponse](t, body); st != 200 || len(lr.Jobs) != 1 || lr.Jobs[0].Job.Namespace != "b" {
		t.Fatalf("b lists after a's id: %d %s", st, body)
	}
	// Cancel, retry and wait of a's ids are "no such job" for b.
	for _, path := range []string{"/api/jobs/a-0/cancel", "/api/jobs/a-0/retry"} {
		if st, body = e.call(t, "tok-b", "POST", path, nil); st != http.StatusNotFound {
			t.Fatalf("b %s: %d %s", path, st, body)
		}
	}
}

// TestNamespacePolicies: servers and timeouts per namespace.
func TestNamespacePolicies(t *testing.T) {
	t.Parallel()
	b := testutil.Broker(t, "", queue.DefaultConfig())
	seen := make(chan sandbox.Job, 8)
	rt := &testutil.FakeRuntime{Func: func(_ context.Context, job sandbox.Job) (sandbox.Result, error) {
		select {
		case seen <- job:
		default:
		}
		return sandbox.Result{Status: sandbox.StatusSuccess}, nil
	}}
	testutil.Worker(t, b, rt, worker.DefaultConfig("w"))
	fe := testutil.FrontendWith(t, b, frontend.Config{ID: "fe", Policy: frontend.DefaultPolicy(), Policies: map[string]frontend.Policy{
		"batch":  {MaxTimeout: 3600, MaxMemoryMB: 4096, MaxCPUs: 2},
		"narrow": {Servers: []string{"github"}, Pools: []string{"default"}},
	}})
	api := jobsapi.New(jobsapi.Config{Backend: fe, Namespace: httpauth.Namespace})
	hs := httptest.NewServer(mcpserver.Handler(mcpserver.New(fe, mcpserver.Options{}), mcpserver.HTTPOptions{API: api, Auth: httpauth.New(httpauth.Config{Tokens: map[string]string{"tok-batch": "batch", "tok-narrow": "narrow", "tok-plain": "plain"}})}))
	t.Cleanup(hs.Close)
	e := env{url: hs.URL}
	if st, body := e.call(t, "tok-plain", "POST", "/api/jobs", map[string]any{"code": "x", "timeout": 600}); st != http.StatusBadRequest || !strings.Contains(string(body), "1..120") {
		t.Fatalf("plain namespace, 600 s: %d %s", st, body)
	}
	if st, body := e.call(t, "tok-batch", "POST", "/api/jobs", map[string]any{"code": "x", "timeout": 600}); st != http.StatusCreated {
		t.Fatalf("batch namespace, 600 s: %d %s", st, body)
	}
	if st, body := e.call(t, "tok-narrow", "POST", "/api/jobs", map[string]any{"code": "x", "servers": []string{"filesystem"}}); st != http.StatusBadRequest || !strings.Contains(string(body), "may not use filesystem") {
		t.Fatalf("narrow namespace, another server: %d %s", st, body)
	}
	// Pools: only those the policy lists.
	if st, body := e.call(t, "tok-narrow", "POST", "/api/jobs", map[string]any{"code": "x", "pool": "gpu"}); st != http.StatusBadRequest || !strings.Contains(string(body), `may not use pool \"gpu\" (it may use default)`) {
		t.Fatalf("narrow namespace, another pool: %d %s", st, body)
	}
	if st, body := e.call(t, "tok-narrow", "POST", "/api/jobs", map[string]any{"code": "x", "pool": "default"}); st != http.StatusCreated {
		t.Fatalf("narrow namespace, its pool: %d %s", st, body)
	}
	// Batch jobs may ask for more memory and CPUs, within their policy; the
	// worker sizes the sandbox as asked.
	for _, c := range []struct {
		tok  string
		job  map[string]any
		want string
	}{
		{"tok-plain", map[string]any{"code": "x", "memory_mb": 1024}, "outside 16..512"},
		{"tok-plain", map[string]any{"code": "x", "cpus": 2}, "outside 0.1..1"},
		{"tok-batch", map[string]any{"code": "x", "memory_mb": 8192}, "outside 16..4096"},
		{"tok-batch", map[string]any{"code": "x", "memory_mb": -1}, "memory_mb"},
		{"tok-batch", map[string]any{"code": "x", "cpus": 0.01}, "cpus"},
	} {
		if st, body := e.call(t, c.tok, "POST", "/api/jobs", c.job); st != http.StatusBadRequest || !strings.Contains(string(body), c.want) {
			t.Errorf("%s %v: %d %s, want 400 with %q", c.tok, c.job, st, body, c.want)
		}
	}
	for len(seen) > 0 {
		<-seen
	}
	st, body := e.call(t, "tok-batch", "POST", "/api/jobs", map[string]any{"code": "big", "timeout": 3600, "memory_mb": 4096, "cpus": 2})
	if st != http.StatusCreated || !strings.Contains(string(body), `"memory_mb":4096`) {
		t.Fatalf("batch namespace, big job: %d %s", st, body)
	}
	for wait := time.After(time.Minute); ; {
		var j sandbox.Job
		select {
		case j = <-seen:
		case <-wait:
			t.Fatal("the worker did not run the big job within a minute")
		}
		if j.Code != "big" {
			continue
		}
		if j.Memory != 4096<<20 || j.CPUs != 2 || j.Timeout != time.Hour {
			t.Fatalf("the worker ran the big job with %d bytes, %g CPUs, %s", j.Memory, j.CPUs, j.Timeout)
		}
		break
	}
}
