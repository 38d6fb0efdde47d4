package state

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/mcpexec/mcpexec/internal/audit"
)

// OpAuditList lists a namespace's audit entries (front-ends, for their
// callers' namespaces). Entries are written to the audit stream by
// front-ends, not through the state service.
const OpAuditList = "audit.list"

// AuditStore is what a replica keeps of the audit trail: each namespace's
// entries linked into a hash chain (package audit). boltstore.Store is one.
type AuditStore interface {
	// AuditApplied returns the audit stream's sequence folded.
	AuditApplied() (uint64, error)
	// ApplyAudit links entries into their namespaces' chains durably and
	// records lastSeq as the audit stream's applied sequence.
	ApplyAudit(entries []AuditIn, lastSeq uint64) error
	// AuditList returns one page of the entries f selects, newest first,
	// and the cursor of the next page ("" when none).
	AuditList(f AuditFilter) ([]audit.Record, string, error)
	// PruneAudit deletes the entries made before cutoff, oldest first, and
	// counts them; each chain keeps the hash of its last deleted entry.
	PruneAudit(cutoff time.Time) (int, error)
}

// AuditIn is an entry received from the audit stream, its proof checked.
type AuditIn struct {
	Namespace string
	JobID     string
	At        time.Time
	Seq       uint64
	// Data is the entry's JSON as published: what the chain hashes.
	Data []byte
}

// Bounds of audit listing.
const (
	DefaultAuditLimit = 100
	MaxAuditLimit     = 1000
	// MaxAuditScan bounds the entries one page looks at: a filter that
	// matches little answers fewer entries and a cursor to go on from.
	MaxAuditScan = 20_000
	// maxAuditEntry bounds an entry received (its preview is 1 KiB; the
	// rest is names and digests), maxAuditMessage and maxAuditLines a
	// message of entries (a front-end's gathering, one entry a line).
	maxAuditEntry   = 16 << 10
	maxAuditMessage = 2 << 20
	maxAuditLines   = 1024
)

// AuditFilter selects a namespace's audit entries.
type AuditFilter struct {
	Namespace string `json:"namespace"`
	Job       string `json:"job,omitempty"` // the wire id
	Server    string `json:"server,omitempty"`
	Tool      string `json:"tool,omitempty"`
	Decision  string `json:"decision,omitempty"`
	// Cursor is the Next of the previous page.
	Cursor string `json:"cursor,omitempty"`
	Limit  int    `json:"limit,omitempty"`
}

// Validate says what is wrong with f, naming the field.
func (f *AuditFilter) Validate() error {
	switch {
	case len(f.Namespace) > MaxNamespaceBytes:
		return fmt.Errorf("namespace is over %d bytes", MaxNamespaceBytes)
	case f.Limit < 0 || f.Limit > MaxAuditLimit:
		return fmt.Errorf("limit must be 1-%d, got %d", MaxAuditLimit, f.Limit)
	case len(f.Job) > 512 || len(f.Server) > audit.MaxNameBytes*2 || len(f.Tool) > audit.MaxNameBytes*2 || len(f.Decision) > 32 || len(f.Cursor) > 32:
		return fmt.Errorf("a filter value is too long")
	}
	if f.Limit == 0 {
		f.Limit = DefaultAuditLimit
	}
	return nil
}

// AuditListReply is the answer of audit.list.
type AuditListReply struct {
	Entries []audit.Record `json:"entries"`
	Next    string         `json:"next,omitempty"`
}

// AuditList lists the audit entries f selects (f.Namespace: the caller's).
func (c *Client) AuditList(ctx context.Context, f AuditFilter) ([]audit.Record, string, error) {
	var r AuditListReply
	if err := c.call(ctx, OpAuditList, f, &r); err != nil {
		return nil, "", err
	}
	return r.Entries, r.Next, nil
}

func (s *Service) handleAuditList(req micro.Request) {
	var f AuditFilter
	if !decodeReq(req, &f, OpAuditList, `{"namespace": ..., "job": ..., "server": ..., "tool": ..., "decision": ..., "cursor": ..., "limit": N}`) {
		return
	}
	as, ok := s.store.(AuditStore)
	if !ok {
		s.respond(req, nil, fmt.Errorf("%w: this state replica keeps no audit trail", ErrUnavailable))
		return
	}
	if err := f.Validate(); err != nil {
		s.respond(req, nil, invalidf("audit.list: %v", err))
		return
	}
	recs, next, err := as.AuditList(f)
	if recs == nil {
		recs = []audit.Record{}
	}
	s.respond(req, AuditListReply{Entries: recs, Next: next}, err)
}

