package tracing_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

// BenchmarkRunTraced runs `print(1)` through the whole fleet (front-end,
// JetStream, worker, process runtime, state service) with tracing off (no
// provider: no-op tracers) and on (three exporting providers posting to an
// in-process OTLP receiver). Run it with
//
//	go test -run '^$' -bench RunTraced -benchtime 100x ./internal/tracing
//
// "recorded" is the embedded front-end's default without an OTLP endpoint:
// one provider for the three parts, no exporter, every span kept by the
// in-process recorder the console reads.
func BenchmarkRunTraced(b *testing.B) {
	for _, name := range []string{"off", "recorded", "on"} {
		b.Run(name, func(b *testing.B) {
			var f *fleet
			switch name {
			case "off":
				f = startFleet(b, nil)
			case "recorded":
				p := recordingProvider(b, tracing.NewRecorder(0, 0))
				f = startFleetOn(b, p, p, p)
			default:
				f = startFleet(b, newReceiver(b))
			}
			ctx := context.Background()
			run := func() {
				rec, err := f.fe.Run(ctx, &jobs.Job{Code: "print(1)"}, nil)
				if err != nil || rec.Status != jobs.StatusSuccess {
					b.Fatalf("run: %v %+v", err, rec)
				}
			}
			for range 3 {
				run() // warm up
			}
			b.ResetTimer()
			for range b.N {
				run()
			}
		})
	}
}

// BenchmarkSpan is what one span costs a process: start it from a parent
// taken off a NATS header, put its traceparent on the next header, end it.
// "recorded" is the front-end's default without an OTLP endpoint: no
// export, the span kept by the in-process recorder (full, so every span
// also evicts the oldest).
func BenchmarkSpan(b *testing.B) {
	for _, name := range []string{"off", "recorded", "on"} {
		b.Run(name, func(b *testing.B) {
			p, err := tracing.New(context.Background(), tracing.Config{})
			if err != nil {
				b.Fatal(err)
			}
			switch name {
			case "on":
				p = newReceiver(b).provider(b, "bench")
			case "recorded":
				p = recordingProvider(b, tracing.NewRecorder(1000, 0))
			}
			tr := tracing.Tracer(p.TracerProvider())
			in := nats.Header{jobs.TraceHeader: {jobs.TraceParent("bench")}}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				ctx, span := tr.Start(tracing.FromHeader(context.Background(), in), tracing.SpanProxyCall,
					trace.WithAttributes(tracing.AttrJobID.String("bench"), tracing.AttrMethod.String("call_tool")))
				out := nats.Header{}
				tracing.Inject(ctx, out)
				span.End()
			}
		})
	}
}
