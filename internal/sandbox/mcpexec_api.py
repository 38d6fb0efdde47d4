"""mcpexec runner: the executor's state (calls to the host, running code)
and the API the sandbox's code sees. Standard library only."""

import builtins
import json
import opcode
import os
import select
import sys
import threading

from mcpexec_protocol import CO_COROUTINE, MAX_CONCURRENT_CALLS, MCPError, PYCF_ALLOW_TOP_LEVEL_AWAIT, _encode


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
        # Who reads the channel. The executor's main thread does, as long as
        # only it calls: its event loop watches the channel (add_reader) and a
        # blocking call reads it until its reply comes, so the executor keeps
        # one thread (runner._executor_main says why that matters). A call
        # from another thread (the code's own) starts a reader thread, which
        # reads for good. _rlock keeps each frame whole between readers.
        self.main = None  # the main thread's ident, set by the executor
        self.threaded = False
        self._rlock = threading.Lock()
        self._watched = None  # the event loop watching the channel
        self.execs = []  # exec frames read, not yet run
        self.cond = threading.Condition()  # execs appended, for the main thread
        # The code of this executor's jobs (a session's, newest last), where
        # save_tool finds the source of a function the code defined.
        self.codes = []

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
        self._route(loop)
        self._send_call(method, params, (loop, fut))
        self._await_alone(loop)
        return await fut

    def _await_alone(self, loop):
        """Reads a lone call's reply here when nothing else on the loop can
        run before it comes: no callback ready, no reader but the channel's,
        no thread reading for us. It waits on the channel and the loop's
        wake-up socket (call_soon_threadsafe), up to the loop's next timer;
        whatever else comes first, the loop takes over as before. The reply
        then settles the call on the spot, and the await does not go round
        the loop (its select and two turns) for it.
        Only with asyncio's own loop, whose attributes this reads; any other
        (or a future version without them) goes round the loop."""
        if self.threaded or len(self._pending) != 1 or threading.get_ident() != self.main:
            return
        ready, scheduled = getattr(loop, "_ready", None), getattr(loop, "_scheduled", None)
        selector, wake = getattr(loop, "_selector", None), getattr(loop, "_ssock", None)
        if ready is None or scheduled is None or selector is None or wake is None or ready:
            return
        try:
            if len(selector.get_map()) != 2:  # the wake-up socket and the channel
                return
            timeout = -1
            if scheduled:
                timeout = max(0, int((scheduled[0].when() - loop.time()) * 1000))
            p = select.poll()
            p.register(self.chan.fileno(), select.POLLIN)
            p.register(wake.fileno(), select.POLLIN)
            got = p.poll(timeout)
        except (AttributeError, TypeError, ValueError, OSError):
            return
        if any(fd == self.chan.fileno() for fd, _ in got):
            self._read_ready()

    def rpc_sync(self, method, params=None):
        """Calls the host and blocks until it answers (for helpers that are plain
        functions, such as memory and docs)."""
        done = threading.Event()
        box = {}
        self._route()
        self._send_call(method, params, (None, (done, box)))
        if threading.get_ident() == self.main:
            while not done.is_set() and not self.threaded:
                if self._readable(0.05):  # bounded: a reader thread may start
                    self._read_ready()
        done.wait()
        if box.get("error"):
            raise MCPError(box["error"])
        return box.get("result")

    def _route(self, loop=None):
        """Sees that the reply to a call about to be sent will be read: by the
        loop (on the main thread), by the blocking call itself, or by a reader
        thread once a call comes from another thread."""
        if self.threaded:
            return
        if threading.get_ident() != self.main:
            with self._plock:
                if self.threaded:
                    return
                self.threaded = True
            threading.Thread(target=self._reader, daemon=True).start()
        elif loop is not None and self._watched is not loop:
            loop.add_reader(self.chan.fileno(), self._on_readable, loop)
            self._watched = loop

    def _on_readable(self, loop):
        if self.threaded:  # the reader thread reads from now on
            loop.remove_reader(self.chan.fileno())
            self._watched = None
            return
        self._read_ready()

    def _reader(self):
        while True:
            self._readable(None)
            self._read_ready()

    def _readable(self, timeout):
        """Waits up to timeout seconds (None: for ever) for the channel to be
        readable."""
        p = select.poll()
        p.register(self.chan.fileno(), select.POLLIN)
        return bool(p.poll(None if timeout is None else int(timeout * 1000)))

    def _read_ready(self):
        """Reads the frames that wait, without waiting. Frames are read under
        _rlock, so each goes whole to one reader, in order; no reader holds it
        while it waits."""
        with self._rlock:
            try:
                frames = self.chan.recv_ready()
            except BaseException:
                os._exit(0)  # the supervisor is gone (or broke the protocol): nothing left to do
            for frame in frames:
                self._dispatch(frame)

    def _dispatch(self, frame):
        """A reply settles its call, an exec frame waits in execs."""
        kind = frame.get("type")
        if kind == "reply":
            self.on_reply(frame)
        elif kind == "exec":
            with self.cond:
                self.execs.append(frame)
                self.cond.notify()

    def next_exec(self):
        """The next exec frame: read on this (the main) thread, or waited for
        while a reader thread reads. A reply read here (to a call of a task a
        session's job left running) settles its call."""
        while True:
            with self.cond:
                if self.execs:
                    return self.execs.pop(0)
                if self.threaded:
                    self.cond.wait()
                    continue
            # Bounded while a thread of the code's could start a reader.
            if self._readable(None if threading.active_count() == 1 else 1):
                self._read_ready()

    def _send_call(self, method, params, entry):
        """Sends a call frame under a new id, with entry (loop, future) waiting in
        _pending for on_reply; a failed send takes the entry back."""
        with self._plock:
            self._next_id += 1
            cid = self._next_id
            self._pending[cid] = entry
        try:
            self.chan.send({"type": "call", "id": cid, "method": method, "params": params or {}})
        except BaseException:
            with self._plock:
                self._pending.pop(cid, None)
            raise

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

        if threading.get_ident() == self.main and loop.is_running():
            settle()  # on the loop's own thread (its reader)
        else:
            loop.call_soon_threadsafe(settle)

    # -- execution ---------------------------------------------------------------
    def warm_up(self):
        """Runs a job's steps on nothing and with no output, in an executor
        forked ahead of its job: the pages a job touches are then copied (the
        fork's copy-on-write faults, tens of microseconds each on a virtual
        machine) before the job comes, not while it runs. It goes through
        run_job itself (binding no servers, running a constant in the job's
        globals, then taking back every name and code it added), so the job's
        path is warmed, not a likeness of it: the exec frame's decoding, the
        done frame's encoding included."""
        g = self.globals
        names = set(g)
        ncodes = len(self.codes)
        try:
            done = self.run_job(json.loads(_encode({"type": "exec", "code": "_ = None\n", "servers": [], "persist": False})[4:]))
        finally:
            for name in set(g) - names:
                del g[name]
            del self.codes[ncodes:]
            self.servers = []
        _encode(done)

    def new_globals(self):
        g = {"__name__": "__main__", "__builtins__": builtins}
        g.update(_api(self))
        return g

    def execute(self, code, g):
        compiled, keep = _compile(code)
        self.codes.append(code)
        if _needs_saved_tools(compiled, g):
            load_saved_tools_into(self, g)
        try:
            self._run(compiled, g)
        finally:
            last = g.pop(_LAST, None) if keep else None
        if last is not None and _is_table(last):
            display(last)

    def _run(self, compiled, g):
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
        if "matplotlib.pyplot" in sys.modules:
            _save_figures()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        return {"type": "done", "status": status, "exit_code": code, "error": err}


