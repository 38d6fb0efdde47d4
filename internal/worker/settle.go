package worker

import (
	"fmt"
	"time"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/sandbox"
)

// outcomeKind says how the handling of one delivery ended.
type outcomeKind int

const (
	ranToEnd         outcomeKind = iota // the code ran; result says how it ended
	cancelledRunning                    // the job was cancelled while its code ran
	cancelledQueued                     // a cancellation was recorded before it ran
	finishedAlready                     // its outcome is recorded (a redelivery after a lost ack)
	stopping                            // the worker is shutting down mid-run
	infraFailure                        // the runtime failed (err); started says whether the code had been sent
	transient                           // the broker could not be reached (cancel look-up, started event)
	exhausted                           // its earlier attempts all lost their workers
	undecodable                         // the message is not a job
	refused                             // the worker will not run it (err: why; a session it cannot keep)
	forwarded                           // handed to the worker that holds its session
	historyMoved                        // a first delivery's job has events after its claim: read them on a redelivery
)

// outcome is everything decide needs to know of one delivery.
type outcome struct {
	kind        outcomeKind
	attempt     int // this delivery's attempt: starts recorded so far + 1
	maxAttempts int
	delivery    int // JetStream's count of this message's deliveries
	maxDeliver  int
	started     bool // this attempt's start is recorded (the code was sent)
	result      sandbox.Result
	err         error
	// files are those of result stored in the file store, notes what of
	// them was not kept (the runner's and the worker's).
	files []jobs.FileInfo
	notes []string
}

// action is what happens to a job message.
type action int

const (
	actAck      action = iota // done with it: remove it
	actRetry                  // deliver it again later (another worker may do better)
	actHandBack               // deliver it again now (this worker is stopping, or must read the job's history)
	actTerm                   // it can never be processed
)

func (a action) String() string {
	return [...]string{"ack", "retry", "hand back", "term"}[a]
}

// verdict is decide's answer: record result (when set) as the job's outcome,
// then do action.
type verdict struct {
	action action
	delay  time.Duration // of a retry
	result *jobs.Result
}

// maxRetryDelay caps the delay before an infrastructure failure's redelivery.
const maxRetryDelay = 30 * time.Second

// decide is the one place that chooses between ack, retry, hand back and term
// for a delivery, and what outcome, if any, is recorded. It is pure.
//
// Infrastructure failures are not the code's: a job whose sandbox could not
// be made goes back to the queue without consuming an attempt, after a delay
// that grows with its deliveries, and ends infra_error only when JetStream
// will not deliver it again. Only what happened once the code was sent counts
// as an attempt.
func decide(o outcome, retryDelay time.Duration) verdict {
	switch o.kind {
	case ranToEnd:
		r := resultOf(o.result)
		r.Files, r.Notes = o.files, o.notes
		return verdict{action: actAck, result: &r}
	case cancelledRunning:
		return verdict{action: actAck, result: &jobs.Result{Status: jobs.StatusCancelled, Error: "cancelled while running",
			Stdout: o.result.Stdout, Stderr: o.result.Stderr, DurationMS: o.result.Duration.Milliseconds()}}
	case cancelledQueued, finishedAlready, forwarded:
		return verdict{action: actAck}
	case stopping, historyMoved:
		return verdict{action: actHandBack}
	case transient:
		return verdict{action: actRetry, delay: retryDelay}
	case undecodable:
		return verdict{action: actTerm}
	case exhausted:
		return verdict{action: actAck, result: &jobs.Result{Status: jobs.StatusWorkerLost,
			Error: fmt.Sprintf("the worker running this job was lost %d time(s) (max_attempts %d)", o.attempt-1, o.maxAttempts)}}
	case refused:
		return verdict{action: actAck, result: &jobs.Result{Status: jobs.StatusError, ExitCode: -1, Error: errText(o.err)}}
	case infraFailure:
		lastDelivery := o.maxDeliver > 0 && o.delivery >= o.maxDeliver
		if !o.started {
			if !lastDelivery {
				return verdict{action: actRetry, delay: backoff(retryDelay, o.delivery)}
			}
			return verdict{action: actAck, result: &jobs.Result{Status: jobs.StatusInfraError, ExitCode: -1,
				Error: fmt.Sprintf("no sandbox could be started for this job on any of its %d deliveries; the last worker said: %s", o.delivery, errText(o.err))}}
		}
		// The sandbox failed after the code was sent: the attempt is spent.
		if o.attempt < o.maxAttempts && !lastDelivery {
			return verdict{action: actRetry, delay: retryDelay}
		}
		return verdict{action: actAck, result: &jobs.Result{Status: jobs.StatusError, ExitCode: -1, SandboxFailed: true,
			Error: fmt.Sprintf("the sandbox failed: %s", errText(o.err))}}
	}
	return verdict{action: actRetry, delay: retryDelay}
}

// backoff is the delay before the redelivery that follows delivery n.
func backoff(base time.Duration, n int) time.Duration {
	d := base
	for i := 1; i < n && d < maxRetryDelay; i++ {
		d *= 2
	}
	return min(d, maxRetryDelay)
}

func errText(err error) string {
	if err == nil {
		return "unknown error"
	}
	return err.Error()
}

// resultOf maps a sandbox result to a job result.
func resultOf(r sandbox.Result) jobs.Result {
	st := jobs.StatusError
	switch r.Status {
	case sandbox.StatusSuccess:
		st = jobs.StatusSuccess
	case sandbox.StatusTimeout:
		st = jobs.StatusTimeout
	}
	return jobs.Result{
		Status: st, ExitCode: r.ExitCode, Stdout: r.Stdout, Stderr: r.Stderr,
		StdoutTruncated: r.StdoutTruncated, StderrTruncated: r.StderrTruncated,
		Error: r.Error, DurationMS: r.Duration.Milliseconds(),
	}
}
