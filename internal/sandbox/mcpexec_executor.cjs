// mcpexec sandbox runner: the JavaScript executor. Node.js, no dependencies.
//
// The Python zygote (runner.py) starts it for a job whose language is
// javascript (or ahead of one), as `node mcpexec_executor.cjs`, with the
// channel to the supervisor on fd 3 and its output pipes on fds 1 and 2. It holds no host
// connection: the supervisor relays its frames and checks them, as it does the
// Python executor's. The frames are the Python executor's (mcpexec_protocol.py):
// 4-byte big-endian length, then a JSON object.
//
//   supervisor → executor: {type: "exec", code, servers, persist}, {type: "reply", id, result, error}
//   executor → supervisor: {type: "call", id, method, params}, {type: "done", status, exit_code, error}
//
// One job, or, when its exec frame says persist, a session's jobs one after
// another. The code runs
// as a script in this process's global scope, so a session's later jobs see
// what earlier ones defined; code that awaits at top level runs as the body of
// an async function (keep values across a session's jobs on globalThis then).
"use strict";

const net = require("node:net");
const vm = require("node:vm");

const MAX_FRAME = 16 << 20;
const MAX_CALL = 8 << 20; // the host's proxy request limit
const MAX_CONCURRENT_CALLS = 15; // the host answers 16 at once; one is kept spare, as in Python

class MCPError extends Error {
  constructor(message) {
    super(message);
    this.name = "MCPError";
  }
}

// ExitRequest is what process.exit throws inside a job: the job ends with that code.
class ExitRequest {
  constructor(code) {
    this.code = code;
  }
}

const chan = new net.Socket({ fd: 3, readable: true, writable: true });

// Output is written through at once, as Python's is: a flood of it is held
// back by the pipe (the supervisor caps what it forwards), not queued in this
// process's memory, and nothing written is left unsent when a job ends.
for (const stream of [process.stdout, process.stderr]) {
  if (stream._handle && typeof stream._handle.setBlocking === "function") {
    stream._handle.setBlocking(true);
  }
}

// flushed resolves once what was written to stream before it has been sent.
function flushed(stream) {
  return new Promise((resolve) => {
    if (stream.writableLength === 0) {
      resolve();
    } else {
      stream.write("", () => resolve());
    }
  });
}

// -- frames ------------------------------------------------------------------------

function encode(frame) {
  return Buffer.from(JSON.stringify(frame), "utf8");
}

// writeBody sends an encoded frame: its length, then its body.
function writeBody(body) {
  const head = Buffer.alloc(4);
  head.writeUInt32BE(body.length);
  chan.write(Buffer.concat([head, body]));
}

function send(frame) {
  const body = encode(frame);
  if (body.length > MAX_FRAME) {
    throw new MCPError(`message of ${body.length} bytes exceeds the ${MAX_FRAME}-byte frame limit`);
  }
  writeBody(body);
}

let inbuf = Buffer.alloc(0);
chan.on("data", (data) => {
  inbuf = inbuf.length ? Buffer.concat([inbuf, data]) : data;
  while (inbuf.length >= 4) {
    const n = inbuf.readUInt32BE(0);
    if (n > MAX_FRAME) {
      process.exit(70);
    }
    if (inbuf.length < 4 + n) {
      break;
    }
    const body = inbuf.subarray(4, 4 + n);
    inbuf = inbuf.subarray(4 + n);
    let frame;
    try {
      frame = JSON.parse(body.toString("utf8"));
    } catch {
      process.exit(70);
    }
    onFrame(frame);
  }
});
// The supervisor gone: nothing left to do.
chan.on("end", () => realExit(0));
chan.on("error", () => realExit(0));

// -- proxy calls -------------------------------------------------------------------

let nextId = 0;
const pending = new Map();
let active = 0;
const waiting = [];

async function slot() {
  if (active < MAX_CONCURRENT_CALLS) {
    active++;
    return;
  }
  await new Promise((resolve) => waiting.push(resolve));
}

