package jobs

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// TraceHeader is the NATS header that carries a job's W3C trace context from the
// front-end through the job message to the worker and on to its events and proxy
// calls, so one job can be followed across processes.
const TraceHeader = "traceparent"

// TraceParent returns the W3C traceparent of job id: the trace id is derived from
// the id, so every process names the same trace for the same job even where a
// header was lost.
func TraceParent(id string) string {
	sum := sha256.Sum256([]byte(id))
	return "00-" + hex.EncodeToString(sum[:16]) + "-" + hex.EncodeToString(sum[16:24]) + "-01"
}

// TraceID returns the trace id of a traceparent value, or "" when it is not one.
func TraceID(traceparent string) string {
	parts := strings.Split(traceparent, "-")
	if len(parts) != 4 || len(parts[1]) != 32 {
		return ""
	}
	if _, err := hex.DecodeString(parts[1]); err != nil {
		return ""
	}
	return parts[1]
}
