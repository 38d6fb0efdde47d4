// Package worker pulls jobs from the queue, runs each in a sandbox runtime, records
// its lifecycle events, and relays the sandbox's proxy calls to the front-end that
// submitted the job.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpexec/mcpexec/internal/durable"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/metrics"
	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
	"github.com/mcpexec/mcpexec/internal/state"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

// Config configures a Worker.
type Config struct {
	ID         string
	Pool       string
	Slots      int
	Queue      queue.Config
	OutputCap  int           // bytes kept of each output stream
	Grace      time.Duration // how long Stop lets running jobs finish
	FetchWait  time.Duration // longest wait of one pull request
	RetryDelay time.Duration // delay before a job whose sandbox failed is redelivered
	Logger     *slog.Logger
	// LocalBarrier, when set, is the Barrier of the broker in this process
	// that the worker's connection reaches in process (the embedded
	// default): its barriers go there directly (durable.Fleet.UseLocal).
	LocalBarrier durable.Barrier
	// LocalProxy, when set, is shared with a front-end in this process (the
	// embedded default): the jobs' proxy calls to subjects its responder
	// serves are answered in process (proxy.Local), the others over NATS.
	LocalProxy *proxy.Local
	// SessionIdle ends a session after this long without a job (0: 300 s);
	// MaxSessions caps the sessions this worker holds at once (0: 16).
	SessionIdle time.Duration
	MaxSessions int
	// Metrics, when set, counts the jobs this worker ends by status.
	Metrics *metrics.Metrics
	// FailureThreshold is how many infrastructure failures in a row make the
	// worker stop taking jobs until a probe of its runtime succeeds (0:
	// DefaultFailureThreshold).
	FailureThreshold int
	// Tracing receives the worker's spans (queue wait, sandbox acquire, run,
	// proxy calls); nil: none.
	Tracing trace.TracerProvider
}

// DefaultConfig returns a worker configuration with the given id.
func DefaultConfig(id string) Config {
	return Config{
		ID:         id,
		Pool:       jobs.DefaultPool,
		Slots:      4,
		Queue:      queue.DefaultConfig(),
		OutputCap:  sandbox.DefaultOutputCap,
		Grace:      30 * time.Second,
		FetchWait:  2 * time.Second,
		RetryDelay: time.Second,
	}
}

// Worker runs jobs. Start begins pulling; Stop drains.
type Worker struct {
	cfg    Config
	nc     *nats.Conn
	client *queue.Client
	verify *queue.Verifier // job messages' signatures
	state  *state.Client   // a job's history, for the jobs this worker holds
	rt     sandbox.Runtime
	log    *slog.Logger
	tracer trace.Tracer

	mu        sync.Mutex // guards cancel, stopJob, svc, statusSub
	cancel    context.CancelFunc
	stopJob   context.CancelFunc
	svc       micro.Service
	statusSub *nats.Subscription
	loop      sync.WaitGroup // the fetch loops and the probe loop
	running   sync.WaitGroup // jobs in flight
	inFlight  atomic.Int64   // jobs in flight
	sess      *sessionTable  // set by Start; see session.go
	health    *health
	langs     []string // the languages rt runs: one consumer and fetch loop each
}

