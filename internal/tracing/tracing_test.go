package tracing_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

func TestEnabledByEnv(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env     map[string]string
		on, bad bool
	}{
		{env: nil},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, on: true},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, on: true},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"}},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "none"}},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "zipkin"}, bad: true},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, bad: true},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
			"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, on: true},
	} {
		on, err := tracing.EnabledByEnv(func(k string) string { return c.env[k] })
		if on != c.on || (err != nil) != c.bad {
			t.Errorf("%v: on=%v err=%v", c.env, on, err)
		}
	}
}

func TestDisabledProviderIsNoop(t *testing.T) {
	t.Parallel()
	p, err := tracing.New(context.Background(), tracing.Config{Service: "x"})
	if err != nil {
		t.Fatal(err)
	}
	_, span := tracing.Tracer(p.TracerProvider()).Start(context.Background(), "s")
	if span.IsRecording() {
		t.Fatal("a disabled provider records spans")
	}
	span.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestHeaderParentIsValidated: a hostile traceparent on a NATS header
// never becomes a parent.
func TestHeaderParentIsValidated(t *testing.T) {
	t.Parallel()
	good := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, v := range []string{"", "garbage", good + "-extra", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", "01" + good[2:]} {
		ctx := tracing.FromHeader(context.Background(), nats.Header{jobs.TraceHeader: {v}})
		if trace.SpanContextFromContext(ctx).IsValid() {
			t.Errorf("header %q became a parent", v)
		}
	}
	ctx := tracing.FromHeader(context.Background(), nats.Header{jobs.TraceHeader: {good}})
	if got := tracing.TraceParent(ctx); got != good {
		t.Fatalf("round trip: %q", got)
	}
	h := nats.Header{}
	if !tracing.Inject(ctx, h) || h.Get(jobs.TraceHeader) != good {
		t.Fatalf("inject: %v", h)
	}
}
