package queue

// The queue's configuration and the streams, buckets and consumers it sets up.

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/jobs"
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

// The bounds of the buckets whose size no Config field sets.
const (
	secretsMaxBytes   = 1 << 20
	approvalsMaxBytes = 256 << 20
	sessionsMaxBytes  = 64 << 20
)

// StoreBound is the disk the streams and buckets Setup and the services
// create are bounded to, on each node that holds a copy: what JetStream
// reserves for them (33.3 GiB by default).
func (c Config) StoreBound() int64 {
	files := c.FilesMaxBytes
	if files == 0 {
		files = DefaultConfig().FilesMaxBytes
	}
	return c.JobsMaxBytes + c.EventsMaxBytes + c.MemoryMaxBytes + c.AuditMaxBytes + files +
		secretsMaxBytes + approvalsMaxBytes + sessionsMaxBytes
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
			// A submission's jobs are enqueued in atomic batches: one sync
			// (one Raft proposal) for many.
			AllowAtomicPublish: true,
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
			// Events published together go in one atomic batch: one sync
			// (one Raft proposal) for all of them (groupCommit).
			AllowAtomicPublish: true,
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
