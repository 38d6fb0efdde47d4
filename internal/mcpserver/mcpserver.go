// Package mcpserver is the MCP surface agents see: the run_python tool, the
// capabilities resource, and the HTTP handler (streamable HTTP at /mcp, /healthz)
// with its Origin and bearer-token checks.
package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpexec/mcpexec/internal/discovery"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/metrics"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

// Options configure the MCP server.
type Options struct {
	Name    string
	Version string
	Servers func() []string // names of proxied servers (the servers enum)
	// Definitions lists the proxied servers for the capabilities manual
	// (catalog servers are left out); nil lists Servers' names only.
	Definitions func() []discovery.Server
	// Catalog is the operator's server catalog (--catalog); nil: none. The
	// catalog servers a namespace enabled join its servers enum.
	Catalog ServerCatalog
	// AgentDiscovery offers the catalog to agents as MCP tools too:
	// find_servers, enable_server and disable_server (--agent-discovery).
	AgentDiscovery bool
	// Namespace returns the memory namespace of the caller (from its token over
	// HTTP; jobs.DefaultNamespace on stdio). nil means jobs.DefaultNamespace.
	Namespace func(ctx context.Context) string
	// OutputMode is OutputText (default) or OutputTOON.
	OutputMode string
	// MaxProgress caps the output-line progress notifications of one call
	// (default 500).
	MaxProgress int
	// Metrics, when set, counts MCP requests by method.
	Metrics *metrics.Metrics
	// Logger receives one line when a run_python call is accepted and one when it
	// ends, each with the job id and the MCP session id; nil logs nothing.
	Logger *slog.Logger
	// Languages are the languages offered, one tool each: run_python for
	// jobs.LangPython, run_javascript for jobs.LangJavaScript. Empty offers
	// Python alone.
	Languages []string
	// ClientNeeds are the client capabilities a tool cannot run without: a
	// 2026-07-28 call that does not declare them is refused with -32021
	// before the tool runs (answered by the task layer, so NewTasks must
	// get the same Options).
	ClientNeeds ClientNeeds
	// TaskTools are tools besides the run tools that the task layer runs as
	// jobs when called as tasks: each turns a call's arguments into the job
	// (its code and language; the layer sets the rest). The caller registers
	// the tools themselves with mcp-go, for tools/list and for calls made
	// without a task. The conformance test's fixture tools use it.
	TaskTools map[string]func(arguments any) (*jobs.Job, error)
}

// Output modes of run_python's text content.
const (
	OutputText = "text" // the compact form: stdout, stderr:, status:/error:
	OutputTOON = "toon" // the structured result as TOON (Token-Oriented Object Notation)
)

// ValidOutputMode reports whether m is a known output mode ("" is the default).
func ValidOutputMode(m string) bool { return m == "" || m == OutputText || m == OutputTOON }

// ToolName is the tool agents see for Python; JSToolName the one for
// JavaScript, when it is offered.
const (
	ToolName   = "run_python"
	JSToolName = "run_javascript"
)

// toolLanguage maps the tools to the languages they run.
var toolLanguage = map[string]string{ToolName: jobs.LangPython, JSToolName: jobs.LangJavaScript}

// ToolFor returns the name of the tool that runs lang.
func ToolFor(lang string) string {
	if lang == jobs.LangJavaScript {
		return JSToolName
	}
	return ToolName
}

// New returns an MCP server exposing run_python backed by r.
func New(r jobs.Service, opts Options) *server.MCPServer {
	s, _ := NewServer(r, opts)
	return s
}

// Tools changes what an MCP server made by NewServer offers after the start:
// Refresh reads Options.Servers again (the servers enum), SetLanguages changes
// the run tools. Clients hear of each change (notifications/tools/list_changed).
type Tools struct {
	s *server.MCPServer
	h *handler
}

// SetLanguages offers one run tool per language of langs (Python always).
func (t *Tools) SetLanguages(langs []string) {
	t.h.mu.Lock()
	t.h.opts.Languages = slices.Clone(langs)
	t.h.mu.Unlock()
	t.Refresh()
}

// Refresh rebuilds the run tools from the current servers and languages.
func (t *Tools) Refresh() {
	langs := t.h.languages()
	var add []server.ServerTool
	for _, lang := range langs {
		add = append(add, server.ServerTool{Tool: t.h.tool(lang), Handler: t.h.call})
	}
	t.s.AddTools(add...)
	for _, lang := range jobs.Languages {
		if !slices.Contains(langs, lang) && t.s.GetTool(ToolFor(lang)) != nil {
			t.s.DeleteTools(ToolFor(lang))
		}
	}
}

