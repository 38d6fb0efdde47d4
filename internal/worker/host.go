package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpexec/mcpexec/internal/errs"
	"github.com/mcpexec/mcpexec/internal/jobclock"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/queue"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

// natsHost relays a sandbox's calls to the front-ends and its output to the
// job's output subject. Each call carries the job's capability and attempt; the
// method and the server it names were chosen by sandbox code, so only known
// methods leave the worker, and the server only selects a subject.
type natsHost struct {
	nc         *nats.Conn
	local      *proxy.Local // a front-end in this process, if any
	subj       jobs.Subjects
	job        *jobs.Job
	attempt    int
	capability string
	outSeq     atomic.Uint64 // the last output chunk's sequence number
	// startedSeq is the events sequence its client had written up to once
	// the attempt's start was recorded (proxy.Request.StartedSeq).
	startedSeq atomic.Uint64
	tracer     trace.Tracer
	parent     atomic.Pointer[trace.SpanContext] // the span proxy calls are children of

	startMu sync.Mutex // guards durable, lost; held while durable runs
	// durable, until it has returned nil, makes the attempt's start
	// durable: the run's first call waits for it. A call is an effect, and a
	// start lost with a broker (a power cut before its sync) would let
	// another delivery run the same attempt and repeat it.
	durable queue.Durable
	// lost ends the run when its start turns out to be another delivery's.
	lost func()

	mu sync.Mutex
	// enabled are the catalog servers this run enabled (enable_server):
	// it may call them too.
	enabled []string
}

// setStart is told, once the attempt's start is stored, what makes it
// durable (durable) and what ends the run if it was lost (lost).
func (h *natsHost) setStart(durable queue.Durable, lost func()) {
	h.startMu.Lock()
	defer h.startMu.Unlock()
	h.durable, h.lost = durable, lost
}

// startIsDurable returns once the attempt's start is durable, or says why
// the call may not be made: no effect of the run leaves the worker before.
func (h *natsHost) startIsDurable(ctx context.Context) error {
	h.startMu.Lock()
	defer h.startMu.Unlock()
	if h.durable == nil {
		return nil
	}
	err := h.durable(ctx)
	if err == nil {
		h.durable = nil
		return nil
	}
	if errors.Is(err, queue.ErrHistoryMoved) {
		if h.lost != nil {
			h.lost()
		}
		return fmt.Errorf("the call was not made: the job's start was lost with its broker, and the job will run again (%w)", err)
	}
	return fmt.Errorf("the call was not made: the job's start could not be made durable (%w): the broker may be failing; try the call again", err)
}

