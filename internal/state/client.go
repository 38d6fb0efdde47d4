package state

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/mcpexec/mcpexec/internal/errs"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

// ErrUnavailable wraps failures to reach the state service.
var ErrUnavailable = errs.New(errs.Unavailable, "the state service is unreachable")

// Client reaches the state service over NATS request/reply. Coded errors come
// back as ErrNotFound, ErrConflict and ErrInvalid (wrapped with the service's
// message); a broker that does not answer as ErrUnavailable.
//
// A Client reads its own writes: it remembers the highest stream sequences it
// has seen (in answers, and those its owner reports with SawEvents) and asks
// replicas to answer only once they have applied them. While the fleet elects
// new leaders or a replica catches up, it retries for up to Patience.
type Client struct {
	nc  *nats.Conn
	sub jobs.Subjects
	// Patience bounds the retries of a request no replica could answer
	// (default DefaultPatience; the caller's context bounds it too).
	Patience time.Duration
	// EventsFloor, when set, gives an events-stream sequence its owner has
	// written (its submissions): reads wait for it too.
	EventsFloor func() uint64

	events atomic.Uint64 // highest events stream sequence seen
	memory atomic.Uint64 // highest memory stream sequence seen
}

// Bounds of one attempt of a request: a request that went to a replica as its
// node died gets no answer, and the next attempt reaches another. A replica
// answers well within them (its own waits are catchUpWait and writeWait).
const (
	readAttempt  = 1500 * time.Millisecond
	writeAttempt = 4 * time.Second
)

// DefaultPatience is how long a Client retries a request while the fleet fails
// over: as long as a submission is retried.
const DefaultPatience = queue.DefaultPatience

// NewClient returns a Client on nc.
func NewClient(nc *nats.Conn, s jobs.Subjects) *Client {
	return &Client{nc: nc, sub: s, Patience: DefaultPatience}
}

// SawEvents tells the client that the events stream holds seq (a submission
// its owner made): later reads see it.
func (c *Client) SawEvents(seq uint64) { storeMax(&c.events, seq) }

func storeMax(a *atomic.Uint64, v uint64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

func (c *Client) call(ctx context.Context, op string, req, resp any) error {
	data, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("encode %s request: %w", op, err)
	}
	deadline := time.Now().Add(c.Patience)
	for try, delay := 0, 50*time.Millisecond; ; try, delay = try+1, min(2*delay, time.Second) {
		err := c.once(ctx, op, data, resp, try)
		if err == nil || !errors.Is(err, ErrUnavailable) || time.Now().Add(delay).After(deadline) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
	}
}

// once makes one request, the try-th (from 0) of a call.
func (c *Client) once(ctx context.Context, op string, data []byte, resp any, try int) error {
	// One attempt waits at most readAttempt or writeAttempt: a request that went to a
	// node as it died gets no answer, and the next attempt reaches another.
	// Each retry waits twice as long as the one before (up to four times):
	// on a loaded machine a large answer (a page of big records) may take
	// longer than the first attempt's bound, and asking again with the same
	// bound would only repeat the work.
	d := readAttempt
	if op == OpMemoryPut || op == OpMemoryDelete {
		d = writeAttempt
	}
	d <<= min(try, 2)
	reply, err := c.onceMsg(ctx, op, data, nil, d)
	if err != nil {
		return err
	}
	if resp == nil {
		return nil
	}
	if err := json.Unmarshal(reply.Data, resp); err != nil {
		return fmt.Errorf("decode %s answer: %w", op, err)
	}
	return nil
}

