// Package queue is the JetStream side of the job model: it creates the streams and
// consumers, submits jobs, and hands deliveries to workers. Wire names come from
// jobs.Subjects.
package queue

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpexec/mcpexec/internal/errs"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

// Config sets the streams' and consumers' limits. Every field is explicit: nothing
// is left to library defaults.
type Config struct {
	Subjects  jobs.Subjects
	MaxQueued int64 // pending jobs the stream holds before refusing more
	// JobsMaxBytes bounds the jobs stream on disk (submissions over it are
	// refused like a full queue); EventsMaxBytes bounds the events stream
	// (the oldest events go first: the state service has applied them).
	JobsMaxBytes   int64
	EventsMaxBytes int64
	// MemoryMaxBytes bounds the memory stream (writes over it are refused).
	MemoryMaxBytes int64
	// FilesMaxBytes bounds the file store (jobs' files in and out); its
	// objects live as long as the events (EventsMaxAge), as records do.
	FilesMaxBytes int64
	DedupeWindow  time.Duration // JetStream duplicate window for job ids
	EventsMaxAge  time.Duration // how long lifecycle events are kept in the stream
	// QueuedMaxAge is the jobs stream's MaxAge: a job message older than
	// this (counted from its enqueue, a running job's included) is deleted
	// by JetStream, and the state service ends the record of a job still
	// queued after it as rejected. It bounds what a pool no worker takes
	// holds in the shared stream.
	QueuedMaxAge time.Duration
	// AckWait is how long a delivery may go without an ack or an InProgress
	// heartbeat before JetStream hands the job to another worker. It must equal
	// BackOff[0] when BackOff is set (JetStream replaces AckWait by BackOff[0]).
	AckWait time.Duration
	// BackOff is the ack deadline of each successive delivery of one job
	// message (the last entry repeats). Every entry must be at least AckWait.
	BackOff    []time.Duration
	MaxDeliver int // deliveries of one job message, all attempts included
	// MaxAckPending bounds the deliveries in flight across the pool's workers.
	MaxAckPending int
	Replicas      int // stream replicas (1, or 3 in a cluster)
	// AuditMaxAge is the audit trail's retention: the audit stream keeps an
	// entry this long, and the state replicas prune theirs past it.
	// AuditMaxBytes bounds the stream (entries over it are refused, and the
	// front-end that wrote them logs and counts them).
	AuditMaxAge   time.Duration
	AuditMaxBytes int64
}

// DefaultAuditRetention is how long the audit trail keeps an entry.
const DefaultAuditRetention = 30 * 24 * time.Hour

// DefaultQueuedMaxAge is how long a job may wait in the jobs stream.
const DefaultQueuedMaxAge = 24 * time.Hour

// DefaultConfig returns the production defaults: a worker that stops
// heartbeating loses its job after 30 s; later redeliveries wait longer.
func DefaultConfig() Config {
	return Config{
		MaxQueued:      100_000,
		JobsMaxBytes:   1 << 30,
		EventsMaxBytes: 8 << 30,
		MemoryMaxBytes: 8 << 30,
		FilesMaxBytes:  8 << 30,
		DedupeWindow:   10 * time.Minute,
		EventsMaxAge:   7 * 24 * time.Hour,
		QueuedMaxAge:   DefaultQueuedMaxAge,
		AckWait:        30 * time.Second,
		BackOff:        []time.Duration{30 * time.Second, 30 * time.Second, 60 * time.Second, 60 * time.Second},
		MaxDeliver:     10, // attempts (at most 4), and deliveries whose sandbox could not be made
		MaxAckPending:  10_000,
		Replicas:       1,
		AuditMaxAge:    DefaultAuditRetention,
		AuditMaxBytes:  8 << 30,
	}
}

