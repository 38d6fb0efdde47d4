// Package jobsapi is the front-end's HTTP jobs API, for batch workflows and the
// web UI: submit jobs (one or many), look them up, list and filter them, cancel
// them, wait for their results, and list and re-run dead letters. Every answer is
// JSON; errors are {"error": {"code": ..., "message": ...}}.
//
//	POST /api/jobs                 one job object or an array of them → records
//	GET  /api/jobs?status=&prefix=&label=k=v&limit=&cursor=&order=  → {"jobs": [...], "next": ...}
//	GET  /api/jobs/{id}            → record
//	POST /api/jobs/{id}/cancel     → record (cancelled)
//	GET  /api/jobs/{id}/wait?timeout=30s → record, terminal unless the timeout passed
//	POST /api/jobs/{id}/retry      {"id": optional new id} → record of the re-run
//	GET  /api/deadletters?limit=&cursor= → {"jobs": [...], "next": ...}
//	GET  /api/audit?job=&server=&tool=&decision=&limit=&cursor= → {"entries": [...], "next": ...}
//	GET  /api/approvals            → {"approvals": [...]}: calls waiting for a person
//	POST /api/approvals/{id}       {"decision": "approve"|"deny", "reason"} → the answer
//	GET  /api/approvals/events     SSE: approval_asked, approval_answered
package jobsapi

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/httpauth"
	"github.com/mcpexec/mcpexec/internal/httperr"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/slots"
)

// OpenAPI is the OpenAPI 3.0 description of the front-end's HTTP API, served
// at GET /api/openapi.json.
//
//go:embed openapi.json
var OpenAPI []byte

// Limits of the API.
const (
	MaxBatch       = 10_000           // jobs in one POST /api/jobs
	DefaultWait    = 30 * time.Second // wait timeout unless given
	MaxWait        = 5 * time.Minute
	cancelSettling = 3 * time.Second // how long cancel waits for the terminal record
)

// Config configures the API handler.
type Config struct {
	// Backend is the front-end's job service; every route works within the
	// caller's namespace, with the namespace's own job ids.
	Backend jobs.Service
	// Namespace returns the authenticated caller's namespace ("" when the server
	// has no auth: the default namespace). Jobs are submitted in it, their ids
	// are its own, and only its jobs are visible. Nil means the caller
	// httpauth put in the request's context (httpauth.Namespace).
	Namespace func(ctx context.Context) string
	Logger    *slog.Logger
}

// New returns the API handler; mount it at /api/.
func New(cfg Config) http.Handler {
	if cfg.Namespace == nil {
		cfg.Namespace = httpauth.Namespace
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	a := &api{cfg: cfg, be: cfg.Backend, streams: &slots.Keyed{Max: MaxNSStreams, Total: MaxEventStreams}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/jobs", a.submit)
	mux.HandleFunc("GET /api/jobs", a.list)
	mux.HandleFunc("GET /api/jobs/{id}", a.get)
	mux.HandleFunc("POST /api/jobs/{id}/cancel", a.cancel)
	mux.HandleFunc("GET /api/jobs/{id}/wait", a.wait)
	mux.HandleFunc("POST /api/jobs/{id}/retry", a.retry)
	mux.HandleFunc("GET /api/jobs/{id}/files/{name...}", a.file)
	mux.HandleFunc("GET /api/deadletters", a.deadLetters)
	mux.HandleFunc("POST /api/workflows", a.submitWorkflow)
	mux.HandleFunc("GET /api/workflows/{id}", a.getWorkflow)
	mux.HandleFunc("GET /api/events", a.events)
	mux.HandleFunc("GET /api/audit", a.audit)
	a.approvalRoutes(mux) // approvals.go
	mux.HandleFunc("GET /api/openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(OpenAPI) // the client went away: nothing to tell it
	})
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no API route %s %s: see the routes of GET/POST /api/jobs, /api/workflows and GET /api/deadletters", r.Method, r.URL.Path), nil)
	})
	return mux
}

