// Package mcpserver is the MCP surface agents see: the run_python tool, the
// capabilities resource, and the HTTP handler (streamable HTTP at /mcp, /healthz)
// with its Origin and bearer-token checks.
package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/mcpexec/mcpexec/internal/jobs"
)

// Runner runs a job to its end; *frontend.Frontend is one.
type Runner interface {
	Run(ctx context.Context, job *jobs.Job, progress func(jobs.Event)) (*jobs.Record, error)
	Limits() jobs.Limits
}

// Options configure the MCP server.
type Options struct {
	Name      string
	Version   string
	Servers   func() []string // names of proxied servers (the servers enum)
	Namespace func(ctx context.Context) string
}

// ToolName is the one tool agents see.
const ToolName = "run_python"

// New returns an MCP server exposing run_python backed by r.
func New(r Runner, opts Options) *server.MCPServer {
	if opts.Name == "" {
		opts.Name = "mcpexec"
	}
	if opts.Version == "" {
		opts.Version = "0.1.0"
	}
	s := server.NewMCPServer(opts.Name, opts.Version,
		server.WithToolCapabilities(false),
		server.WithResourceCapabilities(false, false),
		server.WithInstructions("Run Python with "+ToolName+"; read "+CapabilitiesURI+" for the in-sandbox API."),
	)
	h := &handler{r: r, opts: opts}
	s.AddTool(h.tool(), h.call)
	s.AddResource(mcp.NewResource(CapabilitiesURI, "mcpexec capabilities",
		mcp.WithResourceDescription("The manual of the sandbox's Python API: proxied MCP servers, tool docs, memory."),
		mcp.WithMIMEType("text/markdown")),
		func(context.Context, mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
			return []mcp.ResourceContents{mcp.TextResourceContents{URI: CapabilitiesURI, MIMEType: "text/markdown", Text: Manual}}, nil
		})
	return s
}

type handler struct {
	r    Runner
	opts Options
}

const toolDescription = `Run Python 3 code in an isolated sandbox (no network, read-only filesystem, time and memory limits) and return its stdout, stderr and status. Top-level await works. The code can call the tools of the MCP servers named in "servers" without loading their schemas: await call_tool(server, tool, {...}) or await mcp_<server>.<tool>(...); discover them with await list_servers(), await query_tool_docs(server) and await search_tool_docs("query"). Tool errors raise MCPError. Print what you need: only printed output comes back. Each call starts fresh unless it names a "session", which keeps Python globals between calls. Read resource ` + CapabilitiesURI + ` for the full API.`

func (h *handler) tool() mcp.Tool {
	l := h.r.Limits()
	serverOpts := []mcp.PropertyOption{
		mcp.Description("MCP servers the code may call."),
		mcp.WithStringItems(),
	}
	if h.opts.Servers != nil {
		if names := h.opts.Servers(); len(names) > 0 {
			serverOpts = []mcp.PropertyOption{mcp.Description("MCP servers the code may call."), mcp.WithStringEnumItems(names)}
		}
	}
	return mcp.NewTool(ToolName,
		mcp.WithDescription(toolDescription),
		mcp.WithString("code", mcp.Required(), mcp.MaxLength(l.MaxCodeBytes),
			mcp.Description("Python source to run.")),
		mcp.WithArray("servers", serverOpts...),
		mcp.WithInteger("timeout", mcp.Min(1), mcp.Max(l.MaxTimeout),
			mcp.Description(fmt.Sprintf("Seconds before the run is stopped (default %d).", l.DefaultTimeout))),
		mcp.WithString("session", mcp.Description("Optional name: calls with the same session share Python globals.")),
	)
}

// args is run_python's input.
type args struct {
	Code    *string         `json:"code"`
	Servers []string        `json:"servers"`
	Timeout json.RawMessage `json:"timeout"`
	Session string          `json:"session"`
}

