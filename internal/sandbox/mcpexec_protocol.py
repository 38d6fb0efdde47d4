"""mcpexec runner: the frame protocol between the host, the supervisor and
the code's process, its bounds, and process helpers. Standard library only."""

import array
import gc
import json
import mmap
import os
import signal
import socket
import struct
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
    "memory_list", "job_result", "job_file", "saved_tool_put", "saved_tool_delete", "saved_tool_list",
    "catalog_find", "catalog_enable", "catalog_disable",
))
SECRET_ENV = "MCPEXEC_RUNNER_SECRET"


class MCPError(RuntimeError):
    """An error reported by the host for a proxy call (tool error, unknown server...).
    A RuntimeError, as the Python bridge's MCPError is."""


# Made once: json.dumps with arguments makes an encoder per call, and every
# frame is encoded with these.
_FRAME_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _encode(frame):
    body = _FRAME_ENCODER.encode(frame).encode("utf-8", "surrogatepass")
    if len(body) > MAX_FRAME:
        raise MCPError("message of %d bytes exceeds the %d-byte frame limit" % (len(body), MAX_FRAME))
    return struct.pack(">I", len(body)) + body


def _read_buffer():
    """A 1 MiB buffer to read into, kept for a process's life: a private
    anonymous mapping, whose pages are touched only as reads fill them (a
    bytearray is zeroed whole: 256 page faults, and pages to free at the
    exit). Private: a process forked later gets a copy, never a view of
    what this one reads next. Its first page is touched now, so that a
    small frame's read takes no page fault."""
    buf = memoryview(mmap.mmap(-1, 1 << 20, flags=mmap.MAP_PRIVATE))
    buf[0] = 0
    return buf


def _fds(anc):
    """The file descriptors in recvmsg's ancillary data."""
    fds = array.array("i")
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return list(fds)


# Room for the file descriptor an exec frame may bring (a job's call channel).
_ANC_ONE = socket.CMSG_SPACE(4)


class _Channel:
    """Length-prefixed JSON frames over a blocking socket: written whole,
    read without waiting (the caller knows the socket is readable). A
    channel that takes files (fds) keeps those that come with its frames
    in fds (an exec frame's call channel)."""

    def __init__(self, sock, rbuf=None, fds=False):
        self._sock = sock
        self._wlock = threading.Lock()
        self._frames = _FrameBuffer(MAX_FRAME)
        # Made with the channel: an executor started ahead makes it before
        # its job comes, off the job's path. A job's call channel reads into
        # its executor's (one reader at a time reads either).
        self.rbuf = rbuf if rbuf is not None else _read_buffer()
        self.fds = [] if fds else None

    def fileno(self):
        return self._sock.fileno()

    def close(self):
        self._sock.close()

    def calls(self, frame):
        """The job's call channel, when exec frame came with one (else
        None): a channel of its own, reading into this one's buffer."""
        if frame.get("call_channel") is not True or not self.fds:
            return None
        return _Channel(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=self.fds.pop(0)), self.rbuf)  # the host's socketpair

    def send(self, frame):
        data = _encode(frame)
        with self._wlock:
            self._sock.sendall(data)

    def recv_ready(self):
        """Reads what the socket holds, without waiting, and returns the
        frames it completes (none when it held nothing or part of one). One
        read a frame, into a buffer kept for the channel's life. EOFError
        when the other end closed; ValueError on a bad frame."""
        try:
            if self.fds is None:
                n = self._sock.recv_into(self.rbuf, 0, socket.MSG_DONTWAIT)
            else:
                n, anc, _, _ = self._sock.recvmsg_into([self.rbuf], _ANC_ONE, socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
                if anc:
                    self.fds += _fds(anc)
        except (BlockingIOError, InterruptedError):
            return []
        if n == 0:
            raise EOFError("connection closed")
        return self._frames.feed(self.rbuf[:n])


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


_PRCTL = []  # libc's prctl, once resolved


def _prctl(option, arg):
    """prctl(option, arg, 0, 0, 0) through libc, resolved once per process
    tree: forks inherit it, so an executor's start makes no ctypes lookup
    (each one copies some fifty pages of the zygote)."""
    if not _PRCTL:
        import ctypes

        _PRCTL.append(ctypes.CDLL(None, use_errno=True).prctl)
    return _PRCTL[0](option, arg, 0, 0, 0)


def _settle():
    """Readies a zygote's memory for its forks, once it has imported all it
    holds: collects what its start left, keeps the collector off what
    remains (gc.freeze: a collection in a fork would write to every page it
    scans), and gives the C heap's free pages back (malloc_trim). A fork
    copies a page table entry for each page the zygote has mapped, and an
    exit tears each down: trimmed, a Python zygote maps about 2 MB less.
    A job that reuses freed memory then takes a zero-filled page, not a copy."""
    gc.collect()
    gc.freeze()
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except Exception:
        pass  # not glibc: nothing given back


def _set_nondumpable():
    """prctl(PR_SET_DUMPABLE, 0): no process of the same user may ptrace this one
    or open its /proc files (memory, file descriptors)."""
    try:
        return _prctl(4, 0) == 0
    except Exception:
        return False


def _set_pdeathsig():
    """The calling process dies with its parent (outside a container too)."""
    try:
        _prctl(1, signal.SIGKILL)
    except Exception:
        pass


def _fork_child(child_main):
    """Forks a child that runs child_main() and exits with what it returns (0 for
    None), or with 70 when it raises; returns the child's pid to the parent."""
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            code = child_main() or 0
        except BaseException:
            pass
        os._exit(code)
    return pid
