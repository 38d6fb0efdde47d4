package queue

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

// The per-job messages of core NATS, beside the job message itself: live
// output (Subjects.Output), cancel announcements (Subjects.Cancel) and the
// session look-ups a front-end or worker sends the worker holding a session
// (Subjects.WorkerSessions), with the sessions bucket's entries. Each has one
// encoder and one decoder here, used by both sides. Whoever holds a role's
// credential may publish on these subjects, so a decoder bounds what it reads
// and refuses, with an error saying why, anything but the message its
// subject calls for; the receiver drops what it refuses.

// ErrMalformed is wrapped by every refusal of the decoders below.
var ErrMalformed = errs.New(errs.Invalid, "malformed message")

func malformed(what string, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrMalformed, what, fmt.Sprintf(format, args...))
}

// MaxOutputFrame bounds an encoded output chunk: nats-server's default
// max_payload, so no chunk a default broker carries is refused.
const MaxOutputFrame = 1 << 20

// MaxOutputData bounds the data of one output chunk. JSON may write a byte as
// six ("\u001b"), so a chunk of this much data always encodes within
// MaxOutputFrame; SplitOutput cuts longer data.
const MaxOutputData = 128 << 10

// SplitOutput cuts data into pieces of at most MaxOutputData bytes, each
// ending on a UTF-8 character boundary where data has one (a piece cut inside
// a character would reach the watcher as U+FFFD).
func SplitOutput(data string) []string {
	var out []string
	for len(data) > MaxOutputData {
		n := MaxOutputData
		for i := 0; i < utf8.UTFMax && n > 0 && !utf8.RuneStart(data[n]); i++ {
			n--
		}
		if n == 0 || !utf8.RuneStart(data[n]) {
			n = MaxOutputData // not UTF-8 there: cut anywhere
		}
		out = append(out, data[:n])
		data = data[n:]
	}
	return append(out, data)
}

// EncodeOutput encodes a live output chunk for Subjects.Output.
func EncodeOutput(c jobs.OutputChunk) ([]byte, error) {
	if len(c.Data) > MaxOutputData {
		return nil, fmt.Errorf("encode output chunk: %d bytes of data, at most %d (SplitOutput)", len(c.Data), MaxOutputData)
	}
	data, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode output chunk: %w", err)
	}
	return data, nil
}

// DecodeOutput decodes a live output chunk. It refuses a frame over
// MaxOutputFrame, a stream other than stdout or stderr, no data, more than
// MaxOutputData of it, an attempt or sequence number below 1, and a chunk
// without a proof. It does not check the proof (jobs.CheckOutput does, with
// the job's capability).
func DecodeOutput(data []byte) (jobs.OutputChunk, error) {
	const what = "output chunk"
	var c jobs.OutputChunk
	switch {
	case len(data) > MaxOutputFrame:
		return c, malformed(what, "%d bytes, at most %d", len(data), MaxOutputFrame)
	case json.Unmarshal(data, &c) != nil:
		return jobs.OutputChunk{}, malformed(what, "not a JSON object of its fields")
	case c.Stream != "stdout" && c.Stream != "stderr":
		return c, malformed(what, "stream %q, want stdout or stderr", errs.Clip(c.Stream, 20))
	case c.Data == "" || len(c.Data) > MaxOutputData:
		return c, malformed(what, "%d bytes of data, want 1 to %d", len(c.Data), MaxOutputData)
	case c.Attempt < 1 || c.Seq < 1:
		return c, malformed(what, "attempt %d, sequence %d: both count from 1", c.Attempt, c.Seq)
	case c.Proof == "":
		return c, malformed(what, "no proof")
	}
	return c, nil
}

// MaxCancelFrame bounds an encoded cancel announcement.
const MaxCancelFrame = 8 << 10

// MaxCancelReason bounds a cancel announcement's reason: a longer one is
// clipped by EncodeCancel.
const MaxCancelReason = 1 << 10

// Cancel is the announcement, on Subjects.Cancel(Job), that a job was
// cancelled: the worker running it stops its sandbox. A front-end records
// the cancellation (a cancelled event) before it announces it.
type Cancel struct {
	Job    string `json:"job"`
	Reason string `json:"reason,omitempty"`
}

// EncodeCancel encodes c, clipping its reason to MaxCancelReason.
func EncodeCancel(c Cancel) ([]byte, error) {
	if !jobs.ValidID(c.Job) {
		return nil, fmt.Errorf("encode cancel: invalid job id %q", errs.Clip(c.Job, 40))
	}
	if len(c.Reason) > MaxCancelReason {
		c.Reason = errs.Clip(c.Reason, MaxCancelReason-len("…"))
	}
	data, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode cancel of %s: %w", c.Job, err)
	}
	return data, nil
}

