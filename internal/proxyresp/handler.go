package proxyresp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpexec/mcpexec/internal/audit"
	"github.com/mcpexec/mcpexec/internal/jobclock"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/tracing"
)

// runningJob is a running job as the proxy sees it: built from its record in
// the state service, never from what the caller says.
type runningJob struct {
	job      jobs.Job
	servers  map[string]bool
	deadline time.Time // the proxy's own bound of the attempt's calls
}

func (rj *runningJob) jobDeadline() time.Time { return rj.deadline }

// namespace is the job's namespace (jobs.DefaultNamespace for a job without
// one).
func (rj *runningJob) namespace() string { return jobs.NamespaceOf(rj.job.Namespace) }

var _ proxy.Handler = (*Responder)(nil)

// Handle implements proxy.Handler: a call is allowed when it carries the
// job's capability, the job's record says the call's attempt is running, and
// (for a server's tools) the server was given to the job.
func (r *Responder) Handle(ctx context.Context, req proxy.Request) (json.RawMessage, error) {
	if !jobs.CheckCapability(r.key, req.Job, req.Capability) {
		// Say nothing about whether the job exists.
		return nil, errors.New("proxy call refused: it does not carry its job's capability")
	}
	// From here on the call's span speaks for its job (the console's
	// timelines show only such spans).
	trace.SpanFromContext(ctx).SetAttributes(tracing.AttrAdmitted.Bool(true))
	rj, release, err := r.access.acquire(ctx, req.Job, req.Attempt, req.StartedSeq)
	if err != nil {
		return nil, err
	}
	defer release()
	// The limit moves on by the time the job's calls waited for a person
	// (acquire consults the approvals bucket once it has passed).
	deadline := rj.deadline
	if time.Until(deadline) <= 0 {
		return nil, errors.New("the job's time limit has passed: no more proxy calls")
	}
	var cancel context.CancelFunc
	if req.Parks {
		// This call's own bound stops, with the worker's, while it waits.
		ctx, _, cancel = jobclock.WithBudget(ctx, time.Until(deadline), context.DeadlineExceeded)
	} else {
		ctx, cancel = context.WithDeadline(ctx, deadline)
	}
	defer cancel()
	if len(req.CallID) > proxy.MaxCallID {
		return nil, fmt.Errorf("proxy call refused: call_id is over %d bytes", proxy.MaxCallID)
	}
	if req.CallID != "" {
		ctx = context.WithValue(ctx, writeIDKey{}, writeID(req))
	}
	ctx = withCallRef(ctx, req.Job, req.Attempt, req.CallID) // the audit's
	res, err := r.dispatch(ctx, rj, req.Method, req.Params)
	if err != nil {
		return nil, err
	}
	return json.Marshal(res)
}

// writeIDKey carries, in a call's context, the id of the memory write it
// makes: the same across the worker's retries of the call.
type writeIDKey struct{}

// writeID is the memory write id of req: its job, attempt and call id hashed
// (so no sandbox-chosen text reaches the state service).
func writeID(req proxy.Request) string {
	sum := sha256.Sum256([]byte(req.Job + "\x00" + strconv.Itoa(req.Attempt) + "\x00" + req.CallID))
	return hex.EncodeToString(sum[:16])
}

func (r *Responder) dispatch(ctx context.Context, rj *runningJob, method string, params json.RawMessage) (any, error) {
	switch method {
	case proxy.MethodCallTool:
		var p struct {
			Server    string         `json:"server"`
			Tool      string         `json:"tool"`
			Arguments map[string]any `json:"arguments"`
			Raw       bool           `json:"raw"`
			Timeout   float64        `json:"timeout"`
		}
		if err := decode(params, &p); err != nil {
			return nil, err
		}
		return r.callTool(ctx, rj, p.Server, p.Tool, p.Arguments, p.Raw, p.Timeout)
	case proxy.MethodListServers:
		return r.jobServers(rj), nil
	case proxy.MethodDiscoveredServers:
		var p struct {
			Detailed bool `json:"detailed"`
		}
		if err := decode(params, &p); err != nil {
			return nil, err
		}
		return r.discovered(ctx, rj, p.Detailed)
	case proxy.MethodListTools:
		var p struct {
			Server string `json:"server"`
		}
		if err := decode(params, &p); err != nil {
			return nil, err
		}
		return r.listTools(ctx, rj, p.Server)
	case proxy.MethodQueryToolDocs:
		var p struct {
			Server string  `json:"server"`
			Tool   *string `json:"tool"`
			Detail any     `json:"detail"`
		}
		if err := decode(params, &p); err != nil {
			return nil, err
		}
		return r.queryDocs(ctx, rj, p.Server, p.Tool, p.Detail)
	case proxy.MethodSearchToolDocs:
		var p struct {
			Query  string `json:"query"`
			Limit  int    `json:"limit"`
			Detail any    `json:"detail"`
		}
		if err := decode(params, &p); err != nil {
			return nil, err
		}
		return r.searchDocs(ctx, rj, p.Query, p.Limit, p.Detail)
	case proxy.MethodCapabilitySummary:
		return r.summary(ctx, rj), nil
	case proxy.MethodMemoryGet, proxy.MethodMemoryPut, proxy.MethodMemoryDelete, proxy.MethodMemoryList:
		return r.memory(ctx, rj, method, params)
	case proxy.MethodSavedToolPut, proxy.MethodSavedToolDelete, proxy.MethodSavedToolList:
		return r.savedTools(ctx, rj, method, params)
	case proxy.MethodCatalogFind, proxy.MethodCatalogEnable, proxy.MethodCatalogDisable:
		var p catalogParams
		if err := decode(params, &p); err != nil {
			return nil, err
		}
		return r.catalogCall(ctx, rj, method, p)
	case proxy.MethodJobResult:
		var p struct {
			ID string `json:"id"`
		}
		if err := decode(params, &p); err != nil {
			return nil, err
		}
		return r.jobResult(ctx, rj, p.ID)
	case proxy.MethodJobFile:
		var p struct {
			ID   string `json:"id"`
			Name string `json:"name"`
		}
		if err := decode(params, &p); err != nil {
			return nil, err
		}
		return r.jobFile(ctx, rj, p.ID, p.Name)
	}
	return nil, fmt.Errorf("unknown proxy method %q", method)
}

