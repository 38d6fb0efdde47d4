package state

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

// Jobs' files live in the file store (jobs.Subjects.FilesBucket, a JetStream
// object store replicated like the streams), which only the state service
// reads and writes: no other identity has a right on its subjects. A file
// travels in one request or answer (at most jobs.HardMaxFileBytes, within
// the broker's maximum payload), its bytes as the message body and what it
// is in the HeaderFile header (JSON).
//
//   - file.put: a file of a job, proven with the job's capability. The
//     front-end puts a job's inputs before it submits the job (attempt 0, with
//     the namespace and its quota); the worker holding the job puts what an
//     attempt wrote, bounded by the limits and quota its record carries.
//   - file.input: an input of a job, to the worker holding it (capability).
//   - file.get: a file a job wrote, to a front-end asking for a namespace:
//     only a file the job's record lists, only for the job's own namespace
//     (any other gets ErrNotFound, as if there were no such job), only when
//     the stored bytes are those the record names.

// Operations on files.
const (
	OpFilePut   = "file.put"
	OpFileInput = "file.input"
	OpFileGet   = "file.get"
)

// HeaderFile carries a file request's or answer's JSON description.
const HeaderFile = "Mcpexec-File"

// FilePut describes a file.put: the body is the file's bytes.
type FilePut struct {
	Job        string `json:"job"`
	Capability string `json:"capability"`
	// Attempt 0 is an input, put before the job is submitted; Namespace
	// and QuotaBytes then come from the front-end.
	Attempt    int    `json:"attempt"`
	Name       string `json:"name"`
	Namespace  string `json:"namespace,omitempty"`
	QuotaBytes int64  `json:"quota_bytes,omitempty"`
}

// FileGet describes a file.get (Namespace) or a file.input (Capability).
type FileGet struct {
	Job        string `json:"job"`
	Name       string `json:"name"`
	Namespace  string `json:"namespace,omitempty"`
	Capability string `json:"capability,omitempty"`
	// Input asks a file.get for one of the job's input files (a re-run
	// takes its parent's), not one it wrote.
	Input bool `json:"input,omitempty"`
}

// ErrNoSuchFile is the error of a file.get that finds no file a namespace
// may read: the job is another namespace's, gone, or never wrote it.
var ErrNoSuchFile = errs.New(errs.NotFound, "no such job or file")

// fileTally bounds, per replica, what one job's puts may store: the count
// and bytes of each attempt's files (inputs are attempt 0), so that a worker
// holding a job cannot store more than its limits however it names files.
type fileTally struct {
	mu   sync.Mutex // guards byJA
	byJA map[string]*tallyEntry
}

type tallyEntry struct {
	files map[string]int64 // name -> bytes
	bytes int64
	at    time.Time
}

// tallyKeep is how long a replica remembers a job's puts.
const tallyKeep = 6 * time.Hour

// add records a put of size bytes as name, unless it takes the attempt over
// maxFiles or maxBytes; it returns the attempt's bytes before this put.
func (t *fileTally) add(key, name string, size int64, maxFiles int, maxBytes int64) (int64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	if t.byJA == nil {
		t.byJA = map[string]*tallyEntry{}
	}
	if len(t.byJA) > 10_000 {
		for k, e := range t.byJA {
			if now.Sub(e.at) > tallyKeep {
				delete(t.byJA, k)
			}
		}
	}
	e := t.byJA[key]
	if e == nil {
		e = &tallyEntry{files: map[string]int64{}, at: now}
		t.byJA[key] = e
	}
	old, again := e.files[name]
	if !again && len(e.files) >= maxFiles {
		return 0, invalidf("the job has %d files already, its limit", maxFiles)
	}
	if e.bytes-old+size > maxBytes {
		return 0, invalidf("the job's files would be over %d bytes together", maxBytes)
	}
	before := e.bytes - old
	e.files[name] = size
	e.bytes += size - old
	return before, nil
}

func (t *fileTally) undo(key, name string, size int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.byJA[key]; e != nil && e.files[name] == size {
		delete(e.files, name)
		e.bytes -= size
	}
}

// errNoFileStore: no job has had files yet.
var errNoFileStore = errors.New("the file store does not exist yet")