# -- display: tables as a notebook shows them -------------------------------------

_LAST = "__mcpexec_last__"  # where a job's last expression's value is kept

# How much of a DataFrame display() and a trailing DataFrame show: a compact
# table (first and last rows, the columns that fit), with its dimensions.
_TABLE_OPTIONS = ("display.max_rows", 20, "display.min_rows", 10, "display.max_columns", 12,
                  "display.width", 120, "display.max_colwidth", 40, "display.show_dimensions", "truncate")


def _compile(code):
    """Compiles a job's code; returns the code object and whether it keeps the
    value of a trailing expression in _LAST. It does so only where pandas may
    be in play (loaded, or named by the code), so that a DataFrame left as the
    last expression is shown as in a notebook; other values are not printed
    (code that ends in a call keeps its output as it was)."""
    flags = PYCF_ALLOW_TOP_LEVEL_AWAIT
    if "pandas" not in sys.modules and "pandas" not in code:
        return compile(code, "<code>", "exec", flags=flags, dont_inherit=True), False
    import ast

    tree = compile(code, "<code>", "exec", flags=flags | ast.PyCF_ONLY_AST, dont_inherit=True)
    last = tree.body[-1] if tree.body else None
    if not isinstance(last, ast.Expr):
        return compile(tree, "<code>", "exec", flags=flags, dont_inherit=True), False
    tree.body[-1] = ast.copy_location(ast.Assign(targets=[ast.Name(_LAST, ast.Store())], value=last.value), last)
    ast.fix_missing_locations(tree)
    return compile(tree, "<code>", "exec", flags=flags, dont_inherit=True), True


def _is_table(obj):
    pd = sys.modules.get("pandas")
    return pd is not None and isinstance(obj, (pd.DataFrame, pd.Series))


def display(*objs):
    """Shows each object as a notebook would: a pandas DataFrame or Series as a
    compact table on stdout (at most 20 rows and 12 columns, 120 characters
    wide, with its dimensions when cut), a matplotlib figure as a picture of
    the result (saved to out/ and closed, so it is not shown twice), anything
    else as its repr."""
    for obj in objs:
        if _is_table(obj):
            pd = sys.modules["pandas"]
            with pd.option_context(*_TABLE_OPTIONS):
                text = repr(obj)
        elif _is_figure(obj):
            import mcpexec_mplbackend

            mcpexec_mplbackend.save_figure(obj)
            continue
        else:
            text = repr(obj)
        print(text)


