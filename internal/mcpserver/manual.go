package mcpserver

import (
	"fmt"
	"slices"
	"strings"

	"github.com/mcpexec/mcpexec/internal/discovery"
	"github.com/mcpexec/mcpexec/internal/jobs"
)

// CapabilitiesURI is the resource holding the full manual; BridgeCapabilitiesURI
// serves the same under the seed bridge's name, for agents taught it.
const (
	CapabilitiesURI       = "resource://mcpexec/capabilities"
	BridgeCapabilitiesURI = "resource://mcp-server-code-execution-mode/capabilities"
)

// Manual is the full description of the sandbox's Python API.
const Manual = `# mcpexec sandbox manual

Code sent to run_python runs in a fresh, isolated Python 3 sandbox: no network, a
read-only root filesystem, writable /tmp and /workspace (small, noexec), user nobody,
memory/process/time limits. Top-level ` + "`await`" + ` works. Only what the code prints comes back.
A call that names a "session" keeps its Python globals for the next call of that session.

## Calling MCP tools
Name the servers the code may use in run_python's "servers". Then, without import:
- ` + "`await mcp_<alias>.<tool>(**kwargs)`" + `: the server's proxy object; the alias is the server
  name with other characters than letters, digits and _ replaced by _ (so "my-fs" is
  ` + "`mcp_my_fs`" + `; tool "read-file" is ` + "`.read_file`" + `). Also ` + "`mcp_servers[\"my-fs\"]`" + `,
  ` + "`mcp_my_fs[\"read-file\"]`" + `, and ` + "`from mcp.servers.my_fs import *`" + ` (the tools as functions).
- ` + "`await call_tool(server, tool, arguments={}, raw=False, timeout=None)`" + `: the same by name;
  timeout is seconds for this call (the job's deadline still bounds it).
- ` + "`await mcp_x.list_tools()`" + `: name, alias, description and input_schema of each tool.
A result is the tool's text, JSON-decoded when it parses (so a tool returning JSON gives
dicts and lists); it also answers the MCP result's keys (` + "`r[\"content\"]`" + `, ` + "`r[\"isError\"]`" + `,
` + "`r.get(\"structuredContent\")`" + `; a dict's own keys first). ` + "`raw=True`" + ` returns the whole MCP
result ({content, structuredContent, isError}).
A tool error raises ` + "`MCPError`" + ` (a RuntimeError) with the server's message. Calls run concurrently with
` + "`asyncio.gather`" + ` (a few at a time per job).

## Discovering tools (plain functions; awaiting them works too)
- ` + "`list_servers()`" + `: the servers this run may call.
- ` + "`discovered_servers(detailed=False)`" + `: every server your namespace may use (the catalog's
  once enabled); detailed gives
  name, alias, description, transport, and "available" (given to this run).
- ` + "`query_tool_docs(server, tool=None, detail=\"summary\"|\"full\")`" + `: summary, Python-like
  signature and description of each tool (or one); "full" adds the input schema.
- ` + "`search_tool_docs(query, limit=5)`" + `: this run's tools ranked by relevance to a free-text query.
- ` + "`capability_summary()`" + `: a short overview.
All of these are also in module ` + "`runtime`" + ` (` + "`import runtime`" + ` or ` + "`from mcp import runtime`" + `).

## Code written for mcp-server-code-execution-mode (the Python bridge)
Its names work too: lower-case aliases (server "GitHub" is also ` + "`mcp_github`" + `, tool
"getUser" also ` + "`.getuser`" + `, ` + "`from mcp.servers.github import getuser`" + `); ` + "`mcp`" + ` without import
(` + "`mcp.runtime`" + `, ` + "`mcp.servers.<alias>`" + `, whose modules have ` + "`TOOLS`" + ` and ` + "`TOOL_MAP`" + `);
` + "`LOADED_MCP_SERVERS`" + `, ` + "`list_servers_sync()`" + `, ` + "`list_tools_sync(server)`" + `, ` + "`describe_server(name)`" + `,
` + "`list_loaded_server_metadata()`" + `, ` + "`query_tool_docs_sync(...)`" + `, ` + "`search_tool_docs_sync(...)`" + `.
Docs also have its keys (serverAlias, toolAlias, inputSchema). A tool error raises
MCPError rather than returning isError; so does calling a tool the server lacks
(` + "`await mcp_x.no_such_tool()`" + `: MCPError, a RuntimeError as the bridge's, naming the tools it has);
` + "`save_tool`" + ` is not available.

## Memory (kept across runs, private to the caller)
- ` + "`save_memory(key, value, metadata=None)`" + `: value and metadata JSON-serialisable.
- ` + "`load_memory(key, default=None)`" + `, ` + "`memory_exists(key)`" + `, ` + "`get_memory_info(key)`" + ` (metadata,
  created_at, updated_at, version), ` + "`delete_memory(key)`" + `, ` + "`list_memories(prefix=\"\")`" + `.
- ` + "`update_memory(key, fn, default=None)`" + `: sets the value to fn(current) atomically
  (compare-and-set on the server, retried on conflict) and returns it.
Keys are any non-empty strings; they are stored as given (keys starting with __mcpexec are reserved).

## Saved tools (Python; kept per caller, like memory)
- ` + "`save_tool(fn, source=None)`" + `: keeps a top-level function (def) for later runs; saving a
  name again replaces it. Later runs that use its name have it defined (also ` + "`from user_tools import fn`" + `);
  code that names it only inside eval'd text calls ` + "`load_saved_tools()`" + ` first.
- ` + "`list_saved_tools()`" + ` (name, source, saved_at), ` + "`delete_saved_tool(name)`" + `.
- At most 100 tools, 64 KiB of source each, 512 KiB in all; they count against the memory quota.
  A saved tool that fails to load is reported on stderr and left out; the run goes on.
  JavaScript runs do not get saved tools.

## Workflows (jobs of the HTTP API)
A job submitted with ` + "`after`" + ` (or ` + "`after_any`" + `) parents can read an ended parent's
outcome: ` + "`job_result(id)`" + ` returns {status, summary, exitCode, stdout[], stderr[], error,
timeoutSeconds, jobId} of a job of the same caller.

## Data
The default image has numpy, pandas, matplotlib (headless, Agg), scipy, Pillow and
openpyxl, imported ahead of your code (` + "`import pandas as pd`" + ` costs nothing).
` + "`display(obj)`" + ` prints a DataFrame or Series as a compact table (first and last rows, the
columns that fit, its dimensions) and a matplotlib figure as a picture of the result; a
DataFrame left as the code's last expression is shown the same way, as in a notebook. (A worker may run a slim image without them: ` + "`doctor`" + `
lists an image's libraries.)

## Files and pictures
Files given with the call (` + "`files`" + `: {name, text | base64 | uri}) are in /workspace (the
working directory) when the code starts. What the code writes under /workspace/out comes
back: pictures (PNG, JPEG, GIF, WebP) as images, other files as links
(mcpexec://jobs/{id}/files/{name}, readable with resources/read); every matplotlib figure
shown with ` + "`plt.show()`" + ` or left open is saved there as a PNG. A later job reads a file
with ` + "`job_file(id, name)`" + ` (bytes), or is given it by its URI in ` + "`files`" + `. A session keeps
/workspace between calls. Limits: 100 files, 8 MiB each, 32 MiB together (the
namespace's policy may differ); what is not kept gets a note in the result.

## Outcome
status is success, error (an exception: traceback in stderr; or a non-zero exit code),
timeout or cancelled. stdout and stderr are each capped at 1 MiB; the result says when
they were cut.

## Limits
code up to 256 KiB; timeout 1-120 s (default 30 s).
`