// New returns a Worker that runs jobs on rt.
func New(nc *nats.Conn, rt sandbox.Runtime, cfg Config) (*Worker, error) {
	if cfg.Slots < 1 {
		return nil, fmt.Errorf("worker slots must be at least 1, got %d", cfg.Slots)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	client, err := queue.NewClient(nc, cfg.Queue.Subjects)
	if err != nil {
		return nil, err
	}
	if cfg.LocalBarrier != nil {
		client.UseLocalBarrier(cfg.LocalBarrier)
	}
	return &Worker{cfg: cfg, nc: nc, client: client, verify: queue.NewVerifier(nc, cfg.Queue.Subjects), state: state.NewClient(nc, cfg.Queue.Subjects),
		rt: rt, log: cfg.Logger.With("worker", cfg.ID), tracer: tracing.Tracer(cfg.Tracing),
		health: newHealth(cfg.FailureThreshold), langs: sandbox.Languages(rt)}, nil
}

// Start creates the pool's consumers, one per language the runtime runs, and
// begins pulling jobs. While the broker has not created the streams and
// buckets they need yet (it is starting too), Start waits for them, saying so,
// until ctx ends.
func (w *Worker) Start(ctx context.Context) error {
	var conss []jetstream.Consumer
	var sessCons jetstream.Consumer
	err := w.awaitBroker(ctx, func(ctx context.Context) error {
		conss = conss[:0]
		for _, lang := range w.langs {
			cons, err := queue.WorkerConsumer(ctx, w.client.JetStream(), w.cfg.Queue, w.cfg.Pool, lang)
			if err != nil {
				return needs("the jobs stream "+w.cfg.Queue.Subjects.JobsStream(), err)
			}
			conss = append(conss, cons)
		}
		var err error
		sessCons, err = w.openSessions(ctx)
		return err
	})
	if err != nil {
		return err
	}
	svc, err := micro.AddService(w.nc, micro.Config{
		Name:        w.cfg.Queue.Subjects.WorkerService(),
		Version:     "0.1.0",
		Description: "mcpexec worker " + w.cfg.ID,
		Metadata:    map[string]string{"worker": w.cfg.ID, "pool": w.cfg.Pool, "slots": fmt.Sprint(w.cfg.Slots)},
	})
	if err != nil {
		w.dropSessions()
		return fmt.Errorf("register worker service: %w", err)
	}
	statusSub, err := w.nc.Subscribe(w.cfg.Queue.Subjects.WorkerStatus(), w.answerStatus)
	if err != nil {
		_ = svc.Stop() // the start failed: its error is the one to report
		w.dropSessions()
		return fmt.Errorf("answer status requests: %w", err)
	}
	loopCtx, cancel := context.WithCancel(context.Background())
	jobsCtx, stopJobs := context.WithCancel(context.Background())
	w.mu.Lock()
	w.cancel, w.stopJob, w.svc, w.statusSub = cancel, stopJobs, svc, statusSub
	w.mu.Unlock()
	slots := make(chan struct{}, w.cfg.Slots) // shared by the languages' loops
	w.loop.Add(1 + len(conss))
	for _, cons := range conss {
		go func() {
			defer w.loop.Done()
			w.fetchLoop(loopCtx, jobsCtx, cons, slots)
		}()
	}
	go func() {
		defer w.loop.Done()
		w.probeLoop(loopCtx)
	}()
	w.startSessions(loopCtx, jobsCtx, sessCons)
	w.log.Info("worker started", "pool", w.cfg.Pool, "slots", w.cfg.Slots, "languages", w.langs)
	return nil
}

// Stop stops taking jobs, lets running ones finish within the grace period, then
// cancels the rest (their messages are handed back for redelivery). Idempotent.
func (w *Worker) Stop() {
	w.mu.Lock()
	cancel, stopJobs, svc, statusSub := w.cancel, w.stopJob, w.svc, w.statusSub
	w.cancel, w.stopJob, w.svc, w.statusSub = nil, nil, nil, nil
	w.mu.Unlock()
	if cancel == nil {
		return
	}
	if err := svc.Stop(); err != nil {
		w.log.Warn("stop worker service", "err", err)
	}
	if err := statusSub.Unsubscribe(); err != nil {
		w.log.Debug("stop answering status requests", "err", err)
	}
	cancel()
	w.loop.Wait()
	done := make(chan struct{})
	go func() { w.running.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(w.cfg.Grace):
		w.log.Warn("grace period over: handing back running jobs", "grace", w.cfg.Grace)
		stopJobs()
		<-done
	}
	stopJobs()
	w.closeSessions()
}

// delivery is one delivery of a job message being handled.
type delivery struct {
	msg        jetstream.Msg
	job        jobs.Job
	capability string
	// sessionCapability is the capability of the job's session, if it
	// names one: the proof of this worker's entry in the sessions bucket.
	sessionCapability string
	// claimSeq is the job message's ClaimSeq: on a first delivery, the
	// start is recorded on condition that the claim is the job's last
	// event, instead of reading the job's history first.
	claimSeq uint64
	// lastStartSeq is, on a delivery that read the job's history, the
	// sequence of the job's last start it found: its start is recorded on
	// condition that none came since.
	lastStartSeq uint64
	// token names this delivery in its start's message id
	// (queue.PublishStart).
	token   string
	attempt int
	log     *slog.Logger
	// span is the job's queue wait span (the job's submit span's child):
	// the parent of the attempt's spans and of its events.
	span trace.SpanContext
}

// traced returns ctx with the delivery's span as the parent of what starts
// from it.
func (d *delivery) traced(ctx context.Context) context.Context {
	if !d.span.IsValid() {
		return ctx
	}
	return trace.ContextWithSpanContext(ctx, d.span)
}

func (w *Worker) handle(ctx context.Context, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		w.settle(ctx, &delivery{msg: msg, log: w.log}, outcome{kind: undecodable, err: err})
		return
	}
	o := outcome{delivery: int(meta.NumDelivered), maxDeliver: w.cfg.Queue.MaxDeliver}
	m, err := queue.DecodeMessage(msg.Data())
	if err != nil {
		w.log.Error("dropping undecodable job message", "seq", meta.Sequence.Stream, "err", err)
		w.settle(ctx, &delivery{msg: msg, log: w.log}, outcome{kind: undecodable, err: err})
		return
	}
	if err := w.verify.Verify(ctx, msg.Data(), msg.Headers().Get(jobs.SignatureHeader)); err != nil {
		d := &delivery{msg: msg, log: w.log}
		if errors.Is(err, queue.ErrForgedJob) {
			// Not published by a front-end: never run, never recorded (its
			// id, namespace and session are the forger's word).
			w.log.Error("dropping a forged job message", "seq", meta.Sequence.Stream, "subject", msg.Subject(), "claimed_job", m.ID, "err", err)
			w.settle(ctx, d, outcome{kind: undecodable, err: err})
			return
		}
		w.log.Warn("cannot check a job message's signature yet: retrying it", "job", m.ID, "err", err)
		w.settle(ctx, d, outcome{kind: transient, err: err, delivery: o.delivery, maxDeliver: o.maxDeliver})
		return
	}
	d := &delivery{msg: msg, job: m.Job, capability: m.Capability, sessionCapability: m.SessionCapability, claimSeq: m.ClaimSeq,
		token: queue.NewDeliveryToken()}
	d.span = w.queueWait(ctx, msg, &m.Job, o.delivery)
	d.log = w.log.With("job", m.ID, "delivery", o.delivery, "trace_id", d.span.TraceID().String())
	o.maxAttempts = max(d.job.MaxAttempts, 1)
	w.settle(ctx, d, w.run(ctx, d, o))
}

