package jobs

import (
	"math/rand/v2"
	"testing"
	"time"
)

func res(st Status) *Result { return &Result{Status: st} }

func TestApply(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	spec := &Job{ID: "j1", Code: "print(1)", MaxAttempts: 2}
	queued := func() *Record { return &Record{Job: *spec, Status: StatusQueued, CreatedAt: t0} }
	running := func(attempt int) *Record {
		r := queued()
		r.Status, r.Attempt, r.Worker = StatusRunning, attempt, "w1"
		return r
	}
	done := func(st Status, attempt int) *Record {
		r := running(attempt)
		r.Status, r.Result = st, res(st)
		return r
	}
	cases := []struct {
		name        string
		rec         *Record
		ev          Event
		wantChanged bool
		wantStatus  Status
		wantAttempt int
	}{
		{"SubmitNew", nil, Event{Job: "j1", Kind: EventSubmitted, Spec: spec}, true, StatusQueued, 0},
		{"SubmitAgainIsNoop", queued(), Event{Job: "j1", Kind: EventSubmitted, Spec: &Job{ID: "j1", Code: "other"}}, false, StatusQueued, 0},
		{"StartQueued", queued(), Event{Job: "j1", Kind: EventStarted, Attempt: 1, Worker: "w1"}, true, StatusRunning, 1},
		{"StartSameAttemptTwice", running(1), Event{Job: "j1", Kind: EventStarted, Attempt: 1}, false, StatusRunning, 1},
		{"StartNextAttempt", running(1), Event{Job: "j1", Kind: EventStarted, Attempt: 2, Worker: "w2"}, true, StatusRunning, 2},
		{"StartStaleAttempt", running(2), Event{Job: "j1", Kind: EventStarted, Attempt: 1}, false, StatusRunning, 2},
		{"FinishCurrent", running(1), Event{Job: "j1", Kind: EventFinished, Attempt: 1, Result: res(StatusSuccess)}, true, StatusSuccess, 1},
		{"FinishStaleIsFenced", running(2), Event{Job: "j1", Kind: EventFinished, Attempt: 1, Result: res(StatusError)}, false, StatusRunning, 2},
		{"FinishWithoutStart", queued(), Event{Job: "j1", Kind: EventFinished, Attempt: 1, Result: res(StatusError)}, true, StatusError, 1},
		{"FinishNonTerminalIgnored", running(1), Event{Job: "j1", Kind: EventFinished, Attempt: 1, Result: res(StatusRunning)}, false, StatusRunning, 1},
		{"FinishWithoutResultIgnored", running(1), Event{Job: "j1", Kind: EventFinished, Attempt: 1}, false, StatusRunning, 1},
		{"RejectQueued", queued(), Event{Job: "j1", Kind: EventFinished, Result: res(StatusRejected)}, true, StatusRejected, 0},
		{"CancelQueued", queued(), Event{Job: "j1", Kind: EventCancelled}, true, StatusCancelled, 0},
		{"CancelRunning", running(1), Event{Job: "j1", Kind: EventCancelled, Reason: "user"}, true, StatusCancelled, 1},
		{"TerminalNeverChanges", done(StatusSuccess, 1), Event{Job: "j1", Kind: EventCancelled}, false, StatusSuccess, 1},
		{"TerminalIgnoresLaterAttempt", done(StatusCancelled, 1), Event{Job: "j1", Kind: EventFinished, Attempt: 2, Result: res(StatusSuccess)}, false, StatusCancelled, 1},
		{"TerminalIgnoresStart", done(StatusWorkerLost, 2), Event{Job: "j1", Kind: EventStarted, Attempt: 3}, false, StatusWorkerLost, 2},
		{"BareRecordForLostSubmission", nil, Event{Job: "j1", Kind: EventFinished, Attempt: 1, Result: res(StatusSuccess)}, true, StatusSuccess, 1},
		{"UnknownKind", queued(), Event{Job: "j1", Kind: "bogus"}, false, StatusQueued, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, changed := Apply(tc.rec, tc.ev)
			if changed != tc.wantChanged || got.Status != tc.wantStatus || got.Attempt != tc.wantAttempt {
				t.Fatalf("Apply = status %s attempt %d changed %v; want %s %d %v", got.Status, got.Attempt, changed, tc.wantStatus, tc.wantAttempt, tc.wantChanged)
			}
			if got.Status.Terminal() && (got.Result == nil || got.FinishedAt == nil) && tc.wantChanged {
				t.Fatalf("terminal record without result or finish time: %+v", got)
			}
		})
	}
}