def _is_figure(obj):
    figure = sys.modules.get("matplotlib.figure")
    return figure is not None and isinstance(obj, figure.Figure)


def _save_figures():
    """Saves the figures the job left open (as plt.show() would)."""
    try:
        plt = sys.modules["matplotlib.pyplot"]
        if not plt.get_fignums():
            return
        import mcpexec_mplbackend

        mcpexec_mplbackend.save_open_figures()
    except BaseException as e:  # the job's figures, not the job, failed
        print("mcpexec: could not save the open figures: %s: %s" % (type(e).__name__, e), file=sys.stderr)


# -- saved tools ------------------------------------------------------------------
#
# A namespace's saved tools are loaded (one proxy call) only by a job whose code
# reads a global name that nothing defines: not the job's globals, not builtins,
# not the code itself (a name it assigns, defines or imports anywhere). Code that
# defines everything it uses, which is nearly every job, costs a scan of its
# bytecode and no call. `import user_tools` also loads them, and
# load_saved_tools() does so explicitly (for names only eval'd text uses).

_OP_LOAD = frozenset(opcode.opmap[n] for n in ("LOAD_NAME", "LOAD_GLOBAL") if n in opcode.opmap)
_OP_STORE = frozenset(opcode.opmap[n] for n in ("STORE_NAME", "STORE_GLOBAL", "DELETE_NAME", "DELETE_GLOBAL")
                      if n in opcode.opmap)
_OP_IMPORT = opcode.opmap.get("IMPORT_NAME")
_OP_LOAD_GLOBAL = opcode.opmap.get("LOAD_GLOBAL")
_OP_EXTENDED_ARG = opcode.opmap.get("EXTENDED_ARG")
# From 3.11 LOAD_GLOBAL's argument is the name's index shifted left by one.
_GLOBAL_SHIFT = 1 if sys.version_info >= (3, 11) else 0
_HAVE_ARGUMENT = opcode.HAVE_ARGUMENT


def _global_names(co, loads, stores):
    """Adds the global names co (and the code nested in it) reads to loads and
    those it binds to stores; "user_tools" to loads when it imports it."""
    names = co.co_names
    code = co.co_code
    ext = 0
    for i in range(0, len(code), 2):
        op = code[i]
        if op < _HAVE_ARGUMENT:
            ext = 0
            continue
        arg = code[i + 1] | ext
        if op == _OP_EXTENDED_ARG:
            ext = arg << 8
            continue
        ext = 0
        if op in _OP_LOAD:
            idx = arg >> _GLOBAL_SHIFT if op == _OP_LOAD_GLOBAL else arg
            if idx < len(names):
                loads.add(names[idx])
        elif op in _OP_STORE:
            if arg < len(names):
                stores.add(names[arg])
        elif op == _OP_IMPORT and arg < len(names) and names[arg].split(".")[0] == "user_tools":
            loads.add("user_tools")
    for c in co.co_consts:
        if isinstance(c, type(co)):
            _global_names(c, loads, stores)


def _needs_saved_tools(compiled, g):
    loads, stores = set(), set()
    try:
        _global_names(compiled, loads, stores)
    except Exception:  # an interpreter whose bytecode this does not read: load them
        return True
    if "user_tools" in loads and "user_tools" not in sys.modules:
        return True
    b = builtins.__dict__
    return any(n not in g and n not in b and n not in stores for n in loads)


def load_saved_tools_into(runner, g):
    """Defines the namespace's saved tools in g (and module user_tools), but
    none over a name g already has. A tool that fails to load is reported on
    stderr and left out; the job goes on. Returns the names defined."""
    try:
        tools = runner.rpc_sync("saved_tool_list")
    except Exception as e:
        print("mcpexec: could not load the saved tools: %s" % e, file=sys.stderr)
        return []
    mod = sys.modules.get("user_tools")
    if mod is None:
        mod = type(sys)("user_tools", "This namespace's saved tools (save_tool).")
        sys.modules["user_tools"] = mod
    defined = []
    for t in tools if isinstance(tools, list) else ():
        if not isinstance(t, dict):
            continue
        name, source = t.get("name"), t.get("source")
        if not isinstance(name, str) or not isinstance(source, str) or name in g:
            continue
        filename = "<saved tool %s>" % name
        try:
            import linecache

            linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
            # In the job's globals: the tool reads the API and the other tools.
            exec(compile(source, filename, "exec", dont_inherit=True), g)  # noqa: S102 - the namespace's own code
            fn = g.get(name)
            if not callable(fn):
                raise NameError("its source does not define %s" % name)
        except BaseException as e:
            print("mcpexec: saved tool %s failed to load (left out; delete_saved_tool(%r) removes it): %s: %s"
                  % (name, name, type(e).__name__, e), file=sys.stderr)
            continue
        setattr(mod, name, fn)
        defined.append(name)
    return defined


