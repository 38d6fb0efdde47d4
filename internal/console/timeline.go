package console

import (
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

// Entry is one line of a job's timeline.
type Entry struct {
	At         time.Time `json:"at"`
	Kind       string    `json:"kind"` // submitted, queued, taken, sandbox, started, ran, call, finished
	Title      string    `json:"title"`
	Detail     string    `json:"detail,omitempty"`
	DurationMS float64   `json:"duration_ms,omitempty"`
	Outcome    string    `json:"outcome,omitempty"` // ok, error
	Attempt    int       `json:"attempt,omitempty"`
	// The call's parts, for calls.
	Server string `json:"server,omitempty"`
	Tool   string `json:"tool,omitempty"`
	Method string `json:"method,omitempty"`
	// Decision and DecidedBy are a tool call's, under the namespace's tool
	// rules: "allow" or "deny", and "policy" or who answered its approval.
	Decision  string `json:"decision,omitempty"`
	DecidedBy string `json:"decided_by,omitempty"`
	Source    string `json:"source"` // record or span
}

// Timeline is a job's record with its timeline and the spans it was built
// from.
type Timeline struct {
	Job     *jobs.Record           `json:"job"`
	TraceID string                 `json:"trace_id,omitempty"`
	Entries []Entry                `json:"entries"`
	Spans   []tracing.RecordedSpan `json:"spans"`
	Note    string                 `json:"note,omitempty"`
}

// BuildTimeline makes rec's timeline from its record and the recorded spans
// of its trace. Only the spans of the job itself (its wire id on the span,
// or a descendant of such a span) are used: a trace id is not a secret (a
// caller may choose its job's parent), so spans of another job in the same
// trace never show.
func BuildTimeline(rec *jobs.Record, wireID string, trace []tracing.RecordedSpan) Timeline {
	t := Timeline{Job: rec, TraceID: rec.TraceID, Spans: ownSpans(trace, wireID), Entries: []Entry{}}
	add := func(e Entry) { t.Entries = append(t.Entries, e) }
	if !rec.Job.SubmittedAt.IsZero() {
		add(Entry{At: rec.Job.SubmittedAt, Kind: "submitted", Title: "submitted", Detail: submittedDetail(rec), Source: "record"})
	}
	if !rec.CreatedAt.IsZero() {
		add(Entry{At: rec.CreatedAt, Kind: "queued", Title: "recorded " + map[bool]string{true: "waiting for its parents", false: "queued"}[rec.Job.Waits()], Source: "record"})
	}
	if rec.StartedAt != nil {
		add(Entry{At: *rec.StartedAt, Kind: "started", Title: "started", Detail: "on worker " + rec.Worker, Attempt: rec.Attempt, Source: "record"})
	}
	calls := map[string]bool{} // span ids of proxy.call spans
	for _, s := range t.Spans {
		if s.Name == tracing.SpanProxyCall {
			calls[s.SpanID] = true
		}
	}
	// The front-end's span of a call carries its decision; the call's
	// entry is the worker's span when there is one.
	decided := map[string]tracing.RecordedSpan{}
	for _, s := range t.Spans {
		if s.Name == tracing.SpanProxyHandle && s.Attrs[string(tracing.AttrDecision)] != "" {
			key := s.SpanID
			if calls[s.ParentID] {
				key = s.ParentID
			}
			decided[key] = s
		}
	}
	for _, s := range t.Spans {
		d := float64(s.End.Sub(s.Start).Microseconds()) / 1000
		attempt, _ := strconv.Atoi(s.Attrs[string(tracing.AttrAttempt)])
		outcome := "ok"
		if s.Error {
			outcome = "error"
		}
		worker := s.Attrs[string(tracing.AttrWorker)]
		switch s.Name {
		case tracing.SpanQueueWait:
			add(Entry{At: s.End, Kind: "taken", Title: "taken from the queue", Detail: "by worker " + worker + " after " + ms(d), DurationMS: d, Attempt: attempt, Outcome: outcome, Source: "span"})
		case tracing.SpanAcquire:
			detail := "on worker " + worker
			if c := s.Attrs[string(tracing.AttrSandbox)]; c != "" {
				detail = "container " + c + " " + detail
			}
			add(Entry{At: s.Start, Kind: "sandbox", Title: "sandbox ready in " + ms(d), Detail: detail, DurationMS: d, Attempt: attempt, Outcome: outcome, Source: "span"})
		case tracing.SpanRun:
			detail := "on worker " + worker
			if c := s.Attrs[string(tracing.AttrSandbox)]; c != "" {
				detail += ", container " + c
			}
			if st := s.Attrs[string(tracing.AttrStatus)]; st != "" {
				detail += ": " + st
			}
			add(Entry{At: s.Start, Kind: "ran", Title: "code ran for " + ms(d), Detail: detail, DurationMS: d, Attempt: attempt, Outcome: outcome, Source: "span"})
		case tracing.SpanProxyCall, tracing.SpanProxyHandle:
			if s.Name == tracing.SpanProxyHandle && calls[s.ParentID] {
				continue // the worker's span of the same call is shown
			}
			e := Entry{At: s.Start, Kind: "call", DurationMS: d, Outcome: outcome, Attempt: attempt, Source: "span",
				Server: s.Attrs[string(tracing.AttrServer)], Tool: s.Attrs[string(tracing.AttrTool)], Method: s.Attrs[string(tracing.AttrMethod)]}
			if o := s.Attrs[string(tracing.AttrOutcome)]; o != "" {
				e.Outcome = o
			}
			switch {
			case e.Server != "" && e.Tool != "":
				e.Title = "call " + e.Server + "." + e.Tool
			case e.Method != "":
				e.Title = "call " + e.Method
			default:
				e.Title = "proxy call"
			}
			e.Detail = ms(d) + ", " + e.Outcome
			if s.Status != "" {
				e.Detail += ": " + s.Status
			}
			if h, ok := decided[s.SpanID]; ok {
				e.Decision, e.DecidedBy = h.Attrs[string(tracing.AttrDecision)], h.Attrs[string(tracing.AttrDecidedBy)]
				if e.Decision != "allow" || e.DecidedBy != "policy" {
					// Said when a person, a grant or a refusal decided.
					e.Detail += "; " + map[bool]string{true: "allowed", false: "denied"}[e.Decision == "allow"] + " by " + e.DecidedBy
				}
			}
			add(e)
		}
	}
	if rec.FinishedAt != nil {
		e := Entry{At: *rec.FinishedAt, Kind: "finished", Title: "finished: " + string(rec.Status), Attempt: rec.Attempt, Outcome: "ok", Source: "record"}
		if rec.Status != jobs.StatusSuccess {
			e.Outcome = "error"
		}
		if rec.Result != nil {
			e.Detail = fmt.Sprintf("exit code %d after %s", rec.Result.ExitCode, ms(float64(rec.Result.DurationMS)))
			if rec.Result.Error != "" {
				e.Detail += ": " + rec.Result.Error
			}
		}
		add(e)
	}
	sort.SliceStable(t.Entries, func(i, j int) bool { return t.Entries[i].At.Before(t.Entries[j].At) })
	if len(t.Spans) == 0 {
		t.Note = "no spans of this job on this front-end: they were recorded by another front-end of the fleet, or are older than the recorder keeps (1 h, 20,000 spans)"
	}
	return t
}

func submittedDetail(rec *jobs.Record) string {
	s := "language " + rec.Job.Lang()
	if rec.Job.Frontend != "" {
		s += ", through front-end " + rec.Job.Frontend
	}
	if rec.Job.RetryOf != "" {
		s += ", a re-run of " + rec.Job.RetryOf
	}
	return s
}

// ownSpans returns the spans of trace that belong to the job of wire id:
// those naming it (front-end proxy spans only once admitted), and their
// descendants.
func ownSpans(trace []tracing.RecordedSpan, wireID string) []tracing.RecordedSpan {
	own := map[string]bool{}
	for _, s := range trace {
		// A front-end's span of a proxy call names the job the request
		// claimed; it speaks for the job only once the call's capability
		// was checked.
		if s.Attrs[string(tracing.AttrJobID)] == wireID && (s.Name != tracing.SpanProxyHandle || s.Attrs[string(tracing.AttrAdmitted)] == "true") {
			own[s.SpanID] = true
		}
	}
	for changed := true; changed; { // descendants; a trace is small
		changed = false
		for _, s := range trace {
			if !own[s.SpanID] && s.ParentID != "" && own[s.ParentID] && s.Attrs[string(tracing.AttrJobID)] == "" {
				own[s.SpanID], changed = true, true
			}
		}
	}
	out := []tracing.RecordedSpan{}
	for _, s := range trace {
		if own[s.SpanID] {
			out = append(out, s)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}

func ms(d float64) string {
	if d >= 1000 {
		return strconv.FormatFloat(d/1000, 'f', 2, 64) + " s"
	}
	return strconv.FormatFloat(d, 'f', 1, 64) + " ms"
}
