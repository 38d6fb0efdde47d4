package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/mcpexec/mcpexec/internal/errs"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
)

// JobGetRequest is the body of a job.get request.
type JobGetRequest struct {
	ID string `json:"id"`
}

// JobGetManyRequest is the body of a job.getmany request.
type JobGetManyRequest struct {
	IDs []string `json:"ids"`
}

// JobHistoryRequest is the body of a job.history request: a job and its
// capability, from the job message that delivered it.
type JobHistoryRequest struct {
	ID         string `json:"id"`
	Capability string `json:"capability"`
}

// MaxGetMany bounds the ids of one job.getmany request.
const MaxGetMany = 10_000

// JobsReply is the answer of job.getmany, job.list and deadletter.list.
type JobsReply struct {
	Jobs []*jobs.Record `json:"jobs"`
	Next string         `json:"next,omitempty"` // cursor of the next page
	// Rest are the ids of a job.getmany that did not fit in this answer
	// (MaxReplyBytes): ask for them again.
	Rest []string `json:"rest,omitempty"`
}

// MaxReplyBytes bounds the records of one answer: a page or a getmany ends
// early (with Next or Rest) rather than build an answer near the broker's
// maximum payload, whatever the records' code weighs. One record always fits.
const MaxReplyBytes = 2 << 20

// jobsReply is JobsReply with its records already encoded.
type jobsReply struct {
	Jobs []json.RawMessage `json:"jobs"`
	Next string            `json:"next,omitempty"`
	Rest []string          `json:"rest,omitempty"`
}

// fit encodes recs until MaxReplyBytes, returning the encoded ones and how
// many fitted (at least one when there is any).
func fit(recs []*jobs.Record) ([]json.RawMessage, int, error) {
	out := make([]json.RawMessage, 0, len(recs))
	size := 0
	for _, r := range recs {
		b, err := json.Marshal(r)
		if err != nil {
			return nil, 0, fmt.Errorf("encode record %s: %w", r.Job.ID, err)
		}
		if size += len(b) + 1; size > MaxReplyBytes && len(out) > 0 {
			break
		}
		out = append(out, b)
	}
	return out, len(out), nil
}

// JobStatusesRequest is the body of a job.statuses request.
type JobStatusesRequest struct {
	IDs []string `json:"ids"`
}

// JobStatusesReply maps the ids of a job.statuses request that exist to
// their statuses: what a front-end reconciles its admission counts with,
// without the records' code and results.
type JobStatusesReply struct {
	Statuses map[string]jobs.Status `json:"statuses"`
}

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

// respond answers req with v, or with the coded error err maps to, with the
// replica's applied sequences in the headers (the asker's read-your-writes).
func (s *Service) respond(req micro.Request, v any, err error) {
	ev, mem := s.applied.get()
	h := micro.WithHeaders(micro.Headers{HeaderEventsSeq: {strconv.FormatUint(ev, 10)}, HeaderMemorySeq: {strconv.FormatUint(mem, 10)}})
	var rerr error
	if err == nil {
		rerr = req.RespondJSON(v, h)
	} else {
		rerr = req.Error(codeOf(err), err.Error(), nil, h)
	}
	if rerr != nil {
		s.logger.Debug("answer state request", "subject", req.Subject(), "err", rerr) // the asker is gone
	}
}

// codeOf is the one mapping of errors to the service's error codes, by kind
// (the client maps the codes back to the package's sentinels).
func codeOf(err error) string {
	switch errs.KindOf(err) {
	case errs.NotFound:
		return CodeNotFound
	case errs.Conflict:
		return CodeConflict
	case errs.Invalid, errs.Quota:
		return CodeBadRequest
	case errs.Unavailable:
		return CodeUnavailable
	}
	return CodeInternal
}

// consistent answers a request only once the replica has applied what the
// asker has seen (its sequence headers), within catchUpWait.
func (s *Service) consistent(h micro.HandlerFunc) micro.HandlerFunc {
	return s.readYourWrites(false, h)
}