function release() {
  const next = waiting.shift();
  if (next) {
    next(); // the slot passes on
  } else {
    active--;
  }
}

async function rpc(method, params) {
  await slot();
  try {
    const id = ++nextId;
    // Encoded once: its size is checked against the host's call limit.
    const body = encode({ type: "call", id, method, params: params || {} });
    if (body.length > MAX_CALL) {
      throw new MCPError(`${method}: the call is ${body.length} bytes, over the ${MAX_CALL}-byte limit: send less`);
    }
    const reply = new Promise((resolve, reject) => pending.set(id, { resolve, reject }));
    writeBody(body);
    return await reply;
  } finally {
    release();
  }
}

function onReply(frame) {
  const p = pending.get(frame.id);
  if (!p) {
    return;
  }
  pending.delete(frame.id);
  if (frame.error) {
    p.reject(new MCPError(String(frame.error)));
  } else {
    p.resolve(frame.result === undefined ? null : frame.result);
  }
}

// -- the API the code sees ------------------------------------------------------------

// identifier is a server's or tool's alias: the host's rule (ASCII letters,
// digits and "_"; others become "_"; a leading digit gets a "_" before it).
function identifier(name) {
  let a = "";
  for (const c of name) {
    a += /^[A-Za-z0-9_]$/.test(c) ? c : "_";
  }
  if (a === "" || /^[0-9]/.test(a)) {
    a = "_" + a;
  }
  return a;
}

function jsonValue(value, what) {
  let text;
  try {
    text = JSON.stringify(value);
  } catch (e) {
    throw new TypeError(`${what} must be JSON-serialisable: ${e.message}`);
  }
  if (text === undefined) {
    throw new TypeError(`${what} must be JSON-serialisable (object, array, string, number, boolean or null)`);
  }
  return JSON.parse(text);
}

function memoryKey(key) {
  if (typeof key !== "string" || key === "") {
    throw new TypeError(`memory keys are non-empty strings, got ${JSON.stringify(key)}`);
  }
  return key;
}

function info(m) {
  const out = { ...(m || {}) };
  delete out.value;
  return out;
}

async function callTool(server, tool, args, options) {
  const opts = options || {};
  const params = { server: String(server), tool: String(tool), arguments: args || {}, raw: Boolean(opts.raw) };
  if (opts.timeout !== undefined && opts.timeout !== null) {
    params.timeout = Number(opts.timeout);
  }
  return rpc("call_tool", params);
}

// serverProxy is mcp_<alias>: mcp_x.tool(args) calls a tool by its name or
// alias; mcp_x.listTools() lists them.
function serverProxy(server) {
  let tools = null;
  async function load(fresh) {
    if (tools === null || fresh) {
      const infos = (await rpc("list_tools", { server })) || [];
      tools = new Map();
      for (const t of infos) {
        tools.set(t.name, t.name);
        if (!tools.has(t.alias || identifier(t.name))) {
          tools.set(t.alias || identifier(t.name), t.name);
        }
      }
    }
    return tools;
  }
  async function resolve(name) {
    let names = await load(false);
    if (!names.has(name)) {
      names = await load(true); // the list may have changed: look once more
    }
    if (!names.has(name)) {
      const known = [...new Set(names.values())].sort().join(", ") || "none";
      throw new MCPError(`MCP server ${JSON.stringify(server)} has no tool ${JSON.stringify(name)}; its tools are: ${known}`);
    }
    return names.get(name);
  }
  const target = {
    listTools: async () => {
      const infos = await rpc("list_tools", { server });
      tools = null;
      return infos;
    },
    toString: () => `[MCP server ${server}]`,
  };
  return new Proxy(target, {
    get(t, prop) {
      if (typeof prop !== "string" || prop === "then") {
        return undefined; // not a thenable: `await mcp_x` gives the proxy
      }
      if (Object.hasOwn(t, prop)) {
        return t[prop];
      }
      return async (args, options) => {
        if (args !== undefined && (args === null || typeof args !== "object" || Array.isArray(args))) {
          throw new TypeError(`${server}.${prop} takes one object of arguments, e.g. ${prop}({name: value})`);
        }
        return callTool(server, await resolve(prop), args, options);
      };
    },
  });
}

