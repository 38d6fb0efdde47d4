// A task client built on the official TypeScript MCP SDK
// (client.experimental.tasks). Prints one JSON line.
//
// usage: node tasks_client.mjs URL start CODE   (starts run_python as a task)
//        node tasks_client.mjs URL result ID    (status, result and listing)
//        node tasks_client.mjs URL cancel ID
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { CallToolResultSchema } from "@modelcontextprotocol/sdk/types.js";

const [url, op, arg] = process.argv.slice(2);
const client = new Client({ name: "mcpexec-tasks-test", version: "1.0.0" });
await client.connect(new StreamableHTTPClientTransport(new URL(url)));
const tasks = client.experimental.tasks;
let out;
if (op === "start") {
  const tools = await client.listTools(); // teaches the client run_python's task support
  const t0 = performance.now();
  for await (const msg of tasks.callToolStream({ name: "run_python", arguments: { code: arg, timeout: 120 } })) {
    if (msg.type === "taskCreated") {
      out = { taskId: msg.task.taskId, status: msg.task.status, ms: performance.now() - t0,
        taskSupport: tools.tools[0].execution?.taskSupport, ttl: msg.task.ttl };
      break;
    }
    if (msg.type === "error") throw msg.error;
  }
} else if (op === "result") {
  const t0 = performance.now();
  const got = await tasks.getTask(arg);
  const getMs = performance.now() - t0;
  const res = await tasks.getTaskResult(arg, CallToolResultSchema);
  const listed = await tasks.listTasks();
  const after = await tasks.getTask(arg);
  out = { status: got.status, getMs, finalStatus: after.status, text: res.content[0].text, isError: res.isError ?? false,
    jobStatus: res.structuredContent?.status, listed: listed.tasks.some((t) => t.taskId === arg) };
} else if (op === "cancel") {
  const got = await tasks.cancelTask(arg);
  const after = await tasks.getTask(arg);
  out = { status: got.status, after: after.status };
}
console.log(JSON.stringify(out));
await client.close();
