// Package queue is the JetStream side of the job model: it creates the streams and
// consumers, submits jobs, and hands deliveries to workers. Wire names come from
// jobs.Subjects.
package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
	DedupeWindow   time.Duration // JetStream duplicate window for job ids
	EventsMaxAge   time.Duration // how long lifecycle events are kept in the stream
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
}

// DefaultConfig returns the production defaults: a worker that stops
// heartbeating loses its job after 30 s; later redeliveries wait longer.
func DefaultConfig() Config {
	return Config{
		MaxQueued:      100_000,
		JobsMaxBytes:   1 << 30,
		EventsMaxBytes: 8 << 30,
		MemoryMaxBytes: 8 << 30,
		DedupeWindow:   10 * time.Minute,
		EventsMaxAge:   7 * 24 * time.Hour,
		AckWait:        30 * time.Second,
		BackOff:        []time.Duration{30 * time.Second, 30 * time.Second, 60 * time.Second, 60 * time.Second},
		MaxDeliver:     10, // attempts (at most 4), and deliveries whose sandbox could not be made
		MaxAckPending:  10_000,
		Replicas:       1,
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
	case c.DedupeWindow <= 0:
		return fmt.Errorf("queue DedupeWindow must be positive, got %s", c.DedupeWindow)
	case c.EventsMaxAge < c.DedupeWindow:
		return fmt.Errorf("queue EventsMaxAge (%s) must be at least DedupeWindow (%s)", c.EventsMaxAge, c.DedupeWindow)
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
var ErrQueueFull = errors.New("job queue is full")

// Setup creates or updates the streams. It is idempotent.
func Setup(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	s := cfg.Subjects
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        s.JobsStream(),
		Description: "mcpexec pending jobs",
		Subjects:    []string{s.AllJobs(), s.AllWorkerJobs()},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		MaxMsgs:     cfg.MaxQueued,
		MaxBytes:    cfg.JobsMaxBytes,
		Discard:     jetstream.DiscardNew,
		Duplicates:  cfg.DedupeWindow,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return fmt.Errorf("create stream %s: %w", s.JobsStream(), err)
	}
	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
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
	})
	if err != nil {
		return fmt.Errorf("create stream %s: %w", s.EventsStream(), err)
	}
	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
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
	})
	if err != nil {
		return fmt.Errorf("create stream %s: %w", s.MemoryStream(), err)
	}
	if _, err := SessionsBucket(ctx, js, cfg); err != nil {
		return err
	}
	if _, err := SecretsBucket(ctx, js, cfg); err != nil {
		return err
	}
	return nil
}

// WorkerConsumer creates or updates the durable consumer shared by pool's workers.
func WorkerConsumer(ctx context.Context, js jetstream.JetStream, cfg Config, pool string) (jetstream.Consumer, error) {
	s := cfg.Subjects
	return jobConsumer(ctx, js, cfg, s.Consumer(pool), "mcpexec workers of pool "+pool, s.Job(pool), 0)
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
}

// UseKey gives the client the fleet's proxy key up front, so that the
// outcomes it records itself (a skip, a rejection) carry their proof before
// any submission has read the key.
func (c *Client) UseKey(key []byte) {
	c.keyMu.Lock()
	defer c.keyMu.Unlock()
	c.key = key
}

