package tracing

import (
	"context"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

var tc propagation.TraceContext

// TraceParent returns the W3C traceparent of the span in ctx, or "" when ctx
// holds none.
func TraceParent(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}

// WithParent returns ctx with traceparent as the remote parent of the spans
// started from it, when traceparent is valid (jobs.ValidTraceParent: it
// comes from the network); otherwise ctx unchanged. tracestate is not
// carried.
func WithParent(ctx context.Context, traceparent string) context.Context {
	if !jobs.ValidTraceParent(traceparent) {
		return ctx
	}
	return tc.Extract(ctx, propagation.MapCarrier{jobs.TraceHeader: traceparent})
}

// FromHeader is WithParent with the traceparent of NATS header h.
func FromHeader(ctx context.Context, h nats.Header) context.Context {
	if h == nil {
		return ctx
	}
	return WithParent(ctx, h.Get(jobs.TraceHeader))
}

// Inject sets the traceparent of the span in ctx on h and reports whether
// there was one.
func Inject(ctx context.Context, h nats.Header) bool {
	tp := TraceParent(ctx)
	if tp == "" {
		return false
	}
	h.Set(jobs.TraceHeader, tp)
	return true
}

type viaKey struct{}

// WithVia returns ctx saying how the jobs submitted with it came in
// (run_python, run_javascript, api, task): the submit span's
// mcpexec.submit.via.
func WithVia(ctx context.Context, via string) context.Context {
	return context.WithValue(ctx, viaKey{}, via)
}

// Via returns what WithVia put in ctx ("api" when nothing).
func Via(ctx context.Context) string {
	if v, ok := ctx.Value(viaKey{}).(string); ok {
		return v
	}
	return "api"
}
