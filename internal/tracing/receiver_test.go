package tracing_test

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/mcpexec/mcpexec/internal/tracing"
)

// span is a received span, flattened.
type span struct {
	Service, Name       string
	TraceID, ID, Parent string
	Kind                tracepb.Span_SpanKind
	Start, End          uint64
	Attrs               map[string]string
	Error               bool
}

// receiver is an in-process OTLP/HTTP traces receiver.
type receiver struct {
	URL string

	mu    sync.Mutex // guards spans, posts
	spans []span
	posts int
}

func newReceiver(t testing.TB) *receiver {
	r := &receiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil || req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		var ex coltrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &ex); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.add(&ex)
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{}) // an empty message always encodes
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out) // the exporter may have gone: nothing to do
	}))
	t.Cleanup(srv.Close)
	r.URL = srv.URL + "/v1/traces"
	return r
}

func (r *receiver) add(ex *coltrace.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.posts++
	for _, rs := range ex.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				attrs := map[string]string{}
				for _, kv := range s.GetAttributes() {
					v := kv.GetValue()
					switch {
					case v.GetStringValue() != "":
						attrs[kv.GetKey()] = v.GetStringValue()
					default:
						attrs[kv.GetKey()] = v.String()
					}
				}
				r.spans = append(r.spans, span{Service: service, Name: s.GetName(),
					TraceID: hex.EncodeToString(s.GetTraceId()), ID: hex.EncodeToString(s.GetSpanId()),
					Parent: hex.EncodeToString(s.GetParentSpanId()), Kind: s.GetKind(),
					Start: s.GetStartTimeUnixNano(), End: s.GetEndTimeUnixNano(), Attrs: attrs,
					Error: s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR})
			}
		}
	}
}

// trace returns the spans received of trace id.
func (r *receiver) trace(id string) []span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []span
	for _, s := range r.spans {
		if s.TraceID == id {
			out = append(out, s)
		}
	}
	return out
}

// provider makes an exporting provider for service that sends to r, shut
// down (and so flushed) when the test ends.
func (r *receiver) provider(t testing.TB, service string) *tracing.Provider {
	t.Helper()
	p, err := tracing.New(context.Background(), tracing.Config{Service: service, Enabled: true, EndpointURL: r.URL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return p
}