// Validate reports the first field that is out of range, naming it.
func (c Config) Validate() error {
	switch {
	case c.MaxQueued < 1:
		return fmt.Errorf("queue MaxQueued must be at least 1, got %d", c.MaxQueued)
	case c.JobsMaxBytes < 1<<20:
		return fmt.Errorf("queue JobsMaxBytes must be at least 1 MiB, got %d", c.JobsMaxBytes)
	case c.EventsMaxBytes < 1<<20:
		return fmt.Errorf("queue EventsMaxBytes must be at least 1 MiB, got %d", c.EventsMaxBytes)
	case c.MemoryMaxBytes < 1<<20:
		return fmt.Errorf("queue MemoryMaxBytes must be at least 1 MiB, got %d", c.MemoryMaxBytes)
	case c.FilesMaxBytes != 0 && c.FilesMaxBytes < 1<<20:
		return fmt.Errorf("queue FilesMaxBytes must be at least 1 MiB, got %d", c.FilesMaxBytes)
	case c.DedupeWindow <= 0:
		return fmt.Errorf("queue DedupeWindow must be positive, got %s", c.DedupeWindow)
	case c.EventsMaxAge < c.DedupeWindow:
		return fmt.Errorf("queue EventsMaxAge (%s) must be at least DedupeWindow (%s)", c.EventsMaxAge, c.DedupeWindow)
	case c.QueuedMaxAge < c.DedupeWindow:
		// JetStream refuses a duplicate window longer than the stream's MaxAge.
		return fmt.Errorf("queue QueuedMaxAge (%s) must be at least DedupeWindow (%s)", c.QueuedMaxAge, c.DedupeWindow)
	case c.QueuedMaxAge > c.EventsMaxAge:
		// A released job's queueing starts at its released event.
		return fmt.Errorf("queue QueuedMaxAge (%s) must not exceed EventsMaxAge (%s)", c.QueuedMaxAge, c.EventsMaxAge)
	case c.AckWait < 100*time.Millisecond:
		return fmt.Errorf("queue AckWait must be at least 100ms, got %s", c.AckWait)
	case c.MaxDeliver < 2:
		return fmt.Errorf("queue MaxDeliver must be at least 2 (one delivery to run, one to record a lost worker), got %d", c.MaxDeliver)
	case len(c.BackOff) > c.MaxDeliver:
		return fmt.Errorf("queue BackOff has %d entries, more than MaxDeliver (%d)", len(c.BackOff), c.MaxDeliver)
	case len(c.BackOff) > 0 && c.BackOff[0] != c.AckWait:
		return fmt.Errorf("queue BackOff[0] (%s) must equal AckWait (%s)", c.BackOff[0], c.AckWait)
	case c.MaxAckPending < 1:
		return fmt.Errorf("queue MaxAckPending must be at least 1, got %d", c.MaxAckPending)
	case c.Replicas < 1:
		return fmt.Errorf("queue Replicas must be at least 1, got %d", c.Replicas)
	case c.AuditMaxAge < c.DedupeWindow:
		// JetStream refuses a duplicate window longer than the stream's MaxAge.
		return fmt.Errorf("queue AuditMaxAge (the audit retention, %s) must be at least DedupeWindow (%s)", c.AuditMaxAge, c.DedupeWindow)
	case c.AuditMaxBytes < 1<<20:
		return fmt.Errorf("queue AuditMaxBytes must be at least 1 MiB, got %d", c.AuditMaxBytes)
	}
	for i, d := range c.BackOff {
		if d < c.AckWait {
			return fmt.Errorf("queue BackOff[%d] (%s) is shorter than AckWait (%s)", i, d, c.AckWait)
		}
	}
	return nil
}

// Heartbeat is how often a worker tells JetStream a job is still running: a
// third of the shortest ack deadline, so two heartbeats may be lost.
func (c Config) Heartbeat() time.Duration {
	d := c.AckWait
	for _, b := range c.BackOff {
		d = min(d, b)
	}
	return max(d/3, 10*time.Millisecond)
}

// ErrQueueFull is returned by Submit when the jobs stream holds MaxQueued jobs.
var ErrQueueFull = errs.New(errs.QueueFull, "job queue is full")