// files returns the file store, made first (by a put: create) from
// s.FilesBucket when it does not exist: a fleet whose jobs never have files
// holds none.
func (s *Service) files(ctx context.Context, create bool) (jetstream.ObjectStore, error) {
	s.filesMu.Lock()
	defer s.filesMu.Unlock()
	if s.obs != nil {
		return s.obs, nil
	}
	obs, err := s.js.ObjectStore(ctx, s.sub.FilesBucket())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		if !create || s.FilesBucket.Bucket == "" {
			return nil, errNoFileStore
		}
		obs, err = s.js.CreateOrUpdateObjectStore(ctx, s.FilesBucket)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: file store %s: %w", ErrUnavailable, s.sub.FilesBucket(), err)
	}
	s.obs = obs
	return obs, nil
}

func fileHeader(req micro.Request, v any) error {
	h := req.Headers().Get(HeaderFile)
	if h == "" || len(h) > 8<<10 {
		return invalidf("a file request needs its description in the %s header (JSON, at most 8 KiB)", HeaderFile)
	}
	if err := json.Unmarshal([]byte(h), v); err != nil {
		return invalidf("the %s header is not the JSON a file request needs: %v", HeaderFile, err)
	}
	return nil
}

// handleFilePut stores one file of a job whose capability the asker holds.
func (s *Service) handleFilePut(req micro.Request) {
	var r FilePut
	if err := fileHeader(req, &r); err != nil {
		s.respond(req, nil, err)
		return
	}
	info, err := s.putFile(r, req.Data())
	s.respond(req, info, err)
}

func (s *Service) putFile(r FilePut, data []byte) (*jobs.FileInfo, error) {
	if !jobs.ValidID(r.Job) || !jobs.CheckCapability(s.key, r.Job, r.Capability) {
		return nil, invalidf("file.put of job %.160q needs that job's capability: the one given does not prove it", r.Job)
	}
	if err := jobs.CheckFileName(r.Name); err != nil {
		return nil, invalidf("file.put: %v", err)
	}
	size := int64(len(data))
	ns, limits, quota := jobs.NamespaceOf(r.Namespace), jobs.DefaultFileLimits(), r.QuotaBytes
	rec, err := s.store.Job(r.Job)
	switch {
	case r.Attempt == 0 && err == nil:
		// Inputs are put before the submission: a job that exists has all
		// its inputs (and a worker holding it cannot add to them).
		return nil, invalidf("job %s is submitted already: its input files cannot change", r.Job)
	case r.Attempt == 0 && errors.Is(err, ErrNotFound):
		limits = limits.Or()
		limits.MaxJobBytes, limits.MaxFiles = jobs.HardMaxJobBytes, jobs.HardMaxFiles // the front-end checked the namespace's
	case r.Attempt == 0:
		return nil, err
	case errors.Is(err, ErrNotFound):
		return nil, fmt.Errorf("%w: job %s is not recorded here yet: retry", ErrUnavailable, r.Job)
	case err != nil:
		return nil, err
	case r.Attempt < 1 || r.Attempt > max(rec.Job.MaxAttempts, rec.Attempt):
		return nil, invalidf("file.put of job %s names attempt %d, which it does not have", r.Job, r.Attempt)
	case rec.Status.Terminal():
		return nil, invalidf("job %s has ended: its files cannot change", r.Job)
	default:
		ns, limits = jobs.NamespaceOf(rec.Job.Namespace), rec.Job.FilesLimits()
		if rec.Job.FileLimits != nil {
			quota = rec.Job.FileLimits.QuotaBytes
		} else {
			quota = 0
		}
	}
	if size > limits.MaxFileBytes {
		return nil, invalidf("%s is %d bytes, over the job's limit of %d bytes per file", r.Name, size, limits.MaxFileBytes)
	}
	key := fmt.Sprintf("%s/%d", r.Job, r.Attempt)
	held, err := s.tally.add(key, r.Name, size, limits.MaxFiles, limits.MaxJobBytes)
	if err != nil {
		return nil, err
	}
	if quota > 0 {
		used, err := s.store.FilesUsage(ns)
		if err == nil && used+held+size > quota {
			err = errs.New(errs.Quota, fmt.Sprintf("namespace %s's files would hold %d bytes, over its quota of %d bytes (files_bytes): delete nothing, wait for old jobs to expire, or ask for a larger quota", ns, used+held+size, quota))
		}
		if err != nil {
			s.tally.undo(key, r.Name, size)
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), writeWait)
	defer cancel()
	obs, err := s.files(ctx, true)
	if err == nil {
		_, err = obs.PutBytes(ctx, jobs.FileObject(r.Job, r.Attempt, r.Name), data)
	}
	if err == nil {
		err = s.sync(ctx)
	}
	if err != nil {
		s.tally.undo(key, r.Name, size)
		return nil, fmt.Errorf("%w: store file %s of job %s: %w", ErrUnavailable, r.Name, r.Job, err)
	}
	sum := sha256.Sum256(data)
	return &jobs.FileInfo{Name: r.Name, Size: size, MimeType: jobs.SniffMimeType(r.Name, data), SHA256: hex.EncodeToString(sum[:])}, nil
}