// parseArgs decodes and checks the tool arguments, saying exactly what was wrong.
func parseArgs(raw any) (*jobs.Job, error) {
	b, err := json.Marshal(raw)
	if err != nil {
		return nil, errors.New("arguments are not a JSON object")
	}
	var a args
	if err := json.Unmarshal(b, &a); err != nil {
		return nil, fmt.Errorf("arguments do not match the schema: %v (want code: string, servers: [string], timeout: integer, session: string)", err)
	}
	if a.Code == nil {
		return nil, &jobs.InvalidError{Field: "code", Message: "code is required: pass the Python source to run"}
	}
	job := &jobs.Job{Code: *a.Code, Servers: a.Servers, Session: a.Session}
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

func (h *handler) call(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	job, err := parseArgs(req.GetRawArguments())
	if err != nil {
		return mcp.NewToolResultError(err.Error()), nil
	}
	if h.opts.Namespace != nil {
		job.Namespace = h.opts.Namespace(ctx)
	}
	progress := progressSender(ctx, req)
	rec, err := h.r.Run(ctx, job, progress)
	var inv *jobs.InvalidError
	if errors.As(err, &inv) {
		return mcp.NewToolResultError(err.Error()), nil
	}
	if err != nil {
		return mcp.NewToolResultError(fmt.Sprintf("the job could not be run: %v", err)), nil
	}
	return resultOf(rec), nil
}

// progressSender returns a function sending progress notifications for the
// request's lifecycle events, or nil when the client sent no progress token.
func progressSender(ctx context.Context, req mcp.CallToolRequest) func(jobs.Event) {
	if req.Params.Meta == nil || req.Params.Meta.ProgressToken == nil {
		return nil
	}
	srv := server.ServerFromContext(ctx)
	if srv == nil {
		return nil
	}
	token := req.Params.Meta.ProgressToken
	step := 0
	return func(ev jobs.Event) {
		step++
		_ = srv.SendNotificationToClient(ctx, "notifications/progress", map[string]any{
			"progressToken": token,
			"progress":      step,
			"message":       string(ev.Kind),
		})
	}
}

// Structured is run_python's structuredContent.
type Structured struct {
	Status         string   `json:"status"`
	Summary        string   `json:"summary"`
	ExitCode       int      `json:"exitCode"`
	Stdout         []string `json:"stdout"`
	Stderr         []string `json:"stderr"`
	Error          string   `json:"error,omitempty"`
	TimeoutSeconds int      `json:"timeoutSeconds"`
	JobID          string   `json:"jobId"`
}

// resultOf renders a terminal record as the tool result: the compact text form
// plus structuredContent.
func resultOf(rec *jobs.Record) *mcp.CallToolResult {
	res := rec.Result
	if res == nil {
		res = &jobs.Result{Status: rec.Status}
	}
	st := Structured{
		Status:         string(res.Status),
		ExitCode:       res.ExitCode,
		Stdout:         lines(res.Stdout),
		Stderr:         lines(res.Stderr),
		Error:          res.Error,
		TimeoutSeconds: rec.Job.Timeout,
		JobID:          rec.Job.ID,
	}
	st.Summary = summary(res)
	var b strings.Builder
	b.WriteString(strings.TrimRight(res.Stdout, "\n"))
	if res.StdoutTruncated {
		b.WriteString("\n[stdout truncated]")
	}
	if res.Stderr != "" {
		if b.Len() > 0 {
			b.WriteString("\n")
		}
		b.WriteString("stderr:\n")
		b.WriteString(strings.TrimRight(res.Stderr, "\n"))
		if res.StderrTruncated {
			b.WriteString("\n[stderr truncated]")
		}
	}
	if res.Status != jobs.StatusSuccess {
		if b.Len() > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "status: %s", res.Status)
		if res.Error != "" {
			fmt.Fprintf(&b, "\nerror: %s", res.Error)
		}
	}
	if b.Len() == 0 {
		b.WriteString("(no output)")
	}
	out := mcp.NewToolResultStructured(st, b.String())
	out.IsError = res.Status != jobs.StatusSuccess
	return out
}

func summary(r *jobs.Result) string {
	switch r.Status {
	case jobs.StatusSuccess:
		if r.Stdout == "" && r.Stderr == "" {
			return "Success (no output)"
		}
		return "Success"
	case jobs.StatusTimeout:
		return "Timed out"
	default:
		if r.Error != "" {
			return fmt.Sprintf("%s: %s", r.Status, r.Error)
		}
		return string(r.Status)
	}
}

func lines(s string) []string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return []string{}
	}
	return strings.Split(s, "\n")
}
