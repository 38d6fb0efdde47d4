"""mcpexec sandbox runner.

Started inside the sandbox as `python3 runner.py SOCKET`. Standard library only.

Two processes, so that the user's code never holds the host connection:

- The supervisor (this process, PID 1 of the container) connects to the host,
  says hello, and relays. It makes itself non-dumpable, so a process of the same
  user can neither ptrace it nor open its /proc files (its memory, its file
  descriptors): the host socket is out of reach of the code.
- The executor, forked from the supervisor before any job, closes the host
  socket and runs each job's code with top-level await. It talks to the
  supervisor over a socket pair; its fds 1 and 2 are pipes the supervisor reads.

The supervisor trusts nothing from the executor: output comes only from the
pipes (capped per job), calls are forwarded only with a known method, a
positive id and object params, and a malformed frame ends the job with a
protocol error. The host checks everything again (package sandbox, Go).

Start-up cost matters (every job of a fresh sandbox pays it): only what a plain
synchronous job needs is imported up front; asyncio, traceback, keyword and
importlib's helpers are imported on first use, and the event loop is created by
the first job whose code awaits at top level.
"""

import builtins
import codecs
import fcntl
import json
import os
import select
import signal
import socket
import struct
import sys
import threading

PROTOCOL_VERSION = 2
# ast.PyCF_ALLOW_TOP_LEVEL_AWAIT and inspect.CO_COROUTINE, without importing ast
# and inspect.
PYCF_ALLOW_TOP_LEVEL_AWAIT = 0x2000
CO_COROUTINE = 0x0080
MAX_FRAME = 16 << 20
# Largest call the executor may send (the host's proxy request limit).
MAX_CALL = 8 << 20
# The host answers at most this many calls of a job at once (sandbox.MaxConcurrentCalls)
# and refuses more; coroutines beyond it wait here instead. One slot is kept for the
# blocking helpers (docs, memory).
MAX_CONCURRENT_CALLS = 16
# What the supervisor buffers for an executor that does not read its channel.
MAX_PENDING_TO_EXECUTOR = 32 << 20
KNOWN_METHODS = frozenset((
    "call_tool", "list_servers", "discovered_servers", "list_tools", "query_tool_docs",
    "search_tool_docs", "capability_summary", "memory_get", "memory_put", "memory_delete",
    "memory_list", "job_result",
))
SECRET_ENV = "MCPEXEC_RUNNER_SECRET"


class MCPError(Exception):
    """An error reported by the host for a proxy call (tool error, unknown server...)."""