def _function_source(runner, fn):
    """The source of fn: from its file, else from the code of this executor's
    jobs (newest first) where its first line starts its definition."""
    import inspect
    import re
    import textwrap

    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        pass
    first = fn.__code__.co_firstlineno
    head = re.compile(r"\s*(@|(async\s+)?def\s+%s\b)" % re.escape(fn.__name__))
    for code in reversed(runner.codes):
        lines = code.splitlines(True)
        if first > len(lines) or not head.match(lines[first - 1]):
            continue
        try:
            block = inspect.getblock(lines[first - 1:])
        except Exception:
            continue
        text = textwrap.dedent("".join(block))
        if re.search(r"^(async\s+)?def\s+%s\b" % re.escape(fn.__name__), text, re.M):
            return text
    return None


# -- the API user code sees ---------------------------------------------------------
#
# Helpers that fetch metadata (docs, memory) are plain functions that block on the
# host; their list/dict/str results may also be awaited, so both `list_servers()`
# and `await list_servers()` work. Tool calls are coroutines: await them (or gather
# several).


class _Awaitable:
    """Mixed into a builtin type: awaiting the value gives the value itself."""

    def __await__(self):
        yield from ()
        return self


class _AwaitableList(list, _Awaitable):
    pass


class _AwaitableDict(dict, _Awaitable):
    pass


class _AwaitableStr(str, _Awaitable):
    pass


class _AwaitableTuple(tuple, _Awaitable):
    pass


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


# -- the Python bridge's names (mcp-server-code-execution-mode) ---------------------
#
# Code written for the bridge uses its aliases, which are lower-cased: server
# "GitHub" is mcp_github there (mcp_GitHub here), tool "getUser" is getuser. Both
# resolve. The rules are the bridge's own, character for character; the host
# has the same (tooldocs.BridgeToolAlias, BridgeServerAlias).

def _bridge_tool_alias(name):
    """The bridge's _sanitize_identifier(name, default="tool")."""
    import keyword
    import re

    a = re.sub(r"[^0-9a-zA-Z_]+", "_", name.strip()).lower() or "tool"
    if a[0].isdigit():
        a = "_" + a
    if keyword.iskeyword(a):
        a += "_"
    return a


def _bridge_tool_aliases(names):
    """The bridge's aliases of one server's tools, in its list order: the n-th
    tool of the same alias gets _n (MCPBridge._ensure_server_metadata)."""
    out, count = {}, {}
    for n in names:
        base = _bridge_tool_alias(n)
        count[base] = count.get(base, 0) + 1
        out.setdefault(n, base if count[base] == 1 else "%s_%d" % (base, count[base]))
    return out


def _bridge_server_aliases(names):
    """The bridge's server aliases (MCPBridge._alias_for), de-duplicated in sorted
    name order."""
    import re

    out, used = {}, set()
    for n in sorted(set(names)):
        base = re.sub(r"[^a-z0-9_]+", "_", n.lower()) or "server"
        if base[0].isdigit():
            base = "_" + base
        a, i = base, 1
        while a in used:
            i += 1
            a = "%s_%d" % (base, i)
        used.add(a)
        out[n] = a
    return out


def _server_named(runner, name):
    """The run's server that name names: the name itself, else its alias
    (mcpexec's or the bridge's); None when none does."""
    if not isinstance(name, str):
        return None
    if name in runner.servers:
        return name
    for table in (_aliases(runner.servers), _bridge_server_aliases(runner.servers)):
        for server, alias in table.items():
            if alias == name:
                return server
    return None


# -- what a tool call returns ---------------------------------------------------------
#
# The bridge returns the MCP result ({"content": [...], "isError": ...,
# "structuredContent": ...}); mcpexec returns the tool's value (its text,
# JSON-decoded when it parses). A call returns the value, which also answers the
# result's keys: result["content"][0]["text"], result["isError"],
# result.get("structuredContent") work as in the bridge (a dict value's own keys
# win). The whole result is also value.mcp_result; raw=True returns it alone.

# Go's unicode.IsSpace, which the host's rule (frontend.ToolValue) trims by.
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"


class _ResultKeys:
    """A tool's value that answers the MCP result's keys (str keys, which the
    value's own type does not take)."""

    mcp_result = None

    def __getitem__(self, key):
        if isinstance(key, str):
            return self.mcp_result[key]
        return super().__getitem__(key)

    def get(self, key, default=None):
        return self.mcp_result.get(key, default) if isinstance(key, str) else default


class _ToolStr(_ResultKeys, str):
    pass


class _ToolList(_ResultKeys, list):
    pass


class _ToolInt(_ResultKeys, int):
    def __getitem__(self, key):
        if isinstance(key, str):
            return self.mcp_result[key]
        raise TypeError("'int' object is not subscriptable")


class _ToolFloat(_ResultKeys, float):
    def __getitem__(self, key):
        if isinstance(key, str):
            return self.mcp_result[key]
        raise TypeError("'float' object is not subscriptable")