// Log sends an MCP log message (notifications/message) to every session
// whose logging/setLevel lets it through: what an agent's client should show,
// such as a proxied server that failed to start.
func (t *Tools) Log(level mcp.LoggingLevel, data any) {
	t.h.sessions.Range(func(id, _ any) bool {
		// A session that went or does not log: nothing to tell it.
		_ = t.s.SendLogMessageToSpecificClient(id.(string), mcp.NewLoggingMessageNotification(level, LoggerName, data))
		return true
	})
}

// LoggerName is the logger of mcpexec's MCP log messages.
const LoggerName = "mcpexec"

// NewServer is New, with the Tools that change its tools later.
func NewServer(r jobs.Service, opts Options) (*server.MCPServer, *Tools) {
	if opts.Name == "" {
		opts.Name = "mcpexec"
	}
	if opts.Version == "" {
		opts.Version = "0.1.0"
	}
	if opts.MaxProgress <= 0 {
		opts.MaxProgress = 500
	}
	hooks := &server.Hooks{}
	if m := opts.Metrics; m != nil {
		hooks.AddBeforeAny(func(_ context.Context, _ any, method mcp.MCPMethod, _ any) {
			m.MCPRequest(string(method))
		})
	}
	h := &handler{r: r, opts: opts}
	hooks.AddOnRegisterSession(func(_ context.Context, cs server.ClientSession) { h.sessions.Store(cs.SessionID(), true) })
	hooks.AddOnUnregisterSession(func(_ context.Context, cs server.ClientSession) { h.sessions.Delete(cs.SessionID()) })
	sopts := []server.ServerOption{
		server.WithHooks(hooks),
		server.WithLogging(),
		server.WithToolCapabilities(true), // the servers enum and the languages may change
		server.WithResourceCapabilities(false, false),
		// No prompts, but an answer to prompts/list (empty, with the
		// caching hints 2026-07-28 asks of every list) rather than
		// "method not found": clients and the conformance suite ask.
		server.WithPromptCapabilities(false),
		server.WithInstructions(instructions(opts.Languages)),
		server.WithToolFilter(h.namespaceServers),
	}
	// Declared here, answered by Tasks in front of mcp-go: the 2025-11-25
	// tasks at initialize, the tasks extension at server/discover
	// (2026-07-28).
	sopts = append(sopts, server.WithTaskCapabilities(true, true, true))
	hooks.AddAfterDiscover(discoverTasksExtension)
	s := server.NewMCPServer(opts.Name, opts.Version, sopts...)
	h.srv = s
	for _, lang := range h.languages() {
		s.AddTool(h.tool(lang), h.call)
	}
	if opts.Catalog != nil && opts.AgentDiscovery {
		h.addCatalogTools(s)
	}
	tools := &Tools{s: s, h: h}
	s.AddResourceTemplate(mcp.NewResourceTemplate(FileURITemplate, "job file",
		mcp.WithTemplateDescription("A file a job of your namespace wrote under /workspace/out (or a figure it drew).")),
		h.readFile)
	for _, uri := range []string{CapabilitiesURI, BridgeCapabilitiesURI} {
		s.AddResource(mcp.NewResource(uri, "mcpexec capabilities",
			mcp.WithResourceDescription("The manual of the sandbox's API (Python, and JavaScript where offered): proxied MCP servers, tool docs, memory."),
			mcp.WithMIMEType("text/markdown")),
			func(context.Context, mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
				return []mcp.ResourceContents{mcp.TextResourceContents{URI: uri, MIMEType: "text/markdown", Text: h.manual()}}, nil
			})
	}
	return s, tools
}

type handler struct {
	r        jobs.Service
	srv      *server.MCPServer
	mu       sync.Mutex // guards opts.Languages
	opts     Options
	sessions sync.Map // MCP session id → true, for Tools.Log
}

// languages returns the languages offered, Python first.
func (h *handler) languages() []string {
	h.mu.Lock()
	js := slices.Contains(h.opts.Languages, jobs.LangJavaScript)
	h.mu.Unlock()
	out := []string{jobs.LangPython}
	if js {
		out = append(out, jobs.LangJavaScript)
	}
	return out
}

func instructions(langs []string) string {
	if slices.Contains(langs, jobs.LangJavaScript) {
		return "Run Python with " + ToolName + " or JavaScript with " + JSToolName + "; read " + CapabilitiesURI + " for the in-sandbox API."
	}
	return "Run Python with " + ToolName + "; read " + CapabilitiesURI + " for the in-sandbox API."
}