// run takes a delivery as far as it goes and returns its outcome.
func (w *Worker) run(ctx context.Context, d *delivery, o outcome) outcome {
	runCtx, cancelRun := context.WithCancelCause(ctx)
	defer cancelRun(nil)
	// Listen for a cancellation before looking for one already recorded, so that
	// none falls between the two: a job cancelled while queued never runs.
	cancelSub, err := w.nc.Subscribe(w.client.Subjects().Cancel(d.job.ID), func(m *nats.Msg) {
		if _, err := queue.DecodeCancel(d.job.ID, m.Data); err != nil {
			// Not a front-end's announcement: the job runs on (a cancel
			// is recorded before it is announced, so none is lost).
			d.log.Warn("refusing a cancel announcement", "err", err)
			return
		}
		cancelRun(errCancelled)
	})
	if err != nil {
		o.kind, o.err = transient, fmt.Errorf("listen for cancellation: %w", err)
		return o
	}
	defer func() {
		if err := cancelSub.Unsubscribe(); err != nil {
			d.log.Debug("stop listening for cancellation", "err", err)
		}
	}()
	// A first delivery of a job its front-end claimed has, unless its
	// claim is no longer its last event, no history: its start is then
	// recorded on that condition (recordStart), which fails, storing
	// nothing, if anything was recorded since. Any other delivery reads
	// the history first.
	firstStart := d.claimSeq > 0 && o.delivery == 1
	if firstStart {
		o.attempt, d.attempt = 1, 1
		d.log = d.log.With("attempt", o.attempt)
	} else if !w.lookUpHistory(ctx, d, &o) {
		return o
	}
	if d.job.Session != "" {
		kind, err, ok := w.admit(ctx, d)
		if !ok {
			o.kind, o.err = kind, err
			return o
		}
		defer w.releaseSession(&d.job)
	}
	hbDone := make(chan struct{})
	defer close(hbDone)
	go w.heartbeat(d.msg, hbDone)

	host := &natsHost{nc: w.nc, local: w.cfg.LocalProxy, subj: w.client.Subjects(), job: &d.job, attempt: o.attempt, capability: d.capability, tracer: w.tracer}
	host.setParent(d.span)
	spans := w.attemptSpans(ctx, d, host)
	started := false
	recordStart := func() error {
		// Retried like the outcome: a start that landed but whose ack was
		// lost in a failover would otherwise count as an attempt whose
		// worker was lost, and end a job of max_attempts 1 worker_lost.
		if started {
			// A runtime that sends the code again (to another container,
			// the same attempt) finds its start recorded.
			return nil
		}
		ev := jobs.Event{Job: d.job.ID, Kind: jobs.EventStarted, Attempt: o.attempt, Worker: w.cfg.ID,
			Proof: jobs.EventProof(d.capability, jobs.EventStarted, o.attempt)}
		after := queue.StartAfter{LastStartSeq: d.lastStartSeq}
		if firstStart {
			after = queue.StartAfter{ClaimSeq: d.claimSeq}
		}
		durable, err := w.publishStart(ctx, d, ev, after)
		started = err == nil
		if started {
			host.setStart(durable, func() { cancelRun(errStartLost) })
			host.startedSeq.Store(w.client.EventsSeq())
			spans.running()
		}
		return err
	}
	sj := sandbox.Job{ID: d.job.ID, Code: d.job.Code, Language: d.job.Language, Servers: d.job.Servers, Timeout: d.job.TimeoutDuration(), OutputCap: w.cfg.OutputCap,
		Memory: int64(d.job.MemoryMB) << 20, CPUs: d.job.CPUs, Tenant: jobs.NamespaceOf(d.job.Namespace)}
	if _, ok := w.rt.(sandbox.StartReporter); ok {
		sj.BeforeExec = recordStart // the attempt begins when the code is sent
		sj.OnSandbox = spans.sandbox
		spans.acquiring()
	} else if err := recordStart(); err != nil {
		o.kind, o.err = d.notStarted(err), err
		return o
	}
	if sj.Files, err = w.inputFiles(runCtx, d); err != nil {
		if !inputsFailed(err) {
			o.kind, o.err = transient, err
			return o
		}
		o.kind, o.result = ranToEnd, sandbox.Result{Status: sandbox.StatusError, ExitCode: -1, Error: err.Error()}
		return o
	}
	fl := d.job.FilesLimits()
	sj.FileLimits = sandbox.FileLimits{MaxFiles: fl.MaxFiles, MaxFileBytes: fl.MaxFileBytes, MaxJobBytes: fl.MaxJobBytes}
	res, runErr := w.runSandbox(runCtx, &d.job, sj, host)
	spans.end(res, runErr)
	o.started, o.result = started, res
	if runErr == nil && (len(res.Files) > 0 || len(res.Notes) > 0) {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeFilesWait)
		o.files, o.notes = w.storeFiles(sctx, d, o.attempt, res)
		cancel()
	}
	switch {
	case errors.Is(context.Cause(runCtx), errCancelled):
		o.kind = cancelledRunning
	case errors.Is(context.Cause(runCtx), errStartLost):
		d.log.Warn("the job's start was lost with its broker before any call: handing it back to read its history")
		o.kind = historyMoved
	case ctx.Err() != nil:
		d.log.Warn("worker stopping: handing job back")
		o.kind = stopping
	case errors.Is(runErr, sandbox.ErrNotStarted):
		o.kind, o.err = d.notStarted(runErr), runErr
	case runErr != nil:
		d.log.Error("sandbox failed", "err", runErr, "code_started", started)
		o.kind, o.err = infraFailure, runErr
	default:
		o.kind = ranToEnd
		d.log.Info("job finished", "status", res.Status, "duration_ms", res.Duration.Milliseconds())
	}
	return o
}

