package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// ErrUnavailable wraps failures to reach the state service.
var ErrUnavailable = errors.New("the state service is unreachable")

// DefaultTimeout bounds one request when the caller's context has no deadline.
const DefaultTimeout = 5 * time.Second

// Client reaches the state service over NATS request/reply. Coded errors come
// back as ErrNotFound, ErrConflict and ErrInvalid (wrapped with the service's
// message); a broker that does not answer as ErrUnavailable.
type Client struct {
	nc  *nats.Conn
	sub jobs.Subjects
}

// NewClient returns a Client on nc.
func NewClient(nc *nats.Conn, s jobs.Subjects) *Client { return &Client{nc: nc, sub: s} }

func (c *Client) call(ctx context.Context, op string, req, resp any) error {
	data, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("encode %s request: %w", op, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	msg, err := c.nc.RequestWithContext(ctx, c.sub.State(op), data)
	if err != nil {
		return fmt.Errorf("%w: %s: %v (is the broker running?)", ErrUnavailable, op, err)
	}
	if code := msg.Header.Get(micro.ErrorCodeHeader); code != "" {
		text := msg.Header.Get(micro.ErrorHeader)
		switch code {
		case CodeNotFound:
			return wrapText(ErrNotFound, text)
		case CodeConflict:
			return wrapText(ErrConflict, text)
		case CodeBadRequest:
			return wrapText(ErrInvalid, text)
		}
		return fmt.Errorf("state service %s failed (%s): %s", op, code, text)
	}
	if resp == nil {
		return nil
	}
	if err := json.Unmarshal(msg.Data, resp); err != nil {
		return fmt.Errorf("decode %s answer: %w", op, err)
	}
	return nil
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

// Jobs returns the records of those ids that exist.
func (c *Client) Jobs(ctx context.Context, ids []string) ([]*jobs.Record, error) {
	var out []*jobs.Record
	for lo := 0; lo < len(ids); lo += MaxGetMany {
		var r JobsReply
		if err := c.call(ctx, OpJobGetMany, JobGetManyRequest{IDs: ids[lo:min(lo+MaxGetMany, len(ids))]}, &r); err != nil {
			return nil, err
		}
		out = append(out, r.Jobs...)
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
// a write over it fails with ErrInvalid, saying so.
func (c *Client) MemoryPutQuota(ctx context.Context, m Memory, ifVersion *uint64, maxBytes int64) (*Memory, error) {
	if len(m.Value) > 0 && !json.Valid(m.Value) {
		return nil, invalidf("memory value is not valid JSON")
	}
	if len(m.Metadata) > 0 && !json.Valid(m.Metadata) {
		return nil, invalidf("memory metadata is not valid JSON")
	}
	var out Memory
	if err := c.call(ctx, OpMemoryPut, MemoryPutRequest{Memory: m, IfVersion: ifVersion, MaxBytes: maxBytes}, &out); err != nil {
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
