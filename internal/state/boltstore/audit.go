package boltstore

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/mcpexec/mcpexec/internal/audit"
	"github.com/mcpexec/mcpexec/internal/state"
)

// The audit trail: each namespace's entries in a chain of their own.
var (
	// 'n' + namespace → nested bucket: index (8 bytes, big-endian) → audit.Record (JSON)
	bucketAudit = []byte("audit")
	// namespace → chainHead (JSON)
	bucketAuditHeads = []byte("auditheads")
	// 'n' + namespace + 0 + job id + 0 + index (8 bytes) → empty
	bucketAuditByJob = []byte("auditbyjob")
	metaAuditSeq     = []byte("audit_seq")
)

var _ state.AuditStore = (*Store)(nil)

// chainHead is where a namespace's chain stands: the hash before its first
// entry held (Genesis, or the last pruned entry's), the first and last
// indexes held, and the last entry's hash.
type chainHead struct {
	Base  string `json:"base"`
	First uint64 `json:"first"`
	Last  uint64 `json:"last"`
	Head  string `json:"head"`
}

func indexKey(i uint64) []byte { return binary.BigEndian.AppendUint64(nil, i) }

func byJobPrefix(ns, job string) []byte {
	return append(append(append(nsBucketName(ns), 0), job...), 0)
}

// AuditApplied returns the audit stream's sequence folded.
func (s *Store) AuditApplied() (uint64, error) {
	var seq uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(metaAuditSeq); len(v) == 8 {
			seq = binary.BigEndian.Uint64(v)
		}
		return nil
	})
	return seq, err
}

func readHead(b *bolt.Bucket, ns string) (chainHead, error) {
	h := chainHead{Base: audit.Genesis, First: 1}
	if v := b.Get([]byte(ns)); v != nil {
		if err := json.Unmarshal(v, &h); err != nil {
			return h, fmt.Errorf("decode audit head of %q: %w", ns, err)
		}
	}
	return h, nil
}

func writeHead(b *bolt.Bucket, ns string, h chainHead) error {
	data, _ := json.Marshal(h) // plain fields always encode
	return b.Put([]byte(ns), data)
}

// ApplyAudit links entries into their namespaces' chains in one durable
// transaction and records lastSeq as the audit stream's applied sequence.
func (s *Store) ApplyAudit(entries []state.AuditIn, lastSeq uint64) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		chains, err := tx.CreateBucketIfNotExists(bucketAudit)
		if err != nil {
			return err
		}
		heads, err := tx.CreateBucketIfNotExists(bucketAuditHeads)
		if err != nil {
			return err
		}
		byJob, err := tx.CreateBucketIfNotExists(bucketAuditByJob)
		if err != nil {
			return err
		}
		for _, in := range entries {
			h, err := readHead(heads, in.Namespace)
			if err != nil {
				return err
			}
			var last *audit.Record
			if h.Last >= h.First {
				last = &audit.Record{Index: h.Last, Hash: h.Head}
			}
			rec := audit.Next(last, h.Base, in.Seq, in.Data)
			data, err := json.Marshal(rec)
			if err != nil {
				return err
			}
			chain, err := chains.CreateBucketIfNotExists(nsBucketName(in.Namespace))
			if err != nil {
				return err
			}
			if err := chain.Put(indexKey(rec.Index), data); err != nil {
				return err
			}
			if err := byJob.Put(append(byJobPrefix(in.Namespace, in.JobID), indexKey(rec.Index)...), nil); err != nil {
				return err
			}
			h.Last, h.Head = rec.Index, rec.Hash
			if err := writeHead(heads, in.Namespace, h); err != nil {
				return err
			}
		}
		return setApplied(tx, metaAuditSeq, lastSeq)
	})
}

// AuditList returns one page of f's entries, newest first.
func (s *Store) AuditList(f state.AuditFilter) ([]audit.Record, string, error) {
	if f.Limit <= 0 {
		f.Limit = state.DefaultAuditLimit
	}
	var before uint64 // list indexes below it (0: from the newest)
	if f.Cursor != "" {
		n, err := strconv.ParseUint(f.Cursor, 10, 64)
		if err != nil || n == 0 {
			return nil, "", fmt.Errorf("%w: cursor %.40q is not one this API gave", state.ErrInvalid, f.Cursor)
		}
		before = n
	}
	var out []audit.Record
	next := ""
	err := s.db.View(func(tx *bolt.Tx) error {
		chains := tx.Bucket(bucketAudit)
		if chains == nil {
			return nil
		}
		chain := chains.Bucket(nsBucketName(f.Namespace))
		if chain == nil {
			return nil
		}
		// Walk the chain, or the job's index, backwards from the cursor.
		var c *bolt.Cursor
		var prefix []byte
		indexOf := func(k []byte) uint64 { return binary.BigEndian.Uint64(k[len(k)-8:]) }
		if f.Job != "" {
			ix := tx.Bucket(bucketAuditByJob)
			if ix == nil {
				return nil
			}
			c, prefix = ix.Cursor(), byJobPrefix(f.Namespace, f.Job)
		} else {
			c = chain.Cursor()
		}
		// The first key to list is the last one below start.
		start := append(append([]byte(nil), prefix...), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
		if before > 0 {
			start = append(append([]byte(nil), prefix...), indexKey(before)...)
		}
		k, _ := c.Seek(start)
		if k == nil {
			k, _ = c.Last()
		} else {
			k, _ = c.Prev()
		}
		scanned := 0
		for ; k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Prev() {
			if len(k) != len(prefix)+8 {
				continue // another job whose id extends this one's
			}
			idx := indexOf(k)
			if len(out) == f.Limit || scanned == state.MaxAuditScan {
				next = strconv.FormatUint(idx+1, 10)
				return nil
			}
			scanned++
			v := chain.Get(indexKey(idx))
			if v == nil {
				continue // pruned
			}
			var rec audit.Record
			if err := json.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("decode audit entry %d of %q: %w", idx, f.Namespace, err)
			}
			var e audit.Entry
			if err := json.Unmarshal(rec.Entry, &e); err != nil {
				return fmt.Errorf("decode audit entry %d of %q: %w", idx, f.Namespace, err)
			}
			if e.Namespace != f.Namespace || f.Job != "" && e.JobID != f.Job || f.Server != "" && e.Server != f.Server ||
				f.Tool != "" && e.Tool != f.Tool || f.Decision != "" && e.Decision != f.Decision {
				continue
			}
			out = append(out, rec)
		}
		return nil
	})
	return out, next, err
}

