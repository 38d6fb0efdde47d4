package tracing_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

func recordingProvider(t testing.TB, rec *tracing.Recorder) *tracing.Provider {
	t.Helper()
	p, err := tracing.New(context.Background(), tracing.Config{Service: "mcpexec-test", Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) }) // nothing buffered: the recorder keeps spans as they end
	return p
}

func TestRecorderKeepsSpansByTrace(t *testing.T) {
	t.Parallel()
	rec := tracing.NewRecorder(0, 0)
	tr := tracing.Tracer(recordingProvider(t, rec).TracerProvider())
	in := nats.Header{jobs.TraceHeader: {jobs.TraceParent("job-1")}}
	ctx, parent := tr.Start(tracing.FromHeader(context.Background(), in), tracing.SpanRun, trace.WithAttributes(tracing.AttrJobID.String("job-1")))
	_, child := tr.Start(ctx, tracing.SpanProxyCall, trace.WithAttributes(tracing.AttrServer.String("ts"), tracing.AttrTool.String("echo")))
	child.SetStatus(codes.Error, "boom")
	child.End()
	parent.End()
	id := jobs.TraceID(jobs.TraceParent("job-1"))
	got := rec.Trace(id)
	if len(got) != 2 {
		t.Fatalf("trace %s: want 2 spans, got %+v", id, got)
	}
	if got[0].Name != tracing.SpanProxyCall || !got[0].Error || got[0].Status != "boom" || got[0].Attrs["mcpexec.proxy.tool"] != "echo" || got[0].ParentID != got[1].SpanID {
		t.Errorf("child span: %+v (parent %+v)", got[0], got[1])
	}
	if got[1].Service != "mcpexec-test" || got[1].Attrs["mcpexec.job.id"] != "job-1" {
		t.Errorf("parent span: %+v", got[1])
	}
	if rec.Trace("not-hex") != nil || len(rec.Trace(jobs.TraceID(jobs.TraceParent("other")))) != 0 {
		t.Error("unknown traces must be empty")
	}
}

func TestRecorderIsBounded(t *testing.T) {
	t.Parallel()
	rec := tracing.NewRecorder(10, 0)
	tr := tracing.Tracer(recordingProvider(t, rec).TracerProvider())
	for i := range 25 {
		ctx := tracing.FromHeader(context.Background(), nats.Header{jobs.TraceHeader: {jobs.TraceParent(fmt.Sprint("job-", i%5))}})
		_, s := tr.Start(ctx, "s")
		s.End()
	}
	if rec.Len() != 10 {
		t.Fatalf("want 10 spans held, got %d", rec.Len())
	}
	total := 0
	for i := range 5 {
		total += len(rec.Trace(jobs.TraceID(jobs.TraceParent(fmt.Sprint("job-", i)))))
	}
	if total != 10 {
		t.Errorf("the traces hold %d spans, the ring 10", total)
	}
	old := tracing.NewRecorder(10, time.Millisecond)
	tr = tracing.Tracer(recordingProvider(t, old).TracerProvider())
	_, s := tr.Start(context.Background(), "s")
	s.End()
	time.Sleep(5 * time.Millisecond)
	if got := old.Trace(s.SpanContext().TraceID().String()); len(got) != 0 || old.Len() != 0 {
		t.Errorf("a span older than the age bound is kept: %+v", got)
	}
}

// BenchmarkRecorderFull reports the heap a full recorder holds (20,000
// spans of a job's usual attributes) as B/span.
func BenchmarkRecorderFull(b *testing.B) {
	for range b.N {
		rec := tracing.NewRecorder(0, 0)
		tr := tracing.Tracer(recordingProvider(b, rec).TracerProvider())
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := range tracing.DefaultRecorderSpans {
			ctx := tracing.FromHeader(context.Background(), nats.Header{jobs.TraceHeader: {jobs.TraceParent(fmt.Sprint("job-", i/16))}})
			_, s := tr.Start(ctx, tracing.SpanProxyCall, trace.WithAttributes(tracing.AttrJobID.String(fmt.Sprint("ns-job-", i/16)),
				tracing.AttrAttempt.Int(1), tracing.AttrWorker.String("worker-1"), tracing.AttrMethod.String("call_tool"),
				tracing.AttrServer.String("github"), tracing.AttrTool.String("search_issues"), tracing.AttrOutcome.String("ok")))
			s.End()
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(rec.Len()), "B/span")
		runtime.KeepAlive(rec)
	}
}
