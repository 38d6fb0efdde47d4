// Package tracingenv starts a command's OpenTelemetry traces from the
// standard OTEL_* environment variables (see internal/tracing.FromEnv).
package tracingenv

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/mcpexec/mcpexec/internal/cli"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

// Start returns the process's tracer provider (a no-op one unless
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set)
// and a stop that flushes the spans still buffered (at most 5 s). Call stop
// after the process's parts have stopped. A variable the SDK cannot honour
// is a usage error.
func Start(ctx context.Context, service string, log *slog.Logger) (trace.TracerProvider, func(), error) {
	tp, _, stop, err := start(ctx, service, log, false)
	return tp, stop, err
}

// StartRecording is Start with an in-process span recorder (the last
// tracing.DefaultRecorderSpans spans of at most tracing.DefaultRecorderAge)
// wired into the provider, exporting or not: the front-end's console builds
// job timelines from it. The recorder is nil when OTEL_SDK_DISABLED=true.
func StartRecording(ctx context.Context, service string, log *slog.Logger) (trace.TracerProvider, *tracing.Recorder, func(), error) {
	return start(ctx, service, log, true)
}

func start(ctx context.Context, service string, log *slog.Logger, record bool) (trace.TracerProvider, *tracing.Recorder, func(), error) {
	if _, err := tracing.EnabledByEnv(os.Getenv); err != nil {
		return nil, nil, nil, cli.Usagef("%v", err)
	}
	var rec *tracing.Recorder
	if record && !strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		rec = tracing.NewRecorder(0, 0)
	}
	p, err := tracing.FromEnv(ctx, service, os.Getenv, log, rec)
	if err != nil {
		return nil, nil, nil, err
	}
	if on, _ := tracing.EnabledByEnv(os.Getenv); on {
		log.Info("exporting traces over OTLP/HTTP", "service", service)
	}
	return p.TracerProvider(), rec, func() {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := p.Shutdown(fctx); err != nil {
			log.Warn("traces not flushed", "err", err)
		}
	}, nil
}