def _encode(frame):
    body = json.dumps(frame, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
    if len(body) > MAX_FRAME:
        raise MCPError("message of %d bytes exceeds the %d-byte frame limit" % (len(body), MAX_FRAME))
    return struct.pack(">I", len(body)) + body


class _Channel:
    """Length-prefixed JSON frames over a blocking socket."""

    def __init__(self, sock):
        self._sock = sock
        self._wlock = threading.Lock()

    def send(self, frame):
        data = _encode(frame)
        with self._wlock:
            self._sock.sendall(data)

    def _read_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self._sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise EOFError("connection closed")
            buf += chunk
        return bytes(buf)

    def recv(self):
        (n,) = struct.unpack(">I", self._read_exact(4))
        if n > MAX_FRAME:
            raise EOFError("frame too large")
        return json.loads(self._read_exact(n))


class _FrameBuffer:
    """Splits a byte stream into frames; raises ValueError on a bad one."""

    def __init__(self, limit):
        self._buf = bytearray()
        self._limit = limit

    def feed(self, data):
        self._buf += data
        frames = []
        while len(self._buf) >= 4:
            (n,) = struct.unpack(">I", self._buf[:4])
            if n > self._limit:
                raise ValueError("frame of %d bytes is over the %d-byte limit" % (n, self._limit))
            if len(self._buf) < 4 + n:
                break
            body = bytes(self._buf[4:4 + n])
            del self._buf[:4 + n]
            frame = json.loads(body)
            if not isinstance(frame, dict):
                raise ValueError("frame is not an object")
            frames.append(frame)
        return frames


class Runner:
    """The executor's state: the channel to the supervisor, calls in flight,
    the session's globals and event loop."""

    def __init__(self, chan):
        self.chan = chan
        self._next_id = 0
        self._pending = {}
        self._plock = threading.Lock()
        self.loop = None
        self.globals = None
        self.servers = []
        self._call_slots = None

    # -- proxy calls -------------------------------------------------------------
    async def rpc(self, method, params=None):
        if self._call_slots is None:
            import asyncio

            self._call_slots = asyncio.Semaphore(MAX_CONCURRENT_CALLS - 1)
        async with self._call_slots:
            return await self._rpc(method, params)

    async def _rpc(self, method, params):
        import asyncio

        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self._plock:
            self._next_id += 1
            cid = self._next_id
            self._pending[cid] = (loop, fut)
        try:
            self.chan.send({"type": "call", "id": cid, "method": method, "params": params or {}})
        except BaseException:
            with self._plock:
                self._pending.pop(cid, None)
            raise
        return await fut

    def rpc_sync(self, method, params=None):
        """Calls the host and blocks until it answers (for helpers that are plain
        functions, such as memory and docs)."""
        done = threading.Event()
        box = {}
        with self._plock:
            self._next_id += 1
            cid = self._next_id
            self._pending[cid] = (None, (done, box))
        try:
            self.chan.send({"type": "call", "id": cid, "method": method, "params": params or {}})
        except BaseException:
            with self._plock:
                self._pending.pop(cid, None)
            raise
        done.wait()
        if box.get("error"):
            raise MCPError(box["error"])
        return box.get("result")

    def on_reply(self, frame):
        with self._plock:
            entry = self._pending.pop(frame.get("id"), None)
        if entry is None:
            return
        loop, fut = entry
        if loop is None:  # a blocking rpc_sync call
            done, box = fut
            box["error"], box["result"] = frame.get("error"), frame.get("result")
            done.set()
            return

        def settle():
            if fut.done():
                return
            if frame.get("error"):
                fut.set_exception(MCPError(frame["error"]))
            else:
                fut.set_result(frame.get("result"))

        loop.call_soon_threadsafe(settle)

    # -- execution ---------------------------------------------------------------
    def new_globals(self):
        g = {"__name__": "__main__", "__builtins__": builtins}
        g.update(_api(self))
        return g

    def execute(self, code, g):
        compiled = compile(code, "<code>", "exec", flags=PYCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
        if not compiled.co_flags & CO_COROUTINE:
            # No top-level await: plain code needs no event loop.
            exec(compiled, g)  # noqa: S102 - running the user's code is the point
            return
        if self.loop is None:
            # The first job that awaits creates the loop; a session's later jobs
            # reuse it (tasks they left behind go on).
            import asyncio

            self.loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(eval(compiled, g))  # noqa: S307

    def run_job(self, frame):
        """Runs one exec frame; returns the done frame."""
        self.servers = [s for s in (frame.get("servers") or []) if isinstance(s, str)]
        if self.globals is None:
            self.globals = self.new_globals()
        else:  # a session's next job: its servers may differ
            _bind_servers(self, self.globals)
        g = self.globals
        status, code, err = "success", 0, ""
        try:
            self.execute(frame.get("code", ""), g)
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
            if code != 0:
                status, err = "error", "exited with code %d" % code
        except BaseException as e:  # the user's failure is data, not our crash
            import traceback

            traceback.print_exc()
            status, code = "error", 1
            err = "%s: %s" % (type(e).__name__, e)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        return {"type": "done", "status": status, "exit_code": code, "error": err}


# -- the API user code sees ---------------------------------------------------------
#
# Helpers that fetch metadata (docs, memory) are plain functions that block on the
# host; their list/dict/str results may also be awaited, so both `list_servers()`
# and `await list_servers()` work. Tool calls are coroutines: await them (or gather
# several).


class _AwaitableList(list):
    def __await__(self):
        yield from ()
        return self


class _AwaitableDict(dict):
    def __await__(self):
        yield from ()
        return self


class _AwaitableStr(str):
    def __await__(self):
        yield from ()
        return self


def _aw(v):
    if isinstance(v, list):
        return _AwaitableList(v)
    if isinstance(v, dict):
        return _AwaitableDict(v)
    if isinstance(v, str):
        return _AwaitableStr(v)
    return v


def _identifier(name):
    """The Python alias of a server or tool name (same rule as the host's)."""
    import keyword

    a = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in name)
    if not a or a[0].isdigit():
        a = "_" + a
    if keyword.iskeyword(a):
        a += "_"
    return a


def _aliases(names):
    out, used = {}, set()
    for n in names:
        a = base = _identifier(n)
        i = 2
        while a in used:
            a = "%s_%d" % (base, i)
            i += 1
        used.add(a)
        out[n] = a
    return out


def _json_value(value, what):
    try:
        json.dumps(value)
    except (TypeError, ValueError) as e:
        raise TypeError("%s must be JSON-serialisable (dict, list, str, int, float, bool, None): %s" % (what, e)) from None
    return value


class _Tool:
    """One tool of a server: `await tool(**arguments)`."""

    def __init__(self, runner, server, info):
        self._runner = runner
        self._server = server
        self.name = info["name"]
        self.alias = info.get("alias") or _identifier(self.name)
        self.__doc__ = info.get("description") or ""
        self.__name__ = self.alias
        props = ((info.get("input_schema") or {}).get("properties") or {})
        self._takes_raw = "raw" in props

    async def __call__(self, *args, **kwargs):
        if args:
            raise TypeError("%s.%s takes keyword arguments only, e.g. %s(name=value)" % (self._server, self.name, self.alias))
        raw = False
        if not self._takes_raw:
            raw = bool(kwargs.pop("raw", False))
        return await _call_tool(self._runner, self._server, self.name, kwargs, raw, None)

    def __repr__(self):
        return "<MCP tool %s.%s>" % (self._server, self.name)


class MCPServerProxy:
    """A server given to this run: `await mcp_x.tool(**kwargs)`,
    `await mcp_x.list_tools()`, `mcp_x["tool-name"]`."""

    def __init__(self, runner, name):
        self._runner = runner
        self._name = name
        self._tools = None

    def _load(self):
        if self._tools is None:
            infos = self._runner.rpc_sync("list_tools", {"server": self._name}) or []
            tools = {}
            for info in infos:
                t = _Tool(self._runner, self._name, info)
                tools[t.name] = t
                tools.setdefault(t.alias, t)
            self._tools = tools
        return self._tools

    def _tool(self, name):
        tools = self._load()
        if name in tools:
            return tools[name]
        self._tools = None  # the list may have changed: look once more
        tools = self._load()
        if name in tools:
            return tools[name]
        names = sorted({t.alias for t in tools.values()})
        raise AttributeError("MCP server %r has no tool %r; its tools are: %s" % (self._name, name, ", ".join(names) or "none"))

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return self._tool(attr)

    def __getitem__(self, name):
        try:
            return self._tool(name)
        except AttributeError as e:
            raise KeyError(str(e)) from None

    def __dir__(self):
        return sorted({t.alias for t in self._load().values()} | {"list_tools"})

    async def list_tools(self):
        infos = await self._runner.rpc("list_tools", {"server": self._name})
        self._tools = None
        return infos

    def __repr__(self):
        return "<MCP server %s>" % self._name


class _Servers(dict):
    """mcp_servers: the servers given to this run, by name."""

    def __missing__(self, name):
        raise KeyError("MCP server %r was not given to this run; it may use: %s (add it to run_python's servers)"
                       % (name, ", ".join(sorted(self)) or "none"))


async def _call_tool(runner, server, tool, arguments, raw, timeout):
    params = {"server": server, "tool": tool, "arguments": arguments or {}, "raw": bool(raw)}
    if timeout is not None:
        params["timeout"] = float(timeout)
    return await runner.rpc("call_tool", params)


class _Finder:
    """Serves the synthetic modules `mcp`, `mcp.runtime`, `mcp.servers` and
    `mcp.servers.<alias>` (whose names are the server's tools). A meta path
    finder and loader by protocol (importlib.abc is not imported: it costs
    start-up time)."""

    def __init__(self, runner):
        self.runner = runner

    def find_spec(self, fullname, path=None, target=None):
        if fullname in ("mcp", "mcp.servers"):
            from importlib.machinery import ModuleSpec

            return ModuleSpec(fullname, self, is_package=True)
        if fullname == "mcp.runtime" or fullname.startswith("mcp.servers."):
            from importlib.machinery import ModuleSpec

            return ModuleSpec(fullname, self, is_package=False)
        return None

    def create_module(self, spec):
        if spec.name == "mcp.runtime":
            return sys.modules["runtime"]
        return None

    def exec_module(self, module):
        name = module.__name__
        if module is sys.modules.get("runtime"):
            return  # mcp.runtime is the runtime module itself
        if name in ("mcp", "mcp.servers"):
            module.__path__ = []
            if name == "mcp":
                module.runtime = sys.modules.get("runtime")
            return
        alias = name[len("mcp.servers."):]
        server = {_identifier(s): s for s in self.runner.servers}.get(alias, alias if alias in self.runner.servers else None)
        if server is None:
            raise ImportError("no MCP server %r in this run; it may use: %s (add it to run_python's servers)"
                              % (alias, ", ".join(sorted(self.runner.servers)) or "none"), name=name)
        proxy = MCPServerProxy(self.runner, server)
        tools = {t.alias: t for t in proxy._load().values()}
        module.__dict__.update(tools)
        module.__all__ = sorted(tools)
        module.list_tools = proxy.list_tools
        module.server = proxy


def _install_finder(runner):
    for name in [m for m in sys.modules if m == "mcp" or m.startswith("mcp.")]:
        del sys.modules[name]
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
    sys.meta_path.insert(0, _Finder(runner))


def _bind_servers(runner, g):
    """(Re)binds mcp_servers and mcp_<alias> for the servers of the current job."""
    for name in [k for k, v in g.items() if k.startswith("mcp_") and isinstance(v, MCPServerProxy)]:
        del g[name]
    servers = _Servers()
    for name, alias in _aliases(runner.servers).items():
        proxy = MCPServerProxy(runner, name)
        servers[name] = proxy
        g["mcp_" + alias] = proxy
    g["mcp_servers"] = servers
    for name in [m for m in sys.modules if m.startswith("mcp.servers.")]:
        del sys.modules[name]
    rt = sys.modules.get("runtime")
    if rt is not None:
        rt.mcp_servers = servers


def _api(runner):
    """The names the user's code sees without import (also in module `runtime`)."""

    async def call_tool(server, tool, arguments=None, raw=False, timeout=None):
        """Calls tool of server. The result is the tool's text, JSON-decoded when
        it parses; raw=True gives the whole MCP result. Errors raise MCPError."""
        return await _call_tool(runner, server, tool, arguments, raw, timeout)

    def list_servers():
        """Names of the MCP servers this run may call."""
        return _AwaitableList(sorted(runner.servers))

    def discovered_servers(detailed=False):
        """Every server the front-end knows (detailed: dicts with description,
        transport and whether this run may use it)."""
        return _aw(runner.rpc_sync("discovered_servers", {"detailed": bool(detailed)}))

    def list_tools(server):
        """Tools of a server: dicts of name, alias, description, input_schema."""
        return _aw(runner.rpc_sync("list_tools", {"server": server}))

    def query_tool_docs(server, tool=None, detail="summary"):
        """Documentation of a server's tools (or of one tool): summary and
        signature; detail="full" adds the description and input schema."""
        return _aw(runner.rpc_sync("query_tool_docs", {"server": server, "tool": tool, "detail": detail}))

    def search_tool_docs(query, limit=5, detail="summary"):
        """Tools of this run's servers ranked by relevance to query."""
        return _aw(runner.rpc_sync("search_tool_docs", {"query": str(query), "limit": int(limit), "detail": detail}))

    def capability_summary():
        """A short text overview of what this run can use."""
        return _aw(runner.rpc_sync("capability_summary"))

    # -- memory: kept by the state service across runs, per caller --------------
    def _key(key):
        if not isinstance(key, str) or not key:
            raise TypeError("memory keys are non-empty strings, got %r" % (key,))
        return key

    def save_memory(key, value, metadata=None):
        """Stores value (JSON-serialisable) under key; returns its info."""
        params = {"key": _key(key), "value": _json_value(value, "the value")}
        if metadata is not None:
            params["metadata"] = _json_value(metadata, "metadata")
        return _info(runner.rpc_sync("memory_put", params))

    def load_memory(key, default=None):
        """The value stored under key, or default."""
        m = runner.rpc_sync("memory_get", {"key": _key(key)})
        return default if m is None else m.get("value")

    def delete_memory(key):
        """Deletes key; True when it existed."""
        return bool(runner.rpc_sync("memory_delete", {"key": _key(key)}))

    def list_memories(prefix=""):
        """Infos (key, metadata, created_at, updated_at, version) of the stored
        memories whose key starts with prefix."""
        return _AwaitableList(runner.rpc_sync("memory_list", {"prefix": str(prefix)}) or [])

    def memory_exists(key):
        """True when key is stored."""
        return runner.rpc_sync("memory_get", {"key": _key(key)}) is not None

    def get_memory_info(key):
        """key's info without its value, or None."""
        m = runner.rpc_sync("memory_get", {"key": _key(key)})
        return None if m is None else _info(m)

    def update_memory(key, fn, default=None, metadata=None):
        """Atomically replaces key's value with fn(current) (current is default
        when absent) and returns the new value. It is compare-and-set on the
        server, retried when another run changed the key meanwhile."""
        _key(key)
        for _ in range(50):
            m = runner.rpc_sync("memory_get", {"key": key})
            current = default if m is None else m.get("value")
            new = _json_value(fn(current), "fn's result")
            params = {"key": key, "value": new, "if_version": 0 if m is None else m["version"]}
            meta = metadata if metadata is not None else (None if m is None else m.get("metadata"))
            if meta is not None:
                params["metadata"] = meta
            res = runner.rpc_sync("memory_put", params)
            if not (isinstance(res, dict) and res.get("conflict")):
                return new
        raise MCPError("update_memory(%r): the key kept changing under concurrent updates; try again" % key)

    def _info(m):
        return _AwaitableDict({k: v for k, v in (m or {}).items() if k != "value"})

    # -- workflows ---------------------------------------------------------------
    def job_result(job_id):
        """The outcome of an ended job of the same namespace (typically a parent
        named in this job's after/after_any): {status, summary, exitCode,
        stdout[], stderr[], error, timeoutSeconds, jobId}."""
        if not isinstance(job_id, str) or not job_id:
            raise TypeError("job ids are non-empty strings, got %r" % (job_id,))
        return _AwaitableDict(runner.rpc_sync("job_result", {"id": job_id}))

    api = {
        "MCPError": MCPError,
        "MCPServerProxy": MCPServerProxy,
        "call_tool": call_tool,
        "list_servers": list_servers,
        "discovered_servers": discovered_servers,
        "list_tools": list_tools,
        "query_tool_docs": query_tool_docs,
        "search_tool_docs": search_tool_docs,
        "capability_summary": capability_summary,
        "save_memory": save_memory,
        "load_memory": load_memory,
        "delete_memory": delete_memory,
        "list_memories": list_memories,
        "memory_exists": memory_exists,
        "get_memory_info": get_memory_info,
        "update_memory": update_memory,
        "job_result": job_result,
    }
    rt = type(sys)("runtime", "The mcpexec sandbox API (the same names are available without import).")
    rt.__dict__.update(api)
    sys.modules["runtime"] = rt
    api["runtime"] = rt
    _install_finder(runner)
    _bind_servers(runner, api)
    rt.mcp_servers = api["mcp_servers"]
    return api




# -- the executor: runs the user's code, holds no host connection -----------------


def _open_std():
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)


