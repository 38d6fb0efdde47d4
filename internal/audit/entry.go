package audit

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"time"

	"github.com/mcpexec/mcpexec/internal/errs"
)

// Decisions and who makes them: the namespace's policy (its tool rules,
// or the tool's annotations), or whoever answered the call's approval (a
// decided_by of their own).
const (
	DecisionAllow   = "allow"
	DecisionDeny    = "deny"
	DecidedByPolicy = "policy"
)

// Outcomes of a call.
const (
	OutcomeOK        = "ok"         // the tool answered
	OutcomeToolError = "tool_error" // the tool answered with isError
	OutcomeError     = "error"      // refused, timed out, or the server failed (Error says)
)

// Bounds of what an entry keeps.
const (
	// PreviewBytes is how much of the redacted arguments JSON an entry keeps.
	PreviewBytes = 1 << 10
	// MaxErrorBytes bounds an entry's error text.
	MaxErrorBytes = 256
	// MaxNameBytes bounds the server, tool and caller names (sandbox code
	// chose the tool's).
	MaxNameBytes = 128
)

// Entry is one proxied tool call as a front-end records it. Its JSON is what
// travels on the audit stream and what a replica stores and chains.
type Entry struct {
	// ID names the entry (the call's job, attempt and call id hashed, or
	// random): the stream deduplicates a retried publish by it.
	ID        string `json:"id"`
	JobID     string `json:"job_id"` // the wire id (scoped by namespace)
	Attempt   int    `json:"attempt"`
	Namespace string `json:"namespace"`
	// Caller is who submitted the job (jobs.Job.SubmittedBy: a token's
	// name or fingerprint, an OAuth subject), never a token.
	Caller string `json:"caller,omitempty"`
	Server string `json:"server"`
	Tool   string `json:"tool"`
	// ArgsSHA256 is the SHA-256 of the canonical arguments JSON (before
	// redaction), ArgsBytes its length, Args its first PreviewBytes after
	// redaction, ArgsClipped whether Args is cut short.
	ArgsSHA256  string    `json:"args_sha256"`
	ArgsBytes   int       `json:"args_bytes"`
	Args        string    `json:"args"`
	ArgsClipped bool      `json:"args_clipped,omitempty"`
	Decision    string    `json:"decision"`
	DecidedBy   string    `json:"decided_by"`
	Outcome     string    `json:"outcome"`
	Error       string    `json:"error,omitempty"`
	DurationMS  float64   `json:"duration_ms"`
	At          time.Time `json:"at"`
	Frontend    string    `json:"frontend,omitempty"`
	// Proof is the HMAC-SHA256 of the entry's other fields under the audit
	// key (Key): only a holder of the fleet's proxy key writes entries that
	// replicas keep.
	Proof string `json:"proof,omitempty"`
}

// Query selects a namespace's entries for a reader: by job (the caller's
// id), server, tool and decision; a page of at most Limit, newest first,
// after Cursor (the Next of the page before).
type Query struct {
	Job      string
	Server   string
	Tool     string
	Decision string
	Cursor   string
	Limit    int
}

// View is an entry as a reader sees it: its fields (its job id the
// reader's own, no proof) and its place in its namespace's chain.
type View struct {
	Entry
	Index uint64 `json:"index"`
	Hash  string `json:"hash"`
	Prev  string `json:"prev"`
}

// keyLabel derives the audit key from the proxy key: a key of its own, so
// an audit proof is never a valid capability or event proof.
const keyLabel = "mcpexec audit entries v1"

// Key is the audit key of the fleet whose proxy key is proxyKey.
func Key(proxyKey []byte) []byte {
	m := hmac.New(sha256.New, proxyKey)
	m.Write([]byte(keyLabel))
	return m.Sum(nil)
}

// proofOf is the HMAC of e without its proof.
func proofOf(key []byte, e Entry) string {
	e.Proof = ""
	data, _ := json.Marshal(e) // plain fields always encode
	m := hmac.New(sha256.New, key)
	m.Write(data)
	return hex.EncodeToString(m.Sum(nil))
}

// Sign sets e's proof under key (Key of the proxy key).
func Sign(key []byte, e *Entry) { e.Proof = proofOf(key, *e) }

// Check reports whether e carries its proof under key.
func Check(key []byte, e Entry) bool {
	want := proofOf(key, e)
	return hmac.Equal([]byte(want), []byte(e.Proof))
}

// Clip cuts s to at most n bytes at a rune boundary, valid UTF-8.
func Clip(s string, n int) string {
	return errs.Cut(strings.ToValidUTF8(s, "\uFFFD"), n)
}
