package proxyresp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpexec/mcpexec/internal/audit"
	"github.com/mcpexec/mcpexec/internal/discovery"
	"github.com/mcpexec/mcpexec/internal/jobclock"
	"github.com/mcpexec/mcpexec/internal/jobs"
	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/tooldocs"
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

type serverInfo struct {
	Name        string `json:"name"`
	Alias       string `json:"alias"`
	Description string `json:"description"` // always there, as in the bridge's
	Transport   string `json:"transport"`
	Available   bool   `json:"available"` // given to this run
	Source      string `json:"source,omitempty"`
}

// namespaceServers are the servers the job's namespace may use, in the pool's
// order: the configured servers its policy allows, and the catalog servers it
// has enabled (EnabledServers applies the policy too), as find_servers and
// the proxy's own checks go by. When the enabled set cannot be read, it
// returns the configured ones with the error.
func (r *Responder) namespaceServers(ctx context.Context, rj *runningJob) ([]discovery.Server, error) {
	if r.tools() == nil {
		return nil, nil
	}
	enabled, err := r.EnabledServers(ctx, rj.namespace())
	p := r.policyFor(rj.namespace())
	var out []discovery.Server
	for _, s := range r.tools().Servers() {
		if s.Catalog && slices.Contains(enabled, s.Name) || !s.Catalog && p.allowsServer(s.Name) {
			out = append(out, s)
		}
	}
	return out, err
}