// TestApplyProperties folds random event sequences (shuffled, duplicated, stale)
// and checks the invariants: once terminal a record never changes; its attempt
// never goes down; a submission never replaces the spec; and replaying the same
// events again changes nothing (rebuild is idempotent).
func TestApplyProperties(t *testing.T) {
	kinds := []EventKind{EventSubmitted, EventStarted, EventFinished, EventCancelled}
	statuses := []Status{StatusSuccess, StatusError, StatusTimeout, StatusWorkerLost, StatusRejected, StatusRunning}
	for seed := range uint64(2000) {
		r := rand.New(rand.NewPCG(seed, 7))
		n := 1 + r.IntN(12)
		evs := make([]Event, n)
		for i := range evs {
			ev := Event{Job: "j", Kind: kinds[r.IntN(len(kinds))], Attempt: r.IntN(4), At: time.Unix(int64(i), 0)}
			switch ev.Kind {
			case EventSubmitted:
				ev.Spec = &Job{ID: "j", Code: string(rune('a' + r.IntN(3)))}
			case EventFinished:
				ev.Result = res(statuses[r.IntN(len(statuses))])
			}
			evs[i] = ev
		}
		var rec *Record
		var terminal *Record
		spec := ""
		for i, ev := range evs {
			before := 0
			if rec != nil {
				before = rec.Attempt
			}
			next, _ := Apply(rec, ev)
			if next == nil {
				t.Fatalf("seed %d: Apply returned nil", seed)
			}
			if terminal != nil && (next.Status != terminal.Status || next.Attempt != terminal.Attempt) {
				t.Fatalf("seed %d event %d: terminal record changed from %s to %s", seed, i, terminal.Status, next.Status)
			}
			if next.Attempt < before {
				t.Fatalf("seed %d event %d: attempt went down %d → %d", seed, i, before, next.Attempt)
			}
			if spec != "" && next.Job.Code != spec {
				t.Fatalf("seed %d event %d: a resubmission replaced the spec", seed, i)
			}
			if next.Job.Code != "" {
				spec = next.Job.Code
			}
			if next.Status.Terminal() && terminal == nil {
				c := *next
				terminal = &c
			}
			rec = next
		}
		snapshot := *rec
		for _, ev := range evs {
			if _, changed := Apply(rec, ev); changed && snapshot.Status.Terminal() {
				t.Fatalf("seed %d: replay changed a terminal record", seed)
			}
		}
		if snapshot.Status.Terminal() && (rec.Status != snapshot.Status || rec.Attempt != snapshot.Attempt) {
			t.Fatalf("seed %d: replay changed %s/%d to %s/%d", seed, snapshot.Status, snapshot.Attempt, rec.Status, rec.Attempt)
		}
	}
}

func TestDeadLetter(t *testing.T) {
	cases := []struct {
		rec  Record
		want bool
	}{
		{Record{Status: StatusWorkerLost}, true},
		{Record{Status: StatusRejected}, true},
		{Record{Status: StatusError, Result: &Result{Status: StatusError, SandboxFailed: true}}, true},
		{Record{Status: StatusError, Result: &Result{Status: StatusError}}, false},
		{Record{Status: StatusSuccess}, false},
		{Record{Status: StatusCancelled}, false},
		{Record{Status: StatusRunning}, false},
	}
	for _, tc := range cases {
		if got := tc.rec.DeadLetter(); got != tc.want {
			t.Errorf("%s (result %+v): DeadLetter = %v, want %v", tc.rec.Status, tc.rec.Result, got, tc.want)
		}
	}
	r := Record{Job: Job{ID: "a", Labels: map[string]string{"k": "v"}, SubmittedAt: time.Now()}}
	j := r.RetryJob("b")
	j.Labels["k"] = "changed"
	if j.ID != "b" || j.RetryOf != "a" || !j.SubmittedAt.IsZero() || r.Job.Labels["k"] != "v" {
		t.Fatalf("RetryJob = %+v (original labels %v)", j, r.Job.Labels)
	}
}

func TestParseEvent(t *testing.T) {
	s := Subjects{}
	for _, c := range []struct {
		subject, job string
		kind         EventKind
		ok           bool
	}{
		{s.Event("abc-1", EventStarted), "abc-1", EventStarted, true},
		{s.Event("ns-job_2", EventReleased), "ns-job_2", EventReleased, true},
		{s.Output("abc"), "", "", false},
		{s.p() + ".events.abc", "", "", false},
		{s.p() + ".events.abc.", "", "", false},
		{"other.events.abc.started", "", "", false},
	} {
		job, kind, ok := s.ParseEvent(c.subject)
		if job != c.job || kind != c.kind || ok != c.ok {
			t.Errorf("%s: %q %q %v", c.subject, job, kind, ok)
		}
	}
}