// proxyKey returns the fleet's proxy key, reading it on first use.
func (c *Client) proxyKey(ctx context.Context) ([]byte, error) {
	c.keyMu.Lock()
	defer c.keyMu.Unlock()
	if c.key == nil {
		k, err := ProxyKey(ctx, c.js, c.sub)
		if err != nil {
			return nil, err
		}
		c.key = k
	}
	return c.key, nil
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

func (c *Client) eventMsg(ev *jobs.Event) (*nats.Msg, error) {
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
	m.Header.Set(jobs.TraceHeader, jobs.TraceParent(ev.Job))
	return m, nil
}

// EventMsgID is the Nats-Msg-Id of an event: one event of each kind per attempt,
// so a republished event is deduplicated.
func EventMsgID(ev jobs.Event) string {
	return fmt.Sprintf("%s.%s.%d", ev.Job, ev.Kind, ev.Attempt)
}

// PublishEvent records ev in the events stream and waits for the stream's ack.
func (c *Client) PublishEvent(ctx context.Context, ev jobs.Event) error {
	m, err := c.eventMsg(&ev)
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

// ErrDuplicate is returned by Submit for a job id that was submitted before
// (within the events stream's retention): nothing is enqueued again.
var ErrDuplicate = errors.New("a job with this id was already submitted")

// submitChunk bounds the asynchronous publishes in flight of one SubmitMany.
const submitChunk = 1024

// Submit records the submission of job, which must be normalised, and enqueues
// it. See SubmitMany.
func (c *Client) Submit(ctx context.Context, job *jobs.Job) error {
	return c.SubmitMany(ctx, []*jobs.Job{job})[0]
}

// SubmitMany records the submission of each job (which must be normalised) and
// enqueues it, pipelining the publishes. It returns one error per job: nil when
// the job was enqueued; ErrDuplicate when its id was submitted before (the
// submitted event claims the id in the events stream, so this holds beyond the
// jobs stream's dedupe window too); ErrQueueFull when the jobs stream is full, in
// which case the job is recorded as rejected; any other error when the broker
// could not be reached — submitting again is then safe.
//
// While the cluster fails over, SubmitMany retries the jobs whose submission
// failed transiently, for up to Patience: a retry of a job whose claim landed
// finds its own claim and repairs the enqueue, so nothing is submitted twice.
func (c *Client) SubmitMany(ctx context.Context, js []*jobs.Job) []error {
	errs := make([]error, len(js))
	c.submitAll(ctx, js, errs)
	patience := c.Patience
	if patience <= 0 {
		patience = DefaultPatience
	}
	deadline := time.Now().Add(patience)
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, 2*time.Second) {
		var idx []int
		for i, err := range errs {
			if Transient(err) {
				idx = append(idx, i)
			}
		}
		if len(idx) == 0 || time.Now().Add(delay).After(deadline) {
			return errs
		}
		select {
		case <-ctx.Done():
			return errs
		case <-time.After(delay):
		}
		again := make([]*jobs.Job, len(idx))
		for k, i := range idx {
			again[k] = js[i]
		}
		aerrs := make([]error, len(again))
		c.submitAll(ctx, again, aerrs)
		for k, i := range idx {
			if errors.Is(aerrs[k], ErrDuplicate) {
				aerrs[k] = nil // the failed attempt's claim landed; this one enqueued
			}
			errs[i] = aerrs[k]
		}
	}
}

func (c *Client) submitAll(ctx context.Context, js []*jobs.Job, errs []error) {
	c.claimAll(ctx, js, errs, jobs.EventSubmitted)
}

// ReleaseMany enqueues waiting jobs whose parents have ended as they need
// (jobs, as recorded). The released event claims each job's release once,
// as the submitted event claims its id: it returns nil for a job it
// enqueued, ErrDuplicate for one released before (whose enqueue it repairs
// when the first releaser may have died before it), ErrQueueFull (the job
// is recorded as rejected), or another error when the broker could not be
// reached: releasing again is then safe.
func (c *Client) ReleaseMany(ctx context.Context, js []*jobs.Job) []error {
	errs := make([]error, len(js))
	c.claimAll(ctx, js, errs, jobs.EventReleased)
	return errs
}

func (c *Client) claimAll(ctx context.Context, js []*jobs.Job, errs []error, kind jobs.EventKind) {
	for lo := 0; lo < len(js); lo += submitChunk {
		hi := min(lo+submitChunk, len(js))
		c.claimChunk(ctx, js[lo:hi], errs[lo:hi], kind)
	}
}

// claimChunk claims each job's event of kind (submitted or released) and
// enqueues the jobs it claimed, except submitted jobs that wait for parents.
func (c *Client) claimChunk(ctx context.Context, js []*jobs.Job, errs []error, kind jobs.EventKind) {
	key, err := c.proxyKey(ctx)
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return
	}
	// 1. Claim each id: the event is stored only if its subject is empty.
	claims := make([]jetstream.PubAckFuture, len(js))
	for i, job := range js {
		ev := &jobs.Event{Job: job.ID, Kind: kind}
		if kind == jobs.EventSubmitted {
			ev.Spec, ev.At = job, job.SubmittedAt
		}
		m, err := c.eventMsg(ev)
		if err == nil {
			m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
			claims[i], err = c.js.PublishMsgAsync(m)
		}
		if err != nil {
			errs[i] = fmt.Errorf("record %s of %s: %w", kind, job.ID, err)
		}
	}
	for i, f := range claims {
		if f == nil {
			continue
		}
		ack, err := waitAck(ctx, f)
		if err == nil {
			c.sawEvent(ack.Sequence)
		}
		switch {
		case isWrongLastSeq(err) || (err == nil && ack.Duplicate):
			errs[i] = ErrDuplicate
		case err != nil:
			errs[i] = fmt.Errorf("record %s of %s: %w", kind, js[i].ID, err)
		}
	}
	// 2. Enqueue the claimed jobs, and repair a duplicate whose first claimer
	// may have died between claim and enqueue (the jobs stream deduplicates).
	// A submitted job that waits for parents is enqueued by its release.
	enq := make([]jetstream.PubAckFuture, len(js))
	for i, job := range js {
		if kind == jobs.EventSubmitted && job.Waits() {
			continue
		}
		if errs[i] != nil && !(errors.Is(errs[i], ErrDuplicate) && c.mayBeUnqueued(ctx, job.ID, kind)) {
			continue
		}
		subject, done, rerr := c.route(ctx, job)
		if done {
			errs[i] = rerr
			continue
		}
		data, err := EncodeMessage(job, jobs.Capability(key, job.ID))
		if err == nil {
			m := nats.NewMsg(subject)
			m.Data = data
			m.Header.Set(jobs.TraceHeader, jobs.TraceParent(job.ID))
			enq[i], err = c.js.PublishMsgAsync(m, jetstream.WithMsgID(job.ID))
		}
		if err != nil && errs[i] == nil {
			errs[i] = fmt.Errorf("publish job %s: %w", job.ID, err)
		}
	}
	var rejects []jetstream.PubAckFuture
	for i, f := range enq {
		if f == nil {
			continue
		}
		_, err := waitAck(ctx, f)
		if err == nil || errors.Is(errs[i], ErrDuplicate) {
			continue
		}
		if !isFull(err) {
			errs[i] = fmt.Errorf("publish job %s: %w", js[i].ID, err)
			continue
		}
		errs[i] = ErrQueueFull
		m, merr := c.eventMsg(&jobs.Event{Job: js[i].ID, Kind: jobs.EventFinished, Result: &jobs.Result{
			Status: jobs.StatusRejected,
			Error:  "the job queue is full: retry later with a new id, or add workers",
		}})
		if merr == nil {
			var rf jetstream.PubAckFuture
			if rf, merr = c.js.PublishMsgAsync(m); merr == nil {
				rejects = append(rejects, rf)
			}
		}
		if merr != nil {
			errs[i] = fmt.Errorf("%w (and recording the rejection failed: %v)", ErrQueueFull, merr)
		}
	}
	for _, f := range rejects {
		_, _ = waitAck(ctx, f) // the rejection is deduplicated by id if republished
	}
}

