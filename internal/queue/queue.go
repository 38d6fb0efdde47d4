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
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// Config sets the streams' and consumers' limits. Every field is explicit: nothing
// is left to library defaults.
type Config struct {
	Subjects     jobs.Subjects
	MaxQueued    int64         // pending jobs the stream holds before refusing more
	DedupeWindow time.Duration // JetStream duplicate window for job ids
	EventsMaxAge time.Duration // how long lifecycle events are kept in the stream
	AckWait      time.Duration // a worker that stops heartbeating loses its job after this
	MaxDeliver   int           // deliveries of one job message, all attempts included
	Replicas     int           // stream replicas (1, or 3 in a cluster)
}

// DefaultConfig returns the production defaults.
func DefaultConfig() Config {
	return Config{
		MaxQueued:    100_000,
		DedupeWindow: 10 * time.Minute,
		EventsMaxAge: 7 * 24 * time.Hour,
		AckWait:      30 * time.Second,
		MaxDeliver:   5,
		Replicas:     1,
	}
}

// ErrQueueFull is returned by Submit when the jobs stream holds MaxQueued jobs.
var ErrQueueFull = errors.New("job queue is full")

// Setup creates or updates the streams. It is idempotent.
func Setup(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	s := cfg.Subjects
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        s.JobsStream(),
		Description: "mcpexec pending jobs",
		Subjects:    []string{s.AllJobs()},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		MaxMsgs:     cfg.MaxQueued,
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
		Duplicates:  cfg.DedupeWindow,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return fmt.Errorf("create stream %s: %w", s.EventsStream(), err)
	}
	return nil
}

// WorkerConsumer creates or updates the durable consumer shared by pool's workers.
func WorkerConsumer(ctx context.Context, js jetstream.JetStream, cfg Config, pool string) (jetstream.Consumer, error) {
	s := cfg.Subjects
	c, err := js.CreateOrUpdateConsumer(ctx, s.JobsStream(), jetstream.ConsumerConfig{
		Durable:       s.Consumer(pool),
		Description:   "mcpexec workers of pool " + pool,
		FilterSubject: s.Job(pool),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait,
		MaxDeliver:    cfg.MaxDeliver,
		MaxAckPending: 10_000,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("create consumer %s: %w", s.Consumer(pool), err)
	}
	return c, nil
}

// Client submits jobs and publishes events.
type Client struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	sub jobs.Subjects
}

// NewClient returns a Client on nc.
func NewClient(nc *nats.Conn, s jobs.Subjects) (*Client, error) {
	js, err := jetstream.New(nc)
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

// PublishEvent records ev in the events stream and waits for the stream's ack.
func (c *Client) PublishEvent(ctx context.Context, ev jobs.Event) error {
	if ev.At.IsZero() {
		ev.At = time.Now().UTC()
	}
	data, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("encode %s event of %s: %w", ev.Kind, ev.Job, err)
	}
	msgID := fmt.Sprintf("%s.%s.%d", ev.Job, ev.Kind, ev.Attempt)
	if _, err := c.js.Publish(ctx, c.sub.Event(ev.Job, ev.Kind), data, jetstream.WithMsgID(msgID)); err != nil {
		return fmt.Errorf("publish %s event of %s: %w", ev.Kind, ev.Job, err)
	}
	return nil
}

// Submit records the submission and enqueues job, which must be normalised. A job
// id seen within the dedupe window is not enqueued twice. When the queue is full
// the job is recorded as rejected and ErrQueueFull is returned.
func (c *Client) Submit(ctx context.Context, job *jobs.Job) error {
	data, err := json.Marshal(job)
	if err != nil {
		return fmt.Errorf("encode job %s: %w", job.ID, err)
	}
	if err := c.PublishEvent(ctx, jobs.Event{Job: job.ID, Kind: jobs.EventSubmitted, Spec: job}); err != nil {
		return err
	}
	_, err = c.js.Publish(ctx, c.sub.Job(job.Pool), data, jetstream.WithMsgID(job.ID))
	if err == nil {
		return nil
	}
	if isFull(err) {
		rej := jobs.Event{Job: job.ID, Kind: jobs.EventFinished, Result: &jobs.Result{
			Status: jobs.StatusRejected,
			Error:  "the job queue is full: retry later, or add workers",
		}}
		if perr := c.PublishEvent(ctx, rej); perr != nil {
			return fmt.Errorf("%w (and recording the rejection failed: %v)", ErrQueueFull, perr)
		}
		return ErrQueueFull
	}
	return fmt.Errorf("publish job %s: %w", job.ID, err)
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