let servers = [];
const boundServers = [];

// bindServers (re)defines mcpServers and mcp_<alias> for the servers of the current job.
function bindServers(list) {
  for (const name of boundServers.splice(0)) {
    delete globalThis[name];
  }
  servers = list.filter((s) => typeof s === "string");
  const byName = {};
  const used = new Set();
  for (const name of servers) {
    let alias = identifier(name);
    for (let i = 2; used.has(alias); i++) {
      alias = `${identifier(name)}_${i}`;
    }
    used.add(alias);
    const proxy = serverProxy(name);
    byName[name] = proxy;
    defineGlobal("mcp_" + alias, proxy);
    boundServers.push("mcp_" + alias);
  }
  defineGlobal("mcpServers", Object.freeze(byName));
}

function defineGlobal(name, value) {
  Object.defineProperty(globalThis, name, { value, writable: true, configurable: true, enumerable: false });
}

const api = {
  MCPError,
  callTool,
  listServers: async () => [...servers].sort(),
  discoveredServers: (detailed = false) => rpc("discovered_servers", { detailed: Boolean(detailed) }),
  listTools: (server) => rpc("list_tools", { server: String(server) }),
  queryToolDocs: (server, tool = null, detail = "summary") => rpc("query_tool_docs", { server: String(server), tool, detail }),
  searchToolDocs: (query, limit = 5, detail = "summary") =>
    rpc("search_tool_docs", { query: String(query), limit: Math.trunc(Number(limit)), detail }),
  capabilitySummary: () => rpc("capability_summary"),
  async saveMemory(key, value, metadata) {
    const params = { key: memoryKey(key), value: jsonValue(value, "the value") };
    if (metadata !== undefined && metadata !== null) {
      params.metadata = jsonValue(metadata, "metadata");
    }
    return info(await rpc("memory_put", params));
  },
  async loadMemory(key, fallback = null) {
    const m = await rpc("memory_get", { key: memoryKey(key) });
    return m === null || m === undefined ? fallback : m.value;
  },
  async deleteMemory(key) {
    return Boolean(await rpc("memory_delete", { key: memoryKey(key) }));
  },
  async listMemories(prefix = "") {
    return (await rpc("memory_list", { prefix: String(prefix) })) || [];
  },
  async memoryExists(key) {
    return (await rpc("memory_get", { key: memoryKey(key) })) !== null;
  },
  async getMemoryInfo(key) {
    const m = await rpc("memory_get", { key: memoryKey(key) });
    return m === null || m === undefined ? null : info(m);
  },
  // updateMemory atomically replaces key's value with await fn(current)
  // (current is fallback when absent) and returns the new value: compare-and-set
  // on the server, retried when another run changed the key meanwhile.
  async updateMemory(key, fn, fallback = null, metadata) {
    memoryKey(key);
    for (let i = 0; i < 50; i++) {
      const m = await rpc("memory_get", { key });
      const current = m === null || m === undefined ? fallback : m.value;
      const value = jsonValue(await fn(current), "fn's result");
      const params = { key, value, if_version: m ? m.version : 0 };
      const meta = metadata !== undefined && metadata !== null ? metadata : m ? m.metadata : undefined;
      if (meta !== undefined && meta !== null) {
        params.metadata = meta;
      }
      const res = await rpc("memory_put", params);
      if (!(res && res.conflict)) {
        return value;
      }
    }
    throw new MCPError(`updateMemory(${JSON.stringify(key)}): the key kept changing under concurrent updates; try again`);
  },
  async jobResult(id) {
    if (typeof id !== "string" || id === "") {
      throw new TypeError(`job ids are non-empty strings, got ${JSON.stringify(id)}`);
    }
    return rpc("job_result", { id });
  },
  // jobFile returns a Buffer of a file an ended job of the namespace wrote.
  async jobFile(id, name) {
    if (typeof id !== "string" || id === "" || typeof name !== "string" || name === "") {
      throw new TypeError("jobFile(id, name) takes a job id and a file name");
    }
    const got = await rpc("job_file", { id, name });
    return Buffer.from(got.base64, "base64");
  },
  // The server catalog: servers the operator lists but a namespace enables.
  async findServers(query = "", limit = 5) {
    return (await rpc("catalog_find", { query: String(query), limit: Math.trunc(Number(limit)) || 5 })) || [];
  },
  // enableServer enables a catalog server for this namespace and this run:
  // mcp_<alias> is defined at once.
  async enableServer(name) {
    const entry = await rpc("catalog_enable", { name: serverName(name) });
    if (!servers.includes(name)) {
      bindServers([...servers, name]);
    }
    return entry;
  },
  async disableServer(name) {
    const res = await rpc("catalog_disable", { name: serverName(name) });
    if (servers.includes(name)) {
      bindServers(servers.filter((s) => s !== name));
    }
    return Boolean(res && res.disabled);
  },
};