def _zygote_main(zsock):
    """The zygote: imports and builds the API once, then forks one executor per
    job (or per session) on the supervisor's word. It runs no code itself and
    holds no thread, so every fork starts from the same clean state. It passes
    each executor's channel and output pipes to the supervisor over zsock (a
    SOCK_SEQPACKET pair) and reports its exit status."""
    _open_std()
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    except (OSError, ValueError):
        pass
    runner = Runner(None)
    # Build the API before the first job arrives: a warm sandbox's job then
    # pays only for its own code (its servers are bound when it comes).
    runner.globals = runner.new_globals()
    import gc

    gc.freeze()  # forks share these pages: keep the collector off them
    zsock.send(json.dumps({"type": "ready"}).encode())
    while True:
        try:
            msg = zsock.recv(4096)
        except OSError:
            msg = b""
        if not msg:
            os._exit(0)  # supervisor gone
        try:
            frame = json.loads(msg)
        except ValueError:
            os._exit(70)
        if frame.get("type") != "fork":
            os._exit(70)
        persist = bool(frame.get("persist"))
        parent_end, child_end = socket.socketpair()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                zsock.close()
                parent_end.close()
                os.close(out_r)
                os.close(err_r)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                os.close(out_w)
                os.close(err_w)
                _set_pdeathsig()
                code = _executor_main(runner, child_end, persist) or 0
            except BaseException:
                pass
            os._exit(code)
        child_end.close()
        os.close(out_w)
        os.close(err_w)
        socket.send_fds(zsock, [json.dumps({"type": "forked", "pid": pid}).encode()], [parent_end.fileno(), out_r, err_r])
        parent_end.close()
        os.close(out_r)
        os.close(err_r)
        _, status = os.waitpid(pid, 0)
        zsock.send(json.dumps({"type": "exited", "pid": pid, "status": status}).encode())


