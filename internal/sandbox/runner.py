"""mcpexec sandbox runner.

Started inside the sandbox as
`python3 runner.py SOCKET [--reset] [--spare-javascript] [--preload=MODULE,...]`.
Standard library only (the preload modules are the image's). Four files: this entry point (the zygote and the executor's
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
import select
import signal
import socket
import sys
import threading

# The other modules sit next to this script (python3 -I leaves it off the path).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# matplotlib, if the code (or a preload) imports it, draws with mcpexec's
# backend: plt.show() saves the figures to /workspace/out.
os.environ["MPLBACKEND"] = "module://mcpexec_mplbackend"

from mcpexec_protocol import PROTOCOL_VERSION, SECRET_ENV, _Channel, _fork_child, _set_nondumpable, _set_pdeathsig, _settle  # noqa: E402
from mcpexec_api import Runner  # noqa: E402
from mcpexec_supervisor import _Supervisor, _spawn_zygote  # noqa: E402


# -- the executor: runs the user's code, holds no host connection -----------------


def _open_std():
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)


def _preload(names):
    """Imports names in the zygote, before any job: every job forked from it
    shares their pages (copy-on-write) instead of importing them again. A
    module that is missing or fails to import is skipped; the job that imports
    it sees the error itself. Numeric libraries run single-threaded: a zygote
    must hold no thread when it forks, and a sandbox has a CPU or two."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    os.environ.setdefault("MPLBACKEND", "Agg")  # headless; the image sets it too
    fonts = _matplotlib_config(any(n.split(".")[0] == "matplotlib" for n in names))
    if names:
        import importlib

        for name in names:
            try:
                importlib.import_module(name)
            except BaseException:  # noqa: BLE001 (a broken module must not stop the zygote)
                pass
    _warm_up()
    if fonts:
        import shutil

        shutil.rmtree(fonts, ignore_errors=True)  # loaded: the first job finds /tmp empty