function serverName(name) {
  if (typeof name !== "string" || name === "") {
    throw new TypeError(`server names are non-empty strings, got ${JSON.stringify(name)}`);
  }
  return name;
}
for (const [name, value] of Object.entries(api)) {
  defineGlobal(name, value);
}
defineGlobal("runtime", Object.freeze({ ...api }));
// The code runs as a script, where Node's module-scoped require is not a global.
defineGlobal("require", require);

// -- running a job ----------------------------------------------------------------------

const realExit = process.exit.bind(process);
process.exit = (code) => {
  throw new ExitRequest(code === undefined ? (process.exitCode ?? 0) : code);
};
process.on("unhandledRejection", (e) => {
  // As Python's asyncio does for a task nobody awaited: say so, go on.
  process.stderr.write(`unhandled promise rejection: ${e && e.stack ? e.stack : e}\n`);
});

// compile returns the code as a script, or, when it awaits at top level, as
// the body of an async function (a SyntaxError of the script says so).
function compile(code) {
  try {
    return new vm.Script(code, { filename: "<code>" });
  } catch (e) {
    if (!(e instanceof SyntaxError) || !/await|async/.test(code)) {
      throw e;
    }
    try {
      return new vm.Script(`(async () => {\n${code}\n})()`, { filename: "<code>", lineOffset: -1 });
    } catch {
      throw e; // the script's own error says what is wrong
    }
  }
}

function describe(e) {
  if (e instanceof Error) {
    return `${e.name}: ${e.message}`;
  }
  return `thrown: ${String(e)}`;
}

async function runJob(frame) {
  bindServers(Array.isArray(frame.servers) ? frame.servers : []);
  process.exitCode = undefined;
  let status = "success";
  let code = 0;
  let error = "";
  try {
    await compile(typeof frame.code === "string" ? frame.code : "").runInThisContext();
  } catch (e) {
    if (e instanceof ExitRequest) {
      code = Number.isInteger(e.code) ? e.code : 1;
      if (code !== 0) {
        status = "error";
        error = `exited with code ${code}`;
      }
    } else {
      process.stderr.write(`${e && e.stack ? e.stack : describe(e)}\n`);
      status = "error";
      code = 1;
      error = describe(e);
    }
  }
  await Promise.all([flushed(process.stdout), flushed(process.stderr)]);
  return { type: "done", status, exit_code: code, error };
}

let queue = Promise.resolve();

function onFrame(frame) {
  if (frame === null || typeof frame !== "object") {
    realExit(70);
  }
  if (frame.type === "reply") {
    onReply(frame);
  } else if (frame.type === "exec") {
    queue = queue.then(async () => {
      send(await runJob(frame));
      if (frame.persist !== true) {
        chan.end(() => realExit(0));
      }
    });
  }
}
