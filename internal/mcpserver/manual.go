package mcpserver

// CapabilitiesURI is the resource holding the full manual.
const CapabilitiesURI = "resource://mcpexec/capabilities"

// Manual is the full description of the sandbox's Python API.
const Manual = `# mcpexec sandbox manual

Code sent to run_python runs in a fresh, isolated Python 3 sandbox: no network, a
read-only root filesystem, writable /tmp and /workspace (small, noexec), user nobody,
memory/process/time limits. Top-level ` + "`await`" + ` works. Only what the code prints comes back.

## Calling MCP tools
Names available without import (also as ` + "`import runtime`" + `):
- ` + "`await call_tool(server, tool, arguments={}, raw=False)`" + `: call a tool of a server listed in run_python's "servers". The result is the tool's text, JSON-decoded when it parses; raw=True returns the whole MCP result.
- ` + "`await list_servers()`" + `, ` + "`await discovered_servers(detailed=False)`" + `: the servers this call may use.
- ` + "`await query_tool_docs(server, tool=None, detail=\"summary\"|\"full\")`" + `: tool documentation.
- ` + "`await search_tool_docs(query, limit=5)`" + `: find tools by meaning.
- ` + "`await capability_summary()`" + `: a short overview.
Tool errors raise ` + "`MCPError`" + ` with the server's message.

## Outcome
status is success, error (an exception: traceback in stderr; or a non-zero exit code), or timeout.
stdout and stderr are each capped at 1 MiB; the result says when they were cut.

## Limits
code up to 256 KiB; timeout 1-120 s (default 30 s).
`
