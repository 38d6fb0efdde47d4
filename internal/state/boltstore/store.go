// Package state is the system of record: a bbolt file holding job records (the
// materialised view of the events stream), and the NATS service that fills it
// from the stream and answers queries about it.
// Package boltstore is the state Store in a bbolt file: one file per state
// replica, holding the job records and their indexes, the agents' memory, and
// how far the replica has folded each stream.
package boltstore

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/state"
)

// ErrLocked is returned by Open when another process holds the file.
var ErrLocked = errors.New("the state file is in use")

var (
	bucketJobs        = []byte("jobs")        // job id → jobs.Record (JSON)
	bucketDeadLetters = []byte("deadletters") // job id → empty: terminal records that are dead letters
	bucketFinished    = []byte("finished")    // finish time (8 bytes, big-endian ns) + job id → empty
	bucketMemory      = []byte("memory")      // 'n' + namespace → nested bucket: key → state.Memory (JSON)
	bucketMemoryUsage = []byte("memusage")    // namespace → bytes its memory holds (8 bytes, big-endian)
	bucketFilesUsage  = []byte("filesusage")  // namespace → bytes its jobs' files hold in the file store (8 bytes)
	// 'n' + namespace + 0 + key → sequence of the key's last write (put or delete)
	bucketMemoryWrites = []byte("memwrites")
	bucketMeta         = []byte("meta") // metaEventsSeq, metaMemorySeq → applied stream sequence (8 bytes)
	// Indexes of the job records: statusKey(status, id) → empty, and
	// labelKey(k, v, id) → empty.
	bucketByStatus = []byte("bystatus")
	bucketByLabel  = []byte("bylabel")
	// parent id + 0 + child id → empty: the jobs that wait for each job.
	bucketByParent = []byte("byparent")
	// Memory write ids applied lately: id → sequence, and (time, id) → empty.
	bucketWriteIDs       = []byte("writeids")
	bucketWriteIDsByTime = []byte("writeidsbytime")
)

// Keys of the meta bucket: how far this replica has folded each stream.
var (
	metaEventsSeq = []byte("events_seq")
	metaMemorySeq = []byte("memory_seq")
	// When events_seq and memory_seq were last recorded (this node's clock,
	// Unix ns).
	metaEventsAt = []byte("events_at")
	metaMemoryAt = []byte("memory_at")
)

func setApplied(tx *bolt.Tx, key []byte, seq uint64) error {
	return tx.Bucket(bucketMeta).Put(key, binary.BigEndian.AppendUint64(nil, seq))
}

// setAppliedNow records seq under key, and now under at.
func setAppliedNow(tx *bolt.Tx, key, at []byte, seq uint64) error {
	if err := setApplied(tx, key, seq); err != nil {
		return err
	}
	return tx.Bucket(bucketMeta).Put(at, binary.BigEndian.AppendUint64(nil, uint64(time.Now().UnixNano())))
}

// Applied returns the sequences of the events and memory streams this replica
// has folded.
func (s *Store) Applied() (events, memory uint64, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		m := tx.Bucket(bucketMeta)
		if v := m.Get(metaEventsSeq); len(v) == 8 {
			events = binary.BigEndian.Uint64(v)
		}
		if v := m.Get(metaMemorySeq); len(v) == 8 {
			memory = binary.BigEndian.Uint64(v)
		}
		return nil
	})
	return events, memory, err
}

// RewindEvents records seq as the events stream's applied sequence, keeping
// the records folded: the stream lost its events after seq.
func (s *Store) RewindEvents(seq uint64) error {
	return s.db.Update(func(tx *bolt.Tx) error { return setApplied(tx, metaEventsSeq, seq) })
}

// AppliedAt returns when the replica last recorded each stream's sequence
// applied (zero: never, or a file of an earlier version).
func (s *Store) AppliedAt() (events, memory time.Time, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		m := tx.Bucket(bucketMeta)
		if v := m.Get(metaEventsAt); len(v) == 8 {
			events = time.Unix(0, int64(binary.BigEndian.Uint64(v)))
		}
		if v := m.Get(metaMemoryAt); len(v) == 8 {
			memory = time.Unix(0, int64(binary.BigEndian.Uint64(v)))
		}
		return nil
	})
	return events, memory, err
}

// Store is the state.Store in a bbolt file. Its methods are safe for concurrent use.
// Every write is committed with fsync before the method returns.
type Store struct {
	db    *bolt.DB
	fresh bool // the file had no job bucket when opened
}

