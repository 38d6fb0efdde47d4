"""mcpexec sandbox runner.

Started inside the sandbox as `python3 runner.py SOCKET [--reset]`. Standard
library only. Four files: this entry point (the zygote and the executor's
loop), mcpexec_protocol (frames and bounds), mcpexec_api (the executor's state
and the API the code sees) and mcpexec_supervisor (PID 1: relay, checks and
the sweep between jobs).

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


import json
import os
import signal
import socket
import sys
import threading

# The other modules sit next to this script (python3 -I leaves it off the path).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mcpexec_protocol import PROTOCOL_VERSION, SECRET_ENV, _Channel, _fork_child, _set_nondumpable, _set_pdeathsig  # noqa: E402
from mcpexec_api import Runner  # noqa: E402
from mcpexec_supervisor import _Supervisor, _spawn_zygote  # noqa: E402


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

        def child():
            zsock.close()
            parent_end.close()
            os.close(out_r)
            os.close(err_r)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.close(out_w)
            os.close(err_w)
            _set_pdeathsig()
            return _executor_main(runner, child_end, persist)

        pid = _fork_child(child)
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
    zygote = _spawn_zygote(sock, _zygote_main)
    sup = _Supervisor(sock, zygote, reset)
    hello = {"type": "hello", "version": PROTOCOL_VERSION, "secret": secret, "isolated": isolated, "reset": reset}
    try:
        sup.loop(hello)
    except BaseException:
        sup.exit()


if __name__ == "__main__":
    sys.exit(main())