var errCancelled = errors.New("job cancelled")

// errStartLost ends a run whose start turned out not to be durable, nor its
// delivery's, when its first call asked (natsHost.startIsDurable).
var errStartLost = errors.New("the job's start was lost")

// lookUpHistory reads job d's history from the state service and sets the
// delivery's attempt from it. It returns false, with o's kind set, when the
// job is not to run.
func (w *Worker) lookUpHistory(ctx context.Context, d *delivery, o *outcome) bool {
	// The state service reads the job's events for us, with its capability.
	h, err := w.state.JobHistory(ctx, d.job.ID, d.capability)
	switch {
	case errors.Is(err, state.ErrInvalid):
		// Its capability does not prove the job: nothing this worker
		// recorded of it would be applied, so it is not run.
		d.log.Error("job message without its job's capability: dropping it", "err", err)
		o.kind, o.err = undecodable, err
		return false
	case err != nil:
		o.kind, o.err = transient, err
		return false
	}
	o.attempt, d.attempt, d.lastStartSeq = h.LastAttempt+1, h.LastAttempt+1, h.LastStartSeq
	d.log = d.log.With("attempt", o.attempt)
	switch {
	case h.Cancelled:
		d.log.Info("job was cancelled while queued: not running it")
		o.kind = cancelledQueued
		return false
	case h.Finished:
		// Its worker recorded the outcome but the ack was lost (a broker
		// node died between them): running it again would repeat its effects.
		d.log.Info("job's outcome is already recorded: not running it again")
		o.kind = finishedAlready
		return false
	case o.attempt > o.maxAttempts:
		d.log.Warn("job exhausted its attempts: recording worker_lost")
		o.kind = exhausted
		return false
	}
	return true
}