def _warm_up():
    """Draws a small chart once in the zygote when pyplot (and pandas) are
    preloaded: a process's first chart loads fonts, the Agg renderer's and
    the PNG writer's state and pandas' plotting backend (hundreds of ms),
    which every forked job would otherwise pay again."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        import io

        fig, ax = plt.subplots()
        pd = sys.modules.get("pandas")
        if pd is not None:
            df = pd.DataFrame({"x": [0, 1, 2], "y": [0.5, 1.5, 1.0]})
            df.plot(x="x", y="y", ax=ax, title="warm-up")
            df.plot.bar(x="x", y="y", ax=ax)
            repr(df.describe())
        else:
            ax.plot([0, 1, 2], [0.5, 1.5, 1.0], label="warm-up")
            ax.set_title("warm-up")
        ax.legend()
        fig.savefig(io.BytesIO(), format="png", pil_kwargs={"compress_level": 1})  # as the backend saves
        plt.close("all")
    except BaseException:  # noqa: BLE001 (a warm-up that fails costs only time)
        pass


def _matplotlib_config(preload):
    """Matplotlib wants a writable config directory (else it makes a temporary
    one, warns on stderr and rebuilds its font cache, a second or more). The
    image's (MPLCONFIGDIR) holds the font cache built with the image, on the
    read-only root: point matplotlib at /tmp/matplotlib instead, with that
    cache copied in when it is preloaded. Returns the directory it made."""
    src = os.environ.get("MPLCONFIGDIR", "")
    if not src or not os.path.isdir(src) or os.access(src, os.W_OK):
        return None
    dst = "/tmp/matplotlib"
    os.environ["MPLCONFIGDIR"] = dst  # jobs that import it themselves build the cache there
    if not preload:
        return None
    try:
        os.makedirs(dst, exist_ok=True)
        for name in os.listdir(src):
            if name.startswith("fontlist") and name.endswith(".json"):
                with open(os.path.join(src, name), "rb") as f, open(os.path.join(dst, name), "wb") as g:
                    g.write(f.read())
    except OSError:
        return None
    return dst


def _next_order(sock):
    """The next message on sock, from the process this one serves (the
    supervisor, or the zygote): it exits when that process is gone, and
    with 70 on a message that is not JSON."""
    try:
        msg = sock.recv(4096)
    except OSError:
        msg = b""
    if not msg:
        os._exit(0)
    try:
        return json.loads(msg)
    except ValueError:
        os._exit(70)


def _send_ends(sock, frame, fds):
    """Sends frame with fds (SCM_RIGHTS) on sock, and closes this process's
    copies: the receiver holds them now."""
    socket.send_fds(sock, [json.dumps(frame).encode()], fds)
    for fd in fds:
        os.close(fd)


def _data_zygote_main(dsock, preload):
    """The data zygote, a child of the zygote: imports the preload modules
    (the data stack) once, and forks an executor for each job whose code
    names one of them, on the zygote's word. A fork of a process holding
    the stack costs every job that takes it page tables, copy-on-write
    faults and a larger teardown, so only such jobs take it; it keeps no
    spare. It reports each executor's ends (forked) and exit status
    (exited) to the zygote, which passes them on."""
    _open_std()
    _preload(preload)
    runner = Runner(None)
    runner.globals = runner.new_globals()
    _settle()
    dsock.send(b'{"type": "ready"}')
    while True:
        if _next_order(dsock).get("type") != "fork":
            os._exit(70)
        pid, fds = _fork_executor(lambda chan: _executor_main(runner, chan), [dsock], [])
        _send_ends(dsock, {"type": "forked", "pid": pid}, fds)
        _, status = os.waitpid(pid, 0)
        dsock.send(json.dumps({"type": "exited", "pid": pid, "status": status}).encode())


def _fork_executor(run, socks, fds):
    """Forks an executor that calls run(channel) with its output on fds 1 and
    2, after closing the zygote's sockets socks and descriptors fds (none of
    them the code's); returns its pid and the supervisor's ends (channel,
    stdout, stderr)."""
    parent_end, child_end = socket.socketpair()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()

    def child():
        for sock in socks:
            sock.close()
        parent_end.close()
        for fd in [out_r, err_r] + fds:
            os.close(fd)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.close(out_w)
        os.close(err_w)
        _set_pdeathsig()
        return run(child_end)

    pid = _fork_child(child)
    child_end.close()
    os.close(out_w)
    os.close(err_w)
    return pid, [parent_end.detach(), out_r, err_r]


def _spawn_data_zygote(zsock, preload):
    """Forks the data zygote and waits for it to be ready; returns its pid
    and the zygote's end of their SOCK_SEQPACKET pair, or (None, None)."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)

    def child():
        zsock.close()
        mine.close()
        _set_pdeathsig()
        return _data_zygote_main(theirs, preload)

    pid = _fork_child(child)
    theirs.close()
    try:
        ready = json.loads(mine.recv(4096) or b"{}").get("type") == "ready"
    except (OSError, ValueError):
        ready = False
    if not ready:
        mine.close()
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass
        return None, None
    return pid, mine


