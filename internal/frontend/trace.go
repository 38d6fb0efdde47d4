package frontend

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

// startSubmit starts the submit span of a prepared (wire) job and sets the
// job's TraceParent to it. The span's parent is the caller's traceparent in
// ctx, if one came (tracing.WithParent); else the span is the root of the
// trace derived from the job's id. With tracing off the job still gets a
// traceparent: the caller's, or the derived one.
func (f *Frontend) startSubmit(ctx context.Context, job *jobs.Job) (context.Context, trace.Span) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = tracing.WithJobTrace(ctx, job.ID)
	}
	ctx, span := f.tracer.Start(ctx, tracing.SpanSubmit, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(tracing.AttrJobID.String(job.ID), tracing.AttrVia.String(tracing.Via(ctx)),
			tracing.AttrLanguage.String(job.Lang()), tracing.AttrFrontend.String(f.cfg.ID)))
	job.TraceParent = tracing.TraceParent(ctx)
	if job.TraceParent == "" {
		job.TraceParent = jobs.TraceParent(job.ID)
	}
	return ctx, span
}

// endSubmit ends a submit span: with the job's status when there is a
// record, with the error otherwise.
func endSubmit(span trace.Span, rec *jobs.Record, err error) {
	if rec != nil {
		span.SetAttributes(tracing.AttrStatus.String(string(rec.Status)))
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// submitted ends the submit spans of a batch with each job's outcome.
func submitted(spans []trace.Span, errs []error) {
	for k, span := range spans {
		err := errs[k]
		if errors.Is(err, queue.ErrDuplicate) {
			err = nil // submitted before: not a failure
		}
		endSubmit(span, nil, err)
	}
}