// mayUse reports whether the run may call server: it was given to the job,
// or the run enabled it.
func (h *natsHost) mayUse(server string) bool {
	if slices.Contains(h.job.Servers, server) {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Contains(h.enabled, server)
}

// catalogAnswer notes the catalog server a front-end enabled or disabled for
// this run (from its answer to catalog_enable or catalog_disable).
func (h *natsHost) catalogAnswer(method string, res json.RawMessage) {
	var a struct {
		Name     string `json:"name"`
		Enabled  bool   `json:"enabled"`
		Disabled bool   `json:"disabled"`
	}
	if json.Unmarshal(res, &a) != nil || a.Name == "" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.enabled = slices.DeleteFunc(h.enabled, func(s string) bool { return s == a.Name })
	if method == proxy.MethodCatalogEnable && a.Enabled && len(h.enabled) < maxRunEnabled {
		h.enabled = append(h.enabled, a.Name)
	}
}

// maxRunEnabled bounds the catalog servers one run notes as enabled.
const maxRunEnabled = 256

// setParent makes sc the parent of the calls that follow.
func (h *natsHost) setParent(sc trace.SpanContext) { h.parent.Store(&sc) }

// callRetrying makes a proxy call, sending it again (with the same call id)
// when no front-end answered: any call when none was listening, a retryable
// one when its answer did not come within proxyAttempt or said to try again.
func callRetrying(ctx context.Context, nc *nats.Conn, local *proxy.Local, subject string, req proxy.Request, hdr nats.Header) (json.RawMessage, error) {
	first := time.Now()
	for {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if proxy.Retryable(req.Method) {
			actx, cancel = context.WithTimeout(ctx, proxyAttempt)
		}
		res, err := callOnce(actx, nc, local, subject, req, hdr)
		cancel()
		// No answer in time, or an answer that says the call may be sent
		// again (the front-end's state service failing over).
		again := errors.Is(err, proxy.ErrTryAgain) && time.Since(first) < proxyFailover
		lost := proxy.Retryable(req.Method) && (errors.Is(err, context.DeadlineExceeded) || again) && ctx.Err() == nil
		none := errors.Is(err, proxy.ErrNoResponder) && time.Since(first) < proxyNoResponder
		if !lost && !none {
			return res, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// callOnce sends req once: to the front-end in this process when it
// serves subject (local), else over NATS.
func callOnce(ctx context.Context, nc *nats.Conn, local *proxy.Local, subject string, req proxy.Request, hdr nats.Header) (json.RawMessage, error) {
	if local != nil {
		if res, served, err := local.Call(ctx, subject, req, hdr); served {
			return res, err
		}
	}
	return proxy.Call(ctx, nc, subject, req, hdr)
}

func newCallID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails
	return hex.EncodeToString(b[:])
}

func (h *natsHost) Call(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error) {
	if !proxy.KnownMethod(method) {
		return nil, fmt.Errorf("unknown proxy method %q", errs.Clip(method, 40))
	}
	if err := h.startIsDurable(ctx); err != nil {
		return nil, err
	}
	subject := h.subj.ProxyAny()
	server, tool := "", ""
	if proxy.ServerMethod(method) {
		var p struct {
			Server string `json:"server"`
			Tool   string `json:"tool"`
		}
		if err := json.Unmarshal(params, &p); err != nil || p.Server == "" {
			return nil, errors.New("name a server: the call needs a \"server\" parameter")
		}
		if !h.mayUse(p.Server) {
			return nil, fmt.Errorf("server %q was not given to this run (it may use %s): add it to the job's servers", errs.Clip(p.Server, 80), proxy.QuoteNames(h.job.Servers))
		}
		server, tool, subject = p.Server, p.Tool, h.subj.ProxyServer(p.Server)
	}
	ctx, span := h.startCall(ctx, method, server, tool)
	start := time.Now()
	req := proxy.Request{Job: h.job.ID, Attempt: h.attempt, Capability: h.capability, Method: method, Params: params, CallID: newCallID(),
		StartedSeq: h.startedSeq.Load(), Parks: jobclock.From(ctx) != nil}
	hdr := nats.Header{}
	if !tracing.Inject(ctx, hdr) {
		hdr.Set(jobs.TraceHeader, h.job.Trace())
	}
	res, err := callRetrying(ctx, h.nc, h.local, subject, req, hdr)
	tracing.EndCall(span, start, err)
	if err == nil && (method == proxy.MethodCatalogEnable || method == proxy.MethodCatalogDisable) {
		h.catalogAnswer(method, res)
	}
	if errors.Is(err, proxy.ErrNoResponder) {
		if server != "" {
			return nil, fmt.Errorf("no front-end proxies MCP server %q right now: start a front-end that has it, or retry later", server)
		}
		return nil, errors.New("no front-end is answering proxy calls right now: retry later")
	}
	return res, err
}

// startCall starts the client span of a proxy call. method is a known one;
// server is one of the job's; tool was chosen by sandbox code, so it is only
// cleaned and cut.
func (h *natsHost) startCall(ctx context.Context, method, server, tool string) (context.Context, trace.Span) {
	if p := h.parent.Load(); p != nil && p.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, *p)
	}
	attrs := []attribute.KeyValue{tracing.AttrJobID.String(h.job.ID), tracing.AttrAttempt.Int(h.attempt), tracing.AttrMethod.String(method)}
	if server != "" {
		attrs = append(attrs, tracing.AttrServer.String(server))
	}
	if tool != "" {
		attrs = append(attrs, tracing.AttrTool.String(tracing.Clean(tool, 128)))
	}
	return h.tracer.Start(ctx, tracing.SpanProxyCall, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// Output publishes a live output chunk with its proof under the job's
// capability: front-ends show only chunks whose proof checks.
func (h *natsHost) Output(stream, data string) {
	for _, piece := range queue.SplitOutput(data) {
		c := jobs.OutputChunk{Stream: stream, Data: piece, Attempt: h.attempt, Seq: h.outSeq.Add(1)}
		c.Proof = jobs.OutputProof(h.capability, h.job.ID, c)
		if b, err := queue.EncodeOutput(c); err == nil {
			_ = h.nc.Publish(h.subj.Output(h.job.ID), b) // live output is best effort; the result has it all
		}
	}
}
