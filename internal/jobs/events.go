package jobs

import (
	"time"
)

// EventKind names a lifecycle event.
type EventKind string

// Lifecycle events, recorded in the events stream (the log) and folded into job
// records by the state service (the materialised view).
const (
	EventSubmitted EventKind = "submitted"
	EventStarted   EventKind = "started"
	EventFinished  EventKind = "finished"
	EventCancelled EventKind = "cancelled"
	// EventReleased: a waiting job's parents have ended as it needs, and it
	// is enqueued. Its subject is claimed once, like a submission's.
	EventReleased EventKind = "released"
)

// Event is one record of the events stream.
type Event struct {
	Job     string    `json:"job"`
	Kind    EventKind `json:"kind"`
	Attempt int       `json:"attempt,omitempty"`
	Worker  string    `json:"worker,omitempty"`
	At      time.Time `json:"at"`
	Spec    *Job      `json:"spec,omitempty"`   // submitted
	Result  *Result   `json:"result,omitempty"` // finished
	Reason  string    `json:"reason,omitempty"` // cancelled
	// Proof is EventProof of the job's capability on started and finished
	// events: the state service applies them only with it, so a worker can
	// speak only for the jobs it was given. Records never carry it.
	Proof string `json:"proof,omitempty"`
}

// NeedsProof reports whether events of kind k must carry the job's capability.
func NeedsProof(k EventKind) bool {
	return k == EventStarted || k == EventFinished || k == EventReleased
}

// Record is the state service's view of one job.
type Record struct {
	Job        Job        `json:"job"`
	Status     Status     `json:"status"`
	Attempt    int        `json:"attempt"`
	Worker     string     `json:"worker,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	StartedAt  *time.Time `json:"started_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	Result     *Result    `json:"result,omitempty"`
	// TraceID is the job's trace (32 hex digits): where a console finds the
	// spans of the job.
	TraceID string `json:"trace_id,omitempty"`
}

// Apply folds ev into rec and reports whether rec changed. rec is nil when no
// record exists yet; Apply then returns a new record for a submitted event (or a
// bare one for any other, so that no terminal event is lost even when the
// submission record is missing). The rules:
//   - a terminal record never changes again (exactly one terminal status);
//   - started and finished events of an attempt older than the record's are
//     stale and ignored (fencing by attempt number);
//   - a second submission of an existing id changes nothing (dedupe).
func Apply(rec *Record, ev Event) (*Record, bool) {
	if rec == nil {
		rec = &Record{Job: Job{ID: ev.Job}, Status: StatusQueued, CreatedAt: ev.At}
		if ev.Spec != nil {
			rec.Job = *ev.Spec
			if rec.Job.Waits() {
				rec.Status = StatusWaiting
			}
		}
		rec.TraceID = TraceID(rec.Job.Trace())
		if ev.Kind == EventSubmitted {
			return rec, true
		}
		r, _ := Apply(rec, ev)
		return r, true
	}
	if rec.Status.Terminal() {
		return rec, false
	}
	at := ev.At
	switch ev.Kind {
	case EventSubmitted:
		return rec, false
	case EventReleased:
		if rec.Status != StatusWaiting {
			return rec, false
		}
		rec.Status = StatusQueued
		return rec, true
	case EventStarted:
		if ev.Attempt < rec.Attempt || (ev.Attempt == rec.Attempt && rec.Status == StatusRunning) {
			return rec, false
		}
		rec.Status = StatusRunning
		rec.Attempt = ev.Attempt
		rec.Worker = ev.Worker
		rec.StartedAt = &at
		return rec, true
	case EventFinished:
		if ev.Result == nil || !ev.Result.Status.Terminal() || ev.Attempt < rec.Attempt {
			return rec, false
		}
		res := *ev.Result
		rec.Status = res.Status
		rec.Attempt = ev.Attempt
		if ev.Worker != "" {
			rec.Worker = ev.Worker
		}
		rec.Result = &res
		rec.FinishedAt = &at
		return rec, true
	case EventCancelled:
		rec.Status = StatusCancelled
		rec.Result = &Result{Status: StatusCancelled, Error: cancelText(ev.Reason), Attempt: rec.Attempt, Worker: rec.Worker}
		rec.FinishedAt = &at
		return rec, true
	}
	return rec, false
}

func cancelText(reason string) string {
	if reason == "" {
		return "cancelled"
	}
	return "cancelled: " + reason
}

// DeadLetter reports whether the record is a dead letter: a job that ended without
// its code completing, for reasons an operator may want to look at and re-run —
// its worker was lost on every attempt, the queue refused it, or the sandbox
// itself failed. Failures of the user's code are results, not dead letters.
func (r *Record) DeadLetter() bool {
	switch r.Status {
	case StatusWorkerLost, StatusRejected, StatusInfraError:
		return true
	case StatusError:
		return r.Result != nil && r.Result.SandboxFailed
	}
	return false
}

// RetryJob returns a copy of the record's job to be submitted again under id as a
// re-run of it: attempts and submission time start afresh.
func (r *Record) RetryJob(id string) Job {
	j := r.Job
	j.ID = id
	j.RetryOf = r.Job.ID
	j.SubmittedAt = time.Time{}
	if j.Labels != nil {
		l := make(map[string]string, len(j.Labels))
		for k, v := range j.Labels {
			l[k] = v
		}
		j.Labels = l
	}
	j.Servers = append([]string(nil), j.Servers...)
	return j
}