// handleFileInput answers the worker holding a job one of its input files.
func (s *Service) handleFileInput(req micro.Request) {
	var r FileGet
	if err := fileHeader(req, &r); err != nil {
		s.respond(req, nil, err)
		return
	}
	if !jobs.ValidID(r.Job) || !jobs.CheckCapability(s.key, r.Job, r.Capability) {
		s.respond(req, nil, invalidf("file.input of job %.160q needs that job's capability: the one given does not prove it", r.Job))
		return
	}
	rec, err := s.store.Job(r.Job)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			err = fmt.Errorf("%w: job %s is not recorded here yet: retry", ErrUnavailable, r.Job)
		}
		s.respond(req, nil, err)
		return
	}
	s.sendFile(req, rec.Job.Files, r.Job, 0, r.Name)
}

// handleFileGet answers a front-end a file a job of the namespace it asks
// for wrote.
func (s *Service) handleFileGet(req micro.Request) {
	var r FileGet
	if err := fileHeader(req, &r); err != nil {
		s.respond(req, nil, err)
		return
	}
	rec, err := s.store.Job(r.Job)
	if errors.Is(err, ErrNotFound) || (err == nil && rec.Result == nil && !r.Input) {
		// The asker may have seen the job end (its finished event) before
		// this replica applied it: catch up with the events stream once.
		if s.catchUpEvents() == nil {
			rec, err = s.store.Job(r.Job)
		}
	}
	if errors.Is(err, ErrNotFound) || (err == nil && (jobs.NamespaceOf(rec.Job.Namespace) != jobs.NamespaceOf(r.Namespace) || (rec.Result == nil && !r.Input))) {
		s.respond(req, nil, fmt.Errorf("%w: no such job", ErrNoSuchFile))
		return
	}
	if err != nil {
		s.respond(req, nil, err)
		return
	}
	if r.Input {
		s.sendFile(req, rec.Job.Files, r.Job, 0, r.Name)
		return
	}
	s.sendFile(req, rec.Result.Files, r.Job, rec.Result.Attempt, r.Name)
}

// catchUpEvents waits (within catchUpWait) until this replica has applied
// everything the events stream holds now.
func (s *Service) catchUpEvents() error {
	ctx, cancel := context.WithTimeout(context.Background(), catchUpWait)
	defer cancel()
	last, err := s.lastSeq(ctx, s.sub.EventsStream())
	if err != nil {
		return err
	}
	return s.applied.wait(ctx, last, 0, catchUpWait, false)
}

