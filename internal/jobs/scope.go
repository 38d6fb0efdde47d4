package jobs

import (
	"crypto/sha256"
	"encoding/base32"
	"strings"
)

// Job ids are scoped to their namespace: the id a caller chooses (or is
// given) is its own, and the wire id, under which the job travels and is
// recorded, prefixes it with the namespace's tag. Two namespaces may use the
// same id without meeting, and a namespace's jobs are one prefix of the
// record index, so a listing never passes another namespace's records.

// DefaultNamespace is the namespace of callers without an identity.
const DefaultNamespace = "default"

// tagLen is the length of a namespace tag: 60 bits of a SHA-256.
const tagLen = 12

var tagEncoding = base32.HexEncoding.WithPadding(base32.NoPadding)

// NamespaceOf returns ns, or DefaultNamespace when ns is empty.
func NamespaceOf(ns string) string {
	if ns == "" {
		return DefaultNamespace
	}
	return ns
}

// NamespaceTag returns the prefix of ns's wire ids, separator included.
func NamespaceTag(ns string) string {
	sum := sha256.Sum256([]byte("mcpexec-namespace\x00" + NamespaceOf(ns)))
	return strings.ToLower(tagEncoding.EncodeToString(sum[:]))[:tagLen] + "-"
}

// ScopedID returns the wire id of namespace ns's job id.
func ScopedID(ns, id string) string { return NamespaceTag(ns) + id }

// UnscopedID returns the caller's id of wire id in namespace ns, and whether
// wire belongs to ns.
func UnscopedID(ns, wire string) (string, bool) {
	return strings.CutPrefix(wire, NamespaceTag(ns))
}

// View returns the record as namespace ns sees it: ids without the
// namespace's tag. The record is copied; rec is not changed.
func (r *Record) View(ns string) *Record {
	v := *r
	if id, ok := UnscopedID(ns, r.Job.ID); ok {
		v.Job.ID = id
	}
	if id, ok := UnscopedID(ns, r.Job.RetryOf); ok {
		v.Job.RetryOf = id
	}
	v.Job.After, v.Job.AfterAny = unscopeAll(ns, r.Job.After), unscopeAll(ns, r.Job.AfterAny)
	return &v
}

// ScopeAll returns the wire ids of namespace ns's ids (nil for none).
func ScopeAll(ns string, ids []string) []string {
	if len(ids) == 0 {
		return nil
	}
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = ScopedID(ns, id)
	}
	return out
}

func unscopeAll(ns string, wire []string) []string {
	if len(wire) == 0 {
		return nil
	}
	out := make([]string, len(wire))
	for i, w := range wire {
		out[i] = w
		if id, ok := UnscopedID(ns, w); ok {
			out[i] = id
		}
	}
	return out
}
