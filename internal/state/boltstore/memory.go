package boltstore

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/mcpexec/mcpexec/internal/state"

	bolt "go.etcd.io/bbolt"
)

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", state.ErrInvalid, fmt.Sprintf(format, args...))
}

// nsBucketName maps a namespace to its nested bucket name, injectively (bbolt
// refuses an empty bucket name, and keys are compared as exact bytes).
func nsBucketName(ns string) []byte { return append([]byte{'n'}, ns...) }

// MemoryGet returns the entry of key in ns, or state.ErrNotFound.
func (s *Store) MemoryGet(ns, key string) (*state.Memory, error) {
	if err := state.CheckNamespaceKey(ns, key); err != nil {
		return nil, err
	}
	var m *state.Memory
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketMemory).Bucket(nsBucketName(ns))
		if b == nil {
			return state.ErrNotFound
		}
		v := b.Get([]byte(key))
		if v == nil {
			return state.ErrNotFound
		}
		m = new(state.Memory)
		return json.Unmarshal(v, m)
	})
	return m, err
}

// MemoryList returns the entries of ns whose key starts with prefix, in key
// order, without their values.
func (s *Store) MemoryList(ns, prefix string) ([]state.Memory, error) {
	if len(ns) > state.MaxNamespaceBytes {
		return nil, invalidf("namespace must be at most %d bytes", state.MaxNamespaceBytes)
	}
	out := []state.Memory{}
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketMemory).Bucket(nsBucketName(ns))
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for k, v := c.Seek([]byte(prefix)); k != nil && strings.HasPrefix(string(k), prefix); k, v = c.Next() {
			if len(out) == state.MaxMemoryList {
				return invalidf("more than %d memory entries match: list with a longer prefix", state.MaxMemoryList)
			}
			var m state.Memory
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

// memEntry is how a put stores its entry (also what counts against the quota).
func memEntry(op state.MemoryOp) ([]byte, error) { return json.Marshal(op.Entry(op.Seq)) }

// QuotaCheck reports state.ErrQuota when putting op (its Seq unknown yet) would make
// its namespace's memory, with reserved bytes of writes not yet folded,
// larger than maxBytes (0: no quota), and returns the bytes the put adds.
// Writes that shrink it always pass.
func (s *Store) QuotaCheck(op state.MemoryOp, maxBytes, reserved int64) (int64, error) {
	if maxBytes <= 0 {
		return 0, nil
	}
	op.Seq = 1<<63 - 1 // the widest version: the check never undercounts
	data, err := memEntry(op)
	if err != nil {
		return 0, err
	}
	var grow int64
	err = s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketMemory).Bucket(nsBucketName(op.Namespace))
		var used, old int64
		if b != nil {
			var err error
			if used, err = usage(tx, op.Namespace, b); err != nil {
				return err
			}
			old = entrySize(op.Key, b.Get([]byte(op.Key)))
		}
		held := used + max(reserved, 0)
		grow = entrySize(op.Key, data) - old
		if grown := held + grow; grown > maxBytes && grow > 0 {
			return fmt.Errorf("%w: namespace %q would hold %d bytes of memory, over its quota of %d: delete keys you no longer need, or store less",
				state.ErrQuota, op.Namespace, grown, maxBytes)
		}
		return nil
	})
	return grow, err
}

// LastWrite returns the stream sequence of the last write (put or delete) of
// key in ns that this replica applied, 0 when none: the expected last subject
// sequence of a write that must find the key absent.
func (s *Store) LastWrite(ns, key string) (uint64, error) {
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
func (s *Store) ApplyMemory(ops []state.MemoryOp, lastSeq uint64) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		writes := tx.Bucket(bucketMemoryWrites)
		for _, op := range ops {
			if state.CheckNamespaceKey(op.Namespace, op.Key) != nil {
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
			case state.MemoryPutOp:
				data, err := memEntry(op)
				if err != nil {
					return err
				}
				if err := b.Put([]byte(op.Key), data); err != nil {
					return err
				}
				used += entrySize(op.Key, data)
			case state.MemoryDeleteOp:
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
		return setAppliedNow(tx, metaMemorySeq, metaMemoryAt, lastSeq)
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
func (s *Store) MemoryUsage(ns string) (int64, error) {
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
func (s *Store) AllMemory() ([]state.Memory, error) {
	var out []state.Memory
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMemory).ForEachBucket(func(name []byte) error {
			return tx.Bucket(bucketMemory).Bucket(name).ForEach(func(_, v []byte) error {
				var m state.Memory
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

// ResetMemory drops the memory this replica folded (entries, usage, each
// key's last write, the write ids remembered) and records 0 as the memory
// stream's applied sequence, in one transaction.
func (s *Store) ResetMemory() error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketMemory, bucketMemoryUsage, bucketMemoryWrites, bucketWriteIDs, bucketWriteIDsByTime} {
			if err := tx.DeleteBucket(name); err != nil {
				return err
			}
			if _, err := tx.CreateBucket(name); err != nil {
				return err
			}
		}
		return setApplied(tx, metaMemorySeq, 0)
	})
	if err != nil {
		return fmt.Errorf("reset memory: %w", err)
	}
	return nil
}

// MemoryDigests returns the SHA-256 of each stored memory entry, by
// namespace and key joined by a zero byte.
func (s *Store) MemoryDigests() (map[string][sha256.Size]byte, error) {
	out := map[string][sha256.Size]byte{}
	err := s.db.View(func(tx *bolt.Tx) error {
		mem := tx.Bucket(bucketMemory)
		return mem.ForEachBucket(func(name []byte) error {
			return mem.Bucket(name).ForEach(func(k, v []byte) error {
				out[string(name[1:])+"\x00"+string(k)] = sha256.Sum256(v)
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
func rememberWrite(tx *bolt.Tx, op state.MemoryOp) error {
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
func (s *Store) WriteSeq(id string) (uint64, bool, error) {
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
