package frontend_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/jobsapi"
	"github.com/mcpexec/mcpexec/internal/mcpclients"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// apiFrontend serves fe's jobs API (with namespace tokens) and returns its URL.
func apiFrontend(t *testing.T, fe *frontend.Frontend) string {
	t.Helper()
	api := jobsapi.New(jobsapi.Config{Backend: fe, Namespace: httpauth.Namespace})
	srv := mcpserver.New(fe, mcpserver.Options{})
	hs := httptest.NewServer(mcpserver.Handler(srv, mcpserver.HTTPOptions{API: api, Auth: httpauth.New(httpauth.Config{Tokens: map[string]string{"tok-a": "a"}})}))
	t.Cleanup(hs.Close)
	return hs.URL
}

func postJob(t *testing.T, url string, job map[string]any) jobs.Record {
	t.Helper()
	body, _ := json.Marshal(job)
	rec, code, err := apiRecord(t, "POST", url+"/api/jobs", body)
	if err != nil || code/100 != 2 {
		t.Fatalf("POST /api/jobs: %d, %v", code, err)
	}
	return rec
}

func waitJob(t *testing.T, url, id string) jobs.Record {
	t.Helper()
	rec, code, err := apiRecord(t, "GET", url+"/api/jobs/"+id+"/wait?timeout=60s", nil)
	if err != nil {
		t.Fatalf("wait %s: %d, %v", id, code, err)
	}
	return rec
}

