package jobs

import (
	"fmt"
	"time"
)

// Listing bounds.
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// Filter selects job records. Zero fields match everything.
type Filter struct {
	Namespace  string            `json:"namespace,omitempty"` // jobs of this namespace only
	Status     Status            `json:"status,omitempty"`
	Prefix     string            `json:"prefix,omitempty"` // id prefix
	Labels     map[string]string `json:"labels,omitempty"` // every label must match
	Cursor     string            `json:"cursor,omitempty"` // list ids after this one
	Limit      int               `json:"limit,omitempty"`  // DefaultListLimit when 0
	DeadLetter bool              `json:"dead_letter,omitempty"`
	// Newest lists in descending id order (newest first for generated ids);
	// Cursor then lists the ids before it.
	Newest bool `json:"newest,omitempty"`
}

// Validate checks the filter's fields.
func (f *Filter) Validate() error {
	if f.Limit < 0 || f.Limit > MaxListLimit {
		return fmt.Errorf("limit %d is outside 0..%d", f.Limit, MaxListLimit)
	}
	if f.Status != "" && !f.Status.Valid() {
		return fmt.Errorf("status %q is not one of waiting, queued, running, success, error, timeout, cancelled, worker_lost, rejected, infra_error, skipped", f.Status)
	}
	return nil
}

// Match reports whether rec passes the filter's namespace, status and labels
// (the id fields, Prefix and Cursor, are the lister's).
func (f *Filter) Match(rec *Record) bool {
	if f.Namespace != "" && rec.Job.Namespace != f.Namespace {
		return false
	}
	if f.Status != "" && rec.Status != f.Status {
		return false
	}
	for k, v := range f.Labels {
		if got, ok := rec.Job.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Submitted is the outcome of submitting one job.
type Submitted struct {
	// Record is the job's record: a new queued (or waiting) one, the existing
	// one for a resubmitted id, or the rejected one when the queue was full.
	// Nil when Err is an *InvalidError or says the broker is unavailable.
	Record *Record
	// Existing says the id was submitted before and Record is that job's.
	Existing bool
	// Err is nil, an *InvalidError, a conflict (same id, different job:
	// Record is the existing one), a full queue (Record is rejected), or an
	// unavailable broker (errs kinds).
	Err error
}

// EventView is a job's lifecycle event as its namespace sees it: the job's
// own id, what happened, and the job's labels. Seq is the event's position in
// the fleet's events stream: following again after it misses nothing.
type EventView struct {
	Seq     uint64            `json:"seq"`
	Job     string            `json:"job"`
	Kind    EventKind         `json:"kind"`
	Status  Status            `json:"status"` // the job's status after the event
	Attempt int               `json:"attempt,omitempty"`
	Worker  string            `json:"worker,omitempty"`
	At      time.Time         `json:"at"`
	Error   string            `json:"error,omitempty"` // of a finished or cancelled job
	Labels  map[string]string `json:"labels,omitempty"`
}
