// Package errs is mcpexec's one coded error type: a kind (what the caller can
// do about it), a message, and a cause. Each package keeps its sentinel errors
// (errors.Is works on them as before) but makes them of this type, so each
// edge maps errors to its protocol in one place by kind: HTTP statuses in
// jobsapi, NATS service codes in state, JSON-RPC codes in mcpserver.
package errs

import (
	"errors"
	"unicode/utf8"
)

// Kind says what kind of failure an error is, and so what the caller can do.
type Kind int

// Kinds of errors.
const (
	Internal     Kind = iota // a bug or an unexpected failure: report it
	Invalid                  // the request is wrong: fix it
	NotFound                 // no such thing (for this caller)
	Conflict                 // the request collides with the current state: choose another id, or read again
	Unavailable              // a part of the system cannot be reached now: retry
	OverCap                  // a namespace cap is reached: wait for work to end
	QueueFull                // the job queue is full: retry later, or add workers
	ShuttingDown             // this process is stopping: use another
	Quota                    // a namespace quota (memory) is exhausted: delete something
)

var names = [...]string{"internal", "invalid", "not_found", "conflict", "unavailable", "over_cap", "queue_full", "shutting_down", "quota"}

// String is the kind's wire name (used as the code of API errors).
func (k Kind) String() string {
	if k < 0 || int(k) >= len(names) {
		return "internal"
	}
	return names[k]
}

// Error is an error of a kind, with a message and an optional cause.
type Error struct {
	Kind Kind
	Msg  string
	Err  error
}

func (e *Error) Error() string {
	if e.Err == nil {
		return e.Msg
	}
	if e.Msg == "" {
		return e.Err.Error()
	}
	return e.Msg + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// ErrKind returns the error's kind (so an *Error is Kinded too).
func (e *Error) ErrKind() Kind { return e.Kind }

// New returns an error of kind with message msg (a sentinel, typically).
func New(kind Kind, msg string) *Error { return &Error{Kind: kind, Msg: msg} }

// Kinded is implemented by errors of other types that know their kind
// (jobs.InvalidError).
type Kinded interface {
	ErrKind() Kind
}

// KindOf returns the kind of the first error in err's chain that has one;
// Internal when none has.
func KindOf(err error) Kind {
	var k Kinded
	if errors.As(err, &k) {
		return k.ErrKind()
	}
	return Internal
}

// Is reports whether err is of kind.
func Is(err error, kind Kind) bool { return err != nil && KindOf(err) == kind }

// Clip cuts s to at most n bytes for a message, marking the cut with "…". It
// cuts at a character boundary, so what was valid UTF-8 stays valid: a name
// or an error from a tenant or a sandbox is shown, never split mid-character.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return Cut(s, n) + "…"
}

// Cut returns s, or its first n bytes at most when it is longer, cut at a
// character boundary: what was valid UTF-8 stays valid.
func Cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