// Open opens (creating if needed) the bbolt file at path.
func Open(path string) (*Store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("open state file %s: %w (is another broker using the same --data?)", path, ErrLocked)
	}
	if err != nil {
		return nil, fmt.Errorf("open state file %s: %w", path, err)
	}
	db.MaxBatchDelay = 2 * time.Millisecond
	fresh := false
	err = db.Update(func(tx *bolt.Tx) error {
		fresh = tx.Bucket(bucketJobs) == nil
		unindexed := !fresh && tx.Bucket(bucketByStatus) == nil
		for _, name := range [][]byte{bucketJobs, bucketDeadLetters, bucketFinished, bucketMemory, bucketMemoryUsage, bucketMemoryWrites, bucketMeta, bucketByStatus, bucketByLabel, bucketByParent, bucketWriteIDs, bucketWriteIDsByTime, bucketFilesUsage} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		if unindexed { // a file of an earlier version
			return tx.Bucket(bucketJobs).ForEach(func(k, v []byte) error {
				var rec jobs.Record
				if err := json.Unmarshal(v, &rec); err != nil {
					return fmt.Errorf("decode record %s: %w", k, err)
				}
				return index(tx, nil, &rec)
			})
		}
		return nil
	})
	if err != nil {
		_ = db.Close() // the init failed: that is the error to report
		return nil, fmt.Errorf("init state file %s: %w", path, err)
	}
	return &Store{db: db, fresh: fresh}, nil
}

// Fresh reports whether the file held no job records when it was opened: the
// job index should then be rebuilt from the events stream.
func (s *Store) Fresh() bool { return s.fresh }

// Close closes the file.
func (s *Store) Close() error { return s.db.Close() }

// Job returns the record of id, or state.ErrNotFound.
func (s *Store) Job(id string) (*jobs.Record, error) {
	var rec *jobs.Record
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketJobs).Get([]byte(id))
		if v == nil {
			return state.ErrNotFound
		}
		rec = new(jobs.Record)
		return json.Unmarshal(v, rec)
	})
	return rec, err
}

// ApplyEvents folds events into their job records in one durable transaction,
// records lastSeq as the events stream's applied sequence (0 leaves it), and
// returns the records that changed.
func (s *Store) ApplyEvents(evs []jobs.Event, lastSeq uint64) ([]*jobs.Record, error) {
	var changed []*jobs.Record
	err := s.db.Update(func(tx *bolt.Tx) error {
		if lastSeq > 0 {
			if err := setAppliedNow(tx, metaEventsSeq, metaEventsAt, lastSeq); err != nil {
				return err
			}
		}
		changed = changed[:0]
		b := tx.Bucket(bucketJobs)
		dl, fin := tx.Bucket(bucketDeadLetters), tx.Bucket(bucketFinished)
		cache := map[string]*jobs.Record{}
		before := map[string]jobs.Record{} // what the index holds of each record read
		dirty := map[string]bool{}
		for _, ev := range evs {
			rec, ok := cache[ev.Job]
			if !ok {
				if v := b.Get([]byte(ev.Job)); v != nil {
					rec = new(jobs.Record)
					if err := json.Unmarshal(v, rec); err != nil {
						return fmt.Errorf("decode record %s: %w", ev.Job, err)
					}
					before[ev.Job] = *rec
				}
			}
			next, ch := jobs.Apply(rec, ev)
			cache[ev.Job] = next
			if ch {
				dirty[ev.Job] = true
			}
		}
		for id := range dirty {
			rec := cache[id]
			v, err := json.Marshal(rec)
			if err != nil {
				return fmt.Errorf("encode record %s: %w", id, err)
			}
			if err := b.Put([]byte(id), v); err != nil {
				return fmt.Errorf("write record %s: %w", id, err)
			}
			var old *jobs.Record
			if o, ok := before[id]; ok {
				old = &o
			}
			if err := index(tx, old, rec); err != nil {
				return fmt.Errorf("index record %s: %w", id, err)
			}
			if rec.Status.Terminal() && rec.FinishedAt != nil {
				if err := fin.Put(finishedKey(*rec.FinishedAt, id), nil); err != nil {
					return fmt.Errorf("index record %s: %w", id, err)
				}
			}
			if rec.DeadLetter() {
				if err := dl.Put([]byte(id), nil); err != nil {
					return fmt.Errorf("index dead letter %s: %w", id, err)
				}
			}
			changed = append(changed, rec)
		}
		return nil
	})
	return changed, err
}

// Backup writes a consistent snapshot of the file to path (one read
// transaction: the store goes on serving) and returns its size.
func (s *Store) Backup(path string) (int64, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, fmt.Errorf("backup: %w", err)
	}
	var n int64
	err = s.db.View(func(tx *bolt.Tx) error {
		var werr error
		n, werr = tx.WriteTo(f)
		return werr
	})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path) // best effort: what is left is removed at the next start
		return 0, fmt.Errorf("backup to %s: %w", path, err)
	}
	return n, nil
}