// notStarted is the outcome of a delivery whose start was not recorded
// (err): one whose job has events after its claim goes back at once, to be
// delivered again with its history read; else the broker failed.
func (d *delivery) notStarted(err error) outcomeKind {
	if errors.Is(err, queue.ErrHistoryMoved) {
		d.log.Info("the job has events since its claim: handing it back to read its history")
		return historyMoved
	}
	return transient
}

// settle carries out decide's verdict on a delivery: it records the outcome
// (when there is one), then acknowledges, retries, hands back or terminates
// the message. A message whose outcome could not be recorded is retried, so
// the outcome is not lost.
func (w *Worker) settle(ctx context.Context, d *delivery, o outcome) {
	w.health.observe(o)
	v := decide(o, w.cfg.RetryDelay)
	if v.result != nil {
		attempt := max(o.attempt, 1)
		if err := w.record(ctx, d, attempt, *v.result); err != nil {
			d.log.Error("record result", "err", err)
			v = verdict{action: actRetry, delay: w.cfg.RetryDelay}
		}
	}
	var err error
	switch v.action {
	case actAck:
		// Not waited for: the outcome (or the cancellation, or the
		// forwarded copy) is durable before this, and a lost ack only
		// brings a redelivery that finds it and is acked without running.
		// Waiting cost every job one more replicated, fsynced round trip
		// while it held its slot.
		err = d.msg.Ack()
	case actRetry:
		if o.kind == infraFailure || o.kind == transient {
			d.log.Warn("job goes back to the queue", "why", errText(o.err), "delay", v.delay)
		}
		err = d.msg.NakWithDelay(v.delay)
	case actHandBack:
		err = d.msg.Nak()
	case actTerm:
		err = d.msg.TermWithReason("not a job message")
	}
	if err != nil {
		// JetStream redelivers a message it did not hear about after AckWait;
		// the recorded outcome (if any) fences the redelivery.
		d.log.Warn("settle job message", "action", v.action, "err", err)
	}
}

// heartbeat tells JetStream the job is still being worked on, so a long job is not
// redelivered while a dead worker's job is, within AckWait.
func (w *Worker) heartbeat(msg jetstream.Msg, done <-chan struct{}) {
	t := time.NewTicker(w.cfg.Queue.Heartbeat())
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			_ = msg.InProgress() // a lost heartbeat costs at most a redelivery, which attempts fence
		}
	}
}

// Bounds of a proxy call's retries while the cluster fails over.
const (
	// proxyAttempt bounds one attempt of a retryable call: a request that
	// was in flight on a node as it died gets no answer, and the next
	// attempt (same call id) goes through another.
	proxyAttempt = 8 * time.Second
	// proxyNoResponder is how long a call waits for a front-end to answer
	// at all (every front-end reconnecting, or restarting).
	proxyNoResponder = 15 * time.Second
	// proxyFailover is how long a retryable call is sent again while its
	// answers say to try again (the front-end's state service failing
	// over); the last such answer's error is then the call's.
	proxyFailover = 30 * time.Second
)
