// The official TypeScript SDK's OAuth client against mcpexec behind Hydra:
// it meets the 401 challenge, reads the protected resource metadata, finds
// Hydra from it, gets a token with client credentials and runs run_python.
// Usage: node oauth_client.mjs MCP_URL CLIENT_ID CLIENT_SECRET AUDIENCE
// Prints one JSON line: {"text", "isError", "challenged"}.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ClientCredentialsProvider } from "@modelcontextprotocol/sdk/client/auth-extensions.js";

const [url, clientId, clientSecret, audience] = process.argv.slice(2);

// Hydra issues the audience a client asks for with `audience` (RFC 8707's
// `resource`, which the SDK sends too, it does not read).
class HydraProvider extends ClientCredentialsProvider {
  prepareTokenRequest(scope) {
    const p = super.prepareTokenRequest(scope ?? "mcpexec:run");
    p.set("audience", audience);
    return p;
  }
}

let challenged = false;
const fetchFn = async (input, init) => {
  const res = await fetch(input, init);
  if (res.status === 401 && (res.headers.get("www-authenticate") ?? "").includes("resource_metadata=")) challenged = true;
  return res;
};

const provider = new HydraProvider({ clientId, clientSecret, scope: "mcpexec:run" });
const transport = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider, fetch: fetchFn });
const client = new Client({ name: "oauth-sdk-test", version: "1.0.0" });
await client.connect(transport);
const res = await client.callTool({ name: "run_python", arguments: { code: "print(6 * 7)" } });
const text = (res.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("");
console.log(JSON.stringify({ text, isError: !!res.isError, challenged }));
await client.close();