// JSManual is the manual of the sandbox's JavaScript API, part of the
// capabilities resource where run_javascript is offered.
const JSManual = `
# JavaScript (run_javascript)

Code sent to run_javascript runs in the same sandbox as Python's (same walls,
limits, servers, memory and sessions) with Node.js. It runs as a script: top-level
` + "`await`" + ` works, ` + "`console.log`" + ` is stdout, ` + "`require`" + ` gives Node's built-in modules.
A session keeps its globals (` + "`var`" + `, functions, ` + "`globalThis.x`" + `); code that awaits at top level
runs as an async function body, so keep values across calls on ` + "`globalThis`" + ` there.
A session runs one language: a Python call in a JavaScript session is refused.

Every helper returns a promise; ` + "`await`" + ` it.
- ` + "`await mcp_<alias>.<tool>({...})`" + ` (aliases as in Python), ` + "`mcpServers[\"my-fs\"]`" + `,
  ` + "`await mcp_x.listTools()`" + `.
- ` + "`await callTool(server, tool, args = {}, {raw, timeout})`" + `: by name; raw gives the MCP result.
- ` + "`listServers()`" + `, ` + "`discoveredServers(detailed)`" + `, ` + "`listTools(server)`" + `,
  ` + "`queryToolDocs(server, tool, detail)`" + `, ` + "`searchToolDocs(query, limit, detail)`" + `,
  ` + "`capabilitySummary()`" + `.
- ` + "`saveMemory(key, value, metadata)`" + `, ` + "`loadMemory(key, fallback)`" + `, ` + "`memoryExists(key)`" + `,
  ` + "`getMemoryInfo(key)`" + `, ` + "`deleteMemory(key)`" + `, ` + "`listMemories(prefix)`" + `,
  ` + "`updateMemory(key, fn, fallback)`" + ` (fn may be async; compare-and-set, retried). The memory
  is Python's: a value saved from one language is read from the other.
- ` + "`jobResult(id)`" + `: an ended job's outcome, as Python's job_result; ` + "`jobFile(id, name)`" + ` a
  file it wrote (a Buffer), as Python's job_file.
Errors from tools and the host are ` + "`MCPError`" + `s (an Error subclass).
` + "`process.exit(n)`" + ` ends the job with exit code n (0 is success). An uncaught error is the
job's error, its stack in stderr.
`