class _ToolDict(dict):
    """A dict value: its own keys first, then the MCP result's."""

    mcp_result = None

    def __missing__(self, key):
        if isinstance(key, str) and key in self.mcp_result:
            return self.mcp_result[key]
        raise KeyError(key)

    def get(self, key, default=None):
        if key in self:
            return dict.__getitem__(self, key)
        return self.mcp_result.get(key, default) if isinstance(key, str) else default


_WRAP = ((bool, None), (int, _ToolInt), (float, _ToolFloat), (str, _ToolStr), (list, _ToolList), (dict, _ToolDict))


def _no_constant(name):
    raise ValueError("%s is not JSON" % name)


# The decoder of a tool's text, made once: json.loads with an argument makes
# a decoder per call.
_TEXT_DECODER = json.JSONDecoder(parse_constant=_no_constant)
# The first characters of a JSON text (NaN and Infinity, which Python's json
# reads, are refused by _no_constant): text that starts otherwise is taken as
# it is without trying to parse it, which raised and caught an error per call.
_JSON_START = frozenset('{["-0123456789tfnNI')


def _tool_value(res):
    """The value of an MCP result, by the host's rule (frontend.ToolValue): its
    text, JSON-decoded when it parses; the structured content when there is no
    text; None when there is no content; the result itself when it has only
    other content (images, resources). A value that can carry the result
    (not None or a bool) answers its keys."""
    if not isinstance(res, dict) or not isinstance(res.get("content"), list):
        return res  # not an MCP result (a host that answers otherwise)
    res.setdefault("isError", False)  # the bridge's results always say
    texts = [c["text"] for c in res["content"] if isinstance(c, dict) and c.get("type") == "text" and isinstance(c.get("text"), str)]
    if not texts:
        if res.get("structuredContent") is not None:
            value = res["structuredContent"]
        elif not res["content"]:
            return None
        else:
            return res
    else:
        value = "\n".join(texts)
        t = value.strip(_GO_SPACE)
        if t and t[0] in _JSON_START:
            try:
                value = _TEXT_DECODER.decode(t)
            except ValueError:
                pass
    for typ, wrap in _WRAP:
        if isinstance(value, typ):
            if wrap is None:
                return value
            value = wrap(value)
            value.mcp_result = res
            return value
    return value


def _json_value(value, what):
    try:
        json.dumps(value)
    except (TypeError, ValueError) as e:
        raise TypeError("%s must be JSON-serialisable (dict, list, str, int, float, bool, None): %s" % (what, e)) from None
    return value


class _Tool:
    """One tool of a server: `await tool(**arguments)`."""

    def __init__(self, runner, server, info, bridge_alias=None):
        self._runner = runner
        self._server = server
        self.name = info["name"]
        self.alias = info.get("alias") or _identifier(self.name)
        self.bridge_alias = bridge_alias or _bridge_tool_alias(self.name)
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


class _MissingTool:
    """A tool the server lacks, named as an attribute: calling it raises
    MCPError naming the tools it has (when awaited, like a real call)."""

    def __init__(self, server, name, message):
        self._server, self.name, self._message = server, name, message

    def __call__(self, *args, **kwargs):
        async def fail():
            raise MCPError(self._message)

        return fail()

    def __repr__(self):
        return "<MCP tool %s.%s (not on the server)>" % (self._server, self.name)


class MCPServerProxy:
    """A server given to this run: `await mcp_x.tool(**kwargs)`,
    `await mcp_x.list_tools()`, `mcp_x["tool-name"]`."""

    _aliases = ()

    def __init__(self, runner, name):
        self._runner = runner
        self._name = name
        self._tools = None

    def _load(self):
        if self._tools is None:
            infos = self._runner.rpc_sync("list_tools", {"server": self._name}) or []
            bridge = _bridge_tool_aliases([i["name"] for i in infos])
            tools = {}
            for info in infos:
                t = _Tool(self._runner, self._name, info, bridge.get(info["name"]))
                tools[t.name] = t
            for t in list(tools.values()):
                tools.setdefault(t.alias, t)
            for t in list(tools.values()):
                tools.setdefault(t.bridge_alias, t)  # the bridge's name ("getuser")
            self._tools = tools
        return self._tools

    @staticmethod
    def _find(tools, name):
        if name in tools:
            return tools[name]
        if isinstance(name, str):  # regardless of case, as the bridge's docs find tools
            low = name.lower()
            for key, t in tools.items():
                if key.lower() == low:
                    return t
        return None

    def _tool(self, name):
        t = self._find(self._load(), name)
        if t is not None:
            return t
        self._tools = None  # the list may have changed: look once more
        tools = self._load()
        t = self._find(tools, name)
        if t is not None:
            return t
        names = sorted({t.alias for t in tools.values()})
        raise AttributeError("MCP server %r has no tool %r; its tools are: %s" % (self._name, name, ", ".join(names) or "none"))

    def __getattr__(self, attr):
        if attr.startswith("__") or attr.startswith("_ipython") or attr.startswith("_repr_"):
            raise AttributeError(attr)
        try:
            return self._tool(attr)
        except AttributeError as e:
            # As the Python bridge does: the call is made and fails with the
            # server's error (an MCPError, a RuntimeError), so code that
            # catches RuntimeError around the call works unchanged.
            return _MissingTool(self._name, attr, str(e))

    def __getitem__(self, name):
        try:
            return self._tool(name)
        except AttributeError as e:
            raise KeyError(str(e)) from None

    def __dir__(self):
        return sorted({t.alias for t in self._load().values()} | {t.bridge_alias for t in self._load().values()} | {"list_tools"})

    async def list_tools(self):
        infos = await self._runner.rpc("list_tools", {"server": self._name})
        self._tools = None
        return infos

    def __repr__(self):
        return "<MCP server %s>" % self._name


