package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// JobGetRequest is the body of a job.get request.
type JobGetRequest struct {
	ID string `json:"id"`
}

// JobGetManyRequest is the body of a job.getmany request.
type JobGetManyRequest struct {
	IDs []string `json:"ids"`
}

// MaxGetMany bounds the ids of one job.getmany request.
const MaxGetMany = 10_000

// JobsReply is the answer of job.getmany, job.list and deadletter.list.
type JobsReply struct {
	Jobs []*jobs.Record `json:"jobs"`
	Next string         `json:"next,omitempty"` // cursor of the next page
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
}

// MemoryDeleteReply is the answer of memory.delete.
type MemoryDeleteReply struct {
	Deleted bool `json:"deleted"`
}

// MemoryListReply is the answer of memory.list.
type MemoryListReply struct {
	Entries []Memory `json:"entries"`
}

// respond answers req with v, or with the coded error err maps to.
func respond(req micro.Request, v any, err error) {
	switch {
	case err == nil:
		_ = req.RespondJSON(v)
	case errors.Is(err, ErrNotFound):
		_ = req.Error(CodeNotFound, err.Error(), nil)
	case errors.Is(err, ErrConflict):
		_ = req.Error(CodeConflict, err.Error(), nil)
	case errors.Is(err, ErrInvalid):
		_ = req.Error(CodeBadRequest, err.Error(), nil)
	default:
		_ = req.Error(CodeInternal, err.Error(), nil)
	}
}

func decodeReq(req micro.Request, v any, op, shape string) bool {
	if err := json.Unmarshal(req.Data(), v); err != nil {
		_ = req.Error(CodeBadRequest, fmt.Sprintf("%s needs a JSON body %s: %v", op, shape, err), nil)
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
		respond(req, nil, invalidf(`job.get needs a JSON body {"id": "<job id>"}`))
		return
	}
	rec, err := s.store.Job(r.ID)
	if errors.Is(err, ErrNotFound) {
		err = fmt.Errorf("%w: no job with id %q", ErrNotFound, r.ID)
	}
	respond(req, rec, err)
}

func (s *Service) handleJobGetMany(req micro.Request) {
	var r JobGetManyRequest
	if !decodeReq(req, &r, OpJobGetMany, `{"ids": ["<job id>", ...]}`) {
		return
	}
	if len(r.IDs) > MaxGetMany {
		respond(req, nil, invalidf("job.getmany takes at most %d ids, got %d", MaxGetMany, len(r.IDs)))
		return
	}
	recs, err := s.store.Jobs(r.IDs)
	respond(req, JobsReply{Jobs: nonNil(recs)}, err)
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
		respond(req, nil, fmt.Errorf("%w: %v", ErrInvalid, err))
		return
	}
	recs, next, err := s.store.List(f)
	respond(req, JobsReply{Jobs: nonNil(recs), Next: next}, err)
}

func nonNil(recs []*jobs.Record) []*jobs.Record {
	if recs == nil {
		return []*jobs.Record{}
	}
	return recs
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
	respond(req, m, err)
}

func (s *Service) handleMemoryPut(req micro.Request) {
	var r MemoryPutRequest
	if !decodeReq(req, &r, OpMemoryPut, `{"memory": {...}, "if_version": N}`) {
		return
	}
	m, err := s.store.MemoryPutQuota(r.Memory, r.IfVersion, r.MaxBytes, time.Now())
	if errors.Is(err, ErrQuota) {
		err = fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if errors.Is(err, ErrConflict) {
		err = fmt.Errorf("%w: memory %q changed since it was read: read it again and retry", ErrConflict, r.Memory.Key)
	}
	respond(req, m, err)
}

func (s *Service) handleMemoryList(req micro.Request) {
	var r MemoryKeyRequest
	if !decodeReq(req, &r, OpMemoryList, `{"namespace": ..., "key": "<prefix>"}`) {
		return
	}
	ms, err := s.store.MemoryList(r.Namespace, r.Key)
	respond(req, MemoryListReply{Entries: ms}, err)
}

func (s *Service) handleMemoryDelete(req micro.Request) {
	var r MemoryKeyRequest
	if !decodeReq(req, &r, OpMemoryDelete, `{"namespace": ..., "key": ...}`) {
		return
	}
	ok, err := s.store.MemoryDelete(r.Namespace, r.Key)
	respond(req, MemoryDeleteReply{Deleted: ok}, err)
}