// Setup creates or updates the streams. It is idempotent.
func Setup(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	s := cfg.Subjects
	for _, sc := range []jetstream.StreamConfig{
		{
			Name:        s.JobsStream(),
			Description: "mcpexec pending jobs",
			Subjects:    []string{s.AllJobs(), s.AllWorkerJobs()},
			Retention:   jetstream.WorkQueuePolicy,
			Storage:     jetstream.FileStorage,
			MaxMsgs:     cfg.MaxQueued,
			MaxBytes:    cfg.JobsMaxBytes,
			MaxAge:      cfg.QueuedMaxAge,
			Discard:     jetstream.DiscardNew,
			Duplicates:  cfg.DedupeWindow,
			Replicas:    cfg.Replicas,
		},
		{
			Name:        s.EventsStream(),
			Description: "mcpexec job lifecycle events",
			Subjects:    []string{s.AllEvents()},
			Retention:   jetstream.LimitsPolicy,
			Storage:     jetstream.FileStorage,
			MaxAge:      cfg.EventsMaxAge,
			MaxBytes:    cfg.EventsMaxBytes,
			Duplicates:  cfg.DedupeWindow,
			Replicas:    cfg.Replicas,
			AllowDirect: true, // cheap look-ups of a job's cancel and submit events
		},
		{
			Name:              s.MemoryStream(),
			Description:       "mcpexec memory writes: the last one of each key",
			Subjects:          []string{s.AllMemory()},
			Retention:         jetstream.LimitsPolicy,
			Storage:           jetstream.FileStorage,
			MaxMsgsPerSubject: 1,
			MaxBytes:          cfg.MemoryMaxBytes,
			Discard:           jetstream.DiscardNew,
			Duplicates:        cfg.DedupeWindow,
			Replicas:          cfg.Replicas,
			AllowDirect:       true,
		},
		{
			Name:        s.AuditStream(),
			Description: "mcpexec audit trail of proxied tool calls",
			Subjects:    []string{s.AllAudit()},
			Retention:   jetstream.LimitsPolicy,
			Storage:     jetstream.FileStorage,
			MaxAge:      cfg.AuditMaxAge,
			MaxBytes:    cfg.AuditMaxBytes,
			// A full trail refuses new entries rather than lose old ones.
			Discard:    jetstream.DiscardNew,
			Duplicates: cfg.DedupeWindow,
			Replicas:   cfg.Replicas,
		},
	} {
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("create stream %s: %w", sc.Name, err)
		}
	}
	if _, err := SessionsBucket(ctx, js, cfg); err != nil {
		return err
	}
	if _, err := SecretsBucket(ctx, js, cfg); err != nil {
		return err
	}
	if _, err := ApprovalsBucket(ctx, js, cfg); err != nil {
		return err
	}
	return nil
}

// FilesBucketConfig is the object store of jobs' files: replicated like the
// streams, its objects kept as long as the events (the records' retention).
// The state service, its only user, makes it when a job first has files.
func FilesBucketConfig(cfg Config) jetstream.ObjectStoreConfig {
	limit := cfg.FilesMaxBytes
	if limit == 0 {
		limit = DefaultConfig().FilesMaxBytes
	}
	age := cfg.EventsMaxAge
	if age == 0 {
		age = DefaultConfig().EventsMaxAge
	}
	return jetstream.ObjectStoreConfig{
		Bucket:      cfg.Subjects.FilesBucket(),
		Description: "mcpexec jobs' files: inputs and what the code wrote",
		TTL:         age,
		MaxBytes:    limit,
		Storage:     jetstream.FileStorage,
		Replicas:    max(cfg.Replicas, 1),
	}
}

// WorkerConsumer creates or updates the durable consumer shared by pool's
// workers that run lang (jobs.LangPython, jobs.LangJavaScript).
func WorkerConsumer(ctx context.Context, js jetstream.JetStream, cfg Config, pool, lang string) (jetstream.Consumer, error) {
	s := cfg.Subjects
	return jobConsumer(ctx, js, cfg, s.LangConsumer(pool, lang), "mcpexec "+lang+" workers of pool "+pool, s.LangJob(pool, lang), 0)
}

// jobConsumer creates or updates a durable consumer of the jobs stream with the
// delivery settings of cfg: every field explicit, none left to library defaults.
func jobConsumer(ctx context.Context, js jetstream.JetStream, cfg Config, durable, desc, filter string, inactive time.Duration) (jetstream.Consumer, error) {
	c, err := js.CreateOrUpdateConsumer(ctx, cfg.Subjects.JobsStream(), jetstream.ConsumerConfig{
		Durable:           durable,
		Description:       desc,
		FilterSubject:     filter,
		AckPolicy:         jetstream.AckExplicitPolicy,
		AckWait:           cfg.AckWait,
		BackOff:           cfg.BackOff,
		MaxDeliver:        cfg.MaxDeliver,
		MaxAckPending:     cfg.MaxAckPending,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: inactive,
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer %s: %w", durable, err)
	}
	return c, nil
}

// Client submits jobs and publishes events.
type Client struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	sub jobs.Subjects
	// DedupeWindow is the jobs stream's duplicate window; Submit repairs a lost
	// enqueue only within it. Zero means DefaultConfig's.
	DedupeWindow time.Duration
	// Patience bounds how long SubmitMany retries submissions that failed
	// because the cluster was electing leaders or a node went away (zero:
	// DefaultPatience).
	Patience time.Duration

	eventsSeq atomic.Uint64 // highest events-stream sequence this client wrote

	keyMu sync.Mutex // guards key
	key   []byte     // the fleet's proxy key, read on first submission
	sign  ed25519.PrivateKey
}

