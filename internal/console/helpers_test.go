package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/broker"
	"github.com/mcpexec/mcpexec/internal/console"
	"github.com/mcpexec/mcpexec/internal/frontend"
	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/jobsapi"
	"github.com/mcpexec/mcpexec/internal/mcpclients"
	"github.com/mcpexec/mcpexec/internal/mcpserver"
	"github.com/mcpexec/mcpexec/internal/metrics"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/testutil"
	"github.com/mcpexec/mcpexec/internal/toolrules"
	"github.com/mcpexec/mcpexec/internal/tracing"
	"github.com/mcpexec/mcpexec/internal/worker"
)

// Tokens of the test fleet: namespaces a and b, and an admin.
const (
	tokA     = "token-of-namespace-a"
	tokB     = "token-of-namespace-b"
	tokAdmin = "admin-token-0123456789abcdef"
)

// fleet is a broker, a worker and a front-end in this process, as the
// embedded front-end runs them (one tracer provider with the span recorder),
// behind the front-end's HTTP surface with the console.
type fleet struct {
	url      string
	b        *broker.Broker
	fe       *frontend.Frontend
	workerID string
}

// startFleet starts the fleet on rt; servers gives the front-end the test MCP
// server "ts".
func startFleet(t testing.TB, rt sandbox.Runtime, servers bool) *fleet {
	t.Helper()
	rec := tracing.NewRecorder(0, 0)
	p, err := tracing.New(context.Background(), tracing.Config{Service: "mcpexec-frontend", Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) }) // nothing to flush: no exporter
	tp := p.TracerProvider()
	m := metrics.New("frontend")
	b, err := broker.Start(context.Background(), broker.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:-1",
		Queue: queue.DefaultConfig(), Logger: testutil.Logger(t), Tracing: tp, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() }) // Close always returns nil
	wc := worker.DefaultConfig("console-worker")
	wc.FetchWait, wc.Grace, wc.Tracing, wc.Slots = 200*time.Millisecond, 100*time.Millisecond, tp, 4
	testutil.Worker(t, b, rt, wc)
	history := console.NewHistory(m.Registry, 250*time.Millisecond)
	history.Start(context.Background())
	t.Cleanup(history.Stop)
	// Namespace a's ts/add asks a person (the approvals page); its other
	// tools are allowed.
	fc := frontend.Config{ID: "console-fe", Tracing: tp, Metrics: m, Policies: map[string]frontend.Policy{
		"a": {Tools: map[string]string{"ts/add": "ask"}, ToolDefaults: &toolrules.Defaults{Destructive: "allow"}}}}
	if servers {
		pool := testutil.Pool(t, mcpclients.Config{}, testutil.TestServerDef(t, "ts", nil))
		fc.Tools = pool
		fc.DescribeStatus = func(st *jobs.FrontendStatus) {
			for _, name := range pool.Names() {
				st.Servers = append(st.Servers, jobs.ServerState{Name: name, Running: pool.Running(name)})
			}
			st.CallsPerMinute = m.ProxyCallsPerMinute()
		}
	}
	fe := testutil.FrontendWith(t, b, fc)
	api := console.Routes(console.Config{Backend: fe, Namespace: httpauth.Namespace, IsAdmin: httpauth.IsAdmin,
		Namespaces: []string{"a", "b"}, Spans: rec, History: history, FrontendID: "console-fe", StaleAfter: time.Second},
		jobsapi.New(jobsapi.Config{Backend: fe, Namespace: httpauth.Namespace}))
	srv := mcpserver.New(fe, mcpserver.Options{Namespace: httpauth.Namespace})
	extra := map[string]http.Handler{}
	console.Mount(extra)
	hs := httptest.NewServer(mcpserver.Handler(srv, mcpserver.HTTPOptions{Health: fe.Health, API: api, Extra: extra, Auth: httpauth.New(httpauth.Config{Tokens: map[string]string{tokA: "a", tokB: "b"}, AdminTokens: []string{tokAdmin}})}))
	t.Cleanup(hs.Close)
	return &fleet{url: hs.URL, b: b, fe: fe, workerID: wc.ID}
}

// call makes an API request with token ("" for none) and returns the status
// and body.
func (f *fleet) call(t testing.TB, token, method, path string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, f.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = res.Body.Close() }() // read in full below
	out, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, out
}

// submit submits job through the API in token's namespace and returns its id.
func (f *fleet) submit(t testing.TB, token string, job map[string]any) string {
	t.Helper()
	st, body := f.call(t, token, "POST", "/api/jobs", job)
	if st != http.StatusCreated {
		t.Fatalf("submit %v: %d %s", job, st, body)
	}
	var item jobsapi.Item
	if err := json.Unmarshal(body, &item); err != nil {
		t.Fatal(err)
	}
	return item.Job.ID
}

// wait waits for job id of token's namespace to end and returns its record.
func (f *fleet) wait(t testing.TB, token, id string) *jobs.Record {
	t.Helper()
	st, body := f.call(t, token, "GET", "/api/jobs/"+id+"/wait?timeout=60s", nil)
	var rec jobs.Record
	if err := json.Unmarshal(body, &rec); st != 200 || err != nil || !rec.Status.Terminal() {
		t.Fatalf("wait %s: %d %s", id, st, body)
	}
	return &rec
}

// failOnce wraps a runtime that keeps sessions (the process runtime) and
// fails the first run of each code that holds "#fail-once" as a
// sandbox failure after the code was sent (the job becomes a dead letter);
// later runs of the same code run.
type failOnce struct {
	sandbox.SessionRuntime

	mu     sync.Mutex // guards failed
	failed map[string]bool
}

func newFailOnce(rt sandbox.SessionRuntime) *failOnce {
	return &failOnce{SessionRuntime: rt, failed: map[string]bool{}}
}

func (f *failOnce) ReportsStart() {}

func (f *failOnce) Run(ctx context.Context, job sandbox.Job, host sandbox.Host) (sandbox.Result, error) {
	if strings.Contains(job.Code, "#fail-once") {
		f.mu.Lock()
		first := !f.failed[job.Code]
		f.failed[job.Code] = true
		f.mu.Unlock()
		if first {
			if err := sandbox.BeforeExec(job); err != nil {
				return sandbox.Result{}, err
			}
			return sandbox.Result{}, errors.New("simulated sandbox failure")
		}
	}
	return f.SessionRuntime.Run(ctx, job, host)
}