// mayBeUnqueued reports whether a duplicate claim (of kind) of id should
// republish the job message: the first claim is recent enough for the jobs
// stream to deduplicate the republish, and the job has not already finished or
// been rejected.
func (c *Client) mayBeUnqueued(ctx context.Context, id string, kind jobs.EventKind) bool {
	window := c.DedupeWindow
	if window == 0 {
		window = DefaultConfig().DedupeWindow
	}
	stream, err := c.js.Stream(ctx, c.sub.EventsStream())
	if err != nil {
		return false
	}
	m, err := stream.GetLastMsgForSubject(ctx, c.sub.Event(id, kind))
	if err != nil || time.Since(m.Time) > window*9/10 {
		return false
	}
	for _, k := range []jobs.EventKind{jobs.EventFinished, jobs.EventCancelled} {
		if _, err := stream.GetLastMsgForSubject(ctx, c.sub.Event(id, k)); !errors.Is(err, jetstream.ErrMsgNotFound) {
			return false
		}
	}
	return true
}

// Cancelled reports whether a cancelled event of job id is in the events stream.
// A worker asks before running a job, so a job cancelled while queued never runs.
func (c *Client) Cancelled(ctx context.Context, id string) (bool, error) {
	msg, err := c.lastEvent(ctx, id, jobs.EventCancelled)
	return msg != nil, err
}

// History is what a worker needs to know of a job before running it.
type History struct {
	Cancelled bool // a cancellation is recorded
	Finished  bool // an outcome is recorded
	// LastAttempt is the attempt of the job's last recorded start (0: none).
	// Only attempts that reached the code are counted: a delivery whose
	// sandbox never came up consumes none.
	LastAttempt int
}

// History looks up job id's cancellation, last start and outcome (three
// direct gets, at once).
func (c *Client) History(ctx context.Context, id string) (History, error) {
	var h History
	var started, finished *nats.Msg
	var startErr, finErr error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		started, startErr = c.lastEvent(ctx, id, jobs.EventStarted)
	}()
	go func() {
		defer wg.Done()
		finished, finErr = c.lastEvent(ctx, id, jobs.EventFinished)
	}()
	cancelled, err := c.lastEvent(ctx, id, jobs.EventCancelled)
	wg.Wait()
	if err = errors.Join(err, startErr, finErr); err != nil {
		return h, err
	}
	h.Cancelled = cancelled != nil
	h.Finished = finished != nil
	if started != nil {
		var ev jobs.Event
		if json.Unmarshal(started.Data, &ev) == nil {
			h.LastAttempt = ev.Attempt
		}
	}
	return h, nil
}

// lastEvent returns job id's last event of kind, or nil when there is none.
func (c *Client) lastEvent(ctx context.Context, id string, kind jobs.EventKind) (*nats.Msg, error) {
	msg, err := c.js.Conn().RequestWithContext(ctx, "$JS.API.DIRECT.GET."+c.sub.EventsStream()+"."+c.sub.Event(id, kind), nil)
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

func waitAck(ctx context.Context, f jetstream.PubAckFuture) (*jetstream.PubAck, error) {
	select {
	case ack := <-f.Ok():
		return ack, nil
	case err := <-f.Err():
		return nil, err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return err != nil && strings.Contains(err.Error(), "wrong last sequence")
}

func isFull(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "maximum messages exceeded") || strings.Contains(msg, "maximum bytes exceeded")
}

// WatchEvents subscribes to job's events and delivers them on the returned channel
// until stop is called. Subscribe before submitting so no event is missed.
func (c *Client) WatchEvents(job string) (events <-chan jobs.Event, stop func(), err error) {
	ch := make(chan jobs.Event, 64)
	sub, err := c.nc.Subscribe(c.sub.JobEvents(job), func(m *nats.Msg) {
		var ev jobs.Event
		if json.Unmarshal(m.Data, &ev) != nil {
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
