// Package worker pulls jobs from the queue, runs each in a sandbox runtime, records
// its lifecycle events, and relays the sandbox's proxy calls to the front-end that
// submitted the job.
package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/metrics"
	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/sandbox"
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
	// SessionIdle ends a session after this long without a job (0: 300 s);
	// MaxSessions caps the sessions this worker holds at once (0: 16).
	SessionIdle time.Duration
	MaxSessions int
	// Metrics, when set, counts the jobs this worker ends by status.
	Metrics *metrics.Metrics
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
	rt     sandbox.Runtime
	log    *slog.Logger

	mu      sync.Mutex // guards cancel, stopJob, svc
	cancel  context.CancelFunc
	stopJob context.CancelFunc
	svc     micro.Service
	loop    sync.WaitGroup // the fetch loops
	running sync.WaitGroup // jobs in flight
	sess    *sessionTable  // set by Start; see session.go
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
	return &Worker{cfg: cfg, nc: nc, client: client, rt: rt, log: cfg.Logger.With("worker", cfg.ID)}, nil
}

// Start creates the pool's consumer and begins pulling jobs.
func (w *Worker) Start(ctx context.Context) error {
	cons, err := queue.WorkerConsumer(ctx, w.client.JetStream(), w.cfg.Queue, w.cfg.Pool)
	if err != nil {
		return err
	}
	sessCons, err := w.openSessions(ctx)
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
		return fmt.Errorf("register worker service: %w", err)
	}
	loopCtx, cancel := context.WithCancel(context.Background())
	jobsCtx, stopJobs := context.WithCancel(context.Background())
	w.mu.Lock()
	w.cancel, w.stopJob, w.svc = cancel, stopJobs, svc
	w.mu.Unlock()
	w.loop.Add(1)
	go func() {
		defer w.loop.Done()
		w.fetchLoop(loopCtx, jobsCtx, cons)
	}()
	w.startSessions(loopCtx, jobsCtx, sessCons)
	w.log.Info("worker started", "pool", w.cfg.Pool, "slots", w.cfg.Slots)
	return nil
}

// Stop stops taking jobs, lets running ones finish within the grace period, then
// cancels the rest (their messages are handed back for redelivery). Idempotent.
func (w *Worker) Stop() {
	w.mu.Lock()
	cancel, stopJobs, svc := w.cancel, w.stopJob, w.svc
	w.cancel, w.stopJob, w.svc = nil, nil, nil
	w.mu.Unlock()
	if cancel == nil {
		return
	}
	_ = svc.Stop()
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

func (w *Worker) fetchLoop(ctx, jobsCtx context.Context, cons jetstream.Consumer) {
	slots := make(chan struct{}, w.cfg.Slots)
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		n := 1
	more:
		for n < w.cfg.Slots {
			select {
			case slots <- struct{}{}:
				n++
			default:
				break more
			}
		}
		// Take what is pending for the free slots at once; only when nothing is
		// pending wait (up to FetchWait) for the next job. A Fetch of n would
		// hold freed slots idle until n jobs arrived or the wait expired.
		fctx, cancelFetch := context.WithTimeout(ctx, w.cfg.FetchWait)
		got := 0
		batch, err := cons.FetchNoWait(n)
		for attempt := 0; err == nil; attempt++ {
			for msg := range batch.Messages() {
				got++
				w.running.Add(1)
				go func() {
					defer w.running.Done()
					defer func() { <-slots }()
					w.handle(jobsCtx, msg)
				}()
			}
			err = batch.Error()
			if got > 0 || attempt > 0 || (err != nil && !errors.Is(err, nats.ErrTimeout)) {
				break
			}
			batch, err = cons.Fetch(1, jetstream.FetchContext(fctx))
		}
		cancelFetch()
		for range n - got {
			<-slots
		}
		if err != nil && ctx.Err() == nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
			w.log.Warn("fetch jobs", "err", err)
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
				return
			}
		}
	}
}

// disposition is what happens to a job message after a delivery was handled.
type disposition int

const (
	ack   disposition = iota // the job has its terminal event: remove it
	retry                    // hand it back for another attempt
)

// decide is the one place that chooses between ack and retry.
// runErr is the sandbox's infrastructure failure (not the code's); stopping says
// the worker is shutting down and the run was interrupted.
func decide(attempt, maxAttempts int, runErr error, stopping bool) disposition {
	if runErr == nil {
		return ack
	}
	if stopping || attempt < maxAttempts {
		return retry
	}
	return ack
}

