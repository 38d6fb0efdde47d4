// Package queue is the JetStream side of the job model: it creates the streams and
// consumers, submits jobs, and hands deliveries to workers. Wire names come from
// jobs.Subjects.
package queue

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/durable"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

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

	// fleet makes acknowledged writes durable where the brokers need a
	// barrier for it (Sync).
	fleet *durable.Fleet

	eventsSeq atomic.Uint64 // highest events-stream sequence this client wrote
	events    *groupCommit  // writes to the events stream
	jobs      *groupCommit  // writes to the jobs stream

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
		if err == nil {
			err = c.fleet.Sync(ctx) // a key this client made is durable before it signs with it
		}
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
// yet, a node gone, an ack lost, a write not yet known to be synced): the
// same request succeeds later.
func Transient(err error) bool {
	if errors.Is(err, durable.ErrNotDurable) {
		return true // stored, perhaps not yet synced: sent again under its id, stored once
	}
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
	fleet := durable.NewFleet(nc, s.StateService(), s.SyncBarrier())
	return &Client{nc: nc, js: js, sub: s, fleet: fleet,
		events: &groupCommit{nc: nc, js: js, fleet: fleet, barrier: fleet.Stream(s.EventsStream()), minAtomic: groupMinAtomic},
		jobs:   &groupCommit{nc: nc, js: js, fleet: fleet, barrier: fleet.Stream(s.JobsStream()), minAtomic: groupMinAtomic}}, nil
}

// Sync returns once what JetStream acknowledged to this client before the
// call is durable under the brokers' sync policy: writers that use the
// JetStream context directly (key-value buckets, object stores) call it
// before they tell anyone a write succeeded.
func (c *Client) Sync(ctx context.Context) error { return c.fleet.Sync(ctx) }

// UseLocalBarrier makes the client's barriers go to b, the Barrier of the
// broker in this process that its connection reaches in process
// (durable.Fleet.UseLocal).
func (c *Client) UseLocalBarrier(b durable.Barrier) { c.fleet.UseLocal(b) }

// Fleet is the client's barrier of the brokers it reaches (Sync).
func (c *Client) Fleet() *durable.Fleet { return c.fleet }

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
// ctx holds none), so the state service's apply span is its child. Events
// published at the same time through the client are stored as one atomic
// batch (groupCommit): one sync for all of them. The wait for the ack is
// bounded by publishTimeout, not by ctx.
func (c *Client) PublishEvent(ctx context.Context, ev jobs.Event) error {
	return c.publishEvent(ctx, ev, nil)
}

// ErrHistoryMoved is PublishStart's answer for a job whose history moved on
// from the one its start was decided on: nothing was stored; look the job's
// history up.
var ErrHistoryMoved = errors.New("the job's history moved on since it was read")

// StartAfter is the history a start is decided on, which PublishStart checks
// as JetStream stores the start (Nats-Expected-Last-Subject-Sequence).
type StartAfter struct {
	// ClaimSeq, on a first delivery, is the job's claim (its submitted
	// event, at this sequence of the events stream: Message.ClaimSeq): the
	// start is stored only while the claim is the job's last event, so that
	// the job was neither cancelled nor started nor ended before. A worker
	// records a first delivery's start this way instead of reading the
	// job's history, one request and three reads less.
	ClaimSeq uint64
	// LastStartSeq, when ClaimSeq is 0, is the sequence of the job's last
	// start that the history read said (History.LastStartSeq; 0: none): the
	// start is stored only while no other start came after it, so that two
	// deliveries that read the same history cannot both run its next
	// attempt.
	LastStartSeq uint64
}

// PublishStart records ev, a start of the job by one delivery of its message
// (named by delivery, a NewDeliveryToken, the same across that delivery's
// tries), only on the history after says. It returns ErrHistoryMoved when
// the history moved on, and stores nothing then.
//
// Why the condition and the token: after a power cut that loses a
// consumer's state, JetStream delivers a message again as a first delivery
// while the worker that had it still runs it. With one message id per
// attempt and no condition on a retry, both deliveries were told they had
// started attempt 1, both ran, and the job's effects happened twice under
// one attempt. A retry whose earlier try may have landed (its answer lost)
// gets ErrHistoryMoved here too, as its own start is now the last one: it
// reads the history, and the start is its own when History.LastStartID is
// StartMsgID of its token (StartedBy).
func (c *Client) PublishStart(ctx context.Context, ev jobs.Event, after StartAfter, delivery string) error {
	sync, err := c.StartStored(ctx, ev, after, delivery)
	if err != nil {
		return err
	}
	return sync(ctx)
}

// Durable makes a write that JetStream stored durable: nil once it is.
type Durable func(ctx context.Context) error