// sendFile answers the file name of list, read from the store and checked
// against its digest.
func (s *Service) sendFile(req micro.Request, list []jobs.FileInfo, job string, attempt int, name string) {
	var info *jobs.FileInfo
	for i := range list {
		if list[i].Name == name {
			info = &list[i]
		}
	}
	if info == nil {
		s.respond(req, nil, fmt.Errorf("%w: the job has no file %.300q", ErrNoSuchFile, name))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), writeWait)
	defer cancel()
	obs, err := s.files(ctx, false)
	var data []byte
	if err == nil {
		data, err = obs.GetBytes(ctx, jobs.FileObject(job, attempt, name))
	}
	if errors.Is(err, jetstream.ErrObjectNotFound) || errors.Is(err, errNoFileStore) {
		s.respond(req, nil, fmt.Errorf("%w: file %.300q of the job has expired", ErrNoSuchFile, name))
		return
	}
	if err != nil {
		s.respond(req, nil, fmt.Errorf("%w: read file %s of job %s: %w", ErrUnavailable, name, job, err))
		return
	}
	sum := sha256.Sum256(data)
	if int64(len(data)) != info.Size || (info.SHA256 != "" && hex.EncodeToString(sum[:]) != info.SHA256) {
		s.logger.Warn("a stored file is not the one its job recorded", "job", job, "file", name)
		s.respond(req, nil, fmt.Errorf("%w: file %.300q of the job is not the one it wrote", ErrNoSuchFile, name))
		return
	}
	desc, err := json.Marshal(info)
	if err != nil {
		s.respond(req, nil, err)
		return
	}
	ev, mem := s.applied.get()
	h := micro.Headers{HeaderFile: {string(desc)}, HeaderEventsSeq: {fmt.Sprint(ev)}, HeaderMemorySeq: {fmt.Sprint(mem)}}
	if err := req.Respond(data, micro.WithHeaders(h)); err != nil {
		s.logger.Debug("answer file request", "err", err) // the asker is gone
	}
}

// PutFile stores a file of a job (see FilePut) and returns what it is.
func (c *Client) PutFile(ctx context.Context, r FilePut, data []byte) (jobs.FileInfo, error) {
	var info jobs.FileInfo
	_, err := c.fileCall(ctx, OpFilePut, r, data, &info)
	return info, err
}

// InputFile returns input file name of job, asked with its capability.
func (c *Client) InputFile(ctx context.Context, job, capability, name string) ([]byte, error) {
	return c.fileCall(ctx, OpFileInput, FileGet{Job: job, Capability: capability, Name: name}, nil, nil)
}

// File returns file name that job (a wire id) wrote, read for namespace ns:
// ErrNotFound (ErrNoSuchFile's kind) unless the job is ns's and wrote it.
func (c *Client) File(ctx context.Context, ns, job, name string) (jobs.FileInfo, []byte, error) {
	var info jobs.FileInfo
	data, err := c.fileCall(ctx, OpFileGet, FileGet{Job: job, Name: name, Namespace: ns}, nil, &info)
	return info, data, err
}

// InputOf returns input file name of job (a wire id), read for namespace
// ns: ErrNotFound unless the job is ns's and was given that file.
func (c *Client) InputOf(ctx context.Context, ns, job, name string) ([]byte, error) {
	var info jobs.FileInfo
	return c.fileCall(ctx, OpFileGet, FileGet{Job: job, Name: name, Namespace: ns, Input: true}, nil, &info)
}

// fileCall makes a file request, retried like every other while the fleet
// fails over, and returns the answer's body (and its description in desc,
// for a get; the JSON body, for a put).
func (c *Client) fileCall(ctx context.Context, op string, desc any, body []byte, out *jobs.FileInfo) ([]byte, error) {
	h, err := json.Marshal(desc)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(c.Patience)
	for delay := 50 * time.Millisecond; ; delay = min(2*delay, time.Second) {
		var reply *nats.Msg
		reply, err = c.onceMsg(ctx, op, body, nats.Header{HeaderFile: {string(h)}}, writeAttempt)
		if err == nil {
			switch {
			case op == OpFilePut:
				if out != nil {
					err = json.Unmarshal(reply.Data, out)
				}
				return nil, err
			case out != nil:
				if d := reply.Header.Get(HeaderFile); d == "" || json.Unmarshal([]byte(d), out) != nil {
					return nil, fmt.Errorf("%s answer without its %s header", op, HeaderFile)
				}
			}
			return bytes.Clone(reply.Data), nil
		}
		if !errors.Is(err, ErrUnavailable) || time.Now().Add(delay).After(deadline) || ctx.Err() != nil {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(delay):
		}
	}
}
