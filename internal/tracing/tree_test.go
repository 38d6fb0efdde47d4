package tracing_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpexec/mcpexec/internal/broker"
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

// fleet is a broker, a worker (process runtime) and a front-end proxying the
// test MCP server "ts", each exporting to its own provider as separate
// processes would.
type fleet struct {
	b         *broker.Broker
	providers []*tracing.Provider
	fe        *frontend.Frontend
	pool      *mcpclients.Pool
}

func startFleet(t testing.TB, r *receiver) *fleet {
	t.Helper()
	var bp, wp, fp *tracing.Provider
	if r != nil {
		bp, wp, fp = r.provider(t, "mcpexec-broker"), r.provider(t, "mcpexec-worker"), r.provider(t, "mcpexec-frontend")
	}
	return startFleetOn(t, bp, wp, fp)
}

// startFleetOn starts the fleet on the broker's, worker's and front-end's
// providers (nil: no spans).
func startFleetOn(t testing.TB, bp, wp, fp *tracing.Provider) *fleet {
	t.Helper()
	f := &fleet{}
	if bp != nil {
		f.providers = []*tracing.Provider{bp, wp, fp}
	}
	tp := func(p *tracing.Provider) trace.TracerProvider {
		if p == nil {
			return nil
		}
		return p.TracerProvider()
	}
	b, err := broker.Start(context.Background(), broker.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:-1",
		Queue: queue.DefaultConfig(), Logger: testutil.Logger(t), Tracing: tp(bp)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() }) // Close always returns nil
	f.b = b
	wcfg := worker.DefaultConfig("trace-worker")
	wcfg.Tracing = tp(wp)
	testutil.Worker(t, b, testutil.ProcessRuntime(t), wcfg)
	f.pool = testutil.Pool(t, mcpclients.Config{}, testutil.TestServerDef(t, "ts", nil))
	f.fe = testutil.FrontendWith(t, b, frontend.Config{ID: "trace-fe", Tools: f.pool, Tracing: tp(fp)})
	return f
}