func decode(params json.RawMessage, v any) error {
	if len(params) == 0 || string(params) == "null" {
		return nil
	}
	if err := json.Unmarshal(params, v); err != nil {
		return fmt.Errorf("bad parameters: %w", err)
	}
	return nil
}

func (r *Responder) tools() ToolSource { return r.cfg.Tools }

// server checks that the job may use name: it was given to the job, or it
// is a catalog server the job's namespace has enabled now (the worker lets
// only the job's servers, and those the job itself enabled, ask).
func (r *Responder) server(ctx context.Context, rj *runningJob, name string) error {
	if name == "" {
		return errors.New("name a server: one of " + proxy.QuoteNames(r.jobServers(rj)))
	}
	if !r.policyFor(rj.namespace()).allowsServer(name) {
		return fmt.Errorf("server %q is not allowed for namespace %q", name, rj.namespace())
	}
	if _, isCatalog := r.catalogServer(name); isCatalog {
		on, err := r.catalogEnabled(ctx, rj.namespace(), name)
		if err != nil {
			return err
		}
		if !on {
			return fmt.Errorf("server %q is a catalog server that namespace %q has not enabled: call enable_server(%q) first", name, rj.namespace(), name)
		}
		return nil
	}
	if !rj.servers[name] {
		given := r.jobServers(rj)
		if len(given) == 0 {
			return fmt.Errorf("server %q was not given to this run: run_python was called without servers; call it again with servers=[%q]", name, name)
		}
		return fmt.Errorf("server %q was not given to this run (it may use %s): add it to run_python's servers", name, proxy.QuoteNames(given))
	}
	if r.tools() == nil {
		return fmt.Errorf("no MCP servers are configured on this front-end, so %q is unavailable: start it with --servers FILE", name)
	}
	return nil
}

// jobServers are the job's servers, sorted.
func (r *Responder) jobServers(rj *runningJob) []string {
	out := make([]string, 0, len(rj.servers))
	for s := range rj.servers {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

func (r *Responder) callTool(ctx context.Context, rj *runningJob, server, tool string, args map[string]any, raw bool, timeout float64) (_ any, err error) {
	call := newToolCall(ctx)
	defer func() { r.audit(ctx, rj, call, server, tool, args, err) }() // every end, refusals too (audit.go)
	if err := r.server(ctx, rj, server); err != nil {
		call.deny(audit.DecidedByPolicy)
		return nil, err
	}
	if tool == "" {
		return nil, errors.New("name the tool to call")
	}
	// Per-tool rules and approval (rules.go): a denied call ends here.
	cd, err := r.authorize(ctx, rj, server, tool, args)
	call.decided(cd, err)
	if err != nil {
		return nil, err
	}
	d := r.cfg.CallTimeout
	if timeout > 0 {
		d = time.Duration(timeout * float64(time.Second))
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if args == nil {
		args = map[string]any{}
	}
	res, err := r.tools().CallTool(ctx, server, tool, args)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			left := time.Until(rj.jobDeadline())
			if left <= 0 {
				return nil, fmt.Errorf("%s.%s did not answer before the job's time limit", server, tool)
			}
			return nil, fmt.Errorf("%s.%s did not answer within %s (the per-call timeout): pass timeout=SECONDS to call_tool for slow tools", server, tool, d)
		}
		return nil, err
	}
	if raw {
		return res, nil
	}
	return ToolValue(res), nil
}

// ToolValue is what sandbox code gets from a tool result: its text, JSON-decoded
// when it parses; the structured content when there is no text; the whole result
// when it has neither (images, resources).
func ToolValue(res *mcp.CallToolResult) any {
	var texts []string
	for _, c := range res.Content {
		if tc, ok := c.(mcp.TextContent); ok {
			texts = append(texts, tc.Text)
		}
	}
	if len(texts) == 0 {
		if res.StructuredContent != nil {
			return res.StructuredContent
		}
		if len(res.Content) == 0 {
			return nil
		}
		return res
	}
	text := strings.Join(texts, "\n")
	if t := strings.TrimSpace(text); t != "" && json.Valid([]byte(t)) {
		return json.RawMessage(t)
	}
	return text
}