// onceMsg makes one request with the headers given, within d, and returns
// the answer, or the error it carries.
func (c *Client) onceMsg(ctx context.Context, op string, data []byte, hdr nats.Header, d time.Duration) (*nats.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	msg := nats.NewMsg(c.sub.State(op))
	msg.Data = data
	for k, v := range hdr {
		msg.Header[k] = v
	}
	ev := max(c.events.Load(), eventsFloorOf(ctx))
	if c.EventsFloor != nil {
		ev = max(ev, c.EventsFloor())
	}
	if ev > 0 {
		msg.Header.Set(HeaderEventsSeq, strconv.FormatUint(ev, 10))
	}
	if mem := c.memory.Load(); mem > 0 {
		msg.Header.Set(HeaderMemorySeq, strconv.FormatUint(mem, 10))
	}
	tracing.Inject(ctx, msg.Header) // a memory write's span is the caller's child
	reply, err := c.nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		// The cause stays text: it is often this attempt's own timeout, which callers
		// must not take for their context's deadline.
		return nil, fmt.Errorf("%w: %s: %v (is the broker running?)", ErrUnavailable, op, err) //nolint:errorlint // see above
	}
	storeMax(&c.events, seqHeader(reply.Header, HeaderEventsSeq))
	storeMax(&c.memory, seqHeader(reply.Header, HeaderMemorySeq))
	if code := reply.Header.Get(micro.ErrorCodeHeader); code != "" {
		text := reply.Header.Get(micro.ErrorHeader)
		switch code {
		case CodeNotFound:
			return nil, wrapText(ErrNotFound, text)
		case CodeConflict:
			return nil, wrapText(ErrConflict, text)
		case CodeBadRequest:
			return nil, wrapText(ErrInvalid, text)
		case CodeUnavailable:
			return nil, fmt.Errorf("%w: %s", ErrUnavailable, text)
		}
		return nil, fmt.Errorf("state service %s failed (%s): %s", op, code, text)
	}
	return reply, nil
}

// codedError keeps the service's message while matching its sentinel.
type codedError struct {
	sentinel error
	text     string
}

func (e *codedError) Error() string { return e.text }
func (e *codedError) Unwrap() error { return e.sentinel }

func wrapText(sentinel error, text string) error {
	if text == "" {
		return sentinel
	}
	return &codedError{sentinel: sentinel, text: text}
}

