package tracing

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Recorder bounds.
const (
	DefaultRecorderSpans = 20_000
	DefaultRecorderAge   = time.Hour
	maxRecordedAttrs     = 24  // attributes kept of one span
	maxRecordedValue     = 256 // bytes of one attribute value
)

// RecordedSpan is a finished span as the recorder keeps it: what a console
// needs to draw a job's timeline, no more.
type RecordedSpan struct {
	TraceID  string            `json:"trace_id"`
	SpanID   string            `json:"span_id"`
	ParentID string            `json:"parent_id,omitempty"`
	Name     string            `json:"name"`
	Service  string            `json:"service,omitempty"`
	Start    time.Time         `json:"start"`
	End      time.Time         `json:"end"`
	Error    bool              `json:"error,omitempty"`
	Status   string            `json:"status,omitempty"` // the status description of a failed span
	Attrs    map[string]string `json:"attrs,omitempty"`
}

// Recorder is an sdktrace.SpanProcessor that keeps the most recent finished
// spans in memory, by trace id: at most Max spans, none older than MaxAge
// (by end time). It is what the console builds a job's timeline from when no
// trace backend is at hand. Safe for concurrent use.
type Recorder struct {
	max    int
	maxAge time.Duration
	now    func() time.Time

	mu      sync.Mutex // guards ring, head, n, byTrace
	ring    []*RecordedSpan
	head    int // index of the oldest span
	n       int // spans held
	byTrace map[trace.TraceID][]*RecordedSpan
}

var _ sdktrace.SpanProcessor = (*Recorder)(nil)

// NewRecorder returns a recorder of at most max spans (DefaultRecorderSpans
// when ≤ 0) none older than maxAge (DefaultRecorderAge when ≤ 0).
func NewRecorder(max int, maxAge time.Duration) *Recorder {
	if max <= 0 {
		max = DefaultRecorderSpans
	}
	if maxAge <= 0 {
		maxAge = DefaultRecorderAge
	}
	return &Recorder{max: max, maxAge: maxAge, now: time.Now, ring: make([]*RecordedSpan, max), byTrace: map[trace.TraceID][]*RecordedSpan{}}
}

// OnStart does nothing: only finished spans are kept.
func (r *Recorder) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd keeps s.
func (r *Recorder) OnEnd(s sdktrace.ReadOnlySpan) {
	sc := s.SpanContext()
	rs := &RecordedSpan{
		TraceID: sc.TraceID().String(),
		SpanID:  sc.SpanID().String(),
		Name:    s.Name(),
		Start:   s.StartTime(),
		End:     s.EndTime(),
	}
	if p := s.Parent(); p.IsValid() {
		rs.ParentID = p.SpanID().String()
	}
	if st := s.Status(); st.Code == codes.Error {
		rs.Error, rs.Status = true, Clean(st.Description, maxRecordedValue)
	}
	if res := s.Resource(); res != nil {
		if v, ok := res.Set().Value("service.name"); ok {
			rs.Service = Clean(v.String(), 64)
		}
	}
	if attrs := s.Attributes(); len(attrs) > 0 {
		rs.Attrs = make(map[string]string, min(len(attrs), maxRecordedAttrs))
		for i, kv := range attrs {
			if i == maxRecordedAttrs {
				break
			}
			rs.Attrs[string(kv.Key)] = Clean(kv.Value.String(), maxRecordedValue)
		}
	}
	tid := sc.TraceID()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expireLocked()
	if r.n == r.max {
		r.dropOldestLocked()
	}
	r.ring[(r.head+r.n)%r.max] = rs
	r.n++
	r.byTrace[tid] = append(r.byTrace[tid], rs)
}

// expireLocked drops the spans older than maxAge.
func (r *Recorder) expireLocked() {
	cutoff := r.now().Add(-r.maxAge)
	for r.n > 0 && r.ring[r.head].End.Before(cutoff) {
		r.dropOldestLocked()
	}
}

// dropOldestLocked drops the oldest span; it is the first of its trace's.
func (r *Recorder) dropOldestLocked() {
	old := r.ring[r.head]
	r.ring[r.head] = nil
	r.head = (r.head + 1) % r.max
	r.n--
	tid, err := trace.TraceIDFromHex(old.TraceID)
	if err != nil {
		return
	}
	spans := r.byTrace[tid]
	if len(spans) > 0 && spans[0] == old {
		spans[0] = nil
		spans = spans[1:] // FIFO: a trace's spans are held in the order they ended
	}
	if len(spans) == 0 {
		delete(r.byTrace, tid)
		return
	}
	r.byTrace[tid] = spans
}

// Trace returns copies of the spans held of trace id (32 hex digits), in the
// order they ended; nil for an unknown or malformed id.
func (r *Recorder) Trace(id string) []RecordedSpan {
	if r == nil {
		return nil
	}
	tid, err := trace.TraceIDFromHex(id)
	if err != nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.expireLocked()
	spans := r.byTrace[tid]
	out := make([]RecordedSpan, len(spans))
	for i, s := range spans {
		out[i] = *s
	}
	return out
}

// Len returns the number of spans held.
func (r *Recorder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// Shutdown does nothing: the recorder holds no resources.
func (r *Recorder) Shutdown(context.Context) error { return nil }

// ForceFlush does nothing: spans are kept as they end.
func (r *Recorder) ForceFlush(context.Context) error { return nil }
