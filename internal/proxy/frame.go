package proxy

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// DefaultMaxFrame is the largest frame accepted by default: 16 MiB.
const DefaultMaxFrame = 16 << 20

// ErrFrameTooLarge is returned when a frame's declared length exceeds the limit.
var ErrFrameTooLarge = errors.New("frame exceeds size limit")

// ErrBadFrame is returned when a frame's body is not a JSON object with a type.
var ErrBadFrame = errors.New("malformed frame")

// Frame is one message between the runner and its host. Which fields are set depends
// on Type; see the runner protocol in package sandbox.
type Frame struct {
	Type string `json:"type"`

	// hello (runner → host): the protocol version, the secret the host gave
	// the sandbox at its start, and whether the runner could make itself
	// unreachable from the code's process (non-dumpable).
	Version  int    `json:"version,omitempty"`
	Secret   string `json:"secret,omitempty"`
	Isolated bool   `json:"isolated,omitempty"`
	// Reset: the runner is PID 1 of its own container and sweeps it after
	// each fresh job (kills what the job left running, wipes what it wrote),
	// so the container may serve another job of the same caller.
	Reset bool `json:"reset,omitempty"`

	// out (runner → host)
	Stream string `json:"stream,omitempty"`
	Data   string `json:"data,omitempty"`

	// call (runner → host), reply (host → runner)
	ID     uint64          `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`

	// exec (host → runner)
	Job  string `json:"job,omitempty"`
	Code string `json:"code,omitempty"`
	// Lang is an exec frame's language ("" is Python); Languages, in a
	// hello, what the sandbox can run.
	Lang      string   `json:"lang,omitempty"`
	Languages []string `json:"languages,omitempty"`
	// Spares, in a hello or a ready frame, are the languages whose executor
	// the runner started ahead for the next job (Python's, and JavaScript's
	// where one is expected).
	Spares    []string `json:"spares,omitempty"`
	Servers   []string `json:"servers,omitempty"`
	TimeoutMS int64    `json:"timeout_ms,omitempty"`
	OutputCap int      `json:"output_cap,omitempty"`
	// Fresh runs the job in a process of its own, forked for it from the
	// runner's pre-imported parent, and ends that process with the job (not
	// a session's job, whose process and globals last).
	Fresh bool `json:"fresh,omitempty"`
	// CallChannel, in an exec frame, says the frame came with a socket
	// (SCM_RIGHTS) on which the job's process sends its calls and reads
	// their replies, past the supervisor; in a hello, that the runner takes
	// one with a fresh Python job.
	CallChannel bool `json:"call_channel,omitempty"`
	// DirectExec, in a hello, says the runner takes the next job's call
	// channel ahead (a channel frame, while idle), hands it to its Python
	// spare, and then takes a fresh Python job's exec on it: the host sends
	// the exec there and to the runner (Direct), and the job starts without
	// waiting for the supervisor. DataWords, in the same hello, are the
	// names whose jobs run elsewhere (in the data zygote): their code, if it
	// names one as a word, is not sent directly.
	DirectExec bool     `json:"direct_exec,omitempty"`
	DataWords  []string `json:"data_words,omitempty"`
	// Direct, in an exec frame, says the job's exec went to the spare that
	// holds its call channel as well: that spare runs it, or nothing does.
	Direct bool `json:"direct,omitempty"`
	// MaxFiles, MaxFileBytes and MaxJobBytes bound the files the runner
	// collects from /workspace/out after the job (exec).
	MaxFiles     int   `json:"max_files,omitempty"`
	MaxFileBytes int64 `json:"max_file_bytes,omitempty"`
	MaxJobBytes  int64 `json:"max_job_bytes,omitempty"`

	// file (host → runner before an exec: an input file placed under the
	// workspace; runner → host before a done: a file the job wrote under
	// /workspace/out): its name, relative to the workspace or to out, and
	// its bytes in standard base64 (Data).
	Name string `json:"name,omitempty"`
	// Notes (done) say what of the job's files the runner did not send, and why.
	Notes []string `json:"notes,omitempty"`

	// done (runner → host); Last says the runner takes no further job (the
	// code's process is gone). Out, call and done frames name the job (Job) they
	// belong to.
	ExitCode int    `json:"exit_code,omitempty"`
	Status   string `json:"status,omitempty"`
	Last     bool   `json:"last,omitempty"`
	// NotRun (done) says the runner retired without running the job: the
	// sweep after its previous job found damage. The host runs the job in
	// another sandbox. A done with NotRun always has Last.
	NotRun bool `json:"not_run,omitempty"`
}