def _executor_main(runner, chan_sock, persist):
    """Runs in a forked executor: fds 1 and 2 are already its output pipes.
    It runs the jobs sent on chan_sock: one (then exits), or, for a session,
    each until the supervisor closes the channel."""
    _open_std()
    chan = _Channel(chan_sock)
    runner.chan = chan
    execs = []
    cond = threading.Condition()

    def reader():
        try:
            while True:
                frame = chan.recv()
                kind = frame.get("type")
                if kind == "reply":
                    runner.on_reply(frame)
                elif kind == "exec":
                    with cond:
                        execs.append(frame)
                        cond.notify()
        except BaseException:
            os._exit(0)  # supervisor gone: nothing left to do

    threading.Thread(target=reader, daemon=True).start()
    while True:
        with cond:
            while not execs:
                cond.wait()
            frame = execs.pop(0)
        chan.send(runner.run_job(frame))
        if not persist:
            return 0


# -- the supervisor: PID 1, holds the host connection, relays and checks ----------


def _set_nondumpable():
    """prctl(PR_SET_DUMPABLE, 0): no process of the same user may ptrace this one
    or open its /proc files (memory, file descriptors)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(4, 0, 0, 0, 0) == 0
    except Exception:
        return False


def _set_pdeathsig():
    """The calling process dies with its parent (outside a container too)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass


