// Package proxyresp answers the proxy calls of the fleet's sandboxes, which
// arrive over NATS (the wire protocol is package proxy): it checks each call's
// capability against the fleet's proxy key and its attempt against the job's
// record, then serves it from the MCP client pool (call_tool, the docs
// helpers), the namespace's memory, its saved tools or its server catalog.
// The front-end (package frontend) builds a Responder and starts it with the
// proxy key; the catalog and saved-tool methods also serve the front-end's
// callers.
package proxyresp

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpexec/mcpexec/internal/audit"
	"github.com/mcpexec/mcpexec/internal/discovery"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/metrics"
	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/state"
	"github.com/mcpexec/mcpexec/internal/toolrules"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

// ToolSource is the MCP client pool as the proxy uses it; *mcpclients.Pool is one.
type ToolSource interface {
	Servers() []discovery.Server
	Tools(ctx context.Context, server string) ([]mcp.Tool, error)
	CallTool(ctx context.Context, server, tool string, args map[string]any) (*mcp.CallToolResult, error)
}

// MemoryStore is the state service's memory API; *state.Client is one.
type MemoryStore interface {
	MemoryGet(ctx context.Context, ns, key string) (*state.Memory, error)
	MemoryPutQuota(ctx context.Context, m state.Memory, ifVersion *uint64, maxBytes int64) (*state.Memory, error)
	MemoryList(ctx context.Context, ns, prefix string) ([]state.Memory, error)
	MemoryDelete(ctx context.Context, ns, key string) (bool, error)
}

// Records is where job records come from; *state.Client is one.
type Records interface {
	Job(ctx context.Context, id string) (*jobs.Record, error)
}

var (
	_ MemoryStore = (*state.Client)(nil)
	_ Records     = (*state.Client)(nil)
)

// Policy is what of a namespace's policy the proxy goes by.
type Policy struct {
	// Servers are the MCP servers the namespace may call; empty allows all.
	Servers []string
	// MemoryBytes caps the bytes of its memory (0: no cap).
	MemoryBytes int64
	// Redact hides secrets in the audit's previews of its calls' arguments
	// (nil: audit.DefaultRedactor).
	Redact *audit.Redactor
	// Tools are its compiled tool rules; nil allows every call.
	Tools *toolrules.Rules
	// Approvals bound its calls waiting for approval (zero: the defaults).
	Approvals ApprovalLimits
}

// allowsServer reports whether the namespace may use server.
func (p Policy) allowsServer(server string) bool {
	return len(p.Servers) == 0 || slices.Contains(p.Servers, server)
}

// Proxy defaults.
const (
	DefaultCallTimeout    = 60 * time.Second
	DefaultMaxCallsPerJob = 8
	// Grace is how long a stopping responder keeps answering the proxy calls
	// in flight (new ones go to the other front-ends).
	Grace = 10 * time.Second
)

// Config configures a Responder.
type Config struct {
	// ID is the front-end's id, as its spans name it.
	ID string
	// Local, when set, is where a worker of this process finds this
	// responder, to have its calls answered in process (proxy.Local).
	Local    *proxy.Local
	Subjects jobs.Subjects
	Logger   *slog.Logger
	// Tools is the MCP client pool; nil means no MCP servers are configured.
	Tools ToolSource
	// Memory backs the memory helpers, saved tools and the catalog's enabled
	// sets; nil: none of them is available.
	Memory MemoryStore
	// Records are the jobs' records the calls are checked against.
	Records Records
	// Policy returns namespace ns's policy; nil: no namespace has limits.
	Policy func(ns string) Policy
	// CallTimeout bounds one proxied tool call unless the code asks for another
	// (default DefaultCallTimeout); the job's deadline always bounds it.
	CallTimeout time.Duration
	// MaxCallsPerJob caps one job's proxy calls in flight; more wait for a slot
	// (default DefaultMaxCallsPerJob).
	MaxCallsPerJob int
	// Metrics, when set, records proxy call latency.
	Metrics *metrics.Metrics
	// Tracing receives a span per call answered; nil: none.
	Tracing trace.TracerProvider
	// OnCatalogChange, when set, is told of a namespace that enabled or
	// disabled a catalog server.
	OnCatalogChange func(ns string)
	// Audit, when set, records every call_tool (package audit).
	Audit Auditor
}

