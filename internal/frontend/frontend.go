// Package frontend is the front-end's core: it submits jobs to the queue on behalf
// of agents, waits for their outcome, and reports whether the fleet can take
// work. It starts the responder that answers the sandboxes' proxy calls
// (package proxyresp) with its tools, memory and policies.
package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpexec/mcpexec/internal/errs"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpexec/mcpexec/internal/auditlog"
	"github.com/mcpexec/mcpexec/internal/durable"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/metrics"
	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/proxyresp"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/state"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

// Config configures a Frontend.
type Config struct {
	ID       string
	Subjects jobs.Subjects
	Limits   jobs.Limits
	Logger   *slog.Logger
	// LocalBarrier, when set, is the Barrier of the broker in this process
	// that the front-end's connection reaches in process (the embedded
	// default): its submissions' barriers go there directly
	// (durable.Fleet.UseLocal).
	LocalBarrier durable.Barrier
	// LocalProxy, when set, is shared with a worker in this process (the
	// embedded default): the front-end's proxy responder answers that
	// worker's calls in process (proxy.Local).
	LocalProxy *proxy.Local
	// Tools is the MCP client pool behind call_tool and the docs helpers; nil
	// means no MCP servers are configured.
	Tools proxyresp.ToolSource
	// Memory backs the memory helpers; nil uses the state service over NATS.
	Memory proxyresp.MemoryStore
	// CallTimeout bounds one proxied tool call unless the code asks for another
	// (default proxyresp.DefaultCallTimeout); the job's deadline always bounds it.
	CallTimeout time.Duration
	// MaxCallsPerJob caps one job's proxy calls in flight; more wait for a slot
	// (default proxyresp.DefaultMaxCallsPerJob).
	MaxCallsPerJob int
	// Policy is the policy of namespaces Policies does not name (zero: no
	// caps; DefaultPolicy() is what the command line starts from).
	Policy Policy
	// Policies are the policies of named namespaces.
	Policies map[string]Policy
	// Metrics, when set, records submissions and proxy call latency.
	Metrics *metrics.Metrics
	// DescribeStatus, when set, completes the status this front-end answers
	// on Subjects.FrontendStatus (its servers, its calls per minute).
	DescribeStatus func(*jobs.FrontendStatus)
	// OnCatalogChange, when set, is told of a namespace that enabled or
	// disabled a catalog server (its servers enum changed).
	OnCatalogChange func(ns string)
	// Tracing receives the front-end's spans (submissions, proxy calls
	// answered); nil: none.
	Tracing trace.TracerProvider
	// Audit records the proxied tool calls; nil: the front-end's own
	// writer to the audit stream (auditlog), which it starts and stops.
	Audit proxyresp.Auditor
}

// Frontend submits jobs and waits for them.
type Frontend struct {
	cfg       Config
	nc        *nats.Conn
	client    *queue.Client
	state     *state.Client
	resp      *proxyresp.Responder // answers the sandboxes' proxy calls
	key       []byte               // the fleet's proxy key, set by Start
	log       *slog.Logger
	tracer    trace.Tracer
	once      sync.Once
	inRun     atomic.Int64          // Run calls in flight
	memory    proxyresp.MemoryStore // memory helpers' backend
	adm       *admission            // namespace caps and shutdown
	pools     *servedPools          // the pools live workers serve
	statusSub *nats.Subscription
	audit     *auditlog.Writer // the proxied tool calls' audit entries (nil: Config.Audit's)
	redactors sync.Map         // namespace → *audit.Redactor
	rules     compiledRules    // the namespaces' tool rules
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
	if cfg.LocalBarrier != nil {
		client.UseLocalBarrier(cfg.LocalBarrier)
	}
	st := state.NewClient(nc, cfg.Subjects)
	st.EventsFloor = client.EventsSeq // reads see this front-end's submissions
	rules, err := compileRules(cfg.Policy, cfg.Policies)
	if err != nil {
		return nil, err
	}
	f := &Frontend{cfg: cfg, nc: nc, client: client, state: st, log: cfg.Logger.With("frontend", cfg.ID),
		tracer: tracing.Tracer(cfg.Tracing), rules: rules}
	f.memory = cfg.Memory
	f.adm = newAdmission(f)
	f.pools = newServedPools(f.askWorkers)
	if f.memory == nil {
		f.memory = f.state
	}
	if cfg.Audit == nil {
		if f.audit, err = auditlog.New(nc, auditlog.Config{Subjects: cfg.Subjects, Logger: f.log.With("component", "audit")}); err != nil {
			return nil, err
		}
		cfg.Audit = f.audit
		if m := cfg.Metrics; m != nil {
			w := f.audit
			m.Counter("mcpexec_audit_entries_written_total", "Audit entries of proxied tool calls the audit stream acknowledged.", func() float64 { return float64(w.Written()) })
			m.Counter("mcpexec_audit_entries_dropped_total", "Audit entries of proxied tool calls not written (queue full, stream refused them): each is logged at ERROR.", func() float64 { return float64(w.Dropped()) })
		}
	}
	f.resp = proxyresp.New(nc, proxyresp.Config{ID: cfg.ID, Subjects: cfg.Subjects, Logger: f.log,
		Tools: cfg.Tools, Memory: f.memory, Records: f.state, Policy: f.proxyPolicy,
		CallTimeout: cfg.CallTimeout, MaxCallsPerJob: cfg.MaxCallsPerJob, Metrics: cfg.Metrics,
		Tracing: cfg.Tracing, OnCatalogChange: cfg.OnCatalogChange, Audit: cfg.Audit, Local: cfg.LocalProxy})
	return f, nil
}

