package jobs

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
)

// A job's proxy capability is the proof a sandbox's proxy call carries that it
// comes from a worker holding the job: an HMAC of the job id under the fleet's
// proxy key, which only front-ends hold. It travels in the job message (the
// only place a worker learns it) and never in events, records or API answers;
// a front-end recomputes it to check a call.

// CapabilityKeySize is the length of a fleet's proxy key in bytes.
const CapabilityKeySize = 32

// Capability returns job id's proxy capability under key.
func Capability(key []byte, id string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("mcpexec-proxy-capability/v1\x00"))
	m.Write([]byte(id))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// CheckCapability reports, in constant time, whether capability is job id's
// under key.
func CheckCapability(key []byte, id, capability string) bool {
	if len(key) == 0 || capability == "" {
		return false
	}
	return hmac.Equal([]byte(Capability(key, id)), []byte(capability))
}

// EventProof is the proof a started or finished event of attempt carries: an
// HMAC under the job's capability, so that an event that others may read
// (front-ends, a worker looking up a job's last attempt) gives away neither
// the capability nor the proof of any other event.
func EventProof(capability string, kind EventKind, attempt int) string {
	m := hmac.New(sha256.New, []byte(capability))
	fmt.Fprintf(m, "mcpexec-event/v1\x00%s\x00%d", kind, attempt)
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// CheckEvent reports whether ev carries its proof under key.
func CheckEvent(key []byte, ev Event) bool {
	if len(key) == 0 || ev.Proof == "" {
		return false
	}
	return hmac.Equal([]byte(EventProof(Capability(key, ev.Job), ev.Kind, ev.Attempt)), []byte(ev.Proof))
}

// OutputChunk is one live output chunk, as a worker publishes it on the job's
// output subject (Subjects.Output). Any worker host may publish there, so a
// front-end shows a chunk only when its proof checks.
type OutputChunk struct {
	Stream  string `json:"stream"`
	Data    string `json:"data"`
	Attempt int    `json:"attempt,omitempty"`
	// Seq numbers the chunks of one attempt, from 1.
	Seq uint64 `json:"seq,omitempty"`
	// Proof is OutputProof of the chunk under its job's capability.
	Proof string `json:"proof,omitempty"`
}

// OutputProof is the proof a live output chunk of job carries: an HMAC under
// the job's capability over the job id, attempt, sequence number, stream and
// data, so that only a worker given the job can speak for it.
func OutputProof(capability, job string, c OutputChunk) string {
	m := hmac.New(sha256.New, []byte(capability))
	fmt.Fprintf(m, "mcpexec-output/v1\x00%s\x00%d\x00%d\x00%s\x00", job, c.Attempt, c.Seq, c.Stream)
	m.Write([]byte(c.Data))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// CheckOutput reports whether c carries its proof under job's capability.
func CheckOutput(capability, job string, c OutputChunk) bool {
	if capability == "" || c.Proof == "" {
		return false
	}
	return hmac.Equal([]byte(OutputProof(capability, job, c)), []byte(c.Proof))
}

// SessionCapability returns, under the proxy key, the capability of the
// session whose key is sessionKey (Subjects.SessionKey). The job messages of
// the session's jobs carry it, so only a worker given one of its jobs can
// prove it holds the session.
func SessionCapability(key []byte, sessionKey string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("mcpexec-session-capability/v1\x00"))
	m.Write([]byte(sessionKey))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// SessionProof is the proof a sessions-bucket entry of the session whose key
// is sessionKey carries when it names worker: an HMAC under the session's
// capability, so that a worker host never given a job of the session cannot
// name itself (or anyone) its holder.
func SessionProof(sessionCapability, sessionKey, worker string) string {
	m := hmac.New(sha256.New, []byte(sessionCapability))
	fmt.Fprintf(m, "mcpexec-session/v1\x00%s\x00%s", sessionKey, worker)
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// CheckSessionProof reports whether proof is the proof of an entry of the
// session whose key is sessionKey naming worker, under the session's
// capability.
func CheckSessionProof(sessionCapability, sessionKey, worker, proof string) bool {
	if sessionCapability == "" || proof == "" {
		return false
	}
	return hmac.Equal([]byte(SessionProof(sessionCapability, sessionKey, worker)), []byte(proof))
}
