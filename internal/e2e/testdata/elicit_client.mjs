// A client built on the official TypeScript MCP SDK (2025-11-25) that
// declares elicitation and answers every elicitation with APPROVE (true or
// false): it calls run_python with code whose ts/add call the namespace's
// tool rules park for approval. Prints one JSON line: the call's text, and
// the messages it was asked.
//
// usage: node elicit_client.mjs URL TOKEN APPROVE
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const [url, token, approve] = process.argv.slice(2);
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "mcpexec-elicit-test", version: "1.0.0" }, { capabilities: { elicitation: {} } });
const asked = [];
client.setRequestHandler(ElicitRequestSchema, async (req) => {
  asked.push(req.params.message);
  return { action: "accept", content: { approve: approve === "true", reason: "the SDK test said so" } };
});
await client.connect(transport);
const res = await client.callTool(
  {
    name: "run_python",
    arguments: {
      code: 'try:\n    r = await mcp_ts.add(a=40, b=2)\n    print("sum", r["sum"])\nexcept MCPError as e:\n    print("MCPError:", e)',
      servers: ["ts"],
    },
  },
  undefined,
  { timeout: 120000 },
);
console.log(JSON.stringify({ text: res.content[0].text, isError: res.isError ?? false, asked }));
await client.close();