// proxyPolicy is namespace ns's policy as the proxy responder goes by it.
func (f *Frontend) proxyPolicy(ns string) proxyresp.Policy {
	p := f.policyFor(ns)
	return proxyresp.Policy{Servers: p.Servers, MemoryBytes: p.MemoryBytes, Redact: f.redactor(ns), Tools: f.rules.forNS(ns), Approvals: p.approvalLimits()}
}

// Running returns the number of run_python calls in flight on this front-end.
func (f *Frontend) Running() int { return int(f.inRun.Load()) }

// Start reads the fleet's proxy key and begins answering proxy calls: those
// any front-end may answer, and those of the MCP servers this one proxies.
func (f *Frontend) Start(ctx context.Context) error {
	key, err := queue.ProxyKey(ctx, f.client.JetStream(), f.cfg.Subjects)
	if err == nil {
		err = f.client.Sync(ctx) // a key this front-end made is durable before it signs with it
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	f.key = key
	f.client.UseKey(key) // the outcomes it records itself carry their proof
	if err := f.adm.start(); err != nil {
		return err
	}
	if f.audit != nil {
		f.audit.Start(key)
	}
	if err := f.resp.Start(key); err != nil {
		return err
	}
	sub, err := f.nc.Subscribe(f.cfg.Subjects.FrontendStatus(), f.answerStatus)
	if err != nil {
		return fmt.Errorf("answer status requests: %w", err)
	}
	f.statusSub = sub
	// The server has the subscriptions once Start returns.
	if err := f.nc.FlushTimeout(10 * time.Second); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return nil
}

// ServersChanged answers the proxy calls of the MCP servers Tools holds now
// (after a new discovery): new servers' calls come here, removed ones' no more.
func (f *Frontend) ServersChanged() error {
	if err := f.resp.SetSubjects(); err != nil {
		return err
	}
	if err := f.nc.FlushTimeout(10 * time.Second); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return nil
}

// Stop stops answering proxy calls (those in flight get proxyresp.Grace to
// finish). It is idempotent.
func (f *Frontend) Stop() {
	f.once.Do(func() {
		if f.statusSub != nil {
			_ = f.statusSub.Unsubscribe() // the connection may be closing: it ends the subscription too
		}
		f.resp.Stop()
		if f.audit != nil {
			f.audit.Stop() // after the calls: it writes what they recorded
		}
		f.adm.close()
	})
}

// Status is what this front-end answers on Subjects.FrontendStatus.
func (f *Frontend) Status() jobs.FrontendStatus {
	st := jobs.FrontendStatus{ID: f.cfg.ID, Broker: f.nc.ConnectedServerName(), Servers: []jobs.ServerState{}, Running: f.Running(), At: time.Now().UTC()}
	if f.cfg.DescribeStatus != nil {
		f.cfg.DescribeStatus(&st)
	}
	return st
}

// answerStatus answers a status request (anything in it is ignored).
func (f *Frontend) answerStatus(m *nats.Msg) {
	b, err := json.Marshal(f.Status())
	if err != nil {
		return
	}
	_ = m.Respond(b) // an asker that went away wants no answer
}

// Frontends asks every front-end of the fleet (this one too) for its status.
func (f *Frontend) Frontends(ctx context.Context) ([]jobs.FrontendStatus, error) {
	fs, err := queue.FrontendStatuses(ctx, f.nc, f.cfg.Subjects, workersWait)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return fs, nil
}

// The front-end's job client is the callers' job service.
var _ jobs.Service = (*Frontend)(nil)

// Limits returns the submission limits of namespaces without their own.
func (f *Frontend) Limits() jobs.Limits { return f.cfg.Limits }

// ErrUnavailable wraps failures to reach the broker.
var ErrUnavailable = errs.New(errs.Unavailable, "the job broker is unreachable")

var timeNow = time.Now

// Run validates and submits job for its namespace (job.Namespace; "" is the
// default one), then waits for its terminal record, which it returns as the
// namespace sees it. progress, if not nil, sees each lifecycle event as it
// happens. When ctx ends first the job is cancelled. Invalid jobs return a
// *jobs.InvalidError and never reach a worker.
func (f *Frontend) Run(ctx context.Context, job *jobs.Job, progress func(jobs.Event)) (*jobs.Record, error) {
	ns := jobs.NamespaceOf(job.Namespace)
	job.SubmittedBy = jobs.SubmitterOf(ctx)
	if err := f.prepare(job, ns); err != nil {
		return nil, err
	}
	if err := f.checkPool(ctx, job); err != nil {
		return nil, err
	}
	if err := f.checkSessions(ctx, []*jobs.Job{job})[0]; err != nil {
		return nil, err
	}
	if err := f.stageFiles(ctx, job, ns); err != nil {
		return nil, err
	}
	ctx, span := f.startSubmit(ctx, job)
	rec, err := f.run(ctx, job, progress)
	endSubmit(span, rec, err)
	if rec != nil {
		rec = rec.View(ns)
	}
	var re *ResumableError
	if errors.As(err, &re) {
		re.JobID, _ = jobs.UnscopedID(ns, re.JobID)
	}
	return rec, err
}

// run is Run for a prepared (wire) job.
func (f *Frontend) run(ctx context.Context, job *jobs.Job, progress func(jobs.Event)) (*jobs.Record, error) {
	if err := f.adm.enterRun(job); err != nil {
		return nil, err
	}
	defer f.adm.leaveRun(job.ID)
	f.inRun.Add(1)
	defer f.inRun.Add(-1)
	events, stop, err := f.client.WatchEvents(job.ID, f.trusted)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	defer stop()
	// The submission is made durable while its events are reported: a
	// worker may take the job, and its code print, before the submission's
	// barriers are done, and its progress is reported in the order it
	// happened. The caller hears the outcome only once the submission
	// succeeded.
	subErr := make(chan error, 1)
	go func() { subErr <- f.client.Submit(ctx, job) }()
	defer func() {
		if subErr != nil {
			// The submission ends with ctx, or within its patience; the
			// run has already answered.
			if err := <-subErr; err != nil {
				f.log.Debug("submission of a run that ended first", "job", job.ID, "err", err)
			}
		}
	}()
	var ended *jobs.Event // a terminal event that came before the submission succeeded
	poll := time.NewTicker(5 * time.Second)
	defer poll.Stop()
	for {
		select {
		case err := <-subErr:
			subErr = nil
			if err != nil && !errors.Is(err, queue.ErrDuplicate) {
				if errors.Is(err, queue.ErrQueueFull) {
					f.cfg.Metrics.Submitted("rejected")
					return f.record(context.WithoutCancel(ctx), job.ID)
				}
				f.cfg.Metrics.Submitted("error")
				return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
			f.cfg.Metrics.Submitted("accepted")
			f.log.Debug("job submitted", "job", job.ID, "trace_id", jobs.TraceID(job.Trace()))
			if ended != nil {
				return f.settled(ctx, job, *ended)
			}
		case ev := <-events:
			if progress != nil {
				progress(ev)
			}
			if ev.Kind == jobs.EventFinished || ev.Kind == jobs.EventCancelled {
				if subErr == nil {
					return f.settled(ctx, job, ev)
				}
				ended = &ev
			}
		case <-poll.C:
			// Events are best effort on core NATS; the state service is the record.
			if subErr != nil {
				continue
			}
			if rec, err := f.record(ctx, job.ID); err == nil && rec.Status.Terminal() {
				return rec, nil
			}
		case <-f.adm.abandon:
			// Shutting down: the job goes on, and its caller can fetch the result.
			return nil, &ResumableError{JobID: job.ID}
		case <-ctx.Done():
			if subErr != nil {
				// Cancelled only once recorded: a cancel before the claim
				// would find no job, and the job would then run.
				err := <-subErr
				subErr = nil
				if err != nil && !errors.Is(err, queue.ErrDuplicate) {
					return nil, ctx.Err()
				}
			}
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := f.cancel(cctx, job.ID, "the caller went away"); err != nil {
				f.log.Warn("cancel job", "job", job.ID, "err", err)
			}
			return nil, ctx.Err()
		}
	}
}

// settled turns a terminal event into the job's record, preferring the state
// service's copy (which applies fencing) when it already has it.
func (f *Frontend) settled(ctx context.Context, job *jobs.Job, ev jobs.Event) (*jobs.Record, error) {
	rec, _ := jobs.Apply(&jobs.Record{Job: *job, Status: jobs.StatusQueued, CreatedAt: job.SubmittedAt, TraceID: jobs.TraceID(job.Trace())}, ev)
	if ev.Kind == jobs.EventFinished && ev.Result != nil {
		return rec, nil
	}
	if got, err := f.record(ctx, job.ID); err == nil && got.Status.Terminal() {
		return got, nil
	}
	return rec, nil
}

// Cancel cancels namespace ns's job id: a running job's sandbox is stopped, a
// queued job never runs. It returns state.ErrNotFound for an id the namespace
// has not submitted.
func (f *Frontend) Cancel(ctx context.Context, ns, id, reason string) error {
	rec, err := f.Get(ctx, ns, id)
	if err != nil {
		return err
	}
	if rec.Status.Terminal() {
		return nil
	}
	return f.cancel(ctx, jobs.ScopedID(jobs.NamespaceOf(ns), id), reason)
}

// cancel cancels the job of wire id. The cancellation is recorded before it is
// announced, so a worker that checks for a recorded one after subscribing to
// announcements misses neither.
func (f *Frontend) cancel(ctx context.Context, id, reason string) error {
	if err := f.client.PublishEvent(ctx, jobs.Event{Job: id, Kind: jobs.EventCancelled, Reason: reason}); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return queue.PublishCancel(f.nc, f.cfg.Subjects, id, reason)
}

// Get returns namespace ns's record of job id, as the namespace sees it;
// state.ErrNotFound when the namespace has no such job (whether or not
// another namespace has one), an error wrapping ErrUnavailable when the broker
// does not answer.
func (f *Frontend) Get(ctx context.Context, ns, id string) (*jobs.Record, error) {
	ns = jobs.NamespaceOf(ns)
	if !jobs.ValidUserID(id) {
		return nil, state.ErrNotFound
	}
	rec, err := f.record(ctx, jobs.ScopedID(ns, id))
	if err != nil {
		return nil, err
	}
	if rec.Job.Namespace != ns {
		return nil, state.ErrNotFound
	}
	return rec.View(ns), nil
}

// record returns the state service's record of wire id.
func (f *Frontend) record(ctx context.Context, id string) (*jobs.Record, error) {
	rec, err := f.state.Job(ctx, id)
	if errors.Is(err, state.ErrNotFound) {
		rec, err = f.awaitRecord(ctx, id) // submitted a moment ago?
	}
	if errors.Is(err, state.ErrUnavailable) {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return rec, err
}

// Health reports nil when the front-end can do its job: connected to NATS, and at
// least one healthy worker answering.
func (f *Frontend) Health(ctx context.Context) error {
	if !f.nc.IsConnected() {
		return fmt.Errorf("%w: not connected to NATS", ErrUnavailable)
	}
	ws, err := f.Workers(ctx)
	if err != nil {
		return err
	}
	if len(ws) == 0 {
		return errors.New("no worker is answering: start one with `worker --nats URL`")
	}
	var sick []string
	for _, w := range ws {
		if w.Healthy {
			return nil
		}
		sick = append(sick, w.ID+": "+w.Reason)
	}
	return fmt.Errorf("no healthy worker is left (%s)", strings.Join(sick, "; "))
}

// workersWait is how long Workers collects answers.
const workersWait = 300 * time.Millisecond

// Workers asks every worker for its status and returns the answers that come
// within a moment (or within ctx).
func (f *Frontend) Workers(ctx context.Context) ([]jobs.WorkerStatus, error) {
	ws, err := queue.WorkerStatuses(ctx, f.nc, f.cfg.Subjects, workersWait)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return ws, nil
}
