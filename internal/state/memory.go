package state

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/mcpexec/mcpexec/internal/errs"

	bolt "go.etcd.io/bbolt"
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

func checkNamespaceKey(ns, key string) error {
	if len(ns) > MaxNamespaceBytes || !utf8.ValidString(ns) {
		return invalidf("namespace must be valid UTF-8 of at most %d bytes", MaxNamespaceBytes)
	}
	if key == "" || len(key) > MaxMemoryKeyBytes || !utf8.ValidString(key) {
		return invalidf("memory key must be 1-%d bytes of valid UTF-8, got %d bytes", MaxMemoryKeyBytes, len(key))
	}
	return nil
}

// nsBucketName maps a namespace to its nested bucket name, injectively (bbolt
// refuses an empty bucket name, and keys are compared as exact bytes).
func nsBucketName(ns string) []byte { return append([]byte{'n'}, ns...) }

// MemoryGet returns the entry of key in ns, or ErrNotFound.
func (s *Bolt) MemoryGet(ns, key string) (*Memory, error) {
	if err := checkNamespaceKey(ns, key); err != nil {
		return nil, err
	}
	var m *Memory
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketMemory).Bucket(nsBucketName(ns))
		if b == nil {
			return ErrNotFound
		}
		v := b.Get([]byte(key))
		if v == nil {
			return ErrNotFound
		}
		m = new(Memory)
		return json.Unmarshal(v, m)
	})
	return m, err
}

// MemoryList returns the entries of ns whose key starts with prefix, in key
// order, without their values.
func (s *Bolt) MemoryList(ns, prefix string) ([]Memory, error) {
	if len(ns) > MaxNamespaceBytes {
		return nil, invalidf("namespace must be at most %d bytes", MaxNamespaceBytes)
	}
	out := []Memory{}
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketMemory).Bucket(nsBucketName(ns))
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for k, v := c.Seek([]byte(prefix)); k != nil && strings.HasPrefix(string(k), prefix); k, v = c.Next() {
			if len(out) == MaxMemoryList {
				return invalidf("more than %d memory entries match: list with a longer prefix", MaxMemoryList)
			}
			var m Memory
			if err := json.Unmarshal(v, &m); err != nil {
				return fmt.Errorf("decode memory %q: %w", k, err)
			}
			m.Value = nil
			out = append(out, m)
		}
		return nil
	})
	return out, err
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
	if err := checkNamespaceKey(m.Namespace, m.Key); err != nil {
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

// entry is the memory entry a put stores when applied at seq (also what a
// writer is answered).
func (op MemoryOp) entry(seq uint64) *Memory {
	return &Memory{Namespace: op.Namespace, Key: op.Key, Value: op.Value, Metadata: op.Metadata,
		CreatedAt: op.CreatedAt.UTC(), UpdatedAt: op.At.UTC(), Version: seq, WriteID: op.WriteID}
}

// memEntry is how a put stores its entry (also what counts against the quota).
func memEntry(op MemoryOp) ([]byte, error) { return json.Marshal(op.entry(op.Seq)) }

// QuotaCheck reports ErrQuota when putting op (its Seq unknown yet) would make
// its namespace's memory larger than maxBytes (0: no quota). Writes that
// shrink it always pass.
func (s *Bolt) QuotaCheck(op MemoryOp, maxBytes int64) error {
	if maxBytes <= 0 {
		return nil
	}
	op.Seq = 1<<63 - 1 // the widest version: the check never undercounts
	data, err := memEntry(op)
	if err != nil {
		return err
	}
	return s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketMemory).Bucket(nsBucketName(op.Namespace))
		var used, old int64
		if b != nil {
			var err error
			if used, err = usage(tx, op.Namespace, b); err != nil {
				return err
			}
			old = entrySize(op.Key, b.Get([]byte(op.Key)))
		}
		grown := used - old + entrySize(op.Key, data)
		if grown > maxBytes && grown > used {
			return fmt.Errorf("%w: namespace %q would hold %d bytes of memory, over its quota of %d: delete keys you no longer need, or store less",
				ErrQuota, op.Namespace, grown, maxBytes)
		}
		return nil
	})
}

// LastWrite returns the stream sequence of the last write (put or delete) of
// key in ns that this replica applied, 0 when none: the expected last subject
// sequence of a write that must find the key absent.
func (s *Bolt) LastWrite(ns, key string) (uint64, error) {
	var seq uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMemoryWrites).Get(memWriteKey(ns, key)); len(v) == 8 {
			seq = binary.BigEndian.Uint64(v)
		}
		return nil
	})
	return seq, err
}

func memWriteKey(ns, key string) []byte { return append(append(nsBucketName(ns), 0), key...) }