// Contents returns every key and value the replica holds (job records, their
// indexes, memory and its usage; not how far it has folded the streams, nor
// the write ids it applied lately: a rebuilt replica sees only each key's
// last write, as the memory stream keeps only that), each
// key prefixed by the path of its bucket. Replicas that folded the same
// streams hold the same contents, byte for byte. It is for tests and checks of
// small stores: it holds everything in memory.
func (s *Store) Contents() (map[string][]byte, error) {
	out := map[string][]byte{}
	var walk func(path string, b *bolt.Bucket) error
	walk = func(path string, b *bolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			if v == nil {
				return walk(path+"/"+string(k), b.Bucket(k))
			}
			out[path+"/"+string(k)] = bytes.Clone(v)
			return nil
		})
	}
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			if bytes.Equal(name, bucketMeta) || bytes.Equal(name, bucketWriteIDs) || bytes.Equal(name, bucketWriteIDsByTime) {
				return nil // progress, and a replica's own recent history
			}
			return walk(string(name), b)
		})
	})
	return out, err
}

// statusKey is the status index's key of a record: its status, a zero byte,
// its id (so one status's records are in id order).
func statusKey(st jobs.Status, id string) []byte {
	return append(append([]byte(st), 0), id...)
}

// labelPrefix is the label index's prefix of label k=v: both
// length-prefixed, so that no label's entries run into another's.
func labelPrefix(k, v string) []byte {
	b := binary.AppendUvarint(nil, uint64(len(k)))
	b = append(b, k...)
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

// index moves rec's index entries from what old (nil: none) had to what rec
// has. Labels never change after submission.
func index(tx *bolt.Tx, old, rec *jobs.Record) error {
	id := rec.Job.ID
	bs := tx.Bucket(bucketByStatus)
	if old != nil && old.Status != rec.Status {
		if err := bs.Delete(statusKey(old.Status, id)); err != nil {
			return err
		}
	}
	if old == nil || old.Status != rec.Status {
		if err := bs.Put(statusKey(rec.Status, id), nil); err != nil {
			return err
		}
	}
	var was int64
	if old != nil {
		was = old.StoredBytes()
	}
	if err := addFilesUsage(tx, rec.Job.Namespace, rec.StoredBytes()-was); err != nil {
		return err
	}
	if old == nil || len(old.Job.Labels) != len(rec.Job.Labels) {
		bl := tx.Bucket(bucketByLabel)
		for k, v := range rec.Job.Labels {
			if err := bl.Put(append(labelPrefix(k, v), id...), nil); err != nil {
				return err
			}
		}
	}
	if old == nil || (!old.Job.Waits() && rec.Job.Waits()) {
		bp := tx.Bucket(bucketByParent)
		for _, p := range rec.Job.Parents() {
			if err := bp.Put(parentKey(p, id), nil); err != nil {
				return err
			}
		}
	}
	return nil
}

func parentKey(parent, child string) []byte {
	return append(append([]byte(parent), 0), child...)
}

// Children returns the ids of the jobs that name id as a parent.
func (s *Store) Children(id string) ([]string, error) {
	return s.suffixes(bucketByParent, append([]byte(id), 0))
}

// WithStatus returns the ids of the records in status st.
func (s *Store) WithStatus(st jobs.Status) ([]string, error) {
	return s.suffixes(bucketByStatus, statusKey(st, ""))
}

// suffixes returns what follows prefix in the keys of bucket that have it.
func (s *Store) suffixes(bucket, prefix []byte) ([]string, error) {
	var out []string
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucket).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			out = append(out, string(k[len(prefix):]))
		}
		return nil
	})
	return out, err
}

// unindex deletes rec's index entries.
func unindex(tx *bolt.Tx, rec *jobs.Record) error {
	id := rec.Job.ID
	if err := tx.Bucket(bucketByStatus).Delete(statusKey(rec.Status, id)); err != nil {
		return err
	}
	if err := addFilesUsage(tx, rec.Job.Namespace, -rec.StoredBytes()); err != nil {
		return err
	}
	bl := tx.Bucket(bucketByLabel)
	for k, v := range rec.Job.Labels {
		if err := bl.Delete(append(labelPrefix(k, v), id...)); err != nil {
			return err
		}
	}
	bp := tx.Bucket(bucketByParent)
	for _, p := range rec.Job.Parents() {
		if err := bp.Delete(parentKey(p, id)); err != nil {
			return err
		}
	}
	return nil
}

// addFilesUsage adds delta to the bytes ns's files hold.
func addFilesUsage(tx *bolt.Tx, ns string, delta int64) error {
	if delta == 0 {
		return nil
	}
	b := tx.Bucket(bucketFilesUsage)
	key := []byte(jobs.NamespaceOf(ns))
	var n int64
	if v := b.Get(key); len(v) == 8 {
		n = int64(binary.BigEndian.Uint64(v))
	}
	if n += delta; n <= 0 {
		return b.Delete(key)
	}
	return b.Put(key, binary.BigEndian.AppendUint64(nil, uint64(n)))
}

// FilesUsage returns the bytes the files of ns's retained jobs hold.
func (s *Store) FilesUsage(ns string) (int64, error) {
	var n int64
	err := s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketFilesUsage).Get([]byte(jobs.NamespaceOf(ns))); len(v) == 8 {
			n = int64(binary.BigEndian.Uint64(v))
		}
		return nil
	})
	return n, err
}

var _ state.Store = (*Store)(nil)
