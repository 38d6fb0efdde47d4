// Package frontend is the front-end's core: it submits jobs to the queue on behalf
// of agents, waits for their outcome, answers the proxy calls of its jobs'
// sandboxes, and reports whether the fleet can take work.
package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/state"
)

// Config configures a Frontend.
type Config struct {
	ID       string
	Subjects jobs.Subjects
	Limits   jobs.Limits
	Logger   *slog.Logger
	// Proxy answers sandbox calls; nil answers every call with "no MCP servers".
	Proxy proxy.Handler
}

// Frontend submits jobs and waits for them.
type Frontend struct {
	cfg       Config
	nc        *nats.Conn
	client    *queue.Client
	responder *proxy.Responder
	log       *slog.Logger
	once      sync.Once
}

// New returns a Frontend on nc.
func New(nc *nats.Conn, cfg Config) (*Frontend, error) {
	if !jobs.ValidID(cfg.ID) {
		return nil, fmt.Errorf("front-end id %q must be letters, digits, '-' or '_'", cfg.ID)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	client, err := queue.NewClient(nc, cfg.Subjects)
	if err != nil {
		return nil, err
	}
	f := &Frontend{cfg: cfg, nc: nc, client: client, log: cfg.Logger.With("frontend", cfg.ID)}
	h := cfg.Proxy
	if h == nil {
		h = proxy.HandlerFunc(noServers)
	}
	f.responder = proxy.NewResponder(nc, cfg.Subjects.Proxy(cfg.ID), h)
	return f, nil
}

func noServers(_ context.Context, req proxy.Request) (json.RawMessage, error) {
	switch req.Method {
	case "list_servers", "discovered_servers":
		return json.RawMessage("[]"), nil
	}
	return nil, fmt.Errorf("no MCP servers are configured on this front-end (%s is unavailable): start it with --servers FILE", req.Method)
}

// Start begins answering proxy calls.
func (f *Frontend) Start(ctx context.Context) error { return f.responder.Start(ctx) }

// Stop stops answering proxy calls. It is idempotent.
func (f *Frontend) Stop() { f.once.Do(f.responder.Stop) }

// Limits returns the submission limits in force.
func (f *Frontend) Limits() jobs.Limits { return f.cfg.Limits }

// ErrUnavailable wraps failures to reach the broker.
var ErrUnavailable = errors.New("the job broker is unreachable")

// Run validates and submits job, then waits for its terminal record. progress, if
// not nil, sees each lifecycle event as it happens. When ctx ends first the job is
// cancelled. Invalid jobs return a *jobs.InvalidError and never reach a worker.
func (f *Frontend) Run(ctx context.Context, job *jobs.Job, progress func(jobs.Event)) (*jobs.Record, error) {
	if err := job.Normalize(f.cfg.Limits, time.Now()); err != nil {
		return nil, err
	}
	job.Frontend = f.cfg.ID
	events, stop, err := f.client.WatchEvents(job.ID)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	defer stop()
	if err := f.client.Submit(ctx, job); err != nil {
		if errors.Is(err, queue.ErrQueueFull) {
			return f.Get(context.WithoutCancel(ctx), job.ID)
		}
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	f.log.Debug("job submitted", "job", job.ID)
	poll := time.NewTicker(5 * time.Second)
	defer poll.Stop()
	for {
		select {
		case ev := <-events:
			if progress != nil {
				progress(ev)
			}
			if ev.Kind == jobs.EventFinished || ev.Kind == jobs.EventCancelled {
				return f.settled(ctx, job, ev)
			}
		case <-poll.C:
			// Events are best effort on core NATS; the state service is the record.
			if rec, err := f.Get(ctx, job.ID); err == nil && rec.Status.Terminal() {
				return rec, nil
			}
		case <-ctx.Done():
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := f.Cancel(cctx, job.ID, "the caller went away"); err != nil {
				f.log.Warn("cancel job", "job", job.ID, "err", err)
			}
			return nil, ctx.Err()
		}
	}
}

// settled turns a terminal event into the job's record, preferring the state
// service's copy (which applies fencing) when it already has it.
func (f *Frontend) settled(ctx context.Context, job *jobs.Job, ev jobs.Event) (*jobs.Record, error) {
	rec, _ := jobs.Apply(&jobs.Record{Job: *job, Status: jobs.StatusQueued, CreatedAt: job.SubmittedAt}, ev)
	if ev.Kind == jobs.EventFinished && ev.Result != nil {
		return rec, nil
	}
	if got, err := f.Get(ctx, job.ID); err == nil && got.Status.Terminal() {
		return got, nil
	}
	return rec, nil
}

// Cancel cancels job id: a running job's sandbox is stopped, a queued job never
// runs.
func (f *Frontend) Cancel(ctx context.Context, id, reason string) error {
	if err := f.nc.Publish(f.cfg.Subjects.Cancel(id), []byte(reason)); err != nil {
		return fmt.Errorf("announce cancel of %s: %w", id, err)
	}
	return f.client.PublishEvent(ctx, jobs.Event{Job: id, Kind: jobs.EventCancelled, Reason: reason})
}

// Get returns the state service's record of job id; state.ErrNotFound when there
// is none.
func (f *Frontend) Get(ctx context.Context, id string) (*jobs.Record, error) {
	data, _ := json.Marshal(state.JobGetRequest{ID: id})
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	msg, err := f.nc.RequestWithContext(ctx, f.cfg.Subjects.State("job.get"), data)
	if err != nil {
		return nil, fmt.Errorf("%w: job.get: %v", ErrUnavailable, err)
	}
	if code := msg.Header.Get("Nats-Service-Error-Code"); code != "" {
		if code == state.CodeNotFound {
			return nil, state.ErrNotFound
		}
		return nil, fmt.Errorf("job.get %s: %s", id, msg.Header.Get("Nats-Service-Error"))
	}
	var rec jobs.Record
	if err := json.Unmarshal(msg.Data, &rec); err != nil {
		return nil, fmt.Errorf("decode record %s: %w", id, err)
	}
	return &rec, nil
}

// Health reports nil when the front-end can do its job: connected to NATS, and at
// least one worker answering.
func (f *Frontend) Health(ctx context.Context) error {
	if !f.nc.IsConnected() {
		return fmt.Errorf("%w: not connected to NATS", ErrUnavailable)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := f.nc.RequestWithContext(ctx, "$SRV.PING."+f.cfg.Subjects.WorkerService(), nil); err != nil {
		return errors.New("no worker is answering: start one with `worker --nats URL`")
	}
	return nil
}