// apiRecord sends a jobs API request as tok-a's tenant (body, when not nil, is
// JSON) and decodes the job record it answers.
func apiRecord(t *testing.T, method, url string, body []byte) (jobs.Record, int, error) {
	t.Helper()
	req, _ := http.NewRequest(method, url, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer tok-a")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }() // read or abandoned: nothing to report
	var rec jobs.Record
	err = json.NewDecoder(resp.Body).Decode(&rec)
	return rec, resp.StatusCode, err
}

// TestAPIJobsCallToolsAndMemory: a job submitted through /api/jobs calls a
// proxied stdio server and update_memory; then the same while the front-end
// that submitted it is stopped mid-job, so that a second front-end serves the
// job's remaining calls from its record.
func TestAPIJobsCallToolsAndMemory(t *testing.T) {
	t.Parallel()
	b := processFleet(t)
	fe1, fe2 := tsFrontend(t, b, "fe1"), tsFrontend(t, b, "fe2")
	url1, url2 := apiFrontend(t, fe1), apiFrontend(t, fe2)

	rec := postJob(t, url1, map[string]any{"id": "plain", "servers": []string{"ts"}, "code": `
r = await mcp_ts.echo(text="hello")
n = update_memory("count", lambda n: (n or 0) + 1)
print(r, n, load_memory("count"))`})
	if got := waitJob(t, url1, rec.Job.ID); got.Status != jobs.StatusSuccess || strings.TrimSpace(got.Result.Stdout) != "hello 1 1" {
		t.Fatalf("API job: %s %+v", got.Status, got.Result)
	}

	dir := sharedDir(t)
	started, goOn := filepath.Join(dir, "started"), filepath.Join(dir, "go")
	postJob(t, url1, map[string]any{"id": "outlives", "servers": []string{"ts"}, "timeout": 60, "code": fmt.Sprintf(`
import os, time
a = await mcp_ts.echo(text="one")
update_memory("count", lambda n: (n or 0) + 1)
open(%q, "w").close()
while not os.path.exists(%q):
    time.sleep(0.02)
b = await mcp_ts.echo(text="two")
n = update_memory("count", lambda n: (n or 0) + 1)
print(a, b, n)`, started, goOn)})
	waitFile(t, started)
	fe1.Stop() // the submitting front-end leaves mid-job
	if err := os.WriteFile(goOn, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := waitJob(t, url2, "outlives"); got.Status != jobs.StatusSuccess || strings.TrimSpace(got.Result.Stdout) != "one two 3" {
		t.Fatalf("job whose front-end left: %s %+v", got.Status, got.Result)
	}
}

// processFleet starts a broker and a worker with the process runtime.
func processFleet(t *testing.T) *broker.Broker {
	t.Helper()
	b := testutil.Broker(t, "", queue.DefaultConfig())
	testutil.Worker(t, b, testutil.ProcessRuntime(t), worker.DefaultConfig("w1"))
	return b
}

// tsFrontend starts front-end id, proxying the MCP test server as "ts".
func tsFrontend(t *testing.T, b *broker.Broker, id string) *frontend.Frontend {
	t.Helper()
	pool := testutil.Pool(t, mcpclients.Config{}, testutil.TestServerDef(t, "ts", nil))
	return testutil.FrontendWith(t, b, frontend.Config{ID: id, Tools: pool})
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear", path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sharedDir is a temporary directory the sandbox's code can use too (the
// process runtime runs it as nobody when the tests run as root).
func sharedDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "mcpexec-shared-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) }) // a temporary directory: what is left harms no test
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestSessionCap: a namespace's sessions are capped; its existing sessions
// go on.
func TestSessionCap(t *testing.T) {
	t.Parallel()
	s := setup(t, "", frontend.Config{Policy: frontend.Policy{MaxSessions: 1}})
	call := func(session string) (bool, string) {
		res := testutil.CallRunPython(t, s.C, map[string]any{"code": "print('hi')", "session": session})
		return res.IsError, testutil.Text(res)
	}
	if isErr, text := call("s1"); isErr {
		t.Fatalf("first session: %s", text)
	}
	if isErr, text := call("s2"); !isErr || !strings.Contains(text, "holds 1 sessions (cap 1)") {
		t.Fatalf("second session: %v %s", isErr, text)
	}
	if isErr, text := call("s1"); isErr {
		t.Fatalf("the first session again: %s", text)
	}
}

// brokenRuntime cannot start any sandbox.
type brokenRuntime struct{}

func (brokenRuntime) Run(context.Context, sandbox.Job, sandbox.Host) (sandbox.Result, error) {
	return sandbox.Result{}, errors.New("create container: connection refused")
}
func (brokenRuntime) Close() error  { return nil }
func (brokenRuntime) ReportsStart() {}

// TestHealthSaysWhenNoHealthyWorkerIsLeft: a worker whose runtime fails stops
// taking jobs, its jobs go back to the queue with no attempt spent, and the
// front-end's health says that no healthy worker is left, and why.
func TestHealthSaysWhenNoHealthyWorkerIsLeft(t *testing.T) {
	t.Parallel()
	b := testutil.Broker(t, "", queue.DefaultConfig())
	wc := worker.DefaultConfig("w-broken")
	wc.RetryDelay = 50 * time.Millisecond
	w := testutil.Worker(t, b, brokenRuntime{}, wc)
	fe := testutil.Frontend(t, b, "fe")
	ctx := context.Background()
	// The worker answers status requests once it has started (moments).
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		err := fe.Health(ctx)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health before any job: %v", err)
		}
	}
	out := fe.SubmitMany(ctx, []*jobs.Job{{ID: "a", Code: "x"}, {ID: "b", Code: "x"}, {ID: "c", Code: "x"}, {ID: "d", Code: "x"}}, "ns")
	for _, s := range out {
		if s.Err != nil {
			t.Fatal(s.Err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for w.Health() == nil {
		if time.Now().After(deadline) {
			t.Fatal("the worker did not stop taking jobs")
		}
		time.Sleep(20 * time.Millisecond)
	}
	err := fe.Health(ctx)
	if err == nil || !strings.Contains(err.Error(), "no healthy worker") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("health: %v", err)
	}
	// No attempt was spent: the jobs wait in the queue for a worker that can run them.
	for _, id := range []string{"a", "b", "c", "d"} {
		rec, err := fe.Get(ctx, "ns", id)
		if err != nil || rec.Status != jobs.StatusQueued || rec.Attempt != 0 {
			t.Fatalf("job %s: %+v %v", id, rec, err)
		}
	}
}
