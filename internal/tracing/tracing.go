package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// TracerName is the instrumentation scope of every mcpexec span.
const TracerName = "github.com/mcpexec/mcpexec"

// Config configures New.
type Config struct {
	// Service is the service.name of the process's spans unless
	// OTEL_SERVICE_NAME (or service.name in OTEL_RESOURCE_ATTRIBUTES) names
	// another: "mcpexec-frontend", "mcpexec-worker", "mcpexec-broker".
	Service string
	// Enabled exports spans; false gives a no-op provider.
	Enabled bool
	// EndpointURL, when set, is where spans go (an OTLP/HTTP traces URL such
	// as http://127.0.0.1:4318/v1/traces), over the OTEL_EXPORTER_OTLP_*
	// variables. Tests use it; the processes leave it to the environment.
	EndpointURL string
	// Logger receives the exporter's errors (nil: discarded).
	Logger *slog.Logger
	// Recorder, when set, also keeps the process's finished spans in memory
	// (the console's job timelines), exported or not: with Enabled false the
	// provider records without exporting.
	Recorder *Recorder
}

// Provider is a process's tracer provider and what flushes it.
type Provider struct {
	tp  trace.TracerProvider
	sdk *sdktrace.TracerProvider // nil when disabled
}

// TracerProvider returns the provider to hand to the process's parts.
func (p *Provider) TracerProvider() trace.TracerProvider { return p.tp }

// ForceFlush exports the spans that ended and are still buffered.
func (p *Provider) ForceFlush(ctx context.Context) error {
	if p == nil || p.sdk == nil {
		return nil
	}
	return p.sdk.ForceFlush(ctx)
}

// Shutdown flushes the spans still buffered and stops the exporter. Call it
// once, after the process's parts have stopped; it is safe on a disabled
// provider.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.sdk == nil {
		return nil
	}
	if err := p.sdk.Shutdown(ctx); err != nil {
		return fmt.Errorf("flush traces: %w", err)
	}
	return nil
}

// FromEnv makes the provider the standard OpenTelemetry variables ask for
// (getenv is os.Getenv in the mains): spans are exported over OTLP/HTTP with
// protobuf when OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, unless OTEL_SDK_DISABLED=true or
// OTEL_TRACES_EXPORTER=none. The SDK reads the other variables itself
// (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_EXPORTER_OTLP_HEADERS,
// _TIMEOUT, _COMPRESSION, _CERTIFICATE, OTEL_TRACES_SAMPLER and _ARG,
// OTEL_BSP_*). A protocol other than http/protobuf is an error, not a
// silent fallback.
// rec, when not nil, records the spans whether or not they are exported
// (unless OTEL_SDK_DISABLED=true).
func FromEnv(ctx context.Context, service string, getenv func(string) string, logger *slog.Logger, rec *Recorder) (*Provider, error) {
	enabled, err := EnabledByEnv(getenv)
	if err != nil {
		return nil, err
	}
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		rec = nil // the SDK is off altogether: no recording either
	}
	return New(ctx, Config{Service: service, Enabled: enabled, Logger: logger, Recorder: rec})
}

// EnabledByEnv reports whether the environment asks for exported traces (see
// FromEnv), or what is wrong with it.
func EnabledByEnv(getenv func(string) string) (bool, error) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false, nil
	}
	switch e := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER"))); e {
	case "", "otlp":
	case "none":
		return false, nil
	default:
		return false, fmt.Errorf("OTEL_TRACES_EXPORTER=%q is not supported: use otlp (over OTLP/HTTP) or none", e)
	}
	if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return false, nil
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v := strings.TrimSpace(getenv(k)); v != "" {
			if v != "http/protobuf" {
				return false, fmt.Errorf("%s=%q is not supported: mcpexec exports traces over http/protobuf only (unset it, or point the endpoint at an OTLP/HTTP receiver, port 4318 by default)", k, v)
			}
			break // the traces variable wins over the general one
		}
	}
	return true, nil
}

// New makes a provider as cfg says.
func New(ctx context.Context, cfg Config) (*Provider, error) {
	if !cfg.Enabled && cfg.Recorder == nil {
		return &Provider{tp: noop.NewTracerProvider()}, nil
	}
	var popts []sdktrace.TracerProviderOption
	if cfg.Enabled {
		var opts []otlptracehttp.Option
		if cfg.EndpointURL != "" {
			opts = append(opts, otlptracehttp.WithEndpointURL(cfg.EndpointURL))
		}
		exp, err := otlptracehttp.New(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("OTLP trace exporter: %w", err)
		}
		popts = append(popts, sdktrace.WithBatcher(exp))
	}
	if cfg.Recorder != nil {
		popts = append(popts, sdktrace.WithSpanProcessor(cfg.Recorder))
	}
	// Later detectors win: the environment's service.name over ours.
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", cfg.Service)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("trace resource (OTEL_RESOURCE_ATTRIBUTES?): %w", err)
	}
	if cfg.Logger != nil {
		log := cfg.Logger
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("traces", "err", err) }))
	}
	sdk := sdktrace.NewTracerProvider(append(popts,
		sdktrace.WithResource(res),
		sdktrace.WithIDGenerator(newIDGenerator()),
	)...)
	return &Provider{tp: sdk, sdk: sdk}, nil
}

// Tracer returns mcpexec's tracer of tp, a no-op one when tp is nil.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return noop.NewTracerProvider().Tracer(TracerName)
	}
	return tp.Tracer(TracerName)
}
