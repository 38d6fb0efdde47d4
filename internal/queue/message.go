package queue

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

// Message is a job message of the jobs stream: the job, and its proxy
// capability (jobs.Capability), which only the job message carries.
type Message struct {
	jobs.Job
	Capability string `json:"capability,omitempty"`
	// SessionCapability is the capability of the job's session
	// (jobs.SessionCapability) when it names one: the worker that takes the
	// session proves with it, in the sessions bucket, that it holds it.
	SessionCapability string `json:"session_capability,omitempty"`
	// ClaimSeq is the events stream's sequence of the job's submitted
	// event, when the front-end that published this message claimed the
	// job in the same call (0 for a release, a repair or a requeue). While
	// that event is still the last of the job's events the job has no other
	// history, so its worker records the first start on that condition
	// (Client.PublishStart) instead of reading the history first.
	ClaimSeq uint64 `json:"claim_seq,omitempty"`
}

// NewMessage returns the job message of job under the proxy key: the job,
// its capability and its session's.
func NewMessage(key []byte, job *jobs.Job) Message {
	m := Message{Job: *job, Capability: jobs.Capability(key, job.ID)}
	if job.Session != "" {
		m.SessionCapability = jobs.SessionCapability(key, SessionKey(job.Namespace, job.Session))
	}
	return m
}

// Encode encodes the job message.
func (m *Message) Encode() ([]byte, error) {
	data, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode job %s: %w", m.ID, err)
	}
	return data, nil
}

// EncodeMessage encodes the job message of job with its capability.
func EncodeMessage(job *jobs.Job, capability string) ([]byte, error) {
	data, err := json.Marshal(Message{Job: *job, Capability: capability})
	if err != nil {
		return nil, fmt.Errorf("encode job %s: %w", job.ID, err)
	}
	return data, nil
}

// DecodeMessage decodes a job message. It does not validate the job beyond
// its id: the caller decides what to trust.
func DecodeMessage(data []byte) (*Message, error) {
	var m Message
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("undecodable job message: %w", err)
	}
	if !jobs.ValidID(m.ID) {
		return nil, fmt.Errorf("job message with invalid id %q", errs.Clip(m.ID, 40))
	}
	return &m, nil
}

// SecretsBucket creates or updates the secrets bucket and returns it.
func SecretsBucket(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.KeyValue, error) {
	return keyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket:      cfg.Subjects.SecretsBucket(),
		Description: "mcpexec fleet secrets (front-ends only)",
		History:     1,
		MaxBytes:    secretsMaxBytes,
		Storage:     jetstream.FileStorage,
		Replicas:    max(cfg.Replicas, 1),
	})
}

// ApprovalsTTL is how long the approvals bucket keeps an entry: longer than
// the longest approval_timeout, so a late answer is told the call's fate.
const ApprovalsTTL = 2 * time.Hour

// ApprovalsBucket creates or updates the bucket of calls waiting for a
// person's approval, and returns it.
func ApprovalsBucket(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.KeyValue, error) {
	return keyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket:      cfg.Subjects.ApprovalsBucket(),
		Description: "mcpexec proxied calls waiting for approval (front-ends only)",
		History:     1,
		TTL:         ApprovalsTTL,
		MaxBytes:    approvalsMaxBytes,
		Storage:     jetstream.FileStorage,
		Replicas:    max(cfg.Replicas, 1),
	})
}

// ProxyKey returns the fleet's proxy key, creating it on first use. Every
// front-end of a fleet gets the same key, so any of them can check any job's
// capability.
func ProxyKey(ctx context.Context, js jetstream.JetStream, s jobs.Subjects) ([]byte, error) {
	kv, err := js.KeyValue(ctx, s.SecretsBucket())
	if err != nil {
		return nil, fmt.Errorf("open secrets bucket %s (is the broker up to date?): %w", s.SecretsBucket(), err)
	}
	for range 3 {
		e, err := kv.Get(ctx, jobs.ProxyKeyName)
		if err == nil {
			if len(e.Value()) != jobs.CapabilityKeySize {
				return nil, fmt.Errorf("proxy key in %s has %d bytes, want %d: delete it to have a new one made", s.SecretsBucket(), len(e.Value()), jobs.CapabilityKeySize)
			}
			return e.Value(), publishSigningKey(ctx, kv, e.Value())
		}
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, fmt.Errorf("read proxy key: %w", err)
		}
		key := make([]byte, jobs.CapabilityKeySize)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		if _, err := kv.Create(ctx, jobs.ProxyKeyName, key); err == nil {
			return key, publishSigningKey(ctx, kv, key)
		} else if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("create proxy key: %w", err)
		}
		// Another front-end made it first: read theirs.
	}
	return nil, errors.New("proxy key: could not read or create it")
}

// WorkerStatuses asks every worker for its status and returns the answers
// that come within wait (or before ctx ends).
func WorkerStatuses(ctx context.Context, nc *nats.Conn, s jobs.Subjects, wait time.Duration) ([]jobs.WorkerStatus, error) {
	return gather(ctx, nc, s.WorkerStatus(), wait, func(st jobs.WorkerStatus) bool { return st.ID != "" })
}

// FrontendStatuses asks every front-end for its status and returns the
// answers that come within wait (or before ctx ends).
func FrontendStatuses(ctx context.Context, nc *nats.Conn, s jobs.Subjects, wait time.Duration) ([]jobs.FrontendStatus, error) {
	return gather(ctx, nc, s.FrontendStatus(), wait, func(st jobs.FrontendStatus) bool { return st.ID != "" })
}

// maxAnswers bounds the answers gather keeps (and buffers).
const maxAnswers = 1024

// gather publishes a request on subject and collects, until wait has passed
// or ctx ends, the answers that decode as T and pass ok (at most maxAnswers;
// more are dropped).
func gather[T any](ctx context.Context, nc *nats.Conn, subject string, wait time.Duration, ok func(T) bool) ([]T, error) {
	inbox := nc.NewInbox()
	answers := make(chan *nats.Msg, 256)
	sub, err := nc.ChanSubscribe(inbox, answers)
	if err != nil {
		return nil, fmt.Errorf("ask %s: %w", subject, err)
	}
	defer func() { _ = sub.Unsubscribe() }() // the connection may be closing
	if err := nc.PublishRequest(subject, inbox, nil); err != nil {
		return nil, fmt.Errorf("ask %s: %w", subject, err)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	var out []T
	for {
		select {
		case m := <-answers:
			var v T
			if json.Unmarshal(m.Data, &v) == nil && ok(v) && len(out) < maxAnswers {
				out = append(out, v)
			}
		case <-t.C:
			return out, nil
		case <-ctx.Done():
			return out, nil
		}
	}
}
