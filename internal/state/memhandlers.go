package state

// The state service's memory endpoints: reads, compare-and-set writes
// through the memory stream, lists and deletes.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
)

// MemoryKeyRequest is the body of memory.get, memory.delete and memory.list (where
// Key is a prefix).
type MemoryKeyRequest struct {
	Namespace string `json:"namespace"`
	Key       string `json:"key"`
}

// MemoryPutRequest is the body of a memory.put request.
type MemoryPutRequest struct {
	Memory    Memory  `json:"memory"`
	IfVersion *uint64 `json:"if_version,omitempty"`
	// MaxBytes is the namespace's memory quota (0: none); the front-end sends
	// its namespace policy's.
	MaxBytes int64 `json:"max_bytes,omitempty"`
	// WriteID names this put, the same across its retries (at most 64
	// letters, digits, '-' and '_'): a retry of a put that landed is answered
	// with what it stored.
	WriteID string `json:"write_id,omitempty"`
}

// MemoryDeleteReply is the answer of memory.delete.
type MemoryDeleteReply struct {
	Deleted bool `json:"deleted"`
}

// MemoryListReply is the answer of memory.list.
type MemoryListReply struct {
	Entries []Memory `json:"entries"`
}

func (s *Service) handleMemoryGet(req micro.Request) {
	var r MemoryKeyRequest
	if !decodeReq(req, &r, OpMemoryGet, `{"namespace": ..., "key": ...}`) {
		return
	}
	m, err := s.store.MemoryGet(r.Namespace, r.Key)
	if errors.Is(err, ErrNotFound) {
		err = fmt.Errorf("%w: no memory %q", ErrNotFound, r.Key)
	}
	s.respond(req, m, err)
}

// handleMemoryPut writes through the memory stream: it checks the write and
// the namespace's quota against this replica (reserving the bytes it adds
// until the write is folded, so that concurrent writes cannot pass the quota
// together), publishes it (compare-and-set is JetStream's expected last
// subject sequence), waits until this replica has applied it, and answers the
// stored entry, whose version is the write's stream sequence.
func (s *Service) handleMemoryPut(req micro.Request) {
	var r MemoryPutRequest
	if !decodeReq(req, &r, OpMemoryPut, `{"memory": {...}, "if_version": N}`) {
		return
	}
	m := r.Memory
	if err := CheckMemory(m); err != nil {
		s.respond(req, nil, err)
		return
	}
	if !validWriteID(r.WriteID) {
		s.respond(req, nil, invalidf("write_id %.80q is not 1 to 64 letters, digits, '-' and '_'", r.WriteID))
		return
	}
	now := time.Now().UTC()
	op := MemoryOp{Op: MemoryPutOp, Namespace: m.Namespace, Key: m.Key, Value: m.Value, Metadata: m.Metadata, CreatedAt: now, At: now, WriteID: r.WriteID}
	cur, err := s.store.MemoryGet(m.Namespace, m.Key)
	switch {
	case err == nil && r.WriteID != "" && cur.WriteID == r.WriteID:
		s.respond(req, cur, nil) // a retry of a put that landed
		return
	case err == nil:
		op.CreatedAt = cur.CreatedAt
	case !errors.Is(err, ErrNotFound):
		s.respond(req, nil, err)
		return
	}
	conflict := fmt.Errorf("%w: memory %q changed since it was read: read it again and retry", ErrConflict, m.Key)
	var expect *uint64
	if r.IfVersion != nil {
		stale := (*r.IfVersion == 0 && cur != nil) || (*r.IfVersion != 0 && (cur == nil || cur.Version != *r.IfVersion))
		switch {
		case stale && r.WriteID == "":
			s.respond(req, nil, conflict)
			return
		case *r.IfVersion == 0 && !stale:
			last, err := s.store.LastWrite(m.Namespace, m.Key) // a deleted key's tombstone
			if err != nil {
				s.respond(req, nil, err)
				return
			}
			// The entry is read again after its last write: a creation this
			// replica applied between the first read and LastWrite would
			// otherwise pass for a tombstone to write over, and two "only
			// if absent" writes both succeed. Seen absent after last, the
			// key's last write is last or a later one that JetStream's
			// check refuses.
			switch again, err := s.store.MemoryGet(m.Namespace, m.Key); {
			case err == nil && again != nil:
				expect = r.IfVersion // created since: JetStream refuses "absent"
			case err != nil && !errors.Is(err, ErrNotFound):
				s.respond(req, nil, err)
				return
			default:
				expect = &last
			}
		default:
			// Stale, this may still be a retry of this very write, which
			// landed and was overwritten since: JetStream refuses it (the
			// key's subject is not at the version asked; nats-server 2.15
			// checks that before its duplicate window), and it is looked
			// up below.
			expect = r.IfVersion
		}
	}
	res, err := s.quota.reserve(m.Namespace, func(reserved int64) (int64, error) {
		return s.store.QuotaCheck(op, r.MaxBytes, reserved)
	})
	if err != nil {
		s.respond(req, nil, fmt.Errorf("%w: %w", ErrInvalid, err))
		return
	}
	seq, err := s.writeMemory(op, expect, res)
	if isWrongLastSeq(err) && r.WriteID != "" {
		// Refused: unless this is a retry of a write that landed after
		// what this replica has applied.
		if seq, ok, err := landed(s.catchUpMemory, s.store.WriteSeq, r.WriteID); err != nil || ok {
			s.respond(req, op.Entry(seq), err)
			return
		}
	}
	if isWrongLastSeq(err) {
		s.respond(req, nil, conflict)
		return
	}
	if err != nil {
		s.respond(req, nil, err)
		return
	}
	s.respond(req, op.Entry(seq), nil)
}

