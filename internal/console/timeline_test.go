package console_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcpexec/mcpexec/internal/console"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

func TestBuildTimeline(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	started, finished := at(40), at(90)
	rec := &jobs.Record{Job: jobs.Job{ID: "j1", SubmittedAt: t0, MaxAttempts: 1}, Status: jobs.StatusSuccess, Attempt: 1, Worker: "w1",
		CreatedAt: at(1), StartedAt: &started, FinishedAt: &finished, Result: &jobs.Result{Status: jobs.StatusSuccess, DurationMS: 50}, TraceID: "0123456789abcdef0123456789abcdef"}
	job := map[string]string{"mcpexec.job.id": "ns-j1", "mcpexec.worker.id": "w1", "mcpexec.job.attempt": "1"}
	with := func(m map[string]string, kv ...string) map[string]string {
		out := map[string]string{}
		for k, v := range m {
			out[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	spans := []tracing.RecordedSpan{
		{SpanID: "q", Name: tracing.SpanQueueWait, Start: at(0), End: at(5), Attrs: job},
		{SpanID: "a", ParentID: "q", Name: tracing.SpanAcquire, Start: at(5), End: at(39), Attrs: with(job, "mcpexec.sandbox.id", "abcdef012345")},
		{SpanID: "r", ParentID: "q", Name: tracing.SpanRun, Start: at(40), End: at(89), Attrs: with(job, "mcpexec.job.status", "success")},
		{SpanID: "c", ParentID: "r", Name: tracing.SpanProxyCall, Start: at(50), End: at(60), Attrs: with(job, "mcpexec.proxy.server", "ts", "mcpexec.proxy.tool", "echo", "mcpexec.proxy.outcome", "ok")},
		// The front-end's span of the same call: shown once.
		{SpanID: "h", ParentID: "c", Name: tracing.SpanProxyHandle, Start: at(51), End: at(59), Attrs: map[string]string{"mcpexec.proxy.server": "ts", "mcpexec.proxy.tool": "echo"}},
		// A forged call naming the job, refused for its capability: never shown.
		{SpanID: "f", Name: tracing.SpanProxyHandle, Start: at(70), End: at(71), Error: true, Attrs: map[string]string{"mcpexec.job.id": "ns-j1", "mcpexec.proxy.server": "forged"}},
		// An admitted front-end span of a call whose worker span is elsewhere: shown.
		{SpanID: "g", Name: tracing.SpanProxyHandle, Start: at(72), End: at(73), Attrs: map[string]string{"mcpexec.job.id": "ns-j1", "mcpexec.proxy.admitted": "true", "mcpexec.proxy.method": "memory_get"}},
		// Another job in the same trace (a caller chose the parent): never shown.
		{SpanID: "x", Name: tracing.SpanProxyCall, Start: at(55), End: at(56), Attrs: map[string]string{"mcpexec.job.id": "other-j9", "mcpexec.proxy.server": "secret", "mcpexec.proxy.tool": "leak"}},
		{SpanID: "y", ParentID: "x", Name: tracing.SpanProxyHandle, Start: at(55), End: at(56), Attrs: map[string]string{"mcpexec.proxy.server": "secret"}},
	}
	tl := console.BuildTimeline(rec, "ns-j1", spans)
	var kinds, text []string
	for _, e := range tl.Entries {
		kinds = append(kinds, e.Kind)
		text = append(text, e.Title+" "+e.Detail)
	}
	if got, want := strings.Join(kinds, ","), "submitted,queued,taken,sandbox,started,ran,call,call,finished"; got != want {
		t.Errorf("kinds %s, want %s", got, want)
	}
	all := strings.Join(text, "\n")
	for _, want := range []string{"container abcdef012345", "call ts.echo", "by worker w1"} {
		if !strings.Contains(all, want) {
			t.Errorf("timeline lacks %q:\n%s", want, all)
		}
	}
	if strings.Contains(all, "secret") || strings.Contains(all, "forged") || !strings.Contains(all, "call memory_get") || len(tl.Spans) != 6 {
		t.Errorf("another job's spans leak in (%d spans):\n%s", len(tl.Spans), all)
	}
	if tl.Note != "" {
		t.Errorf("note %q with spans", tl.Note)
	}
	if tl := console.BuildTimeline(rec, "ns-j1", nil); tl.Note == "" || len(tl.Entries) != 4 {
		t.Errorf("without spans: %+v", tl)
	}
}

func TestHistory(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	fin := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mcpexec_jobs_finished_total"}, []string{"status"})
	lat := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "mcpexec_job_total_seconds", Buckets: []float64{0.01, 0.1, 1}})
	depth := prometheus.NewGauge(prometheus.GaugeOpts{Name: "mcpexec_queue_depth"})
	reg.MustRegister(fin, lat, depth)
	h := console.NewHistory(reg, time.Millisecond)
	h.Sample()
	for range 10 {
		fin.WithLabelValues("success").Inc()
		lat.Observe(0.05)
	}
	depth.Set(7)
	time.Sleep(2 * time.Millisecond)
	h.Sample()
	s := h.Series()
	if len(s.At) != 1 || s.JobsPerSecond["success"][0] <= 0 || *s.QueueDepth[0] != 7 {
		t.Fatalf("series %+v", s)
	}
	if p50 := *s.P50[0]; p50 < 0.01 || p50 > 0.1 {
		t.Errorf("p50 %v, want within the (0.01, 0.1] bucket", p50)
	}
	h.Stop() // before Start: no goroutine to wait for
}