// Job returns the record of job id, or ErrNotFound.
func (c *Client) Job(ctx context.Context, id string) (*jobs.Record, error) {
	var rec jobs.Record
	if err := c.call(ctx, OpJobGet, JobGetRequest{ID: id}, &rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

// JobHistory returns what a worker must know of job id before running it,
// asked with the job's capability (from its job message); ErrInvalid when the
// capability does not prove the job.
func (c *Client) JobHistory(ctx context.Context, id, capability string) (queue.History, error) {
	var h queue.History
	err := c.call(ctx, OpJobHistory, JobHistoryRequest{ID: id, Capability: capability}, &h)
	return h, err
}

// Jobs returns the records of those ids that exist, asking again for those
// an answer had no room for (MaxReplyBytes).
func (c *Client) Jobs(ctx context.Context, ids []string) ([]*jobs.Record, error) {
	var out []*jobs.Record
	for lo := 0; lo < len(ids); lo += MaxGetMany {
		batch := ids[lo:min(lo+MaxGetMany, len(ids))]
		for len(batch) > 0 {
			var r JobsReply
			if err := c.call(ctx, OpJobGetMany, JobGetManyRequest{IDs: batch}, &r); err != nil {
				return nil, err
			}
			out = append(out, r.Jobs...)
			if len(r.Rest) >= len(batch) {
				return nil, fmt.Errorf("%s: the state service answered no progress (%d ids left)", OpJobGetMany, len(r.Rest))
			}
			batch = r.Rest
		}
	}
	return out, nil
}

// Statuses returns the statuses of those ids that exist: what Jobs says of
// them without their records.
func (c *Client) Statuses(ctx context.Context, ids []string) (map[string]jobs.Status, error) {
	out := make(map[string]jobs.Status, len(ids))
	for lo := 0; lo < len(ids); lo += MaxGetMany {
		var r JobStatusesReply
		if err := c.call(ctx, OpJobStatuses, JobStatusesRequest{IDs: ids[lo:min(lo+MaxGetMany, len(ids))]}, &r); err != nil {
			return nil, err
		}
		maps.Copy(out, r.Statuses)
	}
	return out, nil
}

// List returns one page of the records matching f and the next page's cursor.
func (c *Client) List(ctx context.Context, f JobFilter) ([]*jobs.Record, string, error) {
	var r JobsReply
	if err := c.call(ctx, OpJobList, f, &r); err != nil {
		return nil, "", err
	}
	return r.Jobs, r.Next, nil
}

// DeadLetters returns one page of the dead-letter records matching f.
func (c *Client) DeadLetters(ctx context.Context, f JobFilter) ([]*jobs.Record, string, error) {
	var r JobsReply
	if err := c.call(ctx, OpDeadLetterList, f, &r); err != nil {
		return nil, "", err
	}
	return r.Jobs, r.Next, nil
}

// MemoryGet returns the entry of key in ns, or ErrNotFound.
func (c *Client) MemoryGet(ctx context.Context, ns, key string) (*Memory, error) {
	var m Memory
	if err := c.call(ctx, OpMemoryGet, MemoryKeyRequest{Namespace: ns, Key: key}, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// MemoryPut writes m. ifVersion nil: unconditional; *ifVersion==0: only if
// absent; else only if the stored version equals it (compare-and-set), else
// ErrConflict. It returns the stored entry with its new version.
func (c *Client) MemoryPut(ctx context.Context, m Memory, ifVersion *uint64) (*Memory, error) {
	return c.MemoryPutQuota(ctx, m, ifVersion, 0)
}

// MemoryPutQuota is MemoryPut within a namespace quota of maxBytes (0: none):
// a write over it fails with ErrInvalid, saying so. m.WriteID, when set, names
// the write across its sender's retries (else each call is one write).
func (c *Client) MemoryPutQuota(ctx context.Context, m Memory, ifVersion *uint64, maxBytes int64) (*Memory, error) {
	if len(m.Value) > 0 && !json.Valid(m.Value) {
		return nil, invalidf("memory value is not valid JSON")
	}
	if len(m.Metadata) > 0 && !json.Valid(m.Metadata) {
		return nil, invalidf("memory metadata is not valid JSON")
	}
	req := MemoryPutRequest{Memory: m, IfVersion: ifVersion, MaxBytes: maxBytes, WriteID: m.WriteID}
	req.Memory.WriteID = ""
	if req.WriteID == "" {
		var id [16]byte
		_, _ = rand.Read(id[:]) // never fails
		req.WriteID = hex.EncodeToString(id[:])
	}
	var out Memory
	if err := c.call(ctx, OpMemoryPut, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// MemoryList returns the entries of ns whose key starts with prefix, without
// their values.
func (c *Client) MemoryList(ctx context.Context, ns, prefix string) ([]Memory, error) {
	var r MemoryListReply
	if err := c.call(ctx, OpMemoryList, MemoryKeyRequest{Namespace: ns, Key: prefix}, &r); err != nil {
		return nil, err
	}
	return r.Entries, nil
}

// MemoryDelete deletes key in ns and reports whether it existed.
func (c *Client) MemoryDelete(ctx context.Context, ns, key string) (bool, error) {
	var r MemoryDeleteReply
	if err := c.call(ctx, OpMemoryDelete, MemoryKeyRequest{Namespace: ns, Key: key}, &r); err != nil {
		return false, err
	}
	return r.Deleted, nil
}

// eventsFloorKey is the context key of WithEventsFloor.
type eventsFloorKey struct{}

// WithEventsFloor returns ctx carrying an events-stream sequence that the
// requests made with it must see: the replica that answers has applied the
// events stream at least that far (it waits for it briefly, else another
// replica answers). It serves a reader who knows of a write this client
// did not make, such as the worker's start of an attempt.
func WithEventsFloor(ctx context.Context, seq uint64) context.Context {
	if seq == 0 {
		return ctx
	}
	return context.WithValue(ctx, eventsFloorKey{}, seq)
}

func eventsFloorOf(ctx context.Context) uint64 {
	seq, _ := ctx.Value(eventsFloorKey{}).(uint64)
	return seq
}