def _zygote_main(zsock, spare_js=False, preload=(), lazy=False):
    """The zygote: imports and builds the API once, then forks one executor per
    job (or per session) on the supervisor's word. It runs no code itself and
    holds no thread, so every fork starts from the same clean state. It passes
    each executor's channel and output pipes to the supervisor over zsock (a
    SOCK_SEQPACKET pair) and reports its exit status.

    It imports no data stack itself: where preload modules are given (the
    data stack by default), it starts a data zygote that imports them, and
    a job whose code names one of them is forked there (fork with data).
    With lazy (the host has seen no such job lately) it starts the data
    zygote at the first such job instead, which waits for its imports: a
    container whose jobs never use the stack never pays its second of CPU.
    The supervisor sends that job's fork only once the sweep found the
    container clean, so the data zygote starts, as at the container's
    start, where no code runs; it hears the data zygote's pid with the
    job's executor (forked with data_zygote).

    It forks each job's executor ahead (a spare), so that a job's request
    finds one started: a Python one always, and a JavaScript one where a
    JavaScript job is expected (Node takes ~70 ms of CPU to start): before
    the first job, if the host has seen some lately (spare_js); after a job,
    if that job was JavaScript's (the supervisor's word). A Python job kills
    a JavaScript spare, so it is started only where it is likely used. The
    host hears which languages' executors wait (ready frames' spares) and
    sends a JavaScript job to a sandbox whose JavaScript executor waits.
    Spares are started only when no code runs in the container (before the
    first job, and after a sweep found it clean); those a job does not take
    are killed when it starts and reaped when it ends: code never meets a
    spare that a later job will use.

    A spare's ends (channel, stdout, stderr) go to the supervisor with the
    ready (or spared) message that announces it, so that a job's exec goes
    straight to its spare: the supervisor says which it took (take), and the
    zygote only ends the others and waits for it."""
    _open_std()
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    except (OSError, ValueError):
        pass
    # The data zygote first: it starts from a process that holds nothing yet.
    data_pid, dsock = _spawn_data_zygote(zsock, preload) if preload and not lazy else (None, None)
    data_later = bool(preload) and lazy  # the data zygote starts at the first job that uses it
    _preload(())  # matplotlib's config directory, for jobs that import it
    runner = Runner(None)
    # Build the API before the first job arrives: a warm sandbox's job then
    # pays only for its own code (its servers are bound when it comes).
    runner.globals = runner.new_globals()
    _settle()  # forks share these pages: keep the collector off them, give back the free ones
    node = _find("node")
    # Executors forked ahead, by language: their pids (their ends are the
    # supervisor's). A job takes its language's; the others end with it (its
    # code could reach them).
    spares = {}
    # The ends of the spares not yet handed to the supervisor, by language.
    unsent = {}

    def fork_executor(run):
        socks = [zsock] + ([dsock] if dsock is not None else [])
        return _fork_executor(run, socks, [fd for fds in unsent.values() for fd in fds])

    def fork_python(spare=False):
        return fork_executor(lambda chan: _executor_main(runner, chan, spare))

    def kill_spares():
        """Kills the spares a job did not take: reaped once it ends."""
        for pid in spares.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def drop(pid, fds=()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        os.waitpid(pid, 0)
        for fd in fds:
            os.close(fd)

    def drop_spares():
        while spares:
            drop(spares.popitem()[1])

    def start_spares(js):
        """Forks the executors the next job may take: only while no code runs
        in the container (before the first job, after a sweep found it clean).
        A Python one always (its fork and start leave the job's path); a
        JavaScript one where JavaScript is expected (Node takes ~70 ms)."""
        if "python" not in spares:
            pid, fds = fork_python(spare=True)
            # Its word that it ran the warm-up (a zero byte, read here so the
            # supervisor sees only frames), or nothing if it died.
            try:
                warm = os.read(fds[0], 1) == b"\0"
            except OSError:
                warm = False
            if warm:
                spares["python"], unsent["python"] = pid, fds
            else:
                drop(pid, fds)
        if js and node is not None and "javascript" not in spares:
            spares["javascript"], unsent["javascript"] = fork_executor(_exec_node)

    def announce(kind):
        """Tells the supervisor which spares wait, handing it their ends:
        [language, pid] for each, its three fds in that order."""
        handed = sorted(unsent)
        fds = [fd for lang in handed for fd in unsent[lang]]
        _send_ends(zsock, {"type": kind, "spares": sorted(spares), "handed": [[lang, spares[lang]] for lang in handed],
                           "data_zygote": data_pid, "data_lazy": data_later}, fds)
        unsent.clear()

    start_spares(spare_js)
    announce("ready")
    while True:
        frame = _next_order(zsock)
        kind = frame.get("type")
        if kind == "spare":
            start_spares(frame.get("javascript") is True)
            # The next job's executors wait, warm: say of which languages.
            announce("spared")
            continue
        if kind not in ("fork", "take"):
            os._exit(70)
        lang = "javascript" if frame.get("lang") == "javascript" else "python"
        data = kind == "fork" and frame.get("data") is True and lang == "python"
        if data and data_later:
            # The first job that uses the data stack: its zygote starts now,
            # after the spares end (no code runs: the supervisor sent this
            # fork once the container was swept clean). If it cannot start,
            # the job is forked here and imports what it uses itself.
            drop_spares()
            data_later = False
            data_pid, dsock = _spawn_data_zygote(zsock, preload)
        if data and dsock is not None:
            # A job that uses the data stack: forked by the data zygote. The
            # spares end with it, as below.
            kill_spares()
            dsock.send(b'{"type": "fork"}')
            try:
                msg, fds, _, _ = socket.recv_fds(dsock, 4096, 3)
                pid = json.loads(msg).get("pid")
            except (OSError, ValueError, AttributeError):
                os._exit(70)
            if len(fds) != 3 or not isinstance(pid, int):
                os._exit(70)
            _send_ends(zsock, {"type": "forked", "pid": pid, "data_zygote": data_pid}, fds)
            try:
                status = json.loads(dsock.recv(4096)).get("status")
            except (OSError, ValueError, AttributeError):
                os._exit(70)
            drop_spares()
            zsock.send(json.dumps({"type": "exited", "pid": pid, "status": status if isinstance(status, int) else 0}).encode())
            continue
        if kind == "take":
            # The supervisor sent the job to its language's spare.
            pid = spares.pop(lang, None)
            if pid is None or frame.get("pid") != pid:
                os._exit(70)
            kill_spares()  # as below
        else:
            # The supervisor held no spare of the job's language: it sent
            # the job before it heard of one (which then goes to it: its
            # ends are the supervisor's already), or none waits and one is
            # forked for the job. The spares this job does not take could
            # be reached by its code: they end with it. Killed now, they
            # free their memory for the job and are reaped, off the job's
            # path, when the job ends.
            # (A job for the data zygote, where there is none, takes no
            # spare: the supervisor closed their ends.)
            pid = None if frame.get("data") is True else spares.pop(lang, None)
            kill_spares()
            if pid is not None:
                zsock.send(json.dumps({"type": "forked", "pid": pid, "handed": True}).encode())
            else:
                if lang == "javascript":
                    pid, fds = fork_executor(_exec_node)
                else:
                    pid, fds = fork_python()
                _send_ends(zsock, {"type": "forked", "pid": pid}, fds)
        _, status = os.waitpid(pid, 0)
        drop_spares()  # the job's code may have reached them
        zsock.send(json.dumps({"type": "exited", "pid": pid, "status": status}).encode())


def _module_name(name):
    """Whether name is a dotted module name (a --preload entry)."""
    return bool(name) and len(name) <= 200 and all(part.isidentifier() for part in name.split("."))


def _find(prog):
    for d in os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(os.pathsep):
        path = os.path.join(d or ".", prog)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _languages():
    """The languages this sandbox can run: Python, and JavaScript where Node.js is."""
    return ["python", "javascript"] if _find("node") else ["python"]


def _exec_node(chan_sock):
    """Runs in a forked executor: replaces it with the JavaScript executor,
    its channel on fd 3 (fds 1 and 2 are already its output pipes). It learns
    whether it serves a session from its first exec frame."""
    node = _find("node")
    if node is None:
        os.write(2, b"this sandbox has no JavaScript runtime (node): run the job as python, or on a worker whose image has Node.js\n")
        os._exit(127)
    os.dup2(chan_sock.fileno(), 3)
    os.set_inheritable(3, True)
    os.closerange(4, os.sysconf("SC_OPEN_MAX"))
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mcpexec_executor.cjs")
    os.execv(node, [node, script])


def _executor_main(runner, chan_sock, spare=False):
    """Runs in a forked executor: fds 1 and 2 are already its output pipes.
    It runs the jobs sent on chan_sock: one (then exits), or, when the first
    exec frame says persist (a session), each until the supervisor closes the
    channel. It may be forked ahead of its job (a spare): it waits for the
    frame, having run a job's steps on nothing (Runner.warm_up), so that the
    job's run copies few pages.

    It stays single-threaded unless the code calls the host from a thread of
    its own: the main thread reads the channel, between jobs and while code
    runs (the event loop watches it; a blocking call reads until its reply
    comes); a reader thread takes over only for a call from another thread
    (Runner._route). A process with one
    thread keeps its memory's TLB flushes on one CPU: a second thread makes
    every copy-on-write fault of the fork an inter-processor interrupt, which
    costs a virtual machine several milliseconds a job."""
    _open_std()
    chan = _Channel(chan_sock, fds=True)
    runner.chan = chan
    if spare:
        runner.warm_up()
        chan_sock.sendall(b"\0")  # to the zygote: warm
    runner.main = threading.get_ident()
    persist = None
    first = _spare_wait(runner, chan) if spare else None
    while True:
        if first is not None:
            (frame, calls), first = first, None
        else:
            frame = runner.next_exec()
            calls = chan.calls(frame)
        if persist is None:
            persist = frame.get("persist") is True
        if calls is not None:
            # A fresh job's calls go to the host past the supervisor; its
            # done still goes to the supervisor (chan), and the process ends.
            runner.chan = calls
        chan.send(runner.run_job(frame))
        if not persist:
            return 0


def _spare_wait(runner, chan):
    """A spare's wait for its job: returns its exec frame and the job's call
    channel (or None). The exec comes from the supervisor (chan), or, once
    the supervisor handed over the next job's call channel (a channel frame,
    sent while the container is idle), from the host on that channel: the
    job then starts without waiting for the supervisor, which only hears of
    it. A channel the host closed before its exec is dropped (the exec then
    comes from the supervisor)."""
    handed = None
    while True:
        socks = [chan] if handed is None else [chan, handed]
        ready, _, _ = select.select(socks, [], [])
        if handed is not None and handed in ready:
            try:
                frames = handed.recv_ready()
            except (EOFError, ValueError, OSError):
                frames = None
            if frames is None:
                handed.close()
                handed = None
            elif frames:
                if frames[0].get("type") != "exec":
                    os._exit(70)  # the host sends its exec first, and nothing else
                return frames[0], handed
        if chan not in ready:
            continue
        try:
            frames = chan.recv_ready()
        except BaseException:
            os._exit(0)  # the supervisor is gone (or broke the protocol): nothing left to do
        for i, frame in enumerate(frames):
            kind = frame.get("type")
            if kind == "channel" and handed is None and chan.fds:
                handed = _Channel(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=chan.fds.pop(0)), chan.rbuf)
            elif kind == "exec":
                if handed is not None:
                    handed.close()
                for rest in frames[i + 1:]:
                    runner._dispatch(rest)
                return frame, chan.calls(frame)


