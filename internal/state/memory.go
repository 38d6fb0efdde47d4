package state

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	bolt "go.etcd.io/bbolt"
)

// Memory is one entry of an agent's memory: a JSON value under a key in a
// namespace (the authenticated caller's). Version starts at 1 and grows by one
// on every write, for compare-and-set.
type Memory struct {
	Namespace string          `json:"namespace"`
	Key       string          `json:"key"`
	Value     json.RawMessage `json:"value,omitempty"`
	Metadata  json.RawMessage `json:"metadata,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
	Version   uint64          `json:"version"`
}

// ErrConflict is returned by a compare-and-set write whose expected version is
// not the stored one.
var ErrConflict = errors.New("version conflict")

// ErrInvalid is returned for a request that can never succeed as sent (too
// large, empty key, malformed JSON); its message says what to change.
var ErrInvalid = errors.New("invalid request")

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
func (s *Store) MemoryGet(ns, key string) (*Memory, error) {
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

// MemoryPut writes m (Namespace, Key, Value, Metadata; the times and version are
// the store's). ifVersion nil writes unconditionally; *ifVersion == 0 writes only
// when the key is absent; any other value writes only when the stored version
// equals it. A refused write returns ErrConflict. Concurrent puts share commits.
func (s *Store) MemoryPut(m Memory, ifVersion *uint64, now time.Time) (*Memory, error) {
	return s.MemoryPutQuota(m, ifVersion, 0, now)
}

// ErrQuota is returned by a write that would take a namespace's memory over
// its quota.
var ErrQuota = errors.New("memory quota exceeded")

// MemoryPutQuota is MemoryPut with a quota: when maxBytes > 0, a write that
// would make the namespace's memory (keys, values, metadata) larger than
// maxBytes is refused with ErrQuota. Writes that shrink it always pass.
func (s *Store) MemoryPutQuota(m Memory, ifVersion *uint64, maxBytes int64, now time.Time) (*Memory, error) {
	if err := checkNamespaceKey(m.Namespace, m.Key); err != nil {
		return nil, err
	}
	if len(m.Value) == 0 {
		return nil, invalidf("memory value is required (any JSON value; use delete to remove a key)")
	}
	if len(m.Value) > MaxMemoryValue {
		return nil, invalidf("memory value is %d bytes, over the limit of %d bytes: store less, or split it over several keys", len(m.Value), MaxMemoryValue)
	}
	if !json.Valid(m.Value) {
		return nil, invalidf("memory value is not valid JSON")
	}
	if len(m.Metadata) > MaxMemoryMetadata {
		return nil, invalidf("memory metadata is %d bytes, over the limit of %d bytes", len(m.Metadata), MaxMemoryMetadata)
	}
	if len(m.Metadata) > 0 && !json.Valid(m.Metadata) {
		return nil, invalidf("memory metadata is not valid JSON")
	}
	now = now.UTC()
	var out *Memory
	conflict := false
	// Batch may run the function more than once: it sets its results afresh.
	err := s.db.Batch(func(tx *bolt.Tx) error {
		out, conflict = nil, false
		b, err := tx.Bucket(bucketMemory).CreateBucketIfNotExists(nsBucketName(m.Namespace))
		if err != nil {
			return err
		}
		next := m
		next.CreatedAt, next.UpdatedAt, next.Version = now, now, 1
		if v := b.Get([]byte(m.Key)); v != nil {
			var old Memory
			if err := json.Unmarshal(v, &old); err != nil {
				return fmt.Errorf("decode memory %q: %w", m.Key, err)
			}
			if ifVersion != nil && *ifVersion != old.Version {
				conflict = true
				return nil
			}
			next.CreatedAt, next.Version = old.CreatedAt, old.Version+1
		} else if ifVersion != nil && *ifVersion != 0 {
			conflict = true
			return nil
		}
		data, err := json.Marshal(next)
		if err != nil {
			return err
		}
		used, err := usage(tx, m.Namespace, b)
		if err != nil {
			return err
		}
		grown := used - entrySize(m.Key, b.Get([]byte(m.Key))) + entrySize(m.Key, data)
		if maxBytes > 0 && grown > maxBytes && grown > used {
			return fmt.Errorf("%w: namespace %q would hold %d bytes of memory, over its quota of %d: delete keys you no longer need, or store less",
				ErrQuota, m.Namespace, grown, maxBytes)
		}
		if err := b.Put([]byte(m.Key), data); err != nil {
			return err
		}
		if err := setUsage(tx, m.Namespace, grown); err != nil {
			return err
		}
		out = &next
		return nil
	})
	if errors.Is(err, ErrQuota) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("write memory %q: %w", m.Key, err)
	}
	if conflict {
		return nil, ErrConflict
	}
	return out, nil
}

// MemoryList returns the entries of ns whose key starts with prefix, in key
// order, without their values.
func (s *Store) MemoryList(ns, prefix string) ([]Memory, error) {
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

// MemoryDelete deletes key in ns and reports whether it existed.
func (s *Store) MemoryDelete(ns, key string) (bool, error) {
	if err := checkNamespaceKey(ns, key); err != nil {
		return false, err
	}
	existed := false
	err := s.db.Batch(func(tx *bolt.Tx) error {
		existed = false
		b := tx.Bucket(bucketMemory).Bucket(nsBucketName(ns))
		if b == nil || b.Get([]byte(key)) == nil {
			return nil
		}
		existed = true
		used, err := usage(tx, ns, b)
		if err != nil {
			return err
		}
		if err := setUsage(tx, ns, used-entrySize(key, b.Get([]byte(key)))); err != nil {
			return err
		}
		return b.Delete([]byte(key))
	})
	if err != nil {
		return false, fmt.Errorf("delete memory %q: %w", key, err)
	}
	return existed, nil
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