class _Executor:
    """One job's (or one session's) code process, as the supervisor sees it."""

    def __init__(self, pid, chan, pipes, persist):
        self.pid = pid
        self.chan = chan  # non-blocking socket
        self.pipes = pipes  # read fd -> stream name
        self.persist = persist
        self.exited = None  # its wait status, once the zygote has reaped it

    def close(self):
        try:
            self.chan.close()
        except OSError:
            pass
        for fd in list(self.pipes):
            try:
                os.close(fd)
            except OSError:
                pass
        self.pipes.clear()


class _Zygote:
    def __init__(self, pid, sock):
        self.pid = pid
        self.sock = sock  # SOCK_SEQPACKET, blocking (messages are small)


def _spawn_zygote(host_sock):
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            host_sock.close()
            parent_end.close()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.close(null)
            _set_pdeathsig()
            try:
                with open("/proc/self/oom_score_adj", "w") as f:
                    f.write("1000")  # the OOM killer takes the code, not the supervisor
            except OSError:
                pass
            code = _zygote_main(child_end) or 0
        except BaseException:
            pass
        os._exit(code)
    child_end.close()
    return _Zygote(pid, parent_end)


# Writable places of a container that a job may leave things in; a sandbox
# that serves another job is wiped of them first.
WRITABLE = ("/tmp", "/workspace", "/dev/shm")


