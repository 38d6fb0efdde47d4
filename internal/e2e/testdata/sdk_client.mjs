// A client built on the official TypeScript MCP SDK: connects to mcpexec over
// stdio (spawning the front-end) or streamable HTTP, lists tools, reads the
// manual, and calls run_python with a progress callback. Prints one JSON line.
//
// usage: node sdk_client.mjs stdio COMMAND ARGS... | node sdk_client.mjs http URL TOKEN
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [mode, target, ...rest] = process.argv.slice(2);
let transport;
if (mode === "stdio") {
  transport = new StdioClientTransport({ command: target, args: rest, stderr: "inherit" });
} else {
  transport = new StreamableHTTPClientTransport(new URL(target), {
    requestInit: { headers: { Authorization: `Bearer ${rest[0]}` } },
  });
}
const client = new Client({ name: "mcpexec-sdk-test", version: "1.0.0" });
await client.connect(transport);
const tools = await client.listTools();
const manual = await client.readResource({ uri: "resource://mcpexec/capabilities" });
const progress = [];
const res = await client.callTool(
  {
    name: "run_python",
    arguments: {
      code: 'print(await mcp_ts.echo(text="hello from the TS SDK"))\nsave_memory("sdk", 1)\nprint(load_memory("sdk"))',
      servers: ["ts"],
    },
  },
  undefined,
  { onprogress: (p) => progress.push(p.message), timeout: 120000 },
);
console.log(
  JSON.stringify({
    tools: tools.tools.map((t) => t.name),
    serversEnum: tools.tools[0].inputSchema.properties.servers.items.enum,
    text: res.content[0].text,
    isError: res.isError ?? false,
    status: res.structuredContent?.status,
    progress,
    manualListsTs: manual.contents[0].text.includes("- ts: "),
  }),
);
await client.close();
