package boltstore

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/state"
)

// maxScan bounds the records one List call examines, so a filter that matches
// little cannot hold the file for long; the caller continues from the returned
// cursor.
const maxScan = 50_000

// Jobs returns the records of ids that exist, in the order of ids.
func (s *Store) Jobs(ids []string) ([]*jobs.Record, error) {
	var out []*jobs.Record
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketJobs)
		for _, id := range ids {
			v := b.Get([]byte(id))
			if v == nil {
				continue
			}
			rec := new(jobs.Record)
			if err := json.Unmarshal(v, rec); err != nil {
				return fmt.Errorf("decode record %s: %w", id, err)
			}
			out = append(out, rec)
		}
		return nil
	})
	return out, err
}

// List returns the records matching f in id order (submission order for
// generated ids), and the cursor of the next page ("" on the last page).
func (s *Store) List(f state.JobFilter) ([]*jobs.Record, string, error) {
	if err := f.Validate(); err != nil {
		return nil, "", err
	}
	limit := f.Limit
	if limit == 0 {
		limit = state.DefaultListLimit
	}
	var out []*jobs.Record
	next := ""
	err := s.db.View(func(tx *bolt.Tx) error {
		jb := tx.Bucket(bucketJobs)
		// Walk the narrowest index: its keys are a fixed head, then the id.
		idx, head := jb, []byte(nil)
		switch {
		case f.DeadLetter:
			idx = tx.Bucket(bucketDeadLetters)
		case f.Status != "":
			idx, head = tx.Bucket(bucketByStatus), statusKey(f.Status, "")
		case len(f.Labels) > 0:
			k := slices.Min(slices.Collect(maps.Keys(f.Labels)))
			idx, head = tx.Bucket(bucketByLabel), labelPrefix(k, f.Labels[k])
		}
		c := idx.Cursor()
		prefix := append(slices.Clip(head), f.Prefix...)
		var k []byte
		step := c.Next
		switch {
		case f.Newest:
			step = c.Prev
			at := successor(prefix) // past the last key of the prefix
			if f.Cursor != "" {
				at = append(slices.Clip(head), f.Cursor...)
			}
			if at == nil {
				k, _ = c.Last()
			} else if k, _ = c.Seek(at); k == nil {
				k, _ = c.Last()
			} else {
				k, _ = c.Prev() // the last key before at
			}
		case f.Cursor != "":
			at := append(slices.Clip(head), f.Cursor...)
			k, _ = c.Seek(at)
			if k != nil && bytes.Equal(k, at) {
				k, _ = c.Next()
			}
		default:
			k, _ = c.Seek(prefix)
		}
		for scanned := 0; k != nil && bytes.HasPrefix(k, prefix); k, _ = step() {
			id := k[len(head):]
			if scanned++; scanned > maxScan {
				next = string(id)
				return nil
			}
			v := jb.Get(id)
			if v == nil {
				continue
			}
			rec := new(jobs.Record)
			if err := json.Unmarshal(v, rec); err != nil {
				return fmt.Errorf("decode record %s: %w", id, err)
			}
			if !f.Match(rec) {
				continue
			}
			if len(out) == limit {
				next = string(out[len(out)-1].Job.ID)
				return nil
			}
			out = append(out, rec)
		}
		return nil
	})
	return out, next, err
}

// successor returns the smallest key greater than every key starting with
// prefix, or nil when there is none (an empty prefix, or all 0xff).
func successor(prefix []byte) []byte {
	s := slices.Clone(prefix)
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] < 0xff {
			s[i]++
			return s[:i+1]
		}
	}
	return nil
}

// Prune deletes finished records as r says and returns how many it deleted.
// It works in transactions of bounded size, oldest finished first.
func (s *Store) Prune(r state.Retention, now time.Time) (int, error) {
	total := 0
	for {
		n, more, err := s.pruneSome(r, now, 1000)
		total += n
		if err != nil || !more {
			return total, err
		}
	}
}

func (s *Store) pruneSome(r state.Retention, now time.Time, batch int) (deleted int, more bool, err error) {
	err = s.db.Update(func(tx *bolt.Tx) error {
		fin := tx.Bucket(bucketFinished)
		excess := 0
		if r.MaxCount > 0 {
			excess = fin.Stats().KeyN - r.MaxCount
		}
		var cutoff []byte
		if r.MaxAge > 0 {
			cutoff = finishedKey(now.Add(-r.MaxAge), "")
		}
		var keys [][]byte
		c := fin.Cursor()
		for k, _ := c.First(); k != nil && len(keys) < batch; k, _ = c.Next() {
			old := cutoff != nil && bytes.Compare(k, cutoff) < 0
			if !old && len(keys) >= excess {
				break
			}
			keys = append(keys, append([]byte(nil), k...))
		}
		more = len(keys) == batch
		jb, dl := tx.Bucket(bucketJobs), tx.Bucket(bucketDeadLetters)
		for _, k := range keys {
			id := k[8:]
			if err := fin.Delete(k); err != nil {
				return err
			}
			if v := jb.Get(id); v != nil {
				var rec jobs.Record
				if err := json.Unmarshal(v, &rec); err != nil {
					return fmt.Errorf("decode record %s: %w", id, err)
				}
				if err := unindex(tx, &rec); err != nil {
					return err
				}
			}
			// A record finished once; its index entry is its only one.
			if err := jb.Delete(id); err != nil {
				return err
			}
			if err := dl.Delete(id); err != nil {
				return err
			}
			deleted++
		}
		return nil
	})
	if err != nil {
		return 0, false, fmt.Errorf("prune finished jobs: %w", err)
	}
	return deleted, more, nil
}

// ResetJobs deletes every job record and index (memory is kept), before a
// rebuild from the events stream.
func (s *Store) ResetJobs() error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketJobs, bucketDeadLetters, bucketFinished, bucketByStatus, bucketByLabel} {
			if err := tx.DeleteBucket(name); err != nil {
				return err
			}
			if _, err := tx.CreateBucket(name); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("reset job records: %w", err)
	}
	return nil
}

// finishedKey orders finished records by time, then id.
func finishedKey(t time.Time, id string) []byte {
	k := make([]byte, 8+len(id))
	binary.BigEndian.PutUint64(k, uint64(max(t.UnixNano(), 0)))
	copy(k[8:], id)
	return k
}

// FinishedCount returns how many job records are terminal.
func (s *Store) FinishedCount() (int, error) {
	n := 0
	err := s.db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket(bucketFinished).Stats().KeyN
		return nil
	})
	return n, err
}