class _Servers(dict):
    """mcp_servers: the servers given to this run, by name (and by alias:
    mcpexec's or the bridge's)."""

    def __missing__(self, name):
        for proxy in self.values():
            if name in proxy._aliases:
                return proxy
        raise KeyError("MCP server %r was not given to this run; it may use: %s (add it to run_python's servers)"
                       % (name, ", ".join(sorted(self)) or "none"))


async def _call_tool(runner, server, tool, arguments, raw, timeout):
    # The host answers the MCP result; the value is taken from it here.
    params = {"server": server, "tool": tool, "arguments": arguments or {}, "raw": True}
    if timeout is not None:
        params["timeout"] = float(timeout)
    res = await runner.rpc("call_tool", params)
    if raw:
        if isinstance(res, dict) and isinstance(res.get("content"), list):
            res.setdefault("isError", False)
        return res
    return _tool_value(res)


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
            else:
                module.__getattr__ = _server_module_attr  # mcp.servers.<alias> without import
            return
        alias = name[len("mcp.servers."):]
        server = _server_named(self.runner, alias)
        if server is None:
            raise ImportError("no MCP server %r in this run; it may use: %s (add it to run_python's servers)"
                              % (alias, ", ".join(sorted(self.runner.servers)) or "none"), name=name)
        proxy = MCPServerProxy(self.runner, server)
        tools = {}
        for t in proxy._load().values():
            tools.setdefault(t.alias, t)
            tools.setdefault(t.bridge_alias, t)
        module.__dict__.update(tools)
        module.__all__ = sorted(tools)
        module.__doc__ = "MCP server %r wrappers" % server
        module.list_tools = proxy.list_tools
        module.server = proxy
        # The bridge's: its tool metadata, and the same by its alias.
        module.TOOLS = _describe(self.runner, server)["tools"]
        module.TOOL_MAP = {t["alias"]: t for t in module.TOOLS}


def _server_module_attr(attr):
    """mcp.servers' module __getattr__: mcp.servers.<alias> imports that server's
    module (as the bridge's mcp.servers has them all)."""
    if attr.startswith("__"):
        raise AttributeError(attr)
    import importlib

    try:
        return importlib.import_module("mcp.servers." + attr)
    except ImportError as e:
        raise AttributeError(str(e)) from None


def _describe(runner, name):
    """The bridge's metadata of a server of this run (describe_server):
    {name, alias, tools: [{name, alias, description, input_schema}], cwd}, with
    the bridge's aliases. cwd is None: servers run on the front-end, not here."""
    server = _server_named(runner, name)
    if server is None:
        raise MCPError("Server %r is not loaded (this run's servers: %s)" % (name, ", ".join(sorted(runner.servers)) or "none"))
    infos = runner.rpc_sync("list_tools", {"server": server}) or []
    bridge = _bridge_tool_aliases([i["name"] for i in infos])
    tools = [{"name": i["name"], "alias": bridge[i["name"]], "description": str(i.get("description") or "").strip(),
              "input_schema": i.get("input_schema", i.get("inputSchema"))} for i in infos]
    return {"name": server, "alias": _bridge_server_aliases(runner.servers)[server], "tools": tools, "cwd": None}


def _install_finder(runner):
    for name in [m for m in sys.modules if m == "mcp" or m.startswith("mcp.")]:
        del sys.modules[name]
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]
    sys.meta_path.insert(0, _Finder(runner))