// UseKey gives the client the fleet's proxy key up front, so that the
// outcomes it records itself (a skip, a rejection) carry their proof before
// any submission has read the key.
func (c *Client) UseKey(key []byte) {
	c.keyMu.Lock()
	defer c.keyMu.Unlock()
	c.key, c.sign = key, jobs.SigningKey(key)
}

// proxyKey returns the fleet's proxy key and the job-signing key derived
// from it, reading the proxy key on first use.
func (c *Client) proxyKey(ctx context.Context) ([]byte, ed25519.PrivateKey, error) {
	c.keyMu.Lock()
	defer c.keyMu.Unlock()
	if c.key == nil {
		k, err := ProxyKey(ctx, c.js, c.sub)
		if err != nil {
			return nil, nil, err
		}
		c.key, c.sign = k, jobs.SigningKey(k)
	}
	return c.key, c.sign, nil
}

// DefaultPatience is how long a submission is retried while the cluster fails
// over.
const DefaultPatience = 15 * time.Second

// publishTimeout bounds the wait for one publish's ack: a publish that went to
// a node as it died is retried.
const publishTimeout = 4 * time.Second

// EventsSeq is the highest events-stream sequence this client has written: a
// state read that carries it sees every submission made through the client.
func (c *Client) EventsSeq() uint64 { return c.eventsSeq.Load() }

func (c *Client) sawEvent(seq uint64) {
	for {
		cur := c.eventsSeq.Load()
		if seq <= cur || c.eventsSeq.CompareAndSwap(cur, seq) {
			return
		}
	}
}

// Transient reports whether err is one of a cluster failing over (no leader
// yet, a node gone, an ack lost): the same request succeeds later.
func Transient(err error) bool {
	if err == nil || errors.Is(err, ErrDuplicate) || errors.Is(err, ErrQueueFull) || errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, errUnsure) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.Code == 503 || apiErr.Code == 408
	}
	for _, t := range []error{nats.ErrTimeout, nats.ErrNoResponders, jetstream.ErrNoStreamResponse,
		jetstream.ErrAsyncPublishTimeout, context.DeadlineExceeded, nats.ErrDisconnected,
		nats.ErrConnectionReconnecting, nats.ErrNoServers, nats.ErrJetStreamNotEnabled} {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// NewClient returns a Client on nc.
func NewClient(nc *nats.Conn, s jobs.Subjects) (*Client, error) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4*submitChunk),
		jetstream.WithPublishAsyncTimeout(publishTimeout))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return &Client{nc: nc, js: js, sub: s}, nil
}

// JetStream returns the client's JetStream context.
func (c *Client) JetStream() jetstream.JetStream { return c.js }

// Conn returns the client's NATS connection.
func (c *Client) Conn() *nats.Conn { return c.nc }

// Subjects returns the wire names in use.
func (c *Client) Subjects() jobs.Subjects { return c.sub }

// eventMsg makes the message of ev, with traceparent (the span it belongs
// to, jobs.Job.Trace when none) as its trace header.
func (c *Client) eventMsg(ev *jobs.Event, traceparent string) (*nats.Msg, error) {
	if ev.At.IsZero() {
		ev.At = time.Now().UTC()
	}
	if ev.Proof == "" && jobs.NeedsProof(ev.Kind) {
		// A front-end (which holds the proxy key) records an outcome itself:
		// a rejection, a session that is gone.
		c.keyMu.Lock()
		if c.key != nil {
			ev.Proof = jobs.EventProof(jobs.Capability(c.key, ev.Job), ev.Kind, ev.Attempt)
		}
		c.keyMu.Unlock()
	}
	data, err := json.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("encode %s event of %s: %w", ev.Kind, ev.Job, err)
	}
	m := nats.NewMsg(c.sub.Event(ev.Job, ev.Kind))
	m.Data = data
	m.Header.Set(jetstream.MsgIDHeader, EventMsgID(*ev))
	m.Header.Set(jobs.TraceHeader, traceparent)
	return m, nil
}

// EventMsgID is the Nats-Msg-Id of an event: one event of each kind per attempt,
// so a republished event is deduplicated.
func EventMsgID(ev jobs.Event) string {
	return jobs.Subjects{}.EventMsgID(ev.Job, ev.Kind, ev.Attempt)
}