def main():
    args = sys.argv[1:]
    reset = "--reset" in args
    spare_js = "--spare-javascript" in args
    lazy = "--preload-lazy" in args
    preload = ()
    for a in args:
        if a.startswith("--preload="):
            preload = tuple(n for n in a[len("--preload="):].split(",") if _module_name(n))
    args = [a for a in args if a not in ("--reset", "--spare-javascript", "--preload-lazy") and not a.startswith("--preload=")]
    if len(args) != 1:
        sys.__stderr__.write("usage: runner.py SOCKET [--reset] [--spare-javascript] [--preload=MODULE,... [--preload-lazy]]\n")
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
    zygote = _spawn_zygote(sock, lambda z: _zygote_main(z, spare_js and reset, preload, lazy))
    data_names = sorted({n.split(".")[0] for n in preload})
    sup = _Supervisor(sock, zygote, reset, data_names=data_names)
    # direct_exec: the host may hand the Python spare the next job's call
    # channel while idle, and send a fresh Python job's exec on it, unless
    # its code names one of data_words (a job for the data zygote).
    hello = {"type": "hello", "version": PROTOCOL_VERSION, "secret": secret, "isolated": isolated, "reset": reset,
             "languages": _languages(), "call_channel": True, "direct_exec": True, "data_words": data_names}
    try:
        sup.loop(hello)
    except BaseException:
        sup.exit()


if __name__ == "__main__":
    sys.exit(main())
