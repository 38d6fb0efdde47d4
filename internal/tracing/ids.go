package tracing

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"

	"go.opentelemetry.io/otel/trace"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

type traceIDKey struct{}

// WithJobTrace returns ctx with the trace id derived from job id
// (jobs.TraceParent): a span started from it without a parent is the root of
// that trace, so a job whose caller sent no traceparent still has a trace
// that every process can name from the id alone. A parent in ctx wins.
func WithJobTrace(ctx context.Context, jobID string) context.Context {
	var tid trace.TraceID
	if _, err := hex.Decode(tid[:], []byte(jobs.TraceID(jobs.TraceParent(jobID)))); err != nil {
		return ctx
	}
	return context.WithValue(ctx, traceIDKey{}, tid)
}

// idGenerator is the SDK's random generator, except that a root span takes
// the trace id WithJobTrace put in its context.
type idGenerator struct{}

func newIDGenerator() idGenerator { return idGenerator{} }

func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	var tid trace.TraceID
	if forced, ok := ctx.Value(traceIDKey{}).(trace.TraceID); ok && forced.IsValid() {
		tid = forced
	} else {
		for !tid.IsValid() {
			binary.NativeEndian.PutUint64(tid[:8], rand.Uint64())
			binary.NativeEndian.PutUint64(tid[8:], rand.Uint64())
		}
	}
	return tid, newSpanID()
}

func (idGenerator) NewSpanID(context.Context, trace.TraceID) trace.SpanID { return newSpanID() }

func newSpanID() trace.SpanID {
	var sid trace.SpanID
	for !sid.IsValid() {
		binary.NativeEndian.PutUint64(sid[:], rand.Uint64())
	}
	return sid
}