// consistentMemory is consistent for memory requests: while the replica folds
// the memory stream again (it found the stream held less than it had
// applied), they wait until it has folded what the stream held then.
func (s *Service) consistentMemory(h micro.HandlerFunc) micro.HandlerFunc {
	return s.readYourWrites(true, h)
}

func (s *Service) readYourWrites(memory bool, h micro.HandlerFunc) micro.HandlerFunc {
	return func(req micro.Request) {
		hdr := nats.Header(req.Headers())
		deadline := time.Now().Add(catchUpWait)
		ev, mem := s.unlost(seqHeader(hdr, HeaderEventsSeq), seqHeader(hdr, HeaderMemorySeq))
		if ev > 0 || mem > 0 || memory {
			if err := s.applied.wait(context.Background(), ev, mem, time.Until(deadline), memory); err != nil {
				s.respond(req, nil, err)
				return
			}
		}
		h(req)
	}
}

// unlost caps the sequences an asker has seen at what the streams hold, where
// it may have seen sequences a stream lost: after this replica found that a
// stream held less than it had applied, and until the stream holds as much
// again, an asker ahead of the replica may have seen the lost ones, which the
// stream will never hold (new writes take their sequences).
func (s *Service) unlost(events, memory uint64) (uint64, uint64) {
	ae, am, le, lm := s.applied.lost()
	if (events <= ae || le <= ae) && (memory <= am || lm <= am) {
		return events, memory // the common case: no stream info asked
	}
	ctx, cancel := context.WithTimeout(context.Background(), catchUpWait)
	defer cancel()
	if events > ae && le > ae {
		if last, err := s.lastSeq(ctx, s.sub.EventsStream()); err == nil {
			events = min(events, last)
		}
	}
	if memory > am && lm > am {
		if last, err := s.lastSeq(ctx, s.sub.MemoryStream()); err == nil {
			memory = min(memory, last)
		}
	}
	return events, memory
}

func decodeReq(req micro.Request, v any, op, shape string) bool {
	if err := json.Unmarshal(req.Data(), v); err != nil {
		_ = req.Error(CodeBadRequest, fmt.Sprintf("%s needs a JSON body %s: %v", op, shape, err), nil) // the asker may be gone
		return false
	}
	return true
}

func (s *Service) handleJobGet(req micro.Request) {
	var r JobGetRequest
	if !decodeReq(req, &r, OpJobGet, `{"id": "<job id>"}`) {
		return
	}
	if r.ID == "" {
		s.respond(req, nil, invalidf(`job.get needs a JSON body {"id": "<job id>"}`))
		return
	}
	rec, err := s.store.Job(r.ID)
	if errors.Is(err, ErrNotFound) {
		err = fmt.Errorf("%w: no job with id %q", ErrNotFound, r.ID)
	}
	s.respond(req, rec, err)
}

// historyWait bounds the direct gets of one job.history request.
const historyWait = 5 * time.Second

// handleJobHistory answers a worker what it must know of a job before running
// it, only for a job whose capability it holds: the direct gets a worker may
// not make itself (they would read any job's outcome).
func (s *Service) handleJobHistory(req micro.Request) {
	var r JobHistoryRequest
	if !decodeReq(req, &r, OpJobHistory, `{"id": "<job id>", "capability": "<from the job message>"}`) {
		return
	}
	if !jobs.ValidID(r.ID) || !jobs.CheckCapability(s.key, r.ID, r.Capability) {
		s.respond(req, nil, invalidf("job.history of job %.160q needs that job's capability, from the job message that delivered it: the one given does not prove it", r.ID))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), historyWait)
	defer cancel()
	h, err := queue.LookupHistory(ctx, s.nc, s.sub, s.key, r.ID)
	if err != nil {
		err = fmt.Errorf("%w: history of job %s: %w", ErrUnavailable, r.ID, err)
	}
	s.respond(req, h, err)
}

