package worker

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

// queueWait records the job's wait in the queue, from its submission to now
// (a worker took it), as a child of the front-end's submit span: the job
// message's traceparent header, else the job's own (a forwarded session job
// has no header), else the one derived from its id. It returns the span's
// context, the parent of the attempt's spans.
func (w *Worker) queueWait(ctx context.Context, msg jetstream.Msg, job *jobs.Job, delivery int) trace.SpanContext {
	parent := msg.Headers().Get(jobs.TraceHeader)
	if !jobs.ValidTraceParent(parent) {
		parent = job.Trace()
	}
	now := time.Now()
	start := job.SubmittedAt
	if start.IsZero() || start.After(now) {
		start = now // a front-end's clock ahead of ours
	}
	_, span := w.tracer.Start(tracing.WithParent(ctx, parent), tracing.SpanQueueWait,
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithTimestamp(start),
		trace.WithAttributes(tracing.AttrJobID.String(job.ID), tracing.AttrDelivery.Int(delivery),
			tracing.AttrWorker.String(w.cfg.ID), tracing.AttrLanguage.String(job.Lang())))
	span.End(trace.WithTimestamp(now))
	return span.SpanContext()
}

// attemptSpans are the spans of one attempt: acquiring the sandbox, then
// running the code. The runtime calls running (through BeforeExec) on its
// own goroutine while the worker's waits in Run.
type attemptSpans struct {
	w    *Worker
	ctx  context.Context // the delivery's span as parent
	host *natsHost
	base []attribute.KeyValue

	mu      sync.Mutex // guards acquire, run
	acquire trace.Span
	run     trace.Span
}

func (w *Worker) attemptSpans(ctx context.Context, d *delivery, host *natsHost) *attemptSpans {
	return &attemptSpans{w: w, ctx: d.traced(context.WithoutCancel(ctx)), host: host,
		base: []attribute.KeyValue{tracing.AttrJobID.String(d.job.ID), tracing.AttrAttempt.Int(host.attempt), tracing.AttrWorker.String(w.cfg.ID)}}
}

// acquiring starts the acquire span (runtimes that report the start).
func (a *attemptSpans) acquiring() {
	_, s := a.w.tracer.Start(a.ctx, tracing.SpanAcquire, trace.WithAttributes(a.base...))
	a.mu.Lock()
	a.acquire = s
	a.mu.Unlock()
}

// sandbox names the attempt's container on its spans (the acquire span and
// the run span to come).
func (a *attemptSpans) sandbox(id string) {
	kv := tracing.AttrSandbox.String(tracing.Clean(id, 64))
	a.mu.Lock()
	defer a.mu.Unlock()
	a.base = append(a.base[:len(a.base):len(a.base)], kv)
	if a.acquire != nil {
		a.acquire.SetAttributes(kv)
	}
}

// running ends the acquire span and starts the run span, the parent of the
// sandbox's proxy calls.
func (a *attemptSpans) running() {
	a.mu.Lock()
	base := a.base
	a.mu.Unlock()
	_, s := a.w.tracer.Start(a.ctx, tracing.SpanRun, trace.WithAttributes(base...))
	a.mu.Lock()
	if a.acquire != nil {
		a.acquire.End()
		a.acquire = nil
	}
	a.run = s
	a.mu.Unlock()
	a.host.setParent(s.SpanContext())
}

// end ends the open span with the run's result.
func (a *attemptSpans) end(res sandbox.Result, err error) {
	a.mu.Lock()
	acq, run := a.acquire, a.run
	a.acquire, a.run = nil, nil
	a.mu.Unlock()
	if acq != nil { // the code was never sent
		if err != nil {
			acq.RecordError(err)
			acq.SetStatus(codes.Error, err.Error())
		}
		acq.End()
	}
	if run == nil {
		return
	}
	run.SetAttributes(tracing.AttrStatus.String(string(res.Status)), tracing.AttrExitCode.Int(res.ExitCode))
	switch {
	case err != nil:
		run.RecordError(err)
		run.SetStatus(codes.Error, err.Error())
	case res.Status != sandbox.StatusSuccess:
		run.SetStatus(codes.Error, string(res.Status))
	}
	run.End()
}