// followAudit folds the audit stream into as from the message after from,
// until ctx ends. Unlike the events and memory followers it does not look
// for a stream that lost its tail (see docs/design.md).
func (s *Service) followAudit(ctx context.Context, as AuditStore, from uint64) {
	stream := s.sub.AuditStream()
	for ctx.Err() == nil {
		cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
		if from > 0 {
			cfg = jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from + 1}
		}
		cons, err := s.js.OrderedConsumer(ctx, stream, cfg)
		if err != nil {
			s.logger.Warn("follow stream", "stream", stream, "err", err)
			s.sleep(ctx, time.Second)
			continue
		}
		from = s.drainAudit(ctx, as, cons, from)
	}
}

func (s *Service) drainAudit(ctx context.Context, as AuditStore, cons jetstream.Consumer, from uint64) uint64 {
	const maxBatch = 512
	msgs := make(chan jetstream.Msg, 2*maxBatch)
	stop := make(chan struct{})
	cc, err := cons.Consume(func(m jetstream.Msg) {
		select {
		case msgs <- m:
		case <-stop:
		}
	}, jetstream.PullMaxMessages(maxBatch), jetstream.PullExpiry(followExpiry), jetstream.PullHeartbeat(followHeartbeat))
	if err != nil {
		s.logger.Warn("follow stream", "stream", s.sub.AuditStream(), "err", err)
		s.sleep(ctx, time.Second)
		return from
	}
	defer cc.Stop()
	defer close(stop)
	prev := 0
	for {
		var batch []jetstream.Msg
		select {
		case m := <-msgs:
			batch = append(batch, m)
		case <-ctx.Done():
			return from
		}
		batch = gather(msgs, batch, maxBatch, prev > 1, nil) // no request waits for the audit trail
		prev = len(batch)
		last := from
		var in []AuditIn
		for _, m := range batch {
			md, err := m.Metadata()
			if err != nil || md.Sequence.Stream <= from {
				continue
			}
			last = md.Sequence.Stream
			if len(m.Data()) > maxAuditMessage {
				s.logger.Warn("skipping an oversized audit message", "subject", m.Subject(), "bytes", len(m.Data()))
				continue
			}
			for i, line := range bytes.Split(m.Data(), []byte("\n")) {
				if i == maxAuditLines {
					s.logger.Warn("skipping the rest of an audit message of too many entries", "subject", m.Subject(), "kept", i)
					break
				}
				if e, ok := s.auditEntry(m.Subject(), line); ok {
					in = append(in, AuditIn{Namespace: e.Namespace, JobID: e.JobID, At: e.At, Seq: md.Sequence.Stream, Data: line})
				}
			}
		}
		if last == from {
			continue
		}
		if err := as.ApplyAudit(in, last); err != nil {
			s.logger.Error("apply stream", "stream", s.sub.AuditStream(), "count", len(in), "err", err)
			s.sleep(ctx, time.Second)
			return from
		}
		from = last
	}
}

// auditEntry decodes one line of an audit message and reports whether it
// is kept: a front-end's entry, proven with the audit key, on its
// namespace's subject. Anything else (a forged entry from a worker host of
// a fleet without NATS permissions, a malformed one) is skipped and logged.
func (s *Service) auditEntry(subject string, line []byte) (audit.Entry, bool) {
	var e audit.Entry
	if len(line) > maxAuditEntry {
		s.logger.Warn("skipping an oversized audit entry", "subject", subject, "bytes", len(line))
		return e, false
	}
	if err := json.Unmarshal(line, &e); err != nil {
		s.logger.Warn("skipping a malformed audit entry", "subject", subject, "err", err)
		return e, false
	}
	if !audit.Check(s.auditKey, e) {
		s.logger.Warn("skipping an audit entry without a front-end's proof (forged?)", "subject", subject, "job", audit.Clip(e.JobID, 160), "namespace", audit.Clip(e.Namespace, 160))
		return e, false
	}
	if subject != s.sub.Audit(e.Namespace) {
		s.logger.Warn("skipping an audit entry on another namespace's subject", "subject", subject, "namespace", audit.Clip(e.Namespace, 160))
		return e, false
	}
	return e, true
}

// pruneAudit applies the audit retention.
func (s *Service) pruneAudit(now time.Time) {
	as, ok := s.store.(AuditStore)
	if !ok || s.AuditRetention <= 0 {
		return
	}
	n, err := as.PruneAudit(now.Add(-s.AuditRetention))
	if err != nil {
		s.logger.Error("apply audit retention", "err", err)
	} else if n > 0 {
		s.logger.Info("deleted audit entries past retention", "count", n, "retention", s.AuditRetention)
	}
}
