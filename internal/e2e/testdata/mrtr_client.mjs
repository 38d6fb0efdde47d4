// A client built on the official TypeScript MCP SDK v2
// (@modelcontextprotocol/client), pinned to protocol 2026-07-28, that
// declares elicitation and answers every elicitation with APPROVE (true or
// false). It calls run_python with code whose ts/add call the namespace's
// tool rules park for approval: the server answers input_required, and the
// SDK's multi round-trip driver asks this client's elicitation handler and
// retries the call with the answer. Prints one JSON line: the call's text,
// and the messages it was asked.
//
// usage: node mrtr_client.mjs URL TOKEN APPROVE
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";

const [url, token, approve] = process.argv.slice(2);
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client(
  { name: "mcpexec-mrtr-test", version: "1.0.0" },
  { capabilities: { elicitation: {} }, versionNegotiation: { mode: { pin: "2026-07-28" } } },
);
const asked = [];
client.setRequestHandler("elicitation/create", async (req) => {
  asked.push(req.params?.message ?? req.message);
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
  { timeout: 120000 },
);
console.log(JSON.stringify({ era: client.getProtocolEra(), text: res.content[0].text, isError: res.isError ?? false, asked }));
await client.close();