// DecodeCancel decodes a cancel announcement received on the cancel subject
// of job: one over MaxCancelFrame, that does not decode, names another job
// or has a reason over MaxCancelReason is refused.
func DecodeCancel(job string, data []byte) (Cancel, error) {
	const what = "cancel"
	var c Cancel
	switch {
	case len(data) > MaxCancelFrame:
		return c, malformed(what, "%d bytes, at most %d", len(data), MaxCancelFrame)
	case json.Unmarshal(data, &c) != nil:
		return Cancel{}, malformed(what, "not a JSON object of its fields")
	case c.Job != job:
		return c, malformed(what, "names job %q on the subject of %q", errs.Clip(c.Job, 40), job)
	case len(c.Reason) > MaxCancelReason:
		return c, malformed(what, "a reason of %d bytes, at most %d", len(c.Reason), MaxCancelReason)
	}
	return c, nil
}

// PublishCancel announces that job was cancelled, for reason.
func PublishCancel(nc *nats.Conn, s jobs.Subjects, job, reason string) error {
	data, err := EncodeCancel(Cancel{Job: job, Reason: reason})
	if err != nil {
		return err
	}
	if err := nc.Publish(s.Cancel(job), data); err != nil {
		return fmt.Errorf("announce cancel of %s: %w", job, err)
	}
	return nil
}

// MaxSessionRequest bounds an encoded session look-up.
const MaxSessionRequest = 1 << 10

// sessionKeyPattern is what SessionKey returns: a key-value key.
var sessionKeyPattern = regexp.MustCompile(`^[-_=a-zA-Z0-9]+\.[-_a-zA-Z0-9]+$`)

// SessionRequest is a question to the worker holding a session, on
// Subjects.WorkerSessions(worker): does it hold the session with Key, or,
// with End, will it end it. The worker answers a SessionAnswer.
type SessionRequest struct {
	Key string
	End bool
}

// Encode encodes r: the key, after EndSessionRequest when it asks to end
// the session (the form every version of the fleet speaks).
func (r SessionRequest) Encode() []byte {
	if r.End {
		return []byte(EndSessionRequest + r.Key)
	}
	return []byte(r.Key)
}

// DecodeSessionRequest decodes a session look-up: one over
// MaxSessionRequest, or whose key is not a session key (SessionKey), is
// refused.
func DecodeSessionRequest(data []byte) (SessionRequest, error) {
	const what = "session look-up"
	if len(data) > MaxSessionRequest {
		return SessionRequest{}, malformed(what, "%d bytes, at most %d", len(data), MaxSessionRequest)
	}
	key, end := strings.CutPrefix(string(data), EndSessionRequest)
	if !sessionKeyPattern.MatchString(key) {
		return SessionRequest{}, malformed(what, "%q is not a session key", errs.Clip(key, 60))
	}
	return SessionRequest{Key: key, End: end}, nil
}

// SessionAnswer is a worker's answer to a SessionRequest.
type SessionAnswer string

// A worker's answers.
const (
	// SessionHeld: it holds the session asked about.
	SessionHeld SessionAnswer = "held"
	// SessionEnded: it ended the session as asked.
	SessionEnded SessionAnswer = "ended"
	// SessionGone: it does not hold the session (or the request was
	// refused).
	SessionGone SessionAnswer = "gone"
)

// DecodeSessionAnswer decodes a worker's answer; anything but the three
// answers is refused.
func DecodeSessionAnswer(data []byte) (SessionAnswer, error) {
	switch a := SessionAnswer(data); a {
	case SessionHeld, SessionEnded, SessionGone:
		return a, nil
	}
	return "", malformed("session answer", "%q", errs.Clip(string(data), 20))
}

// EndSessionRequest, followed by a session's key, is the encoded
// SessionRequest that asks the worker that holds the session to end it.
const EndSessionRequest = "end:"

// MaxSessionEntry bounds an encoded sessions-bucket entry.
const MaxSessionEntry = 4 << 10

// Encode encodes e as the value of its session's key.
func (e SessionEntry) Encode() ([]byte, error) {
	data, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("encode session entry: %w", err)
	}
	return data, nil
}

// DecodeSessionEntry decodes a sessions-bucket entry: one over
// MaxSessionEntry, that does not decode, or whose worker or session is not
// a valid id, is refused. It does not check the proof (SessionEntry.Proven
// does).
func DecodeSessionEntry(data []byte) (SessionEntry, error) {
	const what = "session entry"
	var e SessionEntry
	switch {
	case len(data) > MaxSessionEntry:
		return e, malformed(what, "%d bytes, at most %d", len(data), MaxSessionEntry)
	case json.Unmarshal(data, &e) != nil:
		return SessionEntry{}, malformed(what, "not a JSON object of its fields")
	case !jobs.ValidID(e.Worker):
		return e, malformed(what, "invalid worker %q", errs.Clip(e.Worker, 40))
	case !jobs.ValidID(e.Session):
		return e, malformed(what, "invalid session %q", errs.Clip(e.Session, 40))
	}
	return e, nil
}