// Frame types.
const (
	TypeHello = "hello"
	TypeOut   = "out"
	TypeCall  = "call"
	TypeReply = "reply"
	TypeExec  = "exec"
	TypeDone  = "done"
	TypeFile  = "file"
	// TypeReady (runner → host, between jobs): the sandbox was swept after
	// its last job and the next job's process is started and waiting. The
	// host prefers such a sandbox; it is the only frame a runner may send
	// while idle.
	TypeReady = "ready"
	// TypeChannel (host → runner, while idle): the next job's call channel,
	// attached (SCM_RIGHTS), for the runner's Python spare (DirectExec).
	TypeChannel = "channel"
)

// Writer encodes frames onto a stream. It is not safe for concurrent use.
type Writer struct {
	w   io.Writer
	max int
	buf []byte
}

// NewWriter returns a Writer that refuses frames larger than max bytes.
func NewWriter(w io.Writer, max int) *Writer {
	if max <= 0 {
		max = DefaultMaxFrame
	}
	return &Writer{w: w, max: max}
}

// Write encodes one frame. Its Params and Result go out as they are, not
// encoded again: they must be valid JSON, as a decoder left them (Params
// from a runner's frame, Result from a proxy response).
func (fw *Writer) Write(f *Frame) error {
	head := *f
	head.Params, head.Result = nil, nil
	body, err := spliced(&head, rawField{"params", f.Params}, rawField{"result", f.Result})
	if err != nil {
		return fmt.Errorf("encode %s frame: %w", f.Type, err)
	}
	if len(body) > fw.max {
		return fmt.Errorf("%s frame of %d bytes: %w (limit %d)", f.Type, len(body), ErrFrameTooLarge, fw.max)
	}
	fw.buf = fw.buf[:0]
	fw.buf = binary.BigEndian.AppendUint32(fw.buf, uint32(len(body)))
	fw.buf = append(fw.buf, body...)
	_, err = fw.w.Write(fw.buf)
	return err
}

// rawField is a field spliced into an encoded object: its key and its
// value, JSON as it was received.
type rawField struct {
	key string
	raw json.RawMessage
}

// spliced encodes v, an object whose fields named by fields' keys are left
// empty (omitempty), and appends each non-empty raw value under its key as
// it is: JSON that was validated where it was received is not encoded again
// at each hop (encoding/json compacts and escapes a RawMessage, a scan and
// a copy of what may be megabytes).
func spliced(v any, fields ...rawField) ([]byte, error) {
	head, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	n := len(head)
	for _, f := range fields {
		n += len(f.key) + len(f.raw) + 4
	}
	out := append(make([]byte, 0, n), head[:len(head)-1]...)
	for _, f := range fields {
		if len(f.raw) == 0 {
			continue
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, '"')
		out = append(out, f.key...)
		out = append(out, '"', ':')
		out = append(out, f.raw...)
	}
	return append(out, '}'), nil
}

// Reader decodes frames from a stream. It is not safe for concurrent use.
type Reader struct {
	r   io.Reader
	max int
	hdr [4]byte
}

// NewReader returns a Reader that refuses frames larger than max bytes.
func NewReader(r io.Reader, max int) *Reader {
	if max <= 0 {
		max = DefaultMaxFrame
	}
	return &Reader{r: r, max: max}
}

// Read decodes the next frame. It returns io.EOF at a clean end of stream,
// ErrFrameTooLarge when the declared length is over the limit (without reading the
// body), and ErrBadFrame when the body is not a valid frame.
func (fr *Reader) Read() (*Frame, error) {
	if _, err := io.ReadFull(fr.r, fr.hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(fr.hdr[:])
	if int64(n) > int64(fr.max) {
		return nil, fmt.Errorf("declared %d bytes: %w (limit %d)", n, ErrFrameTooLarge, fr.max)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(fr.r, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("read frame body: %w", err)
	}
	return DecodeFrame(body)
}

// DecodeFrame validates and decodes one frame body.
func DecodeFrame(body []byte) (*Frame, error) {
	var f Frame
	if err := json.Unmarshal(body, &f); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadFrame, err)
	}
	switch f.Type {
	case TypeHello, TypeExec, TypeDone, TypeReady:
	case TypeOut:
		if f.Stream != "stdout" && f.Stream != "stderr" {
			return nil, fmt.Errorf("%w: out frame with stream %q", ErrBadFrame, f.Stream)
		}
	case TypeFile:
		if f.Name == "" {
			return nil, fmt.Errorf("%w: file frame needs a name", ErrBadFrame)
		}
	case TypeCall:
		if f.ID == 0 || f.Method == "" {
			return nil, fmt.Errorf("%w: call frame needs id and method", ErrBadFrame)
		}
	case TypeReply:
		if f.ID == 0 {
			return nil, fmt.Errorf("%w: reply frame needs id", ErrBadFrame)
		}
	default:
		return nil, fmt.Errorf("%w: unknown type %q", ErrBadFrame, f.Type)
	}
	return &f, nil
}
