package proxyresp

// What a job's code learns of its servers: the servers it may use, their
// tools and docs, searches over them, and the capability summary.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/mcpexec/mcpexec/internal/discovery"
	"github.com/mcpexec/mcpexec/internal/proxy"
	"github.com/mcpexec/mcpexec/internal/tooldocs"
)

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