// landed tells a refused retry of write id from a conflict: once this
// replica has caught up with the memory stream (catchUp), a write it
// remembers (lookup) landed, and one it does not is a conflict. When it
// cannot catch up (a leader elected, the stream away), it cannot tell, and
// says so (ErrUnavailable: the caller retries with the same id). Taking
// that for a conflict made update_memory read the key again and apply its
// change a second time, when the write had landed: JetStream forgets the
// id of a write a later one replaced (one message per key) once a node
// restarts, so such a retry after a fault reaches this check.
func landed(catchUp func() error, lookup func(id string) (uint64, bool, error), id string) (uint64, bool, error) {
	if err := catchUp(); err != nil {
		return 0, false, fmt.Errorf("%w: whether write %s landed cannot be told yet (the replica could not catch up with the memory stream): %w", ErrUnavailable, id, err)
	}
	return lookup(id)
}

// catchUpMemory waits (within catchUpWait) until this replica has applied
// everything the memory stream holds now.
func (s *Service) catchUpMemory() error {
	ctx, cancel := context.WithTimeout(context.Background(), catchUpWait)
	defer cancel()
	last, err := s.lastSeq(ctx, s.sub.MemoryStream())
	if err != nil {
		return err
	}
	return s.applied.wait(ctx, 0, last, catchUpWait, false)
}

// writeMemory publishes op (with the expected last sequence of its key's
// subject, when set) and waits until this replica has applied it. res, the
// quota op reserved (nil: none), ends when op is folded, or now when op is
// not published.
func (s *Service) writeMemory(op MemoryOp, expect *uint64, res *reservation) (uint64, error) {
	data, err := json.Marshal(op)
	if err != nil {
		s.quota.release(res)
		return 0, err
	}
	msg := nats.NewMsg(s.sub.Memory(op.Namespace, op.Key))
	msg.Data = data
	if op.WriteID != "" {
		// JetStream answers a retry within its duplicate window with the
		// first write's sequence; where the write also expects a version,
		// nats-server 2.15 checks that first and refuses a retry of a
		// write that landed (writeMemory's caller looks it up: landed).
		msg.Header.Set(jetstream.MsgIDHeader, s.sub.MemoryMsgID(op.WriteID))
	}
	if expect != nil {
		msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(*expect, 10))
	}
	ctx, cancel := context.WithTimeout(context.Background(), writeWait)
	defer cancel()
	ack, err := s.js.PublishMsg(ctx, msg)
	if err != nil {
		s.quota.release(res)
	} else {
		s.quota.published(res, ack.Sequence)
	}
	if isWrongLastSeq(err) {
		return 0, err
	}
	if err != nil {
		// The stream has no leader (an election) or the cluster is away:
		// the client retries, with the same write id.
		return 0, fmt.Errorf("%w: write memory %q: %w", ErrUnavailable, op.Key, err)
	}
	if err := s.sync(ctx); err != nil {
		// Stored, not yet durable: the retry (same write id) is deduplicated.
		return 0, fmt.Errorf("%w: write memory %q: %w", ErrUnavailable, op.Key, err)
	}
	if err := s.applied.wait(ctx, 0, ack.Sequence, writeWait, false); err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

func validWriteID(id string) bool {
	if len(id) > 64 {
		return false
	}
	for _, c := range []byte(id) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

func (s *Service) handleMemoryList(req micro.Request) {
	var r MemoryKeyRequest
	if !decodeReq(req, &r, OpMemoryList, `{"namespace": ..., "key": "<prefix>"}`) {
		return
	}
	ms, err := s.store.MemoryList(r.Namespace, r.Key)
	s.respond(req, MemoryListReply{Entries: ms}, err)
}

func (s *Service) handleMemoryDelete(req micro.Request) {
	var r MemoryKeyRequest
	if !decodeReq(req, &r, OpMemoryDelete, `{"namespace": ..., "key": ...}`) {
		return
	}
	if err := CheckNamespaceKey(r.Namespace, r.Key); err != nil {
		s.respond(req, nil, err)
		return
	}
	_, err := s.store.MemoryGet(r.Namespace, r.Key)
	if errors.Is(err, ErrNotFound) {
		s.respond(req, MemoryDeleteReply{Deleted: false}, nil)
		return
	}
	if err == nil {
		now := time.Now().UTC()
		_, err = s.writeMemory(MemoryOp{Op: MemoryDeleteOp, Namespace: r.Namespace, Key: r.Key, At: now, CreatedAt: now}, nil, nil)
	}
	s.respond(req, MemoryDeleteReply{Deleted: err == nil}, err)
}
