package state

import (
	"crypto/sha256"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// Store is what a state replica keeps: the job records folded from the
// events stream, the memory folded from the memory stream, and how far it has
// folded each. The Service speaks to it only through this interface. Package
// boltstore (bbolt, one file per replica) holds the implementation, and
// package statetest the behaviour every Store must have.
type Store interface {
	// Applied returns the sequences of the events and memory streams folded.
	Applied() (events, memory uint64, err error)
	// AppliedAt returns when ApplyEvents and ApplyMemory last recorded a
	// sequence (this node's clock; zero when unknown): what the streams hold
	// from after then, the replica has not applied.
	AppliedAt() (events, memory time.Time, err error)
	// RewindEvents records seq, lower than what it has applied, as the
	// events stream's applied sequence, keeping the records: the stream lost
	// its events after seq, and new ones will take their sequences.
	RewindEvents(seq uint64) error
	// ResetMemory drops the memory folded (entries, usage, last writes and
	// the write ids remembered) and records 0 as the memory stream's applied
	// sequence: the memory is folded again from the stream's start.
	ResetMemory() error
	// MemoryDigests returns a digest of each memory entry held, by namespace
	// and key (joined by a zero byte): what a reset and a new fold changed.
	MemoryDigests() (map[string][sha256.Size]byte, error)

	// ApplyEvents folds evs into their records durably, records lastSeq as
	// the events stream's applied sequence (0 leaves it), and returns the
	// records that changed.
	ApplyEvents(evs []jobs.Event, lastSeq uint64) ([]*jobs.Record, error)
	// Job returns id's record, or ErrNotFound.
	Job(id string) (*jobs.Record, error)
	// Jobs returns the records of those ids that exist.
	Jobs(ids []string) ([]*jobs.Record, error)
	// List returns one page of the records matching f and the next cursor.
	List(f JobFilter) ([]*jobs.Record, string, error)
	// Children returns the ids of the jobs that name id as a parent.
	Children(id string) ([]string, error)
	// WithStatus returns the ids of the records in status st.
	WithStatus(st jobs.Status) ([]string, error)
	// FilesUsage returns the bytes the files of namespace ns's records hold
	// (Record.StoredBytes, summed as records are folded and pruned).
	FilesUsage(ns string) (int64, error)
	// Prune deletes the finished records r does not keep, and counts them.
	Prune(r Retention, now time.Time) (int, error)

	// ApplyMemory folds memory writes durably and records lastSeq as the
	// memory stream's applied sequence.
	ApplyMemory(ops []MemoryOp, lastSeq uint64) error
	// MemoryGet returns a key's memory, or ErrNotFound.
	MemoryGet(ns, key string) (*Memory, error)
	// MemoryList returns a namespace's memories whose keys start with prefix.
	MemoryList(ns, prefix string) ([]Memory, error)
	// AllMemory returns every namespace's memory (a migration's source).
	AllMemory() ([]Memory, error)
	// LastWrite returns the sequence of a key's last write (put or delete).
	LastWrite(ns, key string) (uint64, error)
	// WriteSeq returns the sequence a write id was applied at, if it was.
	WriteSeq(id string) (uint64, bool, error)
	// QuotaCheck reports ErrQuota when op would take its namespace over
	// maxBytes, counting reserved bytes (writes checked, not yet folded) as
	// held, and returns the bytes op adds to its namespace (at most 0 for a
	// write that does not grow it).
	QuotaCheck(op MemoryOp, maxBytes, reserved int64) (grow int64, err error)

	// Backup writes a consistent copy of the store to path and returns its size.
	Backup(path string) (int64, error)
}