// StartStored is PublishStart returning once JetStream has stored the start,
// before it is synced where the brokers sync behind a barrier (one broker
// under sync always); sync makes it durable there, and is a no-op where the
// store already waited for its sync. A write to the events stream made
// durable later makes the start durable with it: the stream syncs in order.
//
// sync fails when the connection was made again since the start was stored
// (a broker that restarted may have lost it: look the history up, StartedBy).
func (c *Client) StartStored(ctx context.Context, ev jobs.Event, after StartAfter, delivery string) (sync Durable, err error) {
	if !validToken(delivery) {
		return nil, fmt.Errorf("start of %s: delivery token %.40q is not 1 to 32 letters and digits", ev.Job, delivery)
	}
	conns := c.nc.Stats().Reconnects
	barrier, err := c.publishEventStored(ctx, ev, func(m *nats.Msg) {
		m.Header.Set(jetstream.MsgIDHeader, c.sub.StartMsgID(ev.Job, ev.Attempt, delivery))
		if after.ClaimSeq > 0 {
			m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(after.ClaimSeq, 10))
			m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, c.sub.JobEvents(ev.Job))
			return
		}
		// The started subject alone: the job's other events (a
		// cancellation, another's outcome) do not stop a start that the
		// history allowed; the worker handles them as for any running job.
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(after.LastStartSeq, 10))
	})
	if isWrongLastSeq(err) {
		return nil, fmt.Errorf("%w: %w", ErrHistoryMoved, err)
	}
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		if err := barrier(ctx); err != nil {
			return err
		}
		// The barrier synced what the broker holds now: a broker that
		// restarted since the start was stored (the connection was made
		// again) may hold it no longer.
		if c.nc.Stats().Reconnects != conns {
			return fmt.Errorf("start of %s: %w: the connection to the broker was made again since it was stored", ev.Job, ErrStartUnconfirmed)
		}
		return nil
	}, nil
}

// SyncEvents returns once what the events stream acknowledged before the
// call is durable (a barrier, where the brokers need one).
func (c *Client) SyncEvents(ctx context.Context) error { return c.events.syncStored(ctx) }

// ErrStartUnconfirmed is a StartStored sync's error when the start may have
// been lost with a broker that restarted: the job's history says whether it
// was (History.StartedBy).
var ErrStartUnconfirmed = errors.New("the start is not known to be durable")

// StartedBy reports whether h's last start is ev's (its attempt), recorded
// by the delivery named delivery.
func (h History) StartedBy(ev jobs.Event, delivery string) bool {
	return h.LastAttempt == ev.Attempt && h.LastStartID == (jobs.Subjects{}).StartMsgID(ev.Job, ev.Attempt, delivery)
}

// NewDeliveryToken returns a token naming one delivery of a job message
// (PublishStart).
func NewDeliveryToken() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails
	return hex.EncodeToString(b[:])
}

func validToken(t string) bool {
	if t == "" || len(t) > 32 {
		return false
	}
	for _, c := range []byte(t) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

func (c *Client) publishEvent(ctx context.Context, ev jobs.Event, expect func(*nats.Msg)) error {
	sync, err := c.publishEventStored(ctx, ev, expect)
	if err != nil {
		return err
	}
	if err := sync(ctx); err != nil {
		return fmt.Errorf("publish %s event of %s: %w", ev.Kind, ev.Job, err)
	}
	return nil
}

// publishEventStored stores ev and returns once JetStream holds it; sync
// makes it durable (groupCommit.publishStored).
func (c *Client) publishEventStored(ctx context.Context, ev jobs.Event, expect func(*nats.Msg)) (sync Durable, err error) {
	tp := tracing.TraceParent(ctx)
	if tp == "" {
		tp = jobs.TraceParent(ev.Job)
	}
	m, err := c.eventMsg(&ev, tp)
	if err != nil {
		return nil, err
	}
	if expect != nil {
		expect(m)
	}
	seq, sync, err := c.events.publishStored(ctx, m)
	if err != nil {
		return nil, fmt.Errorf("publish %s event of %s: %w", ev.Kind, ev.Job, err)
	}
	c.sawEvent(seq)
	return sync, nil
}

// History is what a worker needs to know of a job before running it.
type History struct {
	Cancelled bool `json:"cancelled"` // a cancellation is recorded
	Finished  bool `json:"finished"`  // an outcome is recorded
	// LastAttempt is the attempt of the job's last recorded start (0: none).
	// Only attempts that reached the code are counted: a delivery whose
	// sandbox never came up consumes none.
	LastAttempt int `json:"last_attempt"`
	// LastStartSeq is the events stream's sequence of the last message on
	// the job's started subject, proven or not (0: none): what a start
	// decided on this history expects (StartAfter).
	LastStartSeq uint64 `json:"last_start_seq,omitempty"`
	// LastStartID is the message id of the job's last start, when it is
	// proven (StartedBy).
	LastStartID string `json:"last_start_id,omitempty"`
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
	if started != nil {
		h.LastStartSeq, _ = strconv.ParseUint(started.Header.Get(jetstream.SequenceHeader), 10, 64)
	}
	if ev, ok := provenEvent(key, started, id, jobs.EventStarted); ok {
		h.LastAttempt, h.LastStartID = ev.Attempt, started.Header.Get(jetstream.MsgIDHeader)
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
