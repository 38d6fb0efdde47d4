// Package tracingenv starts a command's OpenTelemetry traces from the
// standard OTEL_* environment variables (see internal/tracing.FromEnv).
package tracingenv

import (
	"context"
	"log/slog"
	"os"
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
	if _, err := tracing.EnabledByEnv(os.Getenv); err != nil {
		return nil, nil, cli.Usagef("%v", err)
	}
	p, err := tracing.FromEnv(ctx, service, os.Getenv, log)
	if err != nil {
		return nil, nil, err
	}
	if on, _ := tracing.EnabledByEnv(os.Getenv); on {
		log.Info("exporting traces over OTLP/HTTP", "service", service)
	}
	return p.TracerProvider(), func() {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := p.Shutdown(fctx); err != nil {
			log.Warn("traces not flushed", "err", err)
		}
	}, nil
}