def _bind_servers(runner, g):
    """(Re)binds mcp_servers, mcp_<alias> (mcpexec's alias and the bridge's) and
    LOADED_MCP_SERVERS for the servers of the current job."""
    for name in [k for k, v in g.items() if k.startswith("mcp_") and isinstance(v, MCPServerProxy)]:
        del g[name]
    servers = _Servers()
    bridge = _bridge_server_aliases(runner.servers)
    for name, alias in _aliases(runner.servers).items():
        proxy = MCPServerProxy(runner, name)
        proxy._aliases = (alias, bridge[name])
        servers[name] = proxy
        g["mcp_" + alias] = proxy
    for name, alias in bridge.items():
        g.setdefault("mcp_" + alias, servers[name])  # mcpexec's aliases win
    g["mcp_servers"] = servers
    g["LOADED_MCP_SERVERS"] = tuple(runner.servers)
    for name in [m for m in sys.modules if m.startswith("mcp.servers.")]:
        del sys.modules[name]
    pkg = sys.modules.get("mcp.servers")
    if pkg is not None:  # the last job's server modules, set on the package by import
        for name in [k for k, v in vars(pkg).items() if isinstance(v, type(sys)) and v.__name__.startswith("mcp.servers.")]:
            delattr(pkg, name)
    rt = sys.modules.get("runtime")
    if rt is not None:
        rt.mcp_servers = servers


