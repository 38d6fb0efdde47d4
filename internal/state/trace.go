package state

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

// tracedWrite wraps a memory write handler with a span, the child of the
// writer's span (the front-end answering the sandbox's call) when the
// request carries its traceparent.
func (s *Service) tracedWrite(op string, h micro.HandlerFunc) micro.HandlerFunc {
	return func(req micro.Request) {
		if s.tracer == nil {
			h(req)
			return
		}
		ctx := tracing.FromHeader(context.Background(), nats.Header(req.Headers()))
		_, span := s.tracer.Start(ctx, tracing.SpanMemoryWrite, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(tracing.AttrMemoryOp.String(op), tracing.AttrNode.String(s.Node)))
		r := &failedReq{Request: req}
		h(r)
		if r.failed != "" {
			span.SetStatus(codes.Error, tracing.Clean(r.failed, 256))
		}
		span.End()
	}
}

// failedReq notes the error a handler answered.
type failedReq struct {
	micro.Request
	failed string
}

func (r *failedReq) Error(code, description string, data []byte, opts ...micro.RespondOpt) error {
	r.failed = code + " " + description
	return r.Request.Error(code, description, data, opts...)
}

// appliedSpans records one span per job event of a batch this replica
// applied (from start to now, the batch's transaction), each the child of
// the span that published the event.
func (s *Service) appliedSpans(msgs []jetstream.Msg, evs []jobs.Event, start time.Time, err error) {
	if s.tracer == nil {
		return
	}
	for i, m := range msgs {
		ctx := tracing.FromHeader(context.Background(), m.Headers())
		if !trace.SpanContextFromContext(ctx).IsValid() {
			continue
		}
		ev := evs[i]
		attrs := trace.WithAttributes(tracing.AttrJobID.String(ev.Job), tracing.AttrEventKind.String(string(ev.Kind)),
			tracing.AttrAttempt.Int(ev.Attempt), tracing.AttrNode.String(s.Node))
		_, span := s.tracer.Start(ctx, tracing.SpanStateApply, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithTimestamp(start), attrs)
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}