func (w *Worker) handle(ctx context.Context, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		_ = msg.TermWithReason("no metadata")
		return
	}
	attempt := int(meta.NumDelivered)
	m, err := queue.DecodeMessage(msg.Data())
	if err != nil {
		w.log.Error("dropping undecodable job message", "seq", meta.Sequence.Stream, "err", err)
		_ = msg.TermWithReason("undecodable job")
		return
	}
	job, capability := m.Job, m.Capability
	trace := msg.Headers().Get(jobs.TraceHeader)
	if trace == "" {
		trace = jobs.TraceParent(job.ID)
	}
	log := w.log.With("job", job.ID, "attempt", attempt, "trace_id", jobs.TraceID(trace))
	if job.MaxAttempts < 1 {
		job.MaxAttempts = 1
	}
	if attempt > job.MaxAttempts {
		log.Warn("job exhausted its attempts: recording worker_lost")
		w.finish(ctx, msg, &job, capability, attempt, jobs.Result{
			Status: jobs.StatusWorkerLost,
			Error:  fmt.Sprintf("the worker running this job was lost %d time(s) (max_attempts %d)", attempt-1, job.MaxAttempts),
		})
		return
	}
	runCtx, cancelRun := context.WithCancelCause(ctx)
	defer cancelRun(nil)
	// Listen for a cancellation before looking for one already recorded, so that
	// none falls between the two: a job cancelled while queued never runs.
	cancelSub, err := w.nc.Subscribe(w.client.Subjects().Cancel(job.ID), func(*nats.Msg) {
		cancelRun(errCancelled)
	})
	if err == nil {
		defer cancelSub.Unsubscribe()
	}
	if cancelled, err := w.client.Cancelled(ctx, job.ID); err != nil {
		log.Warn("check cancellation", "err", err)
		_ = msg.NakWithDelay(w.cfg.RetryDelay)
		return
	} else if cancelled {
		log.Info("job was cancelled while queued: not running it")
		_ = msg.Ack()
		return
	}
	if job.Session != "" {
		if !w.admit(ctx, msg, m, attempt) {
			return
		}
		defer w.releaseSession(&job)
	}
	if err := w.client.PublishEvent(ctx, jobs.Event{Job: job.ID, Kind: jobs.EventStarted, Attempt: attempt, Worker: w.cfg.ID, Proof: jobs.EventProof(capability, jobs.EventStarted, attempt)}); err != nil {
		log.Warn("record start", "err", err)
		_ = msg.NakWithDelay(w.cfg.RetryDelay)
		return
	}
	hbDone := make(chan struct{})
	defer close(hbDone)
	go w.heartbeat(msg, hbDone)

	host := &natsHost{nc: w.nc, subj: w.client.Subjects(), job: &job, attempt: attempt, capability: capability}
	start := time.Now()
	res, runErr := w.runSandbox(runCtx, &job, sandbox.Job{
		ID: job.ID, Code: job.Code, Servers: job.Servers,
		Timeout: job.TimeoutDuration(), OutputCap: w.cfg.OutputCap,
	}, host)
	switch {
	case errors.Is(context.Cause(runCtx), errCancelled):
		w.finish(ctx, msg, &job, capability, attempt, jobs.Result{Status: jobs.StatusCancelled, Error: "cancelled while running",
			Stdout: res.Stdout, Stderr: res.Stderr, DurationMS: time.Since(start).Milliseconds()})
		return
	case ctx.Err() != nil:
		log.Warn("worker stopping: handing job back")
		_ = msg.Nak()
		return
	}
	if runErr != nil {
		log.Error("sandbox failed", "err", runErr)
		if decide(attempt, job.MaxAttempts, runErr, false) == retry {
			_ = msg.NakWithDelay(w.cfg.RetryDelay)
			return
		}
		w.finish(ctx, msg, &job, capability, attempt, jobs.Result{Status: jobs.StatusError, SandboxFailed: true,
			Error: fmt.Sprintf("the sandbox failed: %v", runErr), DurationMS: time.Since(start).Milliseconds()})
		return
	}
	w.finish(ctx, msg, &job, capability, attempt, resultOf(res))
	log.Info("job finished", "status", res.Status, "duration_ms", res.Duration.Milliseconds())
}

var errCancelled = errors.New("job cancelled")

