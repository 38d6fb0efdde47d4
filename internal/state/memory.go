package state

import (
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/mcpexec/mcpexec/internal/errs"
)

// Memory is one entry of an agent's memory: a JSON value under a key in a
// namespace (the authenticated caller's). Version is the stream sequence of
// the write that stored it, for compare-and-set.
type Memory struct {
	Namespace string          `json:"namespace"`
	Key       string          `json:"key"`
	Value     json.RawMessage `json:"value,omitempty"`
	Metadata  json.RawMessage `json:"metadata,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
	Version   uint64          `json:"version"`
	// WriteID names the write that stored this version (the client's id of
	// its put, the same across its retries), so a retried put that already
	// landed is answered, not applied twice.
	WriteID string `json:"write_id,omitempty"`
}

// ErrConflict is returned by a compare-and-set write whose expected version is
// not the stored one.
var ErrConflict = errs.New(errs.Conflict, "version conflict")

// ErrInvalid is returned for a request that can never succeed as sent (too
// large, empty key, malformed JSON); its message says what to change.
var ErrInvalid = errs.New(errs.Invalid, "invalid request")

// Memory limits.
const (
	MaxNamespaceBytes = 256
	MaxMemoryKeyBytes = 1024
	MaxMemoryValue    = 1 << 20 // bytes of the JSON value
	MaxMemoryMetadata = 64 << 10
	// MaxMemoryList bounds the entries one list returns.
	MaxMemoryList = 10_000
)

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

func CheckNamespaceKey(ns, key string) error {
	if len(ns) > MaxNamespaceBytes || !utf8.ValidString(ns) {
		return invalidf("namespace must be valid UTF-8 of at most %d bytes", MaxNamespaceBytes)
	}
	if key == "" || len(key) > MaxMemoryKeyBytes || !utf8.ValidString(key) {
		return invalidf("memory key must be 1-%d bytes of valid UTF-8, got %d bytes", MaxMemoryKeyBytes, len(key))
	}
	return nil
}

// ErrQuota is returned by a write that would take a namespace's memory over
// its quota.
var ErrQuota = errs.New(errs.Quota, "memory quota exceeded")

// MemoryOp is one write of the memory stream: the log every replica folds.
// Everything a replica stores comes from it (times included), so replicas
// agree byte for byte.
type MemoryOp struct {
	Op        string          `json:"op"` // MemoryPutOp or MemoryDeleteOp
	Namespace string          `json:"namespace"`
	Key       string          `json:"key"`
	Value     json.RawMessage `json:"value,omitempty"`
	Metadata  json.RawMessage `json:"metadata,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	At        time.Time       `json:"at"`
	WriteID   string          `json:"write_id,omitempty"`
	// Seq is the write's stream sequence (not encoded): the version of what
	// it writes.
	Seq uint64 `json:"-"`
}

// Memory operations.
const (
	MemoryPutOp    = "put"
	MemoryDeleteOp = "delete"
)

// CheckMemory validates a put of m before it is written.
func CheckMemory(m Memory) error {
	if err := CheckNamespaceKey(m.Namespace, m.Key); err != nil {
		return err
	}
	if len(m.Value) == 0 {
		return invalidf("memory value is required (any JSON value; use delete to remove a key)")
	}
	if len(m.Value) > MaxMemoryValue {
		return invalidf("memory value is %d bytes, over the limit of %d bytes: store less, or split it over several keys", len(m.Value), MaxMemoryValue)
	}
	if !json.Valid(m.Value) {
		return invalidf("memory value is not valid JSON")
	}
	if len(m.Metadata) > MaxMemoryMetadata {
		return invalidf("memory metadata is %d bytes, over the limit of %d bytes", len(m.Metadata), MaxMemoryMetadata)
	}
	if len(m.Metadata) > 0 && !json.Valid(m.Metadata) {
		return invalidf("memory metadata is not valid JSON")
	}
	return nil
}

// Entry is the memory entry a put stores when applied at seq (also what a
// writer is answered).
func (op MemoryOp) Entry(seq uint64) *Memory {
	return &Memory{Namespace: op.Namespace, Key: op.Key, Value: op.Value, Metadata: op.Metadata,
		CreatedAt: op.CreatedAt.UTC(), UpdatedAt: op.At.UTC(), Version: seq, WriteID: op.WriteID}
}