// manual is the capabilities resource: the manual and the proxied servers.
func (h *handler) manual() string {
	var b strings.Builder
	b.WriteString(Manual)
	if slices.Contains(h.languages(), jobs.LangJavaScript) {
		b.WriteString(JSManual)
	}
	b.WriteString("\n## MCP servers on this front-end\n")
	switch {
	case h.opts.Definitions != nil:
		var defs []discovery.Server
		for _, s := range h.opts.Definitions() {
			if !s.Catalog {
				defs = append(defs, s)
			}
		}
		if len(defs) == 0 {
			b.WriteString("None configured.\n")
		}
		for _, s := range defs {
			desc := s.Description
			if desc == "" {
				desc = "(no description: use query_tool_docs)"
			}
			fmt.Fprintf(&b, "- %s: %s\n", s.Name, desc)
		}
	case h.opts.Servers != nil && len(h.opts.Servers()) > 0:
		fmt.Fprintf(&b, "%s\n", strings.Join(h.opts.Servers(), ", "))
	default:
		b.WriteString("None configured.\n")
	}
	if h.opts.Catalog != nil {
		b.WriteString(CatalogManual)
	}
	return b.String()
}

// CatalogManual documents the server catalog, where the operator has one.
const CatalogManual = `
## The server catalog (servers you may enable)
Besides the servers above, the operator lists servers that are known but not
enabled. Enabling one makes it one of your servers: it stays enabled for your
later runs (name it in servers) until you disable it.
- ` + "`find_servers(query=\"\", limit=5)`" + ` (JavaScript ` + "`findServers`" + `): catalog servers ranked by
  relevance to a free-text query: name, alias, description, transport, enabled, score.
  An empty query lists them all.
- ` + "`enable_server(name)`" + ` (` + "`enableServer`" + `): enables it for you and for this run at once:
  ` + "`mcp_<alias>`" + ` is defined, ` + "`call_tool(name, ...)`" + ` works.
- ` + "`disable_server(name)`" + ` (` + "`disableServer`" + `): its calls are refused from then on.
`