// resultOf maps a sandbox result to a job result.
func resultOf(r sandbox.Result) jobs.Result {
	st := jobs.StatusError
	switch r.Status {
	case sandbox.StatusSuccess:
		st = jobs.StatusSuccess
	case sandbox.StatusTimeout:
		st = jobs.StatusTimeout
	}
	return jobs.Result{
		Status: st, ExitCode: r.ExitCode, Stdout: r.Stdout, Stderr: r.Stderr,
		StdoutTruncated: r.StdoutTruncated, StderrTruncated: r.StderrTruncated,
		Error: r.Error, DurationMS: r.Duration.Milliseconds(),
	}
}

// finish records the terminal event and acknowledges the job message. When the
// event cannot be recorded the message is handed back so the outcome is not lost.
func (w *Worker) finish(ctx context.Context, msg jetstream.Msg, job *jobs.Job, proof string, attempt int, res jobs.Result) {
	res.Worker, res.Attempt = w.cfg.ID, attempt
	ev := jobs.Event{Job: job.ID, Kind: jobs.EventFinished, Attempt: attempt, Worker: w.cfg.ID, Result: &res, Proof: jobs.EventProof(proof, jobs.EventFinished, attempt)}
	pubCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err := w.client.PublishEvent(pubCtx, ev)
	if err != nil && isTooLarge(err) {
		shrinkOutput(&res, int(w.nc.MaxPayload())/4)
		err = w.client.PublishEvent(pubCtx, ev)
	}
	if err != nil {
		w.log.Error("record result", "job", job.ID, "err", err)
		_ = msg.NakWithDelay(w.cfg.RetryDelay)
		return
	}
	w.cfg.Metrics.WorkerJob(string(res.Status))
	if err := msg.DoubleAck(pubCtx); err != nil {
		w.log.Warn("ack job", "job", job.ID, "err", err)
	}
}

func isTooLarge(err error) bool {
	return errors.Is(err, nats.ErrMaxPayload)
}

func shrinkOutput(res *jobs.Result, limit int) {
	if len(res.Stdout) > limit {
		res.Stdout, res.StdoutTruncated = res.Stdout[:limit], true
	}
	if len(res.Stderr) > limit {
		res.Stderr, res.StderrTruncated = res.Stderr[:limit], true
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
			_ = msg.InProgress()
		}
	}
}

// natsHost relays a sandbox's calls to the front-ends and its output to the
// job's output subject. Each call carries the job's capability and attempt; the
// method and the server it names were chosen by sandbox code, so only known
// methods leave the worker, and the server only selects a subject.
type natsHost struct {
	nc         *nats.Conn
	subj       jobs.Subjects
	job        *jobs.Job
	attempt    int
	capability string
}

func (h *natsHost) Call(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error) {
	if !proxy.KnownMethod(method) {
		return nil, fmt.Errorf("unknown proxy method %q", truncate(method, 40))
	}
	subject := h.subj.ProxyAny()
	server := ""
	if proxy.ServerMethod(method) {
		var p struct {
			Server string `json:"server"`
		}
		if err := json.Unmarshal(params, &p); err != nil || p.Server == "" {
			return nil, errors.New("name a server: the call needs a \"server\" parameter")
		}
		if !slices.Contains(h.job.Servers, p.Server) {
			return nil, fmt.Errorf("server %q was not given to this run (it may use %s): add it to the job's servers", truncate(p.Server, 80), quoteList(h.job.Servers))
		}
		server, subject = p.Server, h.subj.ProxyServer(p.Server)
	}
	res, err := proxy.Call(ctx, h.nc, subject, proxy.Request{Job: h.job.ID, Attempt: h.attempt, Capability: h.capability, Method: method, Params: params},
		nats.Header{jobs.TraceHeader: []string{jobs.TraceParent(h.job.ID)}})
	if errors.Is(err, proxy.ErrNoResponder) {
		if server != "" {
			return nil, fmt.Errorf("no front-end proxies MCP server %q right now: start a front-end that has it, or retry later", server)
		}
		return nil, errors.New("no front-end is answering proxy calls right now: retry later")
	}
	return res, err
}

func (h *natsHost) Output(stream, data string) {
	b, _ := json.Marshal(map[string]string{"stream": stream, "data": data}) // strings always encode
	_ = h.nc.Publish(h.subj.Output(h.job.ID), b)                            // live output is best effort; the result has it all
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func quoteList(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}