// discovered answers discovered_servers: the servers the job's namespace may
// use (namespaceServers).
func (r *Responder) discovered(ctx context.Context, rj *runningJob, detailed bool) (any, error) {
	all, err := r.namespaceServers(ctx, rj)
	if err != nil {
		return nil, err
	}
	if !detailed {
		names := make([]string, 0, len(all))
		for _, s := range all {
			names = append(names, s.Name)
		}
		sort.Strings(names)
		return names, nil
	}
	out := make([]serverInfo, 0, len(all))
	for _, s := range all {
		out = append(out, serverInfo{Name: s.Name, Alias: tooldocs.Identifier(s.Name), Description: s.Description,
			Transport: s.Type, Available: rj.servers[s.Name]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// toolInfo is a tool as list_tools answers it: mcpexec's keys, and the MCP
// tool's inputSchema, which the bridge's list_tools answers.
type toolInfo struct {
	Name        string          `json:"name"`
	Alias       string          `json:"alias"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
	MCPSchema   json.RawMessage `json:"inputSchema"`
}

// aliases are a server's tools' aliases: mcpexec's (tooldocs.Aliases) and the
// Python bridge's (tooldocs.BridgeToolAliases), by tool name.
type aliases struct{ ours, bridge map[string]string }

func (r *Responder) serverTools(ctx context.Context, rj *runningJob, server string) ([]tooldocs.Tool, aliases, error) {
	if err := r.server(ctx, rj, server); err != nil {
		return nil, aliases{}, err
	}
	ts, err := r.tools().Tools(ctx, server)
	if err != nil {
		return nil, aliases{}, err
	}
	out := make([]tooldocs.Tool, 0, len(ts))
	names := make([]string, 0, len(ts))
	for _, t := range ts {
		schema, _ := json.Marshal(t.InputSchema)
		if len(t.RawInputSchema) > 0 {
			schema = t.RawInputSchema
		}
		out = append(out, tooldocs.Tool{Server: server, Name: t.Name, Description: t.Description, InputSchema: schema})
		names = append(names, t.Name)
	}
	return out, aliases{ours: tooldocs.Aliases(names), bridge: tooldocs.BridgeToolAliases(names)}, nil
}

func (r *Responder) listTools(ctx context.Context, rj *runningJob, server string) (any, error) {
	ts, al, err := r.serverTools(ctx, rj, server)
	if err != nil {
		return nil, err
	}
	out := make([]toolInfo, 0, len(ts))
	for _, t := range ts {
		out = append(out, toolInfo{Name: t.Name, Alias: al.ours[t.Name], Description: t.Description, InputSchema: t.InputSchema, MCPSchema: t.InputSchema})
	}
	return out, nil
}

// bridgeServerAlias is server's alias by the Python bridge's rule among the
// job's servers.
func (r *Responder) bridgeServerAlias(rj *runningJob, server string) string {
	return tooldocs.BridgeServerAliases(r.jobServers(rj))[server]
}

func (r *Responder) queryDocs(ctx context.Context, rj *runningJob, server string, tool *string, detail any) (any, error) {
	full := fullDetail(detail)
	ts, al, err := r.serverTools(ctx, rj, server)
	if err != nil {
		return nil, err
	}
	sa := r.bridgeServerAlias(rj, server)
	doc := func(t tooldocs.Tool) tooldocs.Doc {
		return tooldocs.Document(t, al.ours[t.Name], sa, al.bridge[t.Name], full)
	}
	if tool != nil && *tool != "" {
		if t, ok := findTool(ts, al, *tool); ok {
			return doc(t), nil
		}
		names := make([]string, 0, len(ts))
		for _, t := range ts {
			names = append(names, t.Name)
		}
		return nil, fmt.Errorf("server %q has no tool %q; its tools are %s", server, *tool, proxy.QuoteNames(names))
	}
	docs := make([]tooldocs.Doc, 0, len(ts))
	for _, t := range ts {
		docs = append(docs, doc(t))
	}
	return docs, nil
}

// findTool finds a tool by its name, else its alias, else its bridge alias,
// else any of them regardless of case (as the bridge's query_tool_docs does).
func findTool(ts []tooldocs.Tool, al aliases, name string) (tooldocs.Tool, bool) {
	for _, match := range []func(t tooldocs.Tool) bool{
		func(t tooldocs.Tool) bool { return t.Name == name },
		func(t tooldocs.Tool) bool { return al.ours[t.Name] == name },
		func(t tooldocs.Tool) bool { return al.bridge[t.Name] == name },
		func(t tooldocs.Tool) bool {
			return strings.EqualFold(t.Name, name) || strings.EqualFold(al.ours[t.Name], name) || strings.EqualFold(al.bridge[t.Name], name)
		},
	} {
		for _, t := range ts {
			if match(t) {
				return t, true
			}
		}
	}
	return tooldocs.Tool{}, false
}

// fullDetail reads a detail argument as the bridge does (_normalise_detail):
// "full" in any case is full; anything else, even a value that is not a
// string, is the summary.
func fullDetail(detail any) bool {
	s, ok := detail.(string)
	return ok && strings.ToLower(s) == "full"
}

const maxSearchLimit = 50

func (r *Responder) searchDocs(ctx context.Context, rj *runningJob, query string, limit int, detail any) (any, error) {
	full := fullDetail(detail)
	if strings.TrimSpace(query) == "" {
		return nil, errors.New("search_tool_docs needs a query, e.g. search_tool_docs(\"read a file\")")
	}
	if limit <= 0 {
		limit = 5
	}
	limit = min(limit, maxSearchLimit)
	var all []tooldocs.Tool
	toolAliases := map[string]aliases{}
	var errs []string
	for _, s := range r.jobServers(rj) {
		ts, al, err := r.serverTools(ctx, rj, s)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		toolAliases[s] = al
		all = append(all, ts...)
	}
	serverAliases := tooldocs.BridgeServerAliases(r.jobServers(rj))
	if len(all) == 0 && len(errs) > 0 {
		return nil, errors.New(strings.Join(errs, "; "))
	}
	hits := tooldocs.NewIndex(all).Search(query, limit)
	out := make([]tooldocs.Doc, 0, len(hits))
	for _, hit := range hits {
		al := toolAliases[hit.Tool.Server]
		d := tooldocs.Document(hit.Tool, al.ours[hit.Tool.Name], serverAliases[hit.Tool.Server], al.bridge[hit.Tool.Name], full)
		d.Score = hit.Score
		out = append(out, d)
	}
	return out, nil
}

func (r *Responder) summary(ctx context.Context, rj *runningJob) string {
	var b strings.Builder
	given := r.jobServers(rj)
	if len(given) == 0 {
		b.WriteString("No MCP servers were given to this run.")
	} else {
		b.WriteString("MCP servers available to this run:\n")
		for _, s := range given {
			alias := tooldocs.Identifier(s)
			ts, al, err := r.serverTools(ctx, rj, s)
			if err != nil {
				fmt.Fprintf(&b, "- %s (mcp_%s): unavailable: %v\n", s, alias, err)
				continue
			}
			names := make([]string, 0, len(ts))
			for _, t := range ts {
				names = append(names, al.ours[t.Name])
			}
			fmt.Fprintf(&b, "- %s (mcp_%s), %d tools: %s\n", s, alias, len(ts), strings.Join(names, ", "))
		}
	}
	var others []string
	// The namespace's other servers; without its enabled catalog servers
	// when they cannot be read now (an overview says less, not more).
	all, _ := r.namespaceServers(ctx, rj)
	for _, s := range all {
		if !rj.servers[s.Name] {
			others = append(others, s.Name)
		}
	}
	if len(others) > 0 {
		sort.Strings(others)
		fmt.Fprintf(&b, "\nOther servers (name them in run_python's servers to use them): %s\n", strings.Join(others, ", "))
	}
	b.WriteString("\nCall: await mcp_<alias>.<tool>(**kwargs) or await call_tool(server, tool, {...}) (raw=True for the whole result). " +
		"Docs: query_tool_docs(server, tool=None, detail=\"summary\"|\"full\"), search_tool_docs(query, limit=5). " +
		"Memory (kept across runs): save_memory, load_memory, update_memory, delete_memory, list_memories, memory_exists, get_memory_info.")
	return b.String()
}