func (s *Service) handleJobGetMany(req micro.Request) {
	var r JobGetManyRequest
	if !decodeReq(req, &r, OpJobGetMany, `{"ids": ["<job id>", ...]}`) {
		return
	}
	if len(r.IDs) > MaxGetMany {
		s.respond(req, nil, invalidf("job.getmany takes at most %d ids, got %d", MaxGetMany, len(r.IDs)))
		return
	}
	recs, err := s.store.Jobs(r.IDs)
	if err != nil {
		s.respond(req, nil, err)
		return
	}
	enc, n, err := fit(recs)
	reply := jobsReply{Jobs: enc}
	if err == nil && n < len(recs) {
		// recs follow the order of r.IDs: the rest starts after the last fitted.
		last := recs[n-1].Job.ID
		if i := slices.Index(r.IDs, last); i >= 0 {
			reply.Rest = r.IDs[i+1:]
		}
	}
	s.respond(req, reply, err)
}

func (s *Service) handleJobStatuses(req micro.Request) {
	var r JobStatusesRequest
	if !decodeReq(req, &r, OpJobStatuses, `{"ids": ["<job id>", ...]}`) {
		return
	}
	if len(r.IDs) > MaxGetMany {
		s.respond(req, nil, invalidf("job.statuses takes at most %d ids, got %d", MaxGetMany, len(r.IDs)))
		return
	}
	recs, err := s.store.Jobs(r.IDs)
	out := JobStatusesReply{Statuses: make(map[string]jobs.Status, len(recs))}
	for _, rec := range recs {
		out.Statuses[rec.Job.ID] = rec.Status
	}
	s.respond(req, out, err)
}

func (s *Service) handleJobList(req micro.Request) {
	var f JobFilter
	if !decodeReq(req, &f, OpJobList, `{"status": ..., "prefix": ..., "labels": {...}, "cursor": ..., "limit": N}`) {
		return
	}
	s.list(req, f)
}

func (s *Service) handleDeadLetterList(req micro.Request) {
	var f JobFilter
	if !decodeReq(req, &f, OpDeadLetterList, `{"cursor": ..., "limit": N}`) {
		return
	}
	f.DeadLetter = true
	s.list(req, f)
}

func (s *Service) list(req micro.Request, f JobFilter) {
	if err := f.Validate(); err != nil {
		s.respond(req, nil, fmt.Errorf("%w: %w", ErrInvalid, err))
		return
	}
	recs, next, err := s.store.List(f)
	if err != nil {
		s.respond(req, nil, err)
		return
	}
	enc, n, err := fit(recs)
	if n < len(recs) {
		next = recs[n-1].Job.ID // the store's cursor: the last id answered
	}
	s.respond(req, jobsReply{Jobs: enc, Next: next}, err)
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
			expect = &last
		default:
			// Stale, this may still be a retry of this very write, which
			// landed and was overwritten since: JetStream answers it by its id
			// when it remembers it, else refuses it (the key's subject is
			// not at the version asked), and it is looked up below.
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
		// what this replica has applied. Catch up with the stream, look again.
		if s.catchUpMemory() == nil {
			if seq, ok, err := s.store.WriteSeq(r.WriteID); err != nil || ok {
				s.respond(req, op.Entry(seq), err)
				return
			}
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
		// first write's sequence, before it checks the expected one.
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

// BackupRequest asks a node to write a snapshot of its state file.
type BackupRequest struct {
	Path string `json:"path"` // on the broker's host
}

// BackupReply is the answer to a BackupRequest.
type BackupReply struct {
	Bytes int64  `json:"bytes,omitempty"`
	Node  string `json:"node,omitempty"` // the node that wrote it
	Error string `json:"error,omitempty"`
}

// handleBackup writes a consistent snapshot of the state file (one read
// transaction, while the replica serves) to the path asked.
func (s *Service) handleBackup(m *nats.Msg) {
	var r BackupRequest
	reply := BackupReply{Node: s.Node}
	if err := json.Unmarshal(m.Data, &r); err != nil || !filepath.IsAbs(r.Path) {
		reply.Error = `want {"path": "<absolute path of a new file on the broker's host>"}`
	} else if n, err := s.store.Backup(r.Path); err != nil {
		reply.Error = err.Error()
	} else {
		reply.Bytes = n
	}
	data, _ := json.Marshal(reply) // plain fields always encode
	_ = m.Respond(data)            // the asker may be gone
}