// ApplyMemory folds memory writes (in stream order) into the store in one
// durable transaction, and records lastSeq as the memory stream's applied
// sequence.
func (s *Bolt) ApplyMemory(ops []MemoryOp, lastSeq uint64) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		writes := tx.Bucket(bucketMemoryWrites)
		for _, op := range ops {
			if checkNamespaceKey(op.Namespace, op.Key) != nil {
				continue // nothing valid to apply (a writer past our checks)
			}
			b, err := tx.Bucket(bucketMemory).CreateBucketIfNotExists(nsBucketName(op.Namespace))
			if err != nil {
				return err
			}
			used, err := usage(tx, op.Namespace, b)
			if err != nil {
				return err
			}
			used -= entrySize(op.Key, b.Get([]byte(op.Key)))
			switch op.Op {
			case MemoryPutOp:
				data, err := memEntry(op)
				if err != nil {
					return err
				}
				if err := b.Put([]byte(op.Key), data); err != nil {
					return err
				}
				used += entrySize(op.Key, data)
			case MemoryDeleteOp:
				if err := b.Delete([]byte(op.Key)); err != nil {
					return err
				}
			}
			if err := setUsage(tx, op.Namespace, used); err != nil {
				return err
			}
			if err := writes.Put(memWriteKey(op.Namespace, op.Key), binary.BigEndian.AppendUint64(nil, op.Seq)); err != nil {
				return err
			}
			if err := rememberWrite(tx, op); err != nil {
				return err
			}
		}
		return setApplied(tx, metaMemorySeq, lastSeq)
	})
	if err != nil {
		return fmt.Errorf("apply memory writes: %w", err)
	}
	return nil
}

// entrySize is what one stored entry counts against its namespace's quota.
func entrySize(key string, data []byte) int64 {
	if data == nil {
		return 0
	}
	return int64(len(key) + len(data))
}

// usage returns the bytes ns's memory (bucket b) holds, counting them once
// for a namespace written before usage was kept.
func usage(tx *bolt.Tx, ns string, b *bolt.Bucket) (int64, error) {
	if v := tx.Bucket(bucketMemoryUsage).Get(nsBucketName(ns)); len(v) == 8 {
		return int64(binary.BigEndian.Uint64(v)), nil
	}
	var n int64
	err := b.ForEach(func(k, v []byte) error {
		n += entrySize(string(k), v)
		return nil
	})
	return n, err
}

func setUsage(tx *bolt.Tx, ns string, n int64) error {
	return tx.Bucket(bucketMemoryUsage).Put(nsBucketName(ns), binary.BigEndian.AppendUint64(nil, uint64(max(n, 0))))
}

// MemoryUsage returns the bytes namespace ns's memory holds.
func (s *Bolt) MemoryUsage(ns string) (int64, error) {
	var n int64
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketMemory).Bucket(nsBucketName(ns))
		if b == nil {
			return nil
		}
		var err error
		n, err = usage(tx, ns, b)
		return err
	})
	return n, err
}

// AllMemory returns every memory entry of every namespace, with its value.
func (s *Bolt) AllMemory() ([]Memory, error) {
	var out []Memory
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMemory).ForEachBucket(func(name []byte) error {
			return tx.Bucket(bucketMemory).Bucket(name).ForEach(func(_, v []byte) error {
				var m Memory
				if err := json.Unmarshal(v, &m); err != nil {
					return err
				}
				out = append(out, m)
				return nil
			})
		})
	})
	return out, err
}

// writeIDMemory is how long a replica remembers the write ids it applied (by
// the writes' own times, so every replica forgets the same ones): a put
// retried within it is answered with what it stored.
const writeIDMemory = 15 * time.Minute

// rememberWrite records op's write id with its sequence, and forgets the ids
// of writes more than writeIDMemory older than op.
func rememberWrite(tx *bolt.Tx, op MemoryOp) error {
	if op.WriteID == "" {
		return nil
	}
	ids, byTime := tx.Bucket(bucketWriteIDs), tx.Bucket(bucketWriteIDsByTime)
	if err := ids.Put([]byte(op.WriteID), binary.BigEndian.AppendUint64(nil, op.Seq)); err != nil {
		return err
	}
	if err := byTime.Put(finishedKey(op.At, op.WriteID), nil); err != nil {
		return err
	}
	cutoff := finishedKey(op.At.Add(-writeIDMemory), "")
	c := byTime.Cursor()
	for k, _ := c.First(); k != nil && bytes.Compare(k, cutoff) < 0; k, _ = c.First() {
		if err := ids.Delete(k[8:]); err != nil {
			return err
		}
		if err := byTime.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// WriteSeq returns the stream sequence of the applied write whose id is id,
// if this replica remembers it.
func (s *Bolt) WriteSeq(id string) (uint64, bool, error) {
	var seq uint64
	var ok bool
	err := s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketWriteIDs).Get([]byte(id)); len(v) == 8 {
			seq, ok = binary.BigEndian.Uint64(v), true
		}
		return nil
	})
	return seq, ok, err
}