// PublishEvent records ev in the events stream and waits for the stream's ack.
// The event's trace header is the span in ctx (the job's derived trace when
// ctx holds none), so the state service's apply span is its child.
func (c *Client) PublishEvent(ctx context.Context, ev jobs.Event) error {
	tp := tracing.TraceParent(ctx)
	if tp == "" {
		tp = jobs.TraceParent(ev.Job)
	}
	m, err := c.eventMsg(&ev, tp)
	if err != nil {
		return err
	}
	ack, err := c.js.PublishMsg(ctx, m)
	if err != nil {
		return fmt.Errorf("publish %s event of %s: %w", ev.Kind, ev.Job, err)
	}
	c.sawEvent(ack.Sequence)
	return nil
}

// History is what a worker needs to know of a job before running it.
type History struct {
	Cancelled bool `json:"cancelled"` // a cancellation is recorded
	Finished  bool `json:"finished"`  // an outcome is recorded
	// LastAttempt is the attempt of the job's last recorded start (0: none).
	// Only attempts that reached the code are counted: a delivery whose
	// sandbox never came up consumes none.
	LastAttempt int `json:"last_attempt"`
}

// LookupHistory looks up job id's cancellation, last start and outcome in
// the events stream (three direct gets on nc, at once). Workers may not read
// the events stream: the state service does it for them, for the jobs whose
// capability they hold (state.Client.JobHistory). A start or an outcome
// counts only with its proof under key: a worker host may publish those
// subjects for any job, and a forged outcome would keep the job from running,
// a forged start of a high attempt would end it as worker_lost.
func LookupHistory(ctx context.Context, nc *nats.Conn, s jobs.Subjects, key []byte, id string) (History, error) {
	var h History
	var started, finished *nats.Msg
	var startErr, finErr error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		started, startErr = lastEvent(ctx, nc, s, id, jobs.EventStarted)
	}()
	go func() {
		defer wg.Done()
		finished, finErr = lastEvent(ctx, nc, s, id, jobs.EventFinished)
	}()
	cancelled, err := lastEvent(ctx, nc, s, id, jobs.EventCancelled)
	wg.Wait()
	if err = errors.Join(err, startErr, finErr); err != nil {
		return h, err
	}
	h.Cancelled = cancelled != nil
	if ev, ok := provenEvent(key, finished, id, jobs.EventFinished); ok {
		h.Finished = ev.Result != nil
	}
	if ev, ok := provenEvent(key, started, id, jobs.EventStarted); ok {
		h.LastAttempt = ev.Attempt
	}
	return h, nil
}

// provenEvent decodes m, job id's last event of kind, when it is one and
// carries its proof under key.
func provenEvent(key []byte, m *nats.Msg, id string, kind jobs.EventKind) (jobs.Event, bool) {
	var ev jobs.Event
	if m == nil || json.Unmarshal(m.Data, &ev) != nil || ev.Job != id || ev.Kind != kind || !jobs.CheckEvent(key, ev) {
		return jobs.Event{}, false
	}
	return ev, true
}

// lastEvent returns job id's last event of kind, or nil when there is none.
func lastEvent(ctx context.Context, nc *nats.Conn, s jobs.Subjects, id string, kind jobs.EventKind) (*nats.Msg, error) {
	msg, err := nc.RequestWithContext(ctx, s.DirectGet(s.EventsStream(), s.Event(id, kind)), nil)
	if err != nil {
		return nil, fmt.Errorf("look up %s event of %s: %w", kind, id, err)
	}
	switch msg.Header.Get("Status") {
	case "":
		return msg, nil
	case "404":
		return nil, nil
	}
	return nil, fmt.Errorf("look up %s event of %s: %s %s", kind, id, msg.Header.Get("Status"), msg.Header.Get("Description"))
}

// WatchEvents subscribes to job's events and delivers on the returned channel
// those keep (nil: all) takes, given the subject each came on, until stop is
// called. Subscribe before submitting so no event is missed.
func (c *Client) WatchEvents(job string, keep func(subject string, ev jobs.Event) bool) (events <-chan jobs.Event, stop func(), err error) {
	ch := make(chan jobs.Event, 64)
	sub, err := c.nc.Subscribe(c.sub.JobEvents(job), func(m *nats.Msg) {
		var ev jobs.Event
		if json.Unmarshal(m.Data, &ev) != nil || (keep != nil && !keep(m.Subject, ev)) {
			return
		}
		select {
		case ch <- ev:
		default: // a slow watcher loses intermediate events; the state service has them
		}
	})
	if err != nil {
		return nil, nil, fmt.Errorf("watch events of %s: %w", job, err)
	}
	return ch, func() { _ = sub.Unsubscribe() }, nil
}