class _Supervisor:
    def __init__(self, host, zygote, reset):
        self.host = host
        self.hbuf = _FrameBuffer(MAX_FRAME)
        self.zygote = zygote
        self.reset_ok = reset  # PID 1 of its own container: may sweep and wipe
        self.ex = None  # the running executor
        self.xbuf = None
        self.to_ex = bytearray()
        self.pending = None  # the exec frame waiting for its executor
        self.result = None  # a fresh job's done frame, sent once its process is gone
        self.fresh = False
        self.job = None
        self.cap = 1 << 20
        self.sent = {}
        self.decoders = {}
        self.hello = None  # sent to the host when the zygote is ready

    def send_host(self, frame):
        self.host.sendall(_encode(frame))

    def to_executor(self, frame):
        if self.ex is None:
            return
        self.to_ex += _encode(frame)
        if len(self.to_ex) > MAX_PENDING_TO_EXECUTOR:
            self.fail("the code stopped reading the answers to its calls")

    # -- output -------------------------------------------------------------------
    def drain(self, fds=None):
        if self.ex is None:
            return
        for fd in list(fds if fds is not None else self.ex.pipes):
            while fd in self.ex.pipes:
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    break
                except OSError:
                    data = b""
                if not data:
                    del self.ex.pipes[fd]
                    os.close(fd)
                    break
                self.output(self.ex.pipes[fd], data)

    def output(self, name, data):
        if self.job is None:
            return  # between jobs: what leftover processes write is dropped
        text = self.decoders[name].decode(data)
        # Forward at most one character past the cap, so the host sees the overflow.
        room = self.cap + 1 - self.sent[name]
        if room <= 0 or not text:
            return
        text = text[:room]
        self.sent[name] += len(text)
        self.send_host({"type": "out", "job": self.job, "stream": name, "data": text})

    # -- frames -------------------------------------------------------------------
    def on_host(self, frame):
        kind = frame.get("type")
        if kind == "exec" and self.job is None:
            job = frame.get("job")
            self.job = job if isinstance(job, str) else ""
            cap = frame.get("output_cap")
            self.cap = cap if isinstance(cap, int) and cap > 0 else 1 << 20
            self.sent = {"stdout": 0, "stderr": 0}
            self.decoders = {n: codecs.getincrementaldecoder("utf-8")("replace") for n in ("stdout", "stderr")}
            self.fresh = frame.get("fresh") is True
            self.result = None
            exec_frame = {"type": "exec", "code": frame.get("code", ""), "servers": frame.get("servers") or []}
            if self.ex is not None and self.ex.persist and not self.fresh:
                self.drain()
                self.to_executor(exec_frame)  # a session's next job
                return
            if self.ex is not None:
                self.end_executor()
            self.pending = exec_frame
            try:
                self.zygote.sock.send(json.dumps({"type": "fork", "persist": not self.fresh}).encode())
            except OSError:
                self.zygote_gone()
        elif kind == "reply":
            self.to_executor({"type": "reply", "id": frame.get("id"), "result": frame.get("result"), "error": frame.get("error")})

    def on_zygote(self):
        try:
            msg, fds, _, _ = socket.recv_fds(self.zygote.sock, 4096, 3)
        except OSError:
            msg, fds = b"", []
        if not msg:
            for fd in fds:
                os.close(fd)
            self.zygote_gone()
        try:
            frame = json.loads(msg)
        except ValueError:
            frame = {}
        kind = frame.get("type")
        if kind == "ready" and self.hello is not None:
            self.send_host(self.hello)
            self.hello = None
        elif kind == "forked" and len(fds) == 3 and self.pending is not None and self.ex is None:
            chan = socket.socket(fileno=fds[0])
            chan.setblocking(False)
            for fd in fds[1:]:
                fl = fcntl.fcntl(fd, fcntl.F_GETFL)
                fcntl.fcntl(fd, fcntl.F_SETFL, fl | os.O_NONBLOCK)
            self.ex = _Executor(frame.get("pid"), chan, {fds[1]: "stdout", fds[2]: "stderr"}, not self.fresh)
            self.xbuf = _FrameBuffer(MAX_CALL + 4096)
            self.to_ex = bytearray()
            self.to_executor(self.pending)
            self.pending = None
        elif kind == "exited" and self.ex is not None and frame.get("pid") == self.ex.pid:
            status = frame.get("status")
            self.ex.exited = status if isinstance(status, int) else 0
            self.executor_gone()
        else:
            for fd in fds:
                os.close(fd)
            self.fail_zygote("the code's parent process sent an unexpected message")

    def on_executor(self, frame):
        kind = frame.get("type")
        if kind == "call":
            cid, method, params = frame.get("id"), frame.get("method"), frame.get("params")
            if not isinstance(cid, int) or isinstance(cid, bool) or cid <= 0:
                self.fail("the code sent a call without a valid id")
            elif method not in KNOWN_METHODS:
                self.to_executor({"type": "reply", "id": cid, "error": "unknown proxy method %r" % (str(method)[:40],)})
            elif params is not None and not isinstance(params, dict):
                self.to_executor({"type": "reply", "id": cid, "error": "call parameters must be an object"})
            elif self.job is None:
                self.to_executor({"type": "reply", "id": cid, "error": "no job is running: calls are answered only during a job"})
            else:
                self.send_host({"type": "call", "job": self.job, "id": cid, "method": method, "params": params or {}})
        elif kind == "done":
            if self.job is None or self.result is not None:
                return
            status = frame.get("status")
            code = frame.get("exit_code")
            err = frame.get("error")
            done = {
                "status": status if status in ("success", "error") else "error",
                "exit_code": code if isinstance(code, int) and not isinstance(code, bool) else 1,
                "error": err[:65536] if isinstance(err, str) else "",
            }
            if self.fresh:
                self.result = done  # sent once the job's process is gone and swept
            else:
                self.finish(done)
        else:
            self.fail("the code sent an unexpected %r frame" % (str(kind)[:40],))

    def finish(self, done, last=False):
        self.drain()
        frame = {"type": "done", "job": self.job}
        frame.update(done)
        if last:
            frame["last"] = True
        self.send_host(frame)
        self.job = None

    def fail(self, why):
        """The executor broke the protocol: end it, and the job with it."""
        self.kill_all()
        if self.job is not None:
            self.finish({"status": "error", "exit_code": -1, "error": "the code broke the runner protocol: " + why}, last=True)
        self.exit()

    def fail_zygote(self, why):
        self.kill_all()
        if self.job is not None:
            self.finish({"status": "error", "exit_code": -1, "error": "the sandbox broke: " + why}, last=True)
        self.exit()

    def zygote_gone(self):
        self.fail_zygote("the code's parent process is gone")

    def end_executor(self):
        if self.ex is None:
            return
        if self.ex.exited is None:
            try:
                os.kill(self.ex.pid, signal.SIGKILL)
            except OSError:
                pass
        self.ex.close()
        self.ex = None

    def executor_gone(self):
        """The zygote reaped the executor: the job ends (a fresh one now, with
        the result it sent), and a fresh job's leftovers are swept."""
        ex = self.ex
        self.drain()
        self.read_rest()  # its last frames (its done) may not have been read yet
        done = self.result
        if done is None and self.job is not None:
            status = ex.exited
            if os.WIFSIGNALED(status):
                sig = os.WTERMSIG(status)
                code = 128 + sig
                if sig == signal.SIGKILL:
                    why = "the code's process was killed (SIGKILL): it most likely hit the sandbox's memory limit"
                else:
                    why = "the code's process was killed by signal %d" % sig
            else:
                code = os.WEXITSTATUS(status)
                why = "the code's process exited with code %d" % code
            done = {"status": "error", "exit_code": code, "error": why}
        self.end_executor()
        if done is None:
            return
        clean = self.result is not None and self.fresh and self.sweep()
        self.result = None
        self.finish(done, last=not clean)
        if not clean:
            self.exit()

    def read_rest(self):
        """Reads what an exited executor left in its channel (non-blocking: a
        process it left behind may hold the channel open)."""
        ex = self.ex
        while ex is not None and ex is self.ex:
            try:
                data = ex.chan.recv(1 << 20)
            except OSError:
                return
            if not data:
                return
            try:
                frames = self.xbuf.feed(data)
            except ValueError as e:
                self.fail(str(e))
            for frame in frames:
                self.on_executor(frame)

    # -- between jobs -------------------------------------------------------------
    def strangers(self):
        """Processes of the container other than the supervisor and the zygote."""
        mine = {os.getpid(), self.zygote.pid}
        out = []
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) not in mine:
                out.append(int(name))
        return out

    def reap(self):
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.zygote.pid:
                self.zygote_gone()

    def sweep(self):
        """After a fresh job: kill what it left running and wipe what it wrote.
        Returns whether the sandbox may serve another job of the same caller;
        any sign of damage (a leftover process, something that cannot be
        wiped, System V IPC objects, a stopped zygote, memory still held)
        retires it."""
        if not self.reset_ok:
            return False
        clean = True
        for _ in range(50):
            self.reap()
            left = self.strangers()
            if not left:
                break
            clean = False  # a process outlived its job
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            select.select([], [], [], 0.002)
        else:
            return False
        for top in WRITABLE:
            try:
                entries = os.listdir(top)
            except OSError:
                continue
            for name in entries:
                if not _remove(os.path.join(top, name)):
                    clean = False
        for kind in ("shm", "msg", "sem"):
            try:
                with open("/proc/sysvipc/" + kind) as f:
                    if len(f.read().splitlines()) > 1:
                        clean = False
            except OSError:
                pass
        try:
            with open("/proc/%d/stat" % self.zygote.pid) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if state not in ("S", "R"):
                clean = False
        except (OSError, IndexError):
            clean = False
        return clean and not _memory_held()

    def kill_all(self):
        if self.ex is not None and self.ex.exited is None:
            try:
                os.kill(self.ex.pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.kill(self.zygote.pid, signal.SIGKILL)
        except OSError:
            pass

    def exit(self):
        self.kill_all()
        os._exit(0)

    # -- the loop -----------------------------------------------------------------
    def loop(self, hello):
        """Relays until the host or the zygote goes. hello is sent to the host
        once the zygote says it is ready: a warm sandbox is one whose code
        process waits with its API built."""
        self.hello = hello
        host_fd = self.host.fileno()
        zfd = self.zygote.sock.fileno()
        while True:
            rl = [host_fd, zfd]
            wl = []
            ex = self.ex
            if ex is not None:
                rl.append(ex.chan.fileno())
                rl += list(ex.pipes)
                if self.to_ex:
                    wl.append(ex.chan.fileno())
            readable, writable, _ = select.select(rl, wl, [])
            if ex is not None and ex is self.ex and ex.chan.fileno() in writable:
                try:
                    n = ex.chan.send(self.to_ex[:1 << 20])
                    del self.to_ex[:n]
                except BlockingIOError:
                    pass
                except OSError:
                    self.to_ex = bytearray()  # the executor closed it: its exit is reported
            for fd in readable:
                if fd == host_fd:
                    data = self.host.recv(1 << 20)
                    if not data:
                        self.exit()  # host gone: nothing left to do
                    for frame in self.hbuf.feed(data):
                        self.on_host(frame)
                elif fd == zfd:
                    self.on_zygote()
                elif self.ex is not ex or ex is None:
                    continue  # the executor ended in this round
                elif fd == ex.chan.fileno():
                    try:
                        data = ex.chan.recv(1 << 20)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        continue  # its exit is reported by the zygote
                    try:
                        frames = self.xbuf.feed(data)
                    except ValueError as e:
                        self.fail(str(e))
                    for frame in frames:
                        self.on_executor(frame)
                        if self.ex is not ex:
                            break
                else:
                    self.drain([fd])


def _remove(path):
    """Removes path, whatever the job made of its modes. Reports success."""
    try:
        if os.path.islink(path) or not os.path.isdir(path):
            os.unlink(path)
            return True
        os.chmod(path, 0o700)
        for name in os.listdir(path):
            _remove(os.path.join(path, name))
        os.rmdir(path)
        return True
    except OSError:
        return False


def _memory_held():
    """Whether the container still holds over half its memory limit after a
    job's processes are gone and its files wiped (cgroup v2 or v1)."""
    for cur, lim in (("/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.max"),
                     ("/sys/fs/cgroup/memory/memory.usage_in_bytes", "/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            with open(cur) as f:
                used = int(f.read())
            with open(lim) as f:
                limit = f.read().strip()
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 1 << 60:
            return False
        return used > int(limit) // 2
    return False


def main():
    args = sys.argv[1:]
    reset = "--reset" in args
    args = [a for a in args if a != "--reset"]
    if len(args) != 1:
        sys.__stderr__.write("usage: runner.py SOCKET [--reset]\n")
        return 2
    secret = os.environ.pop(SECRET_ENV, "")
    # PID 1 of a container gets no signal from inside it unless it handles it:
    # take Python's handlers away so the code cannot interrupt the supervisor.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(args[0])
    isolated = _set_nondumpable()
    # Sweeping processes and wiping files is safe only in a container of
    # its own: as its PID 1.
    reset = reset and os.getpid() == 1
    zygote = _spawn_zygote(sock)
    sup = _Supervisor(sock, zygote, reset)
    hello = {"type": "hello", "version": PROTOCOL_VERSION, "secret": secret, "isolated": isolated, "reset": reset}
    try:
        sup.loop(hello)
    except BaseException:
        sup.exit()


if __name__ == "__main__":
    sys.exit(main())