// The run tools' descriptions are short: every agent reads them before its
// first question, on every connection (TestToolListIsSmall bounds tools/list).
// The manual (CapabilitiesURI) has the rest.
const toolDescription = `Run Python 3 in a sandbox; returns what it prints, its status, and the files and charts (plt.show()) it writes to /workspace/out. It calls tools of the MCP servers in "servers" as await mcp_SERVER.TOOL(**kwargs); search_tool_docs("...") finds them. API: ` + CapabilitiesURI

const jsToolDescription = `As run_python, in JavaScript (Node.js): await mcp_SERVER.TOOL({...}); console.log output.`

// tool is the run tool of lang, its servers enum the configured servers.
func (h *handler) tool(lang string) mcp.Tool {
	var names []string
	if h.opts.Servers != nil {
		names = h.opts.Servers()
	}
	return h.toolWith(lang, names)
}

// toolWith is the run tool of lang with names as its servers enum (none: any
// string).
func (h *handler) toolWith(lang string, names []string) mcp.Tool {
	l := h.r.Limits()
	serverOpts := []mcp.PropertyOption{mcp.WithStringItems()}
	if len(names) > 0 {
		serverOpts = []mcp.PropertyOption{mcp.WithStringEnumItems(names)}
	}
	name, desc := ToolName, toolDescription
	if lang == jobs.LangJavaScript {
		name, desc = JSToolName, jsToolDescription
	}
	return mcp.NewTool(name,
		mcp.WithDescription(desc),
		// The spec's defaults (not read-only, may be destructive, open world)
		// are what mcp-go would spell out: leave them implied.
		mcp.WithToolAnnotation(mcp.ToolAnnotation{}),
		mcp.WithString("code", mcp.Required()), // its cap is checked, and told, on the call
		mcp.WithArray("servers", serverOpts...),
		mcp.WithInteger("timeout", mcp.Min(1), mcp.Max(l.MaxTimeout), mcp.DefaultNumber(float64(l.DefaultTimeout))),
		mcp.WithString("session", mcp.Description("Share globals and /workspace across calls.")),
		mcp.WithArray("files", mcp.Description("Put in /workspace: {name, text|base64|uri}."),
			mcp.Items(map[string]any{"type": "object", "required": []string{"name"}})),
		mcp.WithTaskSupport(mcp.TaskSupportOptional), // tasks.go
	)
}

// namespace returns the caller's namespace.
func (h *handler) namespace(ctx context.Context) string {
	if h.opts.Namespace != nil {
		if ns := h.opts.Namespace(ctx); ns != "" {
			return ns
		}
	}
	return jobs.DefaultNamespace
}

// args is run_python's input.
type args struct {
	Code    *string          `json:"code"`
	Servers []string         `json:"servers"`
	Timeout json.RawMessage  `json:"timeout"`
	Session string           `json:"session"`
	Files   []jobs.FileInput `json:"files"`
}

// parseArgs decodes and checks the arguments of tool (run_python or
// run_javascript), saying exactly what was wrong.
func parseArgs(tool string, raw any) (*jobs.Job, error) {
	var a args
	if err := decodeArgs(raw, &a, "code: string, servers: [string], timeout: integer, session: string, files: [{name, text | base64 | uri}]"); err != nil {
		return nil, err
	}
	if a.Code == nil {
		return nil, &jobs.InvalidError{Field: "code", Message: "code is required: pass the source to run"}
	}
	lang := toolLanguage[tool]
	if lang == jobs.LangPython {
		lang = "" // the default
	}
	job := &jobs.Job{Code: *a.Code, Servers: a.Servers, Session: a.Session, Language: lang, Inputs: a.Files}
	if len(a.Timeout) > 0 && string(a.Timeout) != "null" {
		var t float64
		if err := json.Unmarshal(a.Timeout, &t); err != nil || t != float64(int(t)) {
			return nil, &jobs.InvalidError{Field: "timeout", Message: fmt.Sprintf("%s is not a whole number of seconds", a.Timeout)}
		}
		if t < 1 {
			return nil, &jobs.InvalidError{Field: "timeout", Message: fmt.Sprintf("%d seconds is less than 1", int(t))}
		}
		job.Timeout = int(t)
	}
	return job, nil
}