// flushUntil flushes every provider until the receiver holds want spans of
// trace id (the state service applies the finished event after the result
// is back), or fails.
func (f *fleet) flushUntil(t testing.TB, r *receiver, id string, want int) []span {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		for _, p := range f.providers {
			if err := p.ForceFlush(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		got := r.trace(id)
		if len(got) >= want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestJobTraceTree runs a job that calls a tool and writes memory through a
// real fleet, with the caller's traceparent on the MCP HTTP request, and
// checks the tree of spans the receiver got: every span in the caller's
// trace, each with the right parent and process.
func TestJobTraceTree(t *testing.T) {
	r := newReceiver(t)
	f := startFleet(t, r)
	const callerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	const callerSpan = "00f067aa0ba902b7"
	incoming := "00-" + callerTrace + "-" + callerSpan + "-01"
	c := testutil.MCPClientWith(t, f.fe, mcpserver.Options{Servers: f.pool.Names, Definitions: f.pool.Servers}, mcpserver.HTTPOptions{},
		transport.WithHTTPHeaders(map[string]string{"traceparent": incoming}))
	res := testutil.CallRunPython(t, c, map[string]any{"servers": []string{"ts"},
		"code": "print(await mcp_ts.echo(text=\"traced\"))\nsave_memory(\"k\", 1)"})
	if res.IsError || testutil.Text(res) != "traced" {
		t.Fatalf("run_python: %q", testutil.Text(res))
	}
	st := testutil.Structured(t, res)
	rec := testutil.WaitRecord(t, f.b, jobs.ScopedID(jobs.NamespaceOf(""), st.JobID), jobs.StatusSuccess)
	if rec.TraceID != callerTrace || jobs.TraceID(rec.Job.TraceParent) != callerTrace {
		t.Fatalf("record trace id %q (job traceparent %q), want the caller's %s", rec.TraceID, rec.Job.TraceParent, callerTrace)
	}

	// submit, queue wait, acquire, run, 3 proxy calls (list_tools, made by
	// the mcp_ts proxy object, call_tool, memory_put) and their 3 handlings,
	// 1 memory write, 3 events applied (submitted, started, finished).
	spans := f.flushUntil(t, r, callerTrace, 14)
	byName := map[string][]span{}
	byID := map[string]span{}
	for _, s := range spans {
		byName[s.Name] = append(byName[s.Name], s)
		byID[s.ID] = s
	}
	one := func(name, service string) span {
		t.Helper()
		if len(byName[name]) != 1 {
			t.Fatalf("%d %s spans, want 1; got %s", len(byName[name]), name, dump(spans))
		}
		s := byName[name][0]
		if s.Service != service {
			t.Fatalf("%s from %q, want %q", name, s.Service, service)
		}
		return s
	}
	parentIs := func(s span, parent string) {
		t.Helper()
		if byID[s.Parent].Name != parent {
			t.Fatalf("%s's parent is %q (%s), want %s\n%s", s.Name, byID[s.Parent].Name, s.Parent, parent, dump(spans))
		}
	}
	submit := one(tracing.SpanSubmit, "mcpexec-frontend")
	if submit.Parent != callerSpan || submit.Attrs["mcpexec.submit.via"] != "run_python" || submit.Attrs["mcpexec.job.status"] != "success" {
		t.Fatalf("submit span %+v: want the caller's span as parent", submit)
	}
	wait := one(tracing.SpanQueueWait, "mcpexec-worker")
	parentIs(wait, tracing.SpanSubmit)
	if wait.Start < submit.Start-uint64(time.Second) || wait.End < wait.Start {
		t.Fatalf("queue wait from %d to %d, submit at %d", wait.Start, wait.End, submit.Start)
	}
	parentIs(one(tracing.SpanAcquire, "mcpexec-worker"), tracing.SpanQueueWait)
	run := one(tracing.SpanRun, "mcpexec-worker")
	parentIs(run, tracing.SpanQueueWait)
	if run.Attrs["mcpexec.job.status"] != "success" {
		t.Fatalf("run span %+v", run)
	}
	calls := map[string]span{}
	for _, s := range byName[tracing.SpanProxyCall] {
		parentIs(s, tracing.SpanRun)
		if s.Service != "mcpexec-worker" || s.Attrs["mcpexec.proxy.outcome"] != "ok" {
			t.Fatalf("proxy call %+v", s)
		}
		calls[s.Attrs["mcpexec.proxy.method"]] = s
	}
	if c := calls["call_tool"]; c.Attrs["mcpexec.proxy.server"] != "ts" || c.Attrs["mcpexec.proxy.tool"] != "echo" || calls["memory_put"].Name == "" || len(calls) != 3 {
		t.Fatalf("proxy calls %+v", calls)
	}
	handled := map[string]span{}
	for _, s := range byName[tracing.SpanProxyHandle] {
		parentIs(s, tracing.SpanProxyCall)
		if s.Service != "mcpexec-frontend" || byID[s.Parent].Attrs["mcpexec.proxy.method"] != s.Attrs["mcpexec.proxy.method"] {
			t.Fatalf("proxy handling %+v", s)
		}
		handled[s.Attrs["mcpexec.proxy.method"]] = s
	}
	if len(handled) != 3 || handled["call_tool"].Attrs["mcpexec.proxy.tool"] != "echo" {
		t.Fatalf("handled %+v", handled)
	}
	mw := one(tracing.SpanMemoryWrite, "mcpexec-broker")
	if byID[mw.Parent].Name != tracing.SpanProxyHandle || byID[mw.Parent].Attrs["mcpexec.proxy.method"] != "memory_put" {
		t.Fatalf("memory write's parent %+v", byID[mw.Parent])
	}
	kinds := map[string]string{}
	for _, s := range byName[tracing.SpanStateApply] {
		kinds[s.Attrs["mcpexec.event.kind"]] = byID[s.Parent].Name
	}
	if want := map[string]string{"submitted": tracing.SpanSubmit, "started": tracing.SpanQueueWait, "finished": tracing.SpanQueueWait}; fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Fatalf("state apply spans' parents by event %v, want %v", kinds, want)
	}
}

// TestTraceIDs checks where a job's trace id comes from: _meta.traceparent
// over the HTTP header; without either, the one derived from the job's id;
// and an invalid traceparent is ignored.
func TestTraceIDs(t *testing.T) {
	r := newReceiver(t)
	f := startFleet(t, r)
	header := "00-11111111111111111111111111111111-2222222222222222-01"
	c := testutil.MCPClientWith(t, f.fe, mcpserver.Options{}, mcpserver.HTTPOptions{},
		transport.WithHTTPHeaders(map[string]string{"traceparent": header}))
	plain := testutil.MCPClient(t, f.fe)
	run := func(c mcpCaller, meta string) *jobs.Record {
		t.Helper()
		req := mcp.CallToolRequest{}
		req.Params.Name = mcpserver.ToolName
		req.Params.Arguments = map[string]any{"code": "print(1)"}
		if meta != "" {
			req.Params.Meta = &mcp.Meta{AdditionalFields: map[string]any{"traceparent": meta}}
		}
		res, err := c.CallTool(context.Background(), req)
		if err != nil || res.IsError {
			t.Fatalf("run_python: %v %v", err, res)
		}
		id := jobs.ScopedID(jobs.NamespaceOf(""), testutil.Structured(t, res).JobID)
		return testutil.WaitRecord(t, f.b, id, jobs.StatusSuccess)
	}
	if rec := run(c, ""); rec.TraceID != strings.Repeat("1", 32) {
		t.Fatalf("header: trace %s", rec.TraceID)
	}
	meta := "00-33333333333333333333333333333333-4444444444444444-01"
	if rec := run(c, meta); rec.TraceID != strings.Repeat("3", 32) {
		t.Fatalf("_meta over header: trace %s", rec.TraceID)
	}
	if rec := run(plain, "00-33333333333333333333333333333333-4444444444444444-01\r\n"); rec.TraceID != jobs.TraceID(jobs.TraceParent(rec.Job.ID)) {
		t.Fatalf("invalid _meta: trace %s, want the derived one", rec.TraceID)
	}
	rec := run(plain, "")
	derived := jobs.TraceID(jobs.TraceParent(rec.Job.ID))
	if rec.TraceID != derived {
		t.Fatalf("no traceparent: trace %s, want the derived %s", rec.TraceID, derived)
	}
	spans := f.flushUntil(t, r, derived, 5)
	for _, s := range spans {
		if s.Name == tracing.SpanSubmit && s.Parent != "" {
			t.Fatalf("submit span of a job without a caller's trace has parent %s", s.Parent)
		}
	}
	if len(spans) < 5 {
		t.Fatalf("derived trace has %d spans: %s", len(spans), dump(spans))
	}
}

type mcpCaller interface {
	CallTool(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error)
}

func dump(spans []span) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "  %s %s id=%s parent=%s %v\n", s.Service, s.Name, s.ID, s.Parent, s.Attrs)
	}
	return b.String()
}