type api struct {
	cfg     Config
	be      jobs.Service
	streams *slots.Keyed // open event streams, per namespace
}

// JobRequest is one job as submitted to POST /api/jobs.
type JobRequest struct {
	ID          string            `json:"id,omitempty"`
	Code        string            `json:"code"`
	Servers     []string          `json:"servers,omitempty"`
	Timeout     int               `json:"timeout,omitempty"`
	MaxAttempts int               `json:"max_attempts,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Session     string            `json:"session,omitempty"`
	Pool        string            `json:"pool,omitempty"`
	// After: ids of jobs that must all succeed first (else this one is
	// skipped); AfterAny: ids of jobs that must end first, in any status.
	After    []string `json:"after,omitempty"`
	AfterAny []string `json:"after_any,omitempty"`
	// MemoryMB and CPUs size the job's sandbox, within the namespace's policy.
	MemoryMB int     `json:"memory_mb,omitempty"`
	CPUs     float64 `json:"cpus,omitempty"`
	// Language is the code's: python (the default) or javascript.
	Language string `json:"language,omitempty"`
	// Files are placed under /workspace before the code starts.
	Files []jobs.FileInput `json:"files,omitempty"`
}

// job is the request's job.
func (q JobRequest) job() *jobs.Job {
	return &jobs.Job{ID: q.ID, Code: q.Code, Servers: q.Servers, Timeout: q.Timeout, MaxAttempts: q.MaxAttempts,
		Labels: q.Labels, Session: q.Session, Pool: q.Pool, After: q.After, AfterAny: q.AfterAny, MemoryMB: q.MemoryMB, CPUs: q.CPUs, Language: q.Language, Inputs: q.Files}
}

// Item is the answer for one submitted job: its record, flagged when the id
// existed already, with the error of a job that was not accepted.
type Item struct {
	*jobs.Record
	Existing bool       `json:"existing,omitempty"`
	Error    *ErrorBody `json:"error,omitempty"`
}

// ErrorBody is the error object of every failed answer.
type ErrorBody = httperr.Body

// ErrorResponse is the body of a failed answer; Job is set where a record is
// relevant (a conflicting or rejected job).
type ErrorResponse struct {
	Error ErrorBody    `json:"error"`
	Job   *jobs.Record `json:"job,omitempty"`
}

// ListResponse is the body of the list answers.
type ListResponse struct {
	Jobs []*jobs.Record `json:"jobs"`
	Next string         `json:"next,omitempty"`
}

func (a *api) submit(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
		writeError(w, http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("the body is over %d bytes: submit fewer jobs per request", tooLarge.Limit), nil)
		return
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_body", "could not read the request body: "+err.Error(), nil)
		return
	}
	body = bytes.TrimSpace(body)
	batch := len(body) > 0 && body[0] == '['
	var reqs []JobRequest
	if batch {
		err = decodeStrict(body, &reqs)
	} else {
		var one JobRequest
		err = decodeStrict(body, &one)
		reqs = []JobRequest{one}
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_json", "the body must be a job object or an array of them, with fields id, code, servers, timeout, max_attempts, labels, session, pool, after, after_any: "+err.Error(), nil)
		return
	}
	if len(reqs) == 0 || len(reqs) > MaxBatch {
		writeError(w, http.StatusBadRequest, "bad_batch", fmt.Sprintf("submit 1 to %d jobs at once, got %d", MaxBatch, len(reqs)), nil)
		return
	}
	js := make([]*jobs.Job, len(reqs))
	now := time.Now()
	for i, q := range reqs {
		js[i] = q.job()
		// Validate every job before submitting any.
		if err := js[i].Normalize(a.be.LimitsFor(a.cfg.Namespace(r.Context())), now); err != nil {
			msg := err.Error()
			if batch {
				msg = fmt.Sprintf("job %d: %s (no job of this batch was submitted)", i, msg)
			}
			writeError(w, http.StatusBadRequest, "invalid_job", msg, nil)
			return
		}
	}
	res := a.be.SubmitMany(r.Context(), js, a.cfg.Namespace(r.Context()))
	if !batch {
		a.submitOne(w, res[0])
		return
	}
	items := make([]Item, len(res))
	unavailable := 0
	for i, s := range res {
		items[i] = Item{Record: s.Record, Existing: s.Existing}
		if s.Err != nil {
			_, code, msg := httperr.Classify(s.Err)
			items[i].Error = &ErrorBody{Code: code, Message: msg}
			if errs.Is(s.Err, errs.Unavailable) {
				unavailable++
			}
		}
	}
	if unavailable == len(items) {
		writeError(w, http.StatusServiceUnavailable, "unavailable", res[0].Err.Error(), nil)
		return
	}
	httperr.WriteJSON(w, http.StatusOK, items)
}

func (a *api) submitOne(w http.ResponseWriter, s jobs.Submitted) {
	if s.Err != nil {
		status, code, msg := httperr.Classify(s.Err)
		if status == http.StatusServiceUnavailable && errs.Is(s.Err, errs.QueueFull) {
			w.Header().Set("Retry-After", "5")
		}
		writeError(w, status, code, msg, s.Record)
		return
	}
	status := http.StatusCreated
	if s.Existing {
		status = http.StatusOK
	}
	httperr.WriteJSON(w, status, Item{Record: s.Record, Existing: s.Existing})
}

func (a *api) lookup(w http.ResponseWriter, r *http.Request) (*jobs.Record, bool) {
	id := r.PathValue("id")
	if !jobs.ValidUserID(id) {
		writeError(w, http.StatusBadRequest, "bad_id", fmt.Sprintf("%q is not a job id: ids are 1-128 letters, digits, '-' or '_'", id), nil)
		return nil, false
	}
	rec, err := a.be.Get(r.Context(), a.cfg.Namespace(r.Context()), id)
	if err != nil {
		status, code, msg := httperr.Classify(err)
		if status == http.StatusNotFound {
			msg = fmt.Sprintf("no job with id %q", id)
		}
		writeError(w, status, code, msg, nil)
		return nil, false
	}
	return rec, true
}

func (a *api) get(w http.ResponseWriter, r *http.Request) {
	if rec, ok := a.lookup(w, r); ok {
		httperr.WriteJSON(w, http.StatusOK, rec)
	}
}

func (a *api) cancel(w http.ResponseWriter, r *http.Request) {
	rec, ok := a.lookup(w, r)
	if !ok {
		return
	}
	if rec.Status.Terminal() {
		writeError(w, http.StatusConflict, "finished", fmt.Sprintf("job %s already ended with status %s: nothing to cancel", rec.Job.ID, rec.Status), rec)
		return
	}
	ns := a.cfg.Namespace(r.Context())
	if err := a.be.Cancel(r.Context(), ns, rec.Job.ID, "cancelled through the jobs API"); err != nil {
		status, code, msg := httperr.Classify(err)
		writeError(w, status, code, msg, nil)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), cancelSettling)
	defer cancel()
	if got, err := a.be.Wait(ctx, ns, rec.Job.ID); got != nil && (err == nil || ctx.Err() != nil) {
		rec = got
	}
	httperr.WriteJSON(w, http.StatusOK, rec)
}

func (a *api) wait(w http.ResponseWriter, r *http.Request) {
	timeout := DefaultWait
	if s := r.URL.Query().Get("timeout"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			n, nerr := strconv.Atoi(s)
			d, err = time.Duration(n)*time.Second, nerr
		}
		if err != nil || d < 0 || d > MaxWait {
			writeError(w, http.StatusBadRequest, "bad_timeout", fmt.Sprintf("timeout %q must be a duration (e.g. 30s) or seconds, at most %s", s, MaxWait), nil)
			return
		}
		timeout = d
	}
	rec, ok := a.lookup(w, r)
	if !ok {
		return
	}
	if !rec.Status.Terminal() {
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		got, err := a.be.Wait(ctx, a.cfg.Namespace(r.Context()), rec.Job.ID)
		if err != nil && ctx.Err() == nil {
			status, code, msg := httperr.Classify(err)
			writeError(w, status, code, msg, nil)
			return
		}
		if got != nil {
			rec = got
		}
	}
	httperr.WriteJSON(w, http.StatusOK, rec)
}

// RetryRequest is the optional body of POST /api/jobs/{id}/retry.
type RetryRequest struct {
	ID string `json:"id,omitempty"` // the re-run's id; default a new one
}

func (a *api) retry(w http.ResponseWriter, r *http.Request) {
	var req RetryRequest
	if body, err := io.ReadAll(r.Body); err != nil || (len(bytes.TrimSpace(body)) > 0 && decodeStrict(body, &req) != nil) {
		writeError(w, http.StatusBadRequest, "bad_json", `the body must be empty or {"id": "<new job id>"}`, nil)
		return
	}
	rec, ok := a.lookup(w, r)
	if !ok {
		return
	}
	if !rec.Status.Terminal() {
		writeError(w, http.StatusConflict, "not_finished", fmt.Sprintf("job %s is still %s: only a finished job can be re-run", rec.Job.ID, rec.Status), rec)
		return
	}
	if req.ID == "" {
		req.ID = jobs.NewID()
	}
	j := rec.RetryJob(req.ID)
	res := a.be.SubmitMany(r.Context(), []*jobs.Job{&j}, a.cfg.Namespace(r.Context()))
	a.submitOne(w, res[0])
}

func (a *api) list(w http.ResponseWriter, r *http.Request) {
	a.listWith(w, r, a.be.List)
}

func (a *api) deadLetters(w http.ResponseWriter, r *http.Request) {
	a.listWith(w, r, a.be.DeadLetters)
}

func (a *api) listWith(w http.ResponseWriter, r *http.Request, fn func(context.Context, string, jobs.Filter) ([]*jobs.Record, string, error)) {
	q := r.URL.Query()
	f := jobs.Filter{
		Status: jobs.Status(q.Get("status")),
		Prefix: q.Get("prefix"),
		Cursor: q.Get("cursor"),
	}
	switch o := q.Get("order"); o {
	case "", "oldest":
	case "newest":
		f.Newest = true
	default:
		writeError(w, http.StatusBadRequest, "bad_order", fmt.Sprintf("order %.20q must be oldest (the default: ascending ids) or newest", o), nil)
		return
	}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > jobs.MaxListLimit {
			writeError(w, http.StatusBadRequest, "bad_limit", fmt.Sprintf("limit %q must be a whole number from 1 to %d", s, jobs.MaxListLimit), nil)
			return
		}
		f.Limit = n
	}
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			writeError(w, http.StatusBadRequest, "bad_label", fmt.Sprintf("label %q must be KEY=VALUE", l), nil)
			return
		}
		if f.Labels == nil {
			f.Labels = map[string]string{}
		}
		f.Labels[k] = v
	}
	if err := f.Validate(); err != nil {
		writeError(w, http.StatusBadRequest, "bad_filter", err.Error(), nil)
		return
	}
	recs, next, err := fn(r.Context(), a.cfg.Namespace(r.Context()), f)
	if err != nil {
		status, code, msg := httperr.Classify(err)
		writeError(w, status, code, msg, nil)
		return
	}
	httperr.WriteJSON(w, http.StatusOK, ListResponse{Jobs: recs, Next: next})
}

func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("unexpected data after the JSON value")
	}
	return nil
}

func writeError(w http.ResponseWriter, status int, code, msg string, rec *jobs.Record) {
	httperr.WriteJSON(w, status, ErrorResponse{Error: ErrorBody{Code: code, Message: msg}, Job: rec})
}
