package worker

import (
	"errors"
	"testing"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// TestDecide is the table of every outcome a delivery can have and what
// happens to its message.
func TestDecide(t *testing.T) {
	boom := errors.New("create container: connection refused")
	base := time.Second
	tests := []struct {
		name   string
		o      outcome
		action action
		status jobs.Status // recorded outcome; "" for none
		delay  time.Duration
	}{
		{"success", outcome{kind: ranToEnd, result: sandbox.Result{Status: sandbox.StatusSuccess}}, actAck, jobs.StatusSuccess, 0},
		{"code error", outcome{kind: ranToEnd, result: sandbox.Result{Status: sandbox.StatusError, ExitCode: 1}}, actAck, jobs.StatusError, 0},
		{"timeout", outcome{kind: ranToEnd, result: sandbox.Result{Status: sandbox.StatusTimeout}}, actAck, jobs.StatusTimeout, 0},
		{"cancelled while running", outcome{kind: cancelledRunning}, actAck, jobs.StatusCancelled, 0},
		{"cancelled while queued", outcome{kind: cancelledQueued}, actAck, "", 0},
		{"finished before a lost ack", outcome{kind: finishedAlready}, actAck, "", 0},
		{"forwarded to its session's worker", outcome{kind: forwarded}, actAck, "", 0},
		{"worker shutting down", outcome{kind: stopping, started: true}, actHandBack, "", 0},
		{"first start refused: history after the claim", outcome{kind: historyMoved, delivery: 1, attempt: 1, maxAttempts: 1}, actHandBack, "", 0},
		{"broker unreachable", outcome{kind: transient, err: boom}, actRetry, "", base},
		{"not a job", outcome{kind: undecodable}, actTerm, "", 0},
		{"attempts exhausted by lost workers", outcome{kind: exhausted, attempt: 3, maxAttempts: 2}, actAck, jobs.StatusWorkerLost, 0},
		{"session refused", outcome{kind: refused, err: errors.New("session s has expired")}, actAck, jobs.StatusError, 0},
		{"runtime failure, first delivery", outcome{kind: infraFailure, err: boom, delivery: 1, maxDeliver: 10, attempt: 1, maxAttempts: 1}, actRetry, "", base},
		{"runtime failure, third delivery backs off", outcome{kind: infraFailure, err: boom, delivery: 3, maxDeliver: 10, attempt: 1, maxAttempts: 1}, actRetry, "", 4 * base},
		{"runtime failure, backoff capped", outcome{kind: infraFailure, err: boom, delivery: 9, maxDeliver: 10}, actRetry, "", maxRetryDelay},
		{"runtime failure, last delivery", outcome{kind: infraFailure, err: boom, delivery: 10, maxDeliver: 10, attempt: 1, maxAttempts: 1}, actAck, jobs.StatusInfraError, 0},
		{"sandbox lost after the code was sent, attempts left", outcome{kind: infraFailure, err: boom, started: true, delivery: 1, maxDeliver: 10, attempt: 1, maxAttempts: 2}, actRetry, "", base},
		{"sandbox lost after the code was sent, last attempt", outcome{kind: infraFailure, err: boom, started: true, delivery: 2, maxDeliver: 10, attempt: 2, maxAttempts: 2}, actAck, jobs.StatusError, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := decide(tt.o, base)
			got := jobs.Status("")
			if v.result != nil {
				got = v.result.Status
			}
			if v.action != tt.action || got != tt.status || (tt.action == actRetry && v.delay != tt.delay) {
				t.Fatalf("decide = %s %q delay %s, want %s %q delay %s", v.action, got, v.delay, tt.action, tt.status, tt.delay)
			}
			if got == jobs.StatusInfraError && v.result.Error == "" {
				t.Fatal("infra_error without its cause")
			}
		})
	}
}

func TestHealth(t *testing.T) {
	h := newHealth(3)
	fail := outcome{kind: infraFailure, err: errors.New("socket gone")}
	for range 2 {
		h.observe(fail)
	}
	h.observe(outcome{kind: ranToEnd, started: true}) // a job ran: the count starts again
	for range 2 {
		h.observe(fail)
	}
	if sick, _, _ := h.state(); sick {
		t.Fatal("sick after two failures in a row")
	}
	h.observe(fail)
	sick, reason, _ := h.state()
	if !sick || reason == "" {
		t.Fatalf("not sick after three failures in a row: %v %q", sick, reason)
	}
	select {
	case <-h.healthy:
		t.Fatal("healthy channel closed while sick")
	default:
	}
	h.recover()
	if sick, _, _ := h.state(); sick {
		t.Fatal("still sick after recover")
	}
	<-h.healthy
}