// TestAPITraceParent submits through POST /api/jobs with a traceparent
// header: the job's submit span is the caller's child (via "api").
func TestAPITraceParent(t *testing.T) {
	r := newReceiver(t)
	f := startFleet(t, r)
	api := jobsapi.New(jobsapi.Config{Backend: f.fe, Namespace: httpauth.Namespace})
	hs := httptest.NewServer(mcpserver.Handler(mcpserver.New(f.fe, mcpserver.Options{}), mcpserver.HTTPOptions{API: api}))
	t.Cleanup(hs.Close)
	req, _ := http.NewRequest("POST", hs.URL+"/api/jobs", strings.NewReader(`{"id": "api-traced", "code": "print(1)"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-55555555555555555555555555555555-6666666666666666-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close() // read nothing: the record is checked below
	if resp.StatusCode/100 != 2 {
		t.Fatalf("POST /api/jobs: %s", resp.Status)
	}
	rec := testutil.WaitRecord(t, f.b, jobs.ScopedID(jobs.NamespaceOf(""), "api-traced"), jobs.StatusSuccess)
	want := strings.Repeat("5", 32)
	if rec.TraceID != want {
		t.Fatalf("trace %s, want %s", rec.TraceID, want)
	}
	found := false
	for _, s := range f.flushUntil(t, r, want, 4) { // submit, its event applied, queue wait, run...
		if s.Name == tracing.SpanSubmit {
			found = true
			if s.Parent != "6666666666666666" || s.Attrs["mcpexec.submit.via"] != "api" {
				t.Fatalf("submit span %+v", s)
			}
		}
	}
	if !found {
		t.Fatal("no submit span in the caller's trace")
	}
}
