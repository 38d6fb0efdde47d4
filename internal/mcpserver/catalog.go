package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/mcpexec/mcpexec/internal/discovery"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

// ServerCatalog is the operator's server catalog as agents reach it: the
// servers a namespace may enable, find and use. *app.Lazy is one (through
// the front-end).
type ServerCatalog interface {
	// EnabledServers returns the catalog servers namespace ns enabled.
	EnabledServers(ctx context.Context, ns string) ([]string, error)
	FindServers(ctx context.Context, ns, query string, limit int) ([]discovery.CatalogEntry, error)
	EnableServer(ctx context.Context, ns, name string) (discovery.CatalogEntry, error)
	DisableServer(ctx context.Context, ns, name string) (bool, error)
}

// The agent discovery tools (--agent-discovery).
const (
	FindServersTool   = "find_servers"
	EnableServerTool  = "enable_server"
	DisableServerTool = "disable_server"
)

// enabled returns the catalog servers the caller's namespace ns enabled
// (none when there is no catalog or it cannot be read now).
func (h *handler) enabled(ctx context.Context, ns string) []string {
	if h.opts.Catalog == nil {
		return nil
	}
	names, err := h.opts.Catalog.EnabledServers(ctx, ns)
	if err != nil {
		return nil // not running yet, or the state service is away: the configured servers
	}
	return names
}

// listWait bounds what tools/list waits for a namespace's enabled servers:
// it answers at once while the stack starts (with the configured servers).
const listWait = 250 * time.Millisecond

// namespaceServers is the tool filter that gives each caller's run tools
// the servers enum of its namespace: the configured servers and the catalog
// servers it enabled.
func (h *handler) namespaceServers(ctx context.Context, tools []mcp.Tool) []mcp.Tool {
	ctx, cancel := context.WithTimeout(ctx, listWait)
	defer cancel()
	extra := h.enabled(ctx, h.namespace(ctx))
	if len(extra) == 0 {
		return tools
	}
	var names []string
	if h.opts.Servers != nil {
		names = h.opts.Servers()
	}
	names = append(slices.Clone(names), extra...)
	slices.Sort(names)
	names = slices.Compact(names)
	out := make([]mcp.Tool, len(tools))
	for i, t := range tools {
		out[i] = t
		if lang, ok := toolLanguage[t.Name]; ok {
			out[i] = h.toolWith(lang, names)
		}
	}
	return out
}

// addCatalogTools offers the catalog as MCP tools.
func (h *handler) addCatalogTools(s *server.MCPServer) {
	s.AddTool(mcp.NewTool(FindServersTool,
		mcp.WithDescription("Find MCP servers the operator lists but nobody enabled yet, ranked by relevance to what you need. Enable one with "+EnableServerTool+"; then pass it in "+ToolName+"'s servers."),
		mcp.WithString("query", mcp.MaxLength(1024), mcp.Description("What you need, in a few words (empty lists them all).")),
		mcp.WithInteger("limit", mcp.Min(1), mcp.Max(100), mcp.Description("At most this many servers (default 5).")),
		mcp.WithReadOnlyHintAnnotation(true),
	), h.findServers)
	for _, name := range []string{EnableServerTool, DisableServerTool} {
		desc := "Enable a catalog MCP server (from " + FindServersTool + ") for your later runs: pass it in " + ToolName + "'s servers. It stays enabled until " + DisableServerTool + "."
		if name == DisableServerTool {
			desc = "Disable a catalog MCP server you enabled: its calls are refused from then on."
		}
		s.AddTool(mcp.NewTool(name, mcp.WithDescription(desc),
			mcp.WithString("name", mcp.Required(), mcp.MaxLength(64), mcp.Description("The server's name.")),
		), h.switchServer)
	}
}

func (h *handler) findServers(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var a struct {
		Query string `json:"query"`
		Limit int    `json:"limit"`
	}
	if err := decodeArgs(req.GetRawArguments(), &a, "query: string, limit: integer"); err != nil {
		return mcp.NewToolResultError(err.Error()), nil
	}
	found, err := h.opts.Catalog.FindServers(ctx, h.namespace(ctx), a.Query, a.Limit)
	if err != nil {
		return mcp.NewToolResultError(err.Error()), nil
	}
	return jsonResult(found)
}

func (h *handler) switchServer(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var a struct {
		Name string `json:"name"`
	}
	if err := decodeArgs(req.GetRawArguments(), &a, "name: string"); err != nil {
		return mcp.NewToolResultError(err.Error()), nil
	}
	if a.Name == "" {
		return mcp.NewToolResultError("name is required: the catalog server's name, from " + FindServersTool), nil
	}
	ns := h.namespace(ctx)
	if req.Params.Name == DisableServerTool {
		was, err := h.opts.Catalog.DisableServer(ctx, ns, a.Name)
		if err != nil {
			return mcp.NewToolResultError(err.Error()), nil
		}
		return jsonResult(map[string]any{"name": a.Name, "disabled": was})
	}
	e, err := h.opts.Catalog.EnableServer(ctx, ns, a.Name)
	if err != nil {
		return mcp.NewToolResultError(err.Error()), nil
	}
	return jsonResult(e)
}

// decodeArgs decodes a tool call's arguments (as mcp-go hands them over)
// into v; want says what they should be.
func decodeArgs(raw any, v any, want string) error {
	b, err := json.Marshal(raw)
	if err != nil {
		return &jobs.InvalidError{Field: "arguments", Message: "the arguments are not a JSON object (want " + want + ")"}
	}
	if err := json.Unmarshal(b, v); err != nil {
		// An invalid argument (errs.Invalid), as every other refusal of a
		// caller's arguments: the tasks layer and the tools answer it so.
		return &jobs.InvalidError{Field: "arguments", Message: fmt.Sprintf("the arguments do not match the schema: %v (want %s)", err, want)}
	}
	return nil
}

func jsonResult(v any) (*mcp.CallToolResult, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return mcp.NewToolResultText(string(b)), nil
}
