package audit

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
)

// Genesis is the previous hash of a chain's first entry.
var Genesis = strings.Repeat("0", 2*sha256.Size)

// chainLabel separates the chain's hashes from any other SHA-256.
const chainLabel = "mcpexec audit chain v1\x00"

// Record is an entry as a state replica keeps it: linked into its
// namespace's chain. Entry holds the bytes received, unchanged, so that
// anyone can recompute Hash from what is stored.
type Record struct {
	// Index is the entry's place in its namespace's chain, from 1.
	Index uint64 `json:"index"`
	// Seq is the audit stream's sequence of the entry's message.
	Seq  uint64 `json:"seq"`
	Prev string `json:"prev"`
	Hash string `json:"hash"`
	// Entry is the entry's JSON as the front-end published it.
	Entry json.RawMessage `json:"entry"`
}

// Link is the hash of the entry with those bytes at index (and stream
// sequence seq) after the entry whose hash is prev.
func Link(prev string, index, seq uint64, entry []byte) string {
	h := sha256.New()
	h.Write([]byte(chainLabel))
	h.Write([]byte(prev))
	var n [16]byte
	binary.BigEndian.PutUint64(n[:8], index)
	binary.BigEndian.PutUint64(n[8:], seq)
	h.Write(n[:])
	h.Write(entry)
	return hex.EncodeToString(h.Sum(nil))
}

// Next is the record of entry after the record last (nil: the first of a
// chain whose base is base, Genesis for a chain never pruned).
func Next(last *Record, base string, seq uint64, entry []byte) Record {
	prev, index := base, uint64(1)
	if last != nil {
		prev, index = last.Hash, last.Index+1
	}
	return Record{Index: index, Seq: seq, Prev: prev, Hash: Link(prev, index, seq, entry), Entry: entry}
}

// BrokenError names the first entry of a chain that does not fit.
type BrokenError struct {
	Namespace string `json:"namespace"`
	Index     uint64 `json:"index"` // the entry's place (as stored, or as expected when missing)
	Seq       uint64 `json:"seq"`
	Reason    string `json:"reason"`
}

func (e *BrokenError) Error() string {
	return fmt.Sprintf("audit chain of namespace %q broken at entry %d (stream sequence %d): %s", e.Namespace, e.Index, e.Seq, e.Reason)
}

// Verifier checks one namespace's chain record by record, in index order.
type Verifier struct {
	Namespace string
	prev      string
	next      uint64
}

// NewVerifier checks the chain of namespace ns whose first record held
// follows the hash base (Genesis, or the last pruned entry's hash) at
// index first.
func NewVerifier(ns, base string, first uint64) *Verifier {
	return &Verifier{Namespace: ns, prev: base, next: first}
}

// Add checks the next record; the first that does not fit is a
// *BrokenError.
func (v *Verifier) Add(r Record) error {
	broken := func(why string, args ...any) error {
		return &BrokenError{Namespace: v.Namespace, Index: r.Index, Seq: r.Seq, Reason: fmt.Sprintf(why, args...)}
	}
	switch {
	case r.Index != v.next:
		return &BrokenError{Namespace: v.Namespace, Index: v.next, Seq: r.Seq,
			Reason: fmt.Sprintf("entry %d is missing (the next one held is %d): removed", v.next, r.Index)}
	case r.Prev != v.prev:
		return broken("its previous hash %.16s… is not the hash of the entry before it (%.16s…): an entry before it was removed or replaced", r.Prev, v.prev)
	case r.Hash != Link(r.Prev, r.Index, r.Seq, r.Entry):
		return broken("its hash does not match its content: the entry was altered")
	}
	var e Entry
	if err := json.Unmarshal(r.Entry, &e); err != nil {
		return broken("its entry is not JSON: %v", err)
	}
	if e.Namespace != v.Namespace {
		return broken("its entry names namespace %q: moved from another chain", e.Namespace)
	}
	v.prev, v.next = r.Hash, r.Index+1
	return nil
}

// End checks the chain's recorded head (its last hash and index) against
// what was walked: a removed last entry is found here.
func (v *Verifier) End(head string, last uint64) error {
	if last != v.next-1 || head != v.prev {
		return &BrokenError{Namespace: v.Namespace, Index: last, Reason: fmt.Sprintf("the chain's head says entry %d with hash %.16s…, the last entry held is %d with %.16s…: its last entries were removed or altered", last, head, v.next-1, v.prev)}
	}
	return nil
}
