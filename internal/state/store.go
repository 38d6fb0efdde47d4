// Package state is the system of record: a bbolt file holding job records (the
// materialised view of the events stream), and the NATS service that fills it
// from the stream and answers queries about it.
package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// ErrNotFound is returned when no record exists for a key.
var ErrNotFound = errors.New("not found")

var bucketJobs = []byte("jobs")

// Store is the bbolt file. Its methods are safe for concurrent use.
type Store struct {
	db *bolt.DB
}

// Open opens (creating if needed) the bbolt file at path.
func Open(path string) (*Store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open state file %s: %w (is another broker using the same --data?)", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bucketJobs)
		return err
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("init state file %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

// Close closes the file.
func (s *Store) Close() error { return s.db.Close() }

// Job returns the record of id, or ErrNotFound.
func (s *Store) Job(id string) (*jobs.Record, error) {
	var rec *jobs.Record
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketJobs).Get([]byte(id))
		if v == nil {
			return ErrNotFound
		}
		rec = new(jobs.Record)
		return json.Unmarshal(v, rec)
	})
	return rec, err
}

// ApplyEvents folds events into their job records in one durable transaction and
// returns the records that changed.
func (s *Store) ApplyEvents(evs []jobs.Event) ([]*jobs.Record, error) {
	var changed []*jobs.Record
	err := s.db.Update(func(tx *bolt.Tx) error {
		changed = changed[:0]
		b := tx.Bucket(bucketJobs)
		cache := map[string]*jobs.Record{}
		dirty := map[string]bool{}
		for _, ev := range evs {
			rec, ok := cache[ev.Job]
			if !ok {
				if v := b.Get([]byte(ev.Job)); v != nil {
					rec = new(jobs.Record)
					if err := json.Unmarshal(v, rec); err != nil {
						return fmt.Errorf("decode record %s: %w", ev.Job, err)
					}
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
			changed = append(changed, rec)
		}
		return nil
	})
	return changed, err
}
