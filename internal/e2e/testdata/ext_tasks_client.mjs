// A task client built on the official tasks extension package
// (@modelcontextprotocol/ext-tasks) over the official TypeScript SDK v2
// client pinned to 2026-07-28. The extension's wire goes through the host's
// own request path (rawDispatch): one POST per request with the standard
// headers, Mcp-Name carrying the task id on the task methods. Prints one
// JSON line.
//
// usage: node ext_tasks_client.mjs URL TOKEN start CODE        (run_python as a task; hands it off)
//        node ext_tasks_client.mjs URL TOKEN resume REFERENCE  (resumes the handed-off task, waits for its outcome)
//        node ext_tasks_client.mjs URL TOKEN approve CODE      (run_python as a task with servers ["ts"],
//                                                               answering each input request with approve)
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { createTaskSessionFromClient, resultFromTaskOutcome } from "@modelcontextprotocol/ext-tasks/client";

const [url, token, op, arg] = process.argv.slice(2);
const protocolVersion = "2026-07-28";
const clientInfo = { name: "mcpexec-ext-tasks-test", version: "1.0.0" };
const clientCapabilities = { elicitation: { form: {} } };
const client = new Client(clientInfo, { capabilities: clientCapabilities, versionNegotiation: { mode: { pin: protocolVersion } } });
await client.connect(
  new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: { Authorization: `Bearer ${token}` } } }),
);

let nextId = 1;
const sent = [];
async function rawDispatch(request, options) {
  const params = request.params ?? {};
  const headers = {
    "Content-Type": "application/json",
    Accept: "application/json, text/event-stream",
    Authorization: `Bearer ${token}`,
    "Mcp-Protocol-Version": protocolVersion,
    "Mcp-Method": request.method,
    ...(options?.context?.headers ?? {}),
  };
  const name = request.method === "tools/call" ? params.name : params.taskId;
  if (typeof name === "string") headers["Mcp-Name"] = name;
  sent.push(request.method);
  const res = await fetch(url, {
    method: "POST",
    headers,
    body: JSON.stringify({ jsonrpc: "2.0", id: `ext-${nextId++}`, ...request }),
    signal: options?.signal,
  });
  let text = await res.text();
  if ((res.headers.get("content-type") ?? "").includes("text/event-stream")) {
    const data = text.split("\n").filter((l) => l.startsWith("data: "));
    text = data[data.length - 1].slice("data: ".length);
  }
  const msg = JSON.parse(text);
  return msg.error ? { kind: "error", error: msg.error } : { kind: "result", result: msg.result };
}

const asked = [];
const session = createTaskSessionFromClient(client, {
  endpointId: "mcpexec-test-fleet",
  rawDispatch,
  v2RequestFraming: { protocolVersion, clientInfo, clientCapabilities },
  onInputRequest: async (request) => {
    asked.push(request.params.message);
    return { action: "accept", content: { approve: true, reason: "the e2e test approves" } };
  },
});

function summary(outcome) {
  const res = resultFromTaskOutcome(outcome);
  return { outcome: outcome.status, text: res.content[0]?.text, isError: res.isError ?? false, jobStatus: res.structuredContent?.status };
}

let out;
if (op === "start") {
  const exec = await session.callTool("run_python", { code: arg, timeout: 120 });
  const snap = exec.kind === "task" ? await session.task(exec.handle.taskId).snapshot() : undefined;
  let reference;
  if (exec.kind === "task") await exec.handoff((ref) => { reference = ref; });
  out = { kind: exec.kind, taskId: exec.handle?.taskId, status: snap?.status, ttl: snap?.retentionMs, poll: snap?.suggestedPollIntervalMs, reference };
} else if (op === "resume") {
  const exec = await session.resumeTask(JSON.parse(arg));
  const { outcome } = await exec.settle();
  out = { ...summary(outcome), sent };
} else if (op === "approve") {
  const exec = await session.callTool("run_python", { code: arg, timeout: 120, servers: ["ts"] });
  const { outcome } = await exec.settle();
  out = { kind: exec.kind, ...summary(outcome), asked, sent };
}
console.log(JSON.stringify(out));
// Closing the session cancels the executions it still holds, a handed-off
// one included (ext-tasks 0.2.2): after a handoff, only the client closes.
if (op !== "start") await session.close();
await client.close();