// Responder answers the proxy calls of every running job of the fleet.
type Responder struct {
	cfg       Config
	log       *slog.Logger
	tracer    trace.Tracer
	key       []byte // the fleet's proxy key, set by Start
	access    *accessCache
	approvals *approvals
	responder *proxy.Responder
}

// New returns a Responder on nc; it answers nothing until Start.
func New(nc *nats.Conn, cfg Config) *Responder {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.MaxCallsPerJob <= 0 {
		cfg.MaxCallsPerJob = DefaultMaxCallsPerJob
	}
	if cfg.Policy == nil {
		cfg.Policy = func(string) Policy { return Policy{} }
	}
	r := &Responder{cfg: cfg, log: cfg.Logger, tracer: tracing.Tracer(cfg.Tracing),
		access: newAccessCache(cfg.Records, cfg.MaxCallsPerJob), approvals: newApprovals(nc, cfg.Subjects, cfg.ID)}
	r.access.waited = r.approvals.waited
	var h proxy.Handler = r
	if m := cfg.Metrics; m != nil {
		h = proxy.HandlerFunc(func(ctx context.Context, req proxy.Request) (json.RawMessage, error) {
			start := time.Now()
			res, err := r.Handle(ctx, req)
			m.ProxyCall(proxy.MethodLabel(req.Method), err, time.Since(start))
			return res, err
		})
	}
	r.responder = proxy.NewResponder(nc, jobs.ProxyQueue, r.traced(h))
	return r
}

// Start begins answering proxy calls with the fleet's proxy key: those any
// front-end may answer, and those of the MCP servers Tools holds.
func (r *Responder) Start(key []byte) error {
	r.key = key
	if err := r.responder.Start(r.subjects()...); err != nil {
		return err
	}
	if r.cfg.Local != nil {
		r.cfg.Local.Set(r.responder)
	}
	return nil
}

// SetSubjects answers the proxy calls of the MCP servers Tools holds now
// (after a new discovery): new servers' calls come here, removed ones' no more.
func (r *Responder) SetSubjects() error {
	return r.responder.SetSubjects(r.subjects()...)
}

// Stop stops answering proxy calls; those in flight get Grace to finish.
func (r *Responder) Stop() {
	if r.cfg.Local != nil {
		r.cfg.Local.Clear(r.responder)
	}
	r.responder.Stop(Grace)
}

// subjects are the proxy subjects answered: those any front-end may, and
// those of each MCP server in Tools.
func (r *Responder) subjects() []string {
	subjects := []string{r.cfg.Subjects.ProxyAny()}
	if r.cfg.Tools != nil {
		for _, s := range r.cfg.Tools.Servers() {
			subjects = append(subjects, r.cfg.Subjects.ProxyServer(s.Name))
		}
	}
	return subjects
}

// policyFor returns namespace ns's policy.
func (r *Responder) policyFor(ns string) Policy { return r.cfg.Policy(ns) }

// traced wraps h with a server span per call, the child of the worker's
// call span. Job, server and tool come from the worker (and the tool from
// sandbox code): they are cleaned and cut.
func (r *Responder) traced(h proxy.Handler) proxy.Handler {
	return proxy.HandlerFunc(func(ctx context.Context, req proxy.Request) (json.RawMessage, error) {
		attrs := []attribute.KeyValue{tracing.AttrJobID.String(tracing.Clean(req.Job, 160)), tracing.AttrAttempt.Int(req.Attempt),
			tracing.AttrMethod.String(proxy.MethodLabel(req.Method)), tracing.AttrFrontend.String(r.cfg.ID)}
		if proxy.ServerMethod(req.Method) {
			var p struct {
				Server string `json:"server"`
				Tool   string `json:"tool"`
			}
			if json.Unmarshal(req.Params, &p) == nil && p.Server != "" {
				attrs = append(attrs, tracing.AttrServer.String(tracing.Clean(p.Server, 128)))
			}
			if p.Tool != "" {
				attrs = append(attrs, tracing.AttrTool.String(tracing.Clean(p.Tool, 128)))
			}
		}
		ctx, span := r.tracer.Start(ctx, tracing.SpanProxyHandle, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
		start := time.Now()
		res, err := h.Handle(ctx, req)
		tracing.EndCall(span, start, err)
		return res, err
	})
}
