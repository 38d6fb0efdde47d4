"""mcpexec sandbox runner.

Started inside the sandbox as `python3 runner.py SOCKET`. It connects to the host,
says hello, then runs each `exec` frame's code with top-level await and reports the
outcome. See package sandbox (Go) for the protocol. Standard library only.
"""

import ast
import asyncio
import builtins
import codecs
import fcntl
import json
import os
import select
import socket
import struct
import sys
import threading
import traceback
import types

PROTOCOL_VERSION = 1
MAX_FRAME = 16 << 20


class MCPError(Exception):
    """An error reported by the host for a proxy call (tool error, unknown server...)."""


class _Channel:
    """Length-prefixed JSON frames over the host socket."""

    def __init__(self, sock):
        self._sock = sock
        self._wlock = threading.Lock()

    def send(self, frame):
        body = json.dumps(frame, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
        if len(body) > MAX_FRAME:
            raise MCPError("message of %d bytes exceeds the %d-byte frame limit" % (len(body), MAX_FRAME))
        with self._wlock:
            self._sock.sendall(struct.pack(">I", len(body)) + body)

    def _read_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self._sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise EOFError("host closed the connection")
            buf += chunk
        return bytes(buf)

    def recv(self):
        (n,) = struct.unpack(">I", self._read_exact(4))
        if n > MAX_FRAME:
            raise EOFError("host frame too large")
        return json.loads(self._read_exact(n))


class _OutputPump(threading.Thread):
    """Reads the pipes behind fds 1 and 2 and forwards them as `out` frames."""

    def __init__(self, chan, fds):
        super().__init__(daemon=True)
        self._chan = chan
        self._fds = fds  # read fd -> stream name
        self._lock = threading.Lock()
        self._decoders = {fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in fds}
        self.cap = 1 << 20
        self.sent = {}

    def reset(self, cap):
        with self._lock:
            self.cap = cap
            self.sent = {name: 0 for name in self._fds.values()}

    def run(self):
        while True:
            ready, _, _ = select.select(list(self._fds), [], [])
            with self._lock:
                self._drain(ready)

    def drain_all(self):
        with self._lock:
            self._drain(list(self._fds))

    def _drain(self, fds):
        for fd in fds:
            while True:
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if not data:
                    break
                name = self._fds[fd]
                text = self._decoders[fd].decode(data)
                # Forward at most one byte past the cap so the host sees the overflow.
                room = self.cap + 1 - self.sent.get(name, 0)
                if room <= 0 or not text:
                    continue
                text = text[:room]
                self.sent[name] = self.sent.get(name, 0) + len(text)
                self._chan.send({"type": "out", "stream": name, "data": text})


class Runner:
    def __init__(self, chan, pump):
        self.chan = chan
        self.pump = pump
        self._next_id = 0
        self._pending = {}
        self._plock = threading.Lock()
        self.loop = None
        self.globals = None

    # -- proxy calls -------------------------------------------------------------
    async def rpc(self, method, params=None):
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

    def on_reply(self, frame):
        with self._plock:
            entry = self._pending.pop(frame.get("id"), None)
        if entry is None:
            return
        loop, fut = entry

        def settle():
            if fut.done():
                return
            if frame.get("error"):
                fut.set_exception(MCPError(frame["error"]))
            else:
                fut.set_result(frame.get("result"))

        loop.call_soon_threadsafe(settle)

    # -- execution ---------------------------------------------------------------
    def new_globals(self, servers):
        g = {"__name__": "__main__", "__builtins__": builtins}
        g.update(_api(self, servers))
        return g

    async def execute(self, code, g):
        flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        compiled = compile(code, "<code>", "exec", flags=flags, dont_inherit=True)
        res = eval(compiled, g)  # noqa: S307 - running the user's code is the point
        if asyncio.iscoroutine(res):
            await res

    def run_job(self, frame, work):
        """Runs one exec frame; returns the done frame."""
        self.pump.reset(int(frame.get("output_cap") or (1 << 20)))
        g = self.globals if self.globals is not None else self.new_globals(frame.get("servers") or [])
        self.globals = g
        status, code, err = "success", 0, ""
        try:
            work(self.execute(frame.get("code", ""), g))
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
            traceback.print_exc()
            status, code = "error", 1
            err = "%s: %s" % (type(e).__name__, e)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        self.pump.drain_all()
        return {"type": "done", "status": status, "exit_code": code, "error": err}


def _api(runner, servers):
    """The names the user's code sees without import."""

    async def call_tool(server, tool, arguments=None, raw=False):
        res = await runner.rpc("call_tool", {"server": server, "tool": tool, "arguments": arguments or {}, "raw": bool(raw)})
        return res

    async def list_servers():
        return await runner.rpc("list_servers")

    async def discovered_servers(detailed=False):
        return await runner.rpc("discovered_servers", {"detailed": bool(detailed)})

    async def query_tool_docs(server, tool=None, detail="summary"):
        return await runner.rpc("query_tool_docs", {"server": server, "tool": tool, "detail": detail})

    async def search_tool_docs(query, limit=5):
        return await runner.rpc("search_tool_docs", {"query": query, "limit": limit})

    async def capability_summary():
        return await runner.rpc("capability_summary")

    api = {
        "MCPError": MCPError,
        "call_tool": call_tool,
        "list_servers": list_servers,
        "discovered_servers": discovered_servers,
        "query_tool_docs": query_tool_docs,
        "search_tool_docs": search_tool_docs,
        "capability_summary": capability_summary,
    }
    rt = types.ModuleType("runtime")
    rt.__dict__.update(api)
    sys.modules["runtime"] = rt
    api["runtime"] = rt
    return api


def _redirect_output():
    """Points fds 1 and 2 at pipes; returns {read_fd: stream}."""
    fds = {}
    for fd, name in ((1, "stdout"), (2, "stderr")):
        r, w = os.pipe()
        fl = fcntl.fcntl(r, fcntl.F_GETFL)
        fcntl.fcntl(r, fcntl.F_SETFL, fl | os.O_NONBLOCK)
        os.dup2(w, fd)
        os.close(w)
        fds[r] = name
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)
    return fds


def main():
    if len(sys.argv) != 2:
        sys.__stderr__.write("usage: runner.py SOCKET\n")
        return 2
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(sys.argv[1])
    sock.set_inheritable(False)
    chan = _Channel(sock)
    pump = _OutputPump(chan, _redirect_output())
    pump.start()
    runner = Runner(chan, pump)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    runner.loop = loop

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
            os._exit(0)  # host gone: nothing left to do

    threading.Thread(target=reader, daemon=True).start()
    chan.send({"type": "hello", "version": PROTOCOL_VERSION})
    while True:
        with cond:
            while not execs:
                cond.wait()
            frame = execs.pop(0)
        done = runner.run_job(frame, loop.run_until_complete)
        chan.send(done)


if __name__ == "__main__":
    sys.exit(main())