// PruneAudit deletes the entries made before cutoff, from the start of
// each chain; the chain's base becomes the hash of its last deleted entry.
// A chain's entries are in the order the stream received them, so pruning
// stops at its first entry made at or after cutoff.
func (s *Store) PruneAudit(cutoff time.Time) (int, error) {
	n := 0
	err := s.db.Update(func(tx *bolt.Tx) error {
		chains, heads, byJob := tx.Bucket(bucketAudit), tx.Bucket(bucketAuditHeads), tx.Bucket(bucketAuditByJob)
		if chains == nil || heads == nil || byJob == nil {
			return nil
		}
		var names []string
		if err := heads.ForEach(func(k, _ []byte) error { names = append(names, string(k)); return nil }); err != nil {
			return err
		}
		for _, ns := range names {
			h, err := readHead(heads, ns)
			if err != nil {
				return err
			}
			chain := chains.Bucket(nsBucketName(ns))
			if chain == nil {
				continue
			}
			changed := false
			for h.First <= h.Last {
				v := chain.Get(indexKey(h.First))
				if v == nil {
					break // verify says so
				}
				var rec audit.Record
				var e audit.Entry
				if json.Unmarshal(v, &rec) != nil || json.Unmarshal(rec.Entry, &e) != nil || !e.At.Before(cutoff) {
					break
				}
				if err := chain.Delete(indexKey(h.First)); err != nil {
					return err
				}
				if err := byJob.Delete(append(byJobPrefix(ns, e.JobID), indexKey(h.First)...)); err != nil {
					return err
				}
				h.Base, h.First, changed = rec.Hash, h.First+1, true
				n++
			}
			if changed {
				if err := writeHead(heads, ns, h); err != nil {
					return err
				}
			}
		}
		return nil
	})
	return n, err
}

// AuditChain is what VerifyAudit found of one namespace's chain.
type AuditChain struct {
	Namespace string `json:"namespace"`
	Entries   uint64 `json:"entries"`
	First     uint64 `json:"first"`
	Last      uint64 `json:"last"`
	Head      string `json:"head"`
}

// VerifyAudit walks every audit chain of the state file at path (opened
// read-only; a broker using it must be stopped, or give a backup) and
// returns the chains, and an error that names the first entry that does
// not fit (*audit.BrokenError) when one does not.
func VerifyAudit(path string) ([]AuditChain, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open state file %s read-only: %w (a broker that uses it must be stopped: verify a `broker backup` of it instead)", path, err)
	}
	defer func() { _ = db.Close() }() // read-only: nothing to lose
	var out []AuditChain
	err = db.View(func(tx *bolt.Tx) error {
		chains, heads := tx.Bucket(bucketAudit), tx.Bucket(bucketAuditHeads)
		if chains == nil || heads == nil {
			return nil
		}
		seen := map[string]bool{}
		err := heads.ForEach(func(k, _ []byte) error {
			ns := string(k)
			seen[string(nsBucketName(ns))] = true
			h, err := readHead(heads, ns)
			if err != nil {
				return &audit.BrokenError{Namespace: ns, Reason: err.Error()}
			}
			v := audit.NewVerifier(ns, h.Base, h.First)
			if chain := chains.Bucket(nsBucketName(ns)); chain != nil {
				if err := chain.ForEach(func(_, data []byte) error {
					var rec audit.Record
					if err := json.Unmarshal(data, &rec); err != nil {
						return &audit.BrokenError{Namespace: ns, Reason: "an entry is not JSON: " + err.Error()}
					}
					return v.Add(rec)
				}); err != nil {
					return err
				}
			}
			if err := v.End(h.Head, h.Last); err != nil {
				return err
			}
			out = append(out, AuditChain{Namespace: ns, Entries: h.Last - h.First + 1, First: h.First, Last: h.Last, Head: h.Head})
			return nil
		})
		if err != nil {
			return err
		}
		return chains.ForEachBucket(func(name []byte) error {
			if !seen[string(name)] {
				return &audit.BrokenError{Namespace: string(name[1:]), Reason: "its entries have no chain head: the head was removed"}
			}
			return nil
		})
	})
	var broken *audit.BrokenError
	if err != nil && !errors.As(err, &broken) {
		return out, fmt.Errorf("verify audit trail of %s: %w", path, err)
	}
	return out, err
}
