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
