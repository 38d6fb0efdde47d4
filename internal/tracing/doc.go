// Package tracing sets up OpenTelemetry traces for the mcpexec processes and
// holds what they share: the span and attribute names (see docs/design.md,
// "Traces"), the W3C trace context on NATS headers, and the trace id derived
// from a job's id for jobs whose caller sent no traceparent.
//
// Without an OTLP endpoint there is no exporter: the processes get a no-op
// TracerProvider and a span costs an interface call.
package tracing
