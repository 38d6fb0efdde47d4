package tracing

import (
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// EndCall records a call's duration (ms) and outcome (ok or error, the
// error cleaned and cut) on span and ends it: both ends of a proxy call do.
func EndCall(span trace.Span, start time.Time, err error) {
	span.SetAttributes(AttrDurationMS.Float64(float64(time.Since(start).Microseconds()) / 1000))
	if err != nil {
		span.SetAttributes(AttrOutcome.String("error"))
		span.SetStatus(codes.Error, Clean(err.Error(), 256))
	} else {
		span.SetAttributes(AttrOutcome.String("ok"))
	}
	span.End()
}