def _api(runner):
    """The names the user's code sees without import (also in module `runtime`)."""

    async def call_tool(server, tool, arguments=None, raw=False, timeout=None):
        """Calls tool of server. The result is the tool's text, JSON-decoded when
        it parses, which also answers the MCP result's keys (result["content"],
        result["isError"], as the bridge's call_tool returns); raw=True gives the
        whole MCP result. Errors raise MCPError."""
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
        """Documentation of a server's tools (or of one tool): summary,
        signature and description; detail="full" adds the input schema. Each
        doc also has the bridge's keys (serverAlias, toolAlias, inputSchema)."""
        return _aw(runner.rpc_sync("query_tool_docs", {"server": server, "tool": tool, "detail": _detail(detail)}))

    def search_tool_docs(query, limit=5, detail="summary"):
        """Tools of this run's servers ranked by relevance to query."""
        return _aw(runner.rpc_sync("search_tool_docs", {"query": str(query), "limit": _limit(limit), "detail": _detail(detail)}))

    # -- the Python bridge's helpers (mcp-server-code-execution-mode) ------------
    def list_servers_sync():
        """The names of this run's servers (a tuple, as the bridge's)."""
        return _AwaitableTuple(runner.servers)

    def describe_server(name):
        """The bridge's metadata of one of this run's servers: {name, alias,
        tools: [{name, alias, description, input_schema}], cwd}, with the
        bridge's (lower-case) aliases."""
        return _AwaitableDict(_describe(runner, name))

    def list_loaded_server_metadata():
        """describe_server of each of this run's servers (a tuple)."""
        return _AwaitableTuple(_describe(runner, s) for s in runner.servers)

    def list_tools_sync(server=None):
        """The tools of describe_server(server) (a tuple)."""
        if server is None:
            raise MCPError("list_tools_sync(server) requires a server name")
        return _AwaitableTuple(_describe(runner, server)["tools"])

    def query_tool_docs_sync(server, tool=None, detail="summary"):
        """query_tool_docs, always a list (of one doc when tool is given)."""
        if tool is not None and not isinstance(tool, str):
            raise MCPError("'tool' must be a string when provided")
        docs = query_tool_docs(server, tool, detail)
        return _AwaitableList([docs] if tool is not None else docs)

    def search_tool_docs_sync(query, limit=5, detail="summary"):
        """search_tool_docs; a query without words finds nothing."""
        if not str(query).split():
            return _AwaitableList()
        return search_tool_docs(query, limit, detail)

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

    def _detail(value):
        # As the bridge reads it: "full" in any case, else the summary.
        return "full" if value is not None and str(value).lower() == "full" else "summary"

    def _limit(value):
        try:
            return int(value)
        except (TypeError, ValueError):
            return 5

    # -- workflows ---------------------------------------------------------------
    def job_result(job_id):
        """The outcome of an ended job of the same namespace (typically a parent
        named in this job's after/after_any): {status, summary, exitCode,
        stdout[], stderr[], error, timeoutSeconds, jobId}."""
        if not isinstance(job_id, str) or not job_id:
            raise TypeError("job ids are non-empty strings, got %r" % (job_id,))
        return _AwaitableDict(runner.rpc_sync("job_result", {"id": job_id}))

    def job_file(job_id, name=None):
        """The bytes of a file an ended job of the same namespace wrote under
        /workspace/out (or a figure it drew): job_file(id, "summary.csv"), or
        job_file("mcpexec://jobs/{id}/files/{name}")."""
        if name is None and isinstance(job_id, str) and job_id.startswith("mcpexec://jobs/"):
            rest = job_id[len("mcpexec://jobs/"):]
            job_id, sep, name = rest.partition("/files/")
            if not sep:
                raise ValueError("not a file URI: mcpexec://jobs/{id}/files/{name}")
            import urllib.parse

            name = urllib.parse.unquote(name)
        if not isinstance(job_id, str) or not job_id:
            raise TypeError("job ids are non-empty strings, got %r" % (job_id,))
        if not isinstance(name, str) or not name:
            raise TypeError("file names are non-empty strings, got %r" % (name,))
        import base64

        got = runner.rpc_sync("job_file", {"id": job_id, "name": name})
        return base64.b64decode(got["base64"])

    # -- saved tools: functions kept per namespace, defined in its later jobs ---
    def save_tool(fn, source=None):
        """Saves function fn (a top-level def) for this namespace's later jobs:
        a job that uses its name has it defined (also in module user_tools).
        Saving a name again replaces it. source gives the code when it cannot
        be found (a function built by exec). Returns a message."""
        import inspect

        if not inspect.isfunction(fn):
            raise TypeError("save_tool expects a function defined with def, got %r" % (fn,))
        name = fn.__name__
        if not name.isidentifier() or name == "<lambda>":
            raise ValueError("save_tool saves functions defined with def (a lambda has no name)")
        if name in api:
            raise ValueError("%r is a name of the sandbox API; give the function another name" % name)
        if fn.__code__.co_freevars:
            raise ValueError("%s uses variables of an enclosing function (%s): save a top-level function"
                             % (name, ", ".join(fn.__code__.co_freevars)))
        if source is None:
            source = _function_source(runner, fn)
            if source is None:
                raise ValueError("the source of %s cannot be found: pass it, save_tool(fn, source=...)" % name)
        elif not isinstance(source, str):
            raise TypeError("source must be a string")
        res = runner.rpc_sync("saved_tool_put", {"name": name, "source": source})
        verb = "replaced" if (res or {}).get("replaced") else "saved"
        return _AwaitableStr("Tool '%s' %s. It will be available in future runs of this namespace." % (name, verb))

    def list_saved_tools():
        """This namespace's saved tools: dicts of name, source and saved_at."""
        return _AwaitableList(runner.rpc_sync("saved_tool_list") or [])

    def delete_saved_tool(name):
        """Deletes a saved tool; True when it existed."""
        if not isinstance(name, str) or not name:
            raise TypeError("saved tool names are non-empty strings, got %r" % (name,))
        return bool(runner.rpc_sync("saved_tool_delete", {"name": name}))

    def load_saved_tools():
        """Defines this namespace's saved tools now (jobs do so by themselves
        when their code names one); returns the names defined."""
        return _AwaitableList(load_saved_tools_into(runner, runner.globals if runner.globals is not None else api))

    # -- the server catalog: servers the operator lists, a namespace enables ---
    def find_servers(query="", limit=5):
        """Catalog servers (known to the operator, not enabled until a
        namespace enables them) ranked by relevance to query: dicts of name,
        alias, description, transport, enabled and score. An empty query lists
        them all."""
        return _AwaitableList(runner.rpc_sync("catalog_find", {"query": str(query), "limit": _limit(limit)}) or [])

    def enable_server(name):
        """Enables catalog server name for this namespace (its later runs may
        name it in servers) and for this run: mcp_<alias> is defined at once.
        Returns its entry (name, alias, description, enabled)."""
        entry = runner.rpc_sync("catalog_enable", {"name": _server_name(name)})
        if name not in runner.servers:
            runner.servers = runner.servers + [name]
            _bind_servers(runner, runner.globals if runner.globals is not None else api)
        return _AwaitableDict(entry or {})

    def disable_server(name):
        """Disables catalog server name for this namespace; True when it was
        enabled. Its calls are refused from now on."""
        res = runner.rpc_sync("catalog_disable", {"name": _server_name(name)})
        if name in runner.servers:
            runner.servers = [s for s in runner.servers if s != name]
            _bind_servers(runner, runner.globals if runner.globals is not None else api)
        return bool((res or {}).get("disabled"))

    def _server_name(name):
        if not isinstance(name, str) or not name:
            raise TypeError("server names are non-empty strings, got %r" % (name,))
        return name

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
        "list_servers_sync": list_servers_sync,
        "describe_server": describe_server,
        "list_loaded_server_metadata": list_loaded_server_metadata,
        "list_tools_sync": list_tools_sync,
        "query_tool_docs_sync": query_tool_docs_sync,
        "search_tool_docs_sync": search_tool_docs_sync,
        "save_memory": save_memory,
        "load_memory": load_memory,
        "delete_memory": delete_memory,
        "list_memories": list_memories,
        "memory_exists": memory_exists,
        "get_memory_info": get_memory_info,
        "update_memory": update_memory,
        "job_result": job_result,
        "display": display,
        "job_file": job_file,
        "save_tool": save_tool,
        "list_saved_tools": list_saved_tools,
        "delete_saved_tool": delete_saved_tool,
        "load_saved_tools": load_saved_tools,
        "find_servers": find_servers,
        "enable_server": enable_server,
        "disable_server": disable_server,
    }
    rt = type(sys)("runtime", "The mcpexec sandbox API (the same names are available without import).")
    rt.__dict__.update(api)
    sys.modules["runtime"] = rt
    api["runtime"] = rt
    _install_finder(runner)
    # The package mcp, as the bridge puts it among the globals: mcp.runtime and
    # mcp.servers.<alias> work without import.
    api["mcp"] = __import__("mcp.servers")
    _bind_servers(runner, api)
    rt.mcp_servers = api["mcp_servers"]
    return api
