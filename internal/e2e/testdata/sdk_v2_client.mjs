// A client built on the official TypeScript MCP SDK v2
// (@modelcontextprotocol/client): connects to mcpexec in one protocol era
// ("modern": pinned to 2026-07-28, stateless; "legacy": 2025-11-25's
// initialize) over stdio (spawning the front-end) or streamable HTTP, lists
// tools and prompts, reads the manual, and calls run_python with a progress
// callback. Prints one JSON line.
//
// usage: node sdk_v2_client.mjs ERA stdio COMMAND ARGS... | node sdk_v2_client.mjs ERA http URL TOKEN
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";

const [era, mode, target, ...rest] = process.argv.slice(2);
let transport;
if (mode === "stdio") {
  transport = new StdioClientTransport({ command: target, args: rest, stderr: "inherit" });
} else {
  transport = new StreamableHTTPClientTransport(new URL(target), {
    requestInit: { headers: { Authorization: `Bearer ${rest[0]}` } },
  });
}
const client = new Client(
  { name: "mcpexec-sdk-v2-test", version: "1.0.0" },
  { versionNegotiation: { mode: era === "modern" ? { pin: "2026-07-28" } : "legacy" } },
);
await client.connect(transport);
const tools = await client.listTools();
const prompts = await client.listPrompts();
const manual = await client.readResource({ uri: "resource://mcpexec/capabilities" });
const progress = [];
const res = await client.callTool(
  { name: "run_python", arguments: { code: 'print("hello from the v2 SDK")' } },
  { onprogress: (p) => progress.push(p.message), timeout: 120000 },
);
console.log(
  JSON.stringify({
    era: client.getProtocolEra(),
    tools: tools.tools.map((t) => t.name),
    prompts: prompts.prompts.length,
    text: res.content[0].text,
    isError: res.isError ?? false,
    status: res.structuredContent?.status,
    progress,
    manual: manual.contents[0].text.includes("run_python"),
  }),
);
await client.close();