// checkServers refuses server names the front-end does not proxy for
// namespace ns: neither configured nor catalog servers ns enabled.
func (h *handler) checkServers(ctx context.Context, ns string, names []string) error {
	var known []string
	if h.opts.Servers != nil {
		known = h.opts.Servers()
	}
	// The namespace's enabled catalog servers are one state read: made only
	// for a name the configured servers do not have.
	if slices.ContainsFunc(names, func(n string) bool { return !slices.Contains(known, n) }) {
		known = append(slices.Clone(known), h.enabled(ctx, ns)...)
	}
	for _, n := range names {
		if !slices.Contains(known, n) {
			if len(known) == 0 {
				return &jobs.InvalidError{Field: "servers", Message: fmt.Sprintf("%q is not a proxied MCP server: this front-end has none (start it with --servers FILE)", n)}
			}
			return &jobs.InvalidError{Field: "servers", Message: fmt.Sprintf("%q is not a proxied MCP server; known servers: %s", n, strings.Join(known, ", "))}
		}
	}
	return nil
}

func (h *handler) call(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	if req.Params.RequestState != "" || len(req.Params.InputResponses) > 0 {
		// The retry of an input_required run (mrtr.go).
		ctx = tracing.WithVia(ctx, req.Params.Name)
		return h.resumeByMRTR(ctx, req), nil
	}
	job, err := parseArgs(req.Params.Name, req.GetRawArguments())
	if err != nil {
		return mcp.NewToolResultError(err.Error()), nil
	}
	job.Namespace = h.namespace(ctx)
	if err := h.checkServers(ctx, job.Namespace, job.Servers); err != nil {
		return mcp.NewToolResultError(err.Error()), nil
	}
	job.ID = jobs.NewID()
	ctx = tracing.WithVia(ctx, req.Params.Name)
	if req.Params.Meta != nil {
		if tp, ok := req.Params.Meta.AdditionalFields[jobs.TraceHeader].(string); ok {
			ctx = tracing.WithParent(ctx, tp) // _meta.traceparent, when valid, over the HTTP header
		}
	}
	log := h.logger(ctx, job.Namespace, job.ID)
	log.Info(req.Params.Name+" accepted", "namespace", job.Namespace, "servers", job.Servers, "session", job.Session)
	h.clientLog(ctx, mcp.LoggingLevelDebug, map[string]any{"event": "accepted", "tool": req.Params.Name, "job": job.ID})
	if h.asksByMRTR(ctx) {
		return h.runByMRTR(ctx, req, job, log), nil // mrtr.go
	}
	defer h.askClient(ctx, job.Namespace, job.ID, log)() // approvals.go
	progress := progressSender(ctx, req, h.opts.MaxProgress)
	if progress != nil {
		if stop, err := h.r.WatchOutput(job.Namespace, job.ID, progress.output); err == nil {
			defer stop()
		}
	}
	rec, err := h.r.Run(ctx, job, progress.event)
	var inv *jobs.InvalidError
	if errors.As(err, &inv) {
		log.Info(req.Params.Name+" refused", "err", err)
		return mcp.NewToolResultError(err.Error()), nil
	}
	if err != nil {
		log.Warn(req.Params.Name+" failed", "err", err)
		return mcp.NewToolResultError(fmt.Sprintf("the job could not be run: %v", err)), nil
	}
	log.Info(req.Params.Name+" finished", "status", rec.Status)
	h.clientLog(ctx, mcp.LoggingLevelDebug, map[string]any{"event": "finished", "tool": req.Params.Name, "job": job.ID, "status": rec.Status})
	out := resultOf(rec, h.opts.OutputMode)
	h.attachFiles(ctx, job.Namespace, rec, out)
	return out, nil
}

// clientLog sends the calling session a log message, when its level lets it
// through (a job's lifecycle, at debug level).
func (h *handler) clientLog(ctx context.Context, level mcp.LoggingLevel, data any) {
	// A client that does not log, or went away: nothing to tell.
	_ = h.srv.SendLogMessageToClient(ctx, mcp.NewLoggingMessageNotification(level, LoggerName, data))
}

// logger returns the call's logger: job id, and the MCP session id when the
// transport has one.
func (h *handler) logger(ctx context.Context, ns, jobID string) *slog.Logger {
	l := h.opts.Logger
	if l == nil {
		l = slog.New(slog.DiscardHandler)
	}
	traceID := jobs.TraceID(jobs.TraceParent(jobs.ScopedID(ns, jobID)))
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		traceID = sc.TraceID().String() // the caller's trace
	}
	l = l.With("job", jobID, "trace_id", traceID)
	if cs := server.ClientSessionFromContext(ctx); cs != nil && cs.SessionID() != "" {
		l = l.With("mcp_session", cs.SessionID())
	}
	return l
}
