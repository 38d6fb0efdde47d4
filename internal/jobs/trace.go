package jobs

import (
	"crypto/sha256"
	"encoding/hex"
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

// TraceID returns the trace id of a traceparent value, or "" when it is not a
// valid one (ValidTraceParent).
func TraceID(traceparent string) string {
	if !ValidTraceParent(traceparent) {
		return ""
	}
	return traceparent[3:35]
}

// Trace returns the job's traceparent: TraceParent when the front-end set a
// valid one, else the one derived from the job's id.
func (j *Job) Trace() string {
	if ValidTraceParent(j.TraceParent) {
		return j.TraceParent
	}
	return TraceParent(j.ID)
}

// ValidTraceParent reports whether s is a W3C traceparent this system accepts
// from the network: exactly version 00, "00-" + 32 + "-" + 16 + "-" + 2
// lower-case hex digits (55 bytes, nothing after), a trace id and a parent id
// that are not all zeros. Anything else (upper case, other versions, extra
// fields, whitespace) is refused rather than repaired.
func ValidTraceParent(s string) bool {
	if len(s) != 55 || s[0] != '0' || s[1] != '0' || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return false
	}
	return lowerHex(s[3:35]) && lowerHex(s[36:52]) && lowerHex(s[53:55]) &&
		!allZero(s[3:35]) && !allZero(s[36:52])
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func allZero(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] != '0' {
			return false
		}
	}
	return true
}
