"""mcpexec runner: the supervisor, PID 1 of the container. It holds the host
connection, relays and checks the code's frames, and sweeps the container
between fresh jobs. Standard library only."""

import array
import base64
import binascii
import codecs
import errno
import fcntl
import json
import os
import re
import select
import signal
import socket
import stat

from mcpexec_protocol import KNOWN_METHODS, MAX_CALL, MAX_FRAME, MAX_PENDING_TO_EXECUTOR, _FrameBuffer, _encode, _fds, _fork_child, _read_buffer, _set_pdeathsig


class _Executor:
    """One job's (or one session's) code process, as the supervisor sees it."""

    def __init__(self, pid, chan, pipes, persist, lang):
        self.pid = pid
        self.lang = lang
        self.chan = chan  # non-blocking socket
        self.pipes = pipes  # read fd -> stream name
        self.persist = persist
        self.exited = None  # its wait status, once the zygote has reaped it
        # Whether its channel has ended: from then on it is not watched (a
        # socket at its end is always readable), and its exit, which the
        # zygote reports, is waited for.
        self.ended = False

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


def _spawn_zygote(host_sock, zygote_main):
    """Forks the zygote, which runs zygote_main on its end of a SOCK_SEQPACKET
    pair; returns the supervisor's handle of it."""
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)

    def child():
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
        return zygote_main(child_end)

    pid = _fork_child(child)
    child_end.close()
    return _Zygote(pid, parent_end)


# Every place of a container that a job's user can write, and so may leave
# things in for the next job: a sandbox that serves another job has each
# emptied first. /dev/mqueue holds POSIX message queues (the container's own
# IPC namespace); removing its entries is mq_unlink. The reuse test
# (podman.TestReuseWithinNamespace) fails on a writable place not listed here.
WRITABLE = ("/tmp", "/workspace", "/dev/shm", "/dev/mqueue")


class _Supervisor:
    def __init__(self, host, zygote, reset, data_names=()):
        self.pid = os.getpid()
        self.host = host
        self.hbuf = _FrameBuffer(MAX_FRAME)
        # Every socket read lands here: a fresh 1 MiB bytes object per read
        # would cost an mmap, an mremap and an munmap each (glibc maps
        # allocations that large), three page-table changes per frame.
        self.rbuf = _read_buffer()
        self.zygote = zygote
        # The zygote's data zygote (holding the preload modules), once it
        # says: a job whose code names one of data_names is forked there.
        self.data_zygote = None
        # The zygote starts its data zygote at the first job that uses it.
        self.data_lazy = False
        self.data_words = re.compile(r"\b(?:%s)\b" % "|".join(map(re.escape, sorted(set(data_names))))) if data_names else None
        self.reset_ok = reset  # PID 1 of its own container: may sweep and wipe
        self.ex = None  # the running executor
        self.xbuf = None
        self.to_ex = bytearray()
        self.pending = None  # the exec frame waiting for its executor
        self.pending_fd = None  # and the job's call channel, for its executor
        # Call channels the host sent (SCM_RIGHTS), one with each exec frame
        # that says call_channel, in the order of those frames.
        self.host_fds = []
        self.pending_lang = "python"  # and its language
        # The executors the zygote started ahead, by language: (pid, [its
        # channel, stdout, stderr]); a job's exec goes straight to its
        # language's, which it then tells the zygote it took.
        self.spares = {}
        # The pid of the Python spare that holds the next job's call channel,
        # handed over by the host while idle (a channel frame): the host then
        # sends that job's exec to it directly, and says so here (direct).
        self.handed = None
        self.js_last = False  # the last job here was JavaScript's: start a JavaScript executor for the next
        self.result = None  # a fresh job's done frame
        self.answered = False  # a fresh job's done was sent: its process's end and the sweep follow
        self.held = []  # host frames that came meanwhile: handled once the sweep found the container clean
        self.retired = False  # the sweep found damage: no job runs here any more
        self.fresh = False
        self.job = None
        self.cap = 1 << 20
        self.sent = {}
        self.decoders = {}
        self.hello = None  # sent to the host when the zygote is ready
        self.workspace = os.getcwd()  # /workspace in a container
        self.in_errors = []  # input files of the next job that could not be placed
        self.limits = (0, 0, 0)  # the job's (max files, max file bytes, max total bytes) out
        self.collected = {}  # a session's files sent already: name -> (ino, size, mtime)

    def start_job(self, frame):
        """Takes up exec frame's job: its name, output cap and bounds."""
        job = frame.get("job")
        self.job = job if isinstance(job, str) else ""
        cap = frame.get("output_cap")
        self.cap = cap if isinstance(cap, int) and cap > 0 else 1 << 20
        self.sent = {"stdout": 0, "stderr": 0}
        self.decoders = {n: codecs.getincrementaldecoder("utf-8")("replace") for n in ("stdout", "stderr")}
        self.fresh = frame.get("fresh") is True
        self.result = None
        self.limits = (_int(frame.get("max_files")), _int(frame.get("max_file_bytes")), _int(frame.get("max_job_bytes")))
        if self.fresh:
            self.collected = {}

    def recv(self, sock):
        """Reads what sock has (up to 1 MiB) into the read buffer; the view
        returned is valid until the next read (the frame buffers copy it)."""
        return self.rbuf[:sock.recv_into(self.rbuf)]

    def recv_host(self):
        """recv of the host's connection, keeping the call channels that
        come with its exec frames."""
        n, anc, _, _ = self.host.recvmsg_into([self.rbuf], _ANC_SPACE, socket.MSG_CMSG_CLOEXEC)
        self.host_fds += _fds(anc)
        return self.rbuf[:n]

    def channel_of(self, frame):
        """The call channel that came with an exec or channel frame (its
        fd), or None."""
        if frame.get("type") in ("exec", "channel") and frame.get("call_channel") is True and self.host_fds:
            return self.host_fds.pop(0)
        return None

    def send_host(self, frame):
        self.host.sendall(_encode(frame))

    def to_executor(self, frame):
        if self.ex is None:
            return
        self.to_ex += _encode(frame)
        self.flush_executor()  # now: not a round of the loop later
        if len(self.to_ex) > MAX_PENDING_TO_EXECUTOR:
            self.fail("the code stopped reading the answers to its calls")

    def exec_to_executor(self, frame, fd, own_fd=True):
        """Sends a new executor its exec frame, with the job's call channel
        (fd, closed here once sent unless own_fd is false) when there is
        one."""
        if fd is None:
            self.to_executor(frame)
            return
        data = _encode(dict(frame, call_channel=True))
        try:
            n = self.ex.chan.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
        except OSError:
            n = -1
        finally:
            if own_fd:
                os.close(fd)
        if n < 0:
            self.to_executor(frame)  # sent nothing (cannot happen on a fresh socket): the calls come through here
            return
        self.to_ex += data[n:]
        self.flush_executor()

    def flush_executor(self):
        """Sends the executor what waits for it, as much as its socket takes."""
        try:
            n = self.ex.chan.send(self.to_ex[:1 << 20])
            del self.to_ex[:n]
        except BlockingIOError:
            pass
        except OSError:
            self.to_ex = bytearray()  # the executor closed it: its exit is reported

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
        if self.answered:
            # The next job waits for the sweep of the last one.
            if len(self.held) >= MAX_HELD:
                self.exit()
            self.held.append(frame)
            return
        kind = frame.get("type")
        fd = self.channel_of(frame)
        try:
            if kind == "channel":
                self.hand(fd)
            else:
                self.on_host_frame(frame, kind, fd)
        finally:
            if fd is not None and fd != self.pending_fd:
                os.close(fd)  # not the job's process's: its calls come through here

    def hand(self, fd):
        """Hands the next job's call channel (fd, closed by the caller) to the
        Python spare, which then takes its exec from the host directly. Only
        while the container is idle and swept, with a spare that holds none;
        else the channel is closed, and the host's direct exec (if it sends
        one) is run as any other."""
        spare = self.spares.get("python")
        if fd is None or spare is None or self.handed is not None or self.retired or self.job is not None or self.ex is not None:
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=spare[1][0])
        try:
            sock.sendmsg([_encode({"type": "channel"})], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
            self.handed = spare[0]
        except OSError:
            pass  # a spare that died: the zygote reports it
        finally:
            sock.detach()  # still the spare's end, held in spares

    def on_host_frame(self, frame, kind, fd):
        if kind == "exec" and frame.get("direct") is True and self.handed is not None:
            # The host sent the exec to the spare that holds the call channel
            # too: that spare runs it, or nothing does.
            if not self.direct(frame):
                self.refuse_direct(frame)
            return
        if self.retired:
            if kind == "exec":
                self.not_run(frame.get("job"))
            return
        if kind == "file" and self.job is None:
            err = _place(self.workspace, frame.get("name"), frame.get("data"))
            if err:
                self.in_errors.append(err)
        elif kind == "exec" and self.job is None:
            self.start_job(frame)
            if self.in_errors:
                errs, self.in_errors = self.in_errors, []
                self.finish({"status": "error", "exit_code": -1, "error": "could not place the input files: " + "; ".join(errs[:5])})
                return
            exec_frame = {"type": "exec", "code": frame.get("code", ""), "servers": frame.get("servers") or [], "persist": not self.fresh}
            lang = frame.get("lang") or "python"
            self.js_last = lang == "javascript"
            if self.ex is not None and self.ex.persist and not self.fresh:
                if self.ex.lang != lang:
                    # A session keeps one interpreter: its state is not carried over.
                    self.finish({"status": "error", "exit_code": -1, "error": "this session runs %s code, not %s: use another session name for %s"
                                 % (self.ex.lang, str(lang)[:20], str(lang)[:20])})
                    return
                self.drain()
                self.to_executor(exec_frame)  # a session's next job
                return
            if self.ex is not None:
                self.end_executor()
            # Code that names a preloaded module (the data stack) runs in a
            # fork of the data zygote; other code in a fork of the plain one.
            code = exec_frame["code"]
            data = (lang == "python" and (self.data_zygote is not None or self.data_lazy) and self.data_words is not None
                    and isinstance(code, str) and bool(self.data_words.search(code)))
            spare = None if data else self.spares.pop(lang, None)
            self.drop_spares()  # the zygote ends them
            if spare is not None:
                # Straight to the spare: the zygote hears which it was.
                pid, fds = spare
                self.adopt(pid, fds, lang)
                # fd (if any) is closed by on_host once sent.
                self.exec_to_executor(exec_frame, fd if self.fresh and lang == "python" else None, own_fd=False)
                # Told after the job is on its way: a process woken here
                # may take this CPU first.
                self.take(lang, pid)
                return
            self.pending = exec_frame
            self.pending_lang = lang
            if self.fresh and lang == "python":
                self.pending_fd = fd
            try:
                self.zygote.sock.send(json.dumps({"type": "fork", "persist": not self.fresh, "lang": lang, "data": data}).encode())
            except OSError:
                self.zygote_gone()
        elif kind == "reply":
            self.to_executor({"type": "reply", "id": frame.get("id"), "result": frame.get("result"), "error": frame.get("error")})

    def direct(self, frame):
        """A fresh Python job whose exec the host sent to the spare holding
        its call channel: that spare runs it, and this only adopts it (and
        tells the zygote). False (nothing done) when it cannot: the spare
        is gone, or the container is not idle."""
        spare = self.spares.get("python")
        if (spare is None or self.handed != spare[0] or self.retired or self.job is not None or self.ex is not None
                or self.in_errors or frame.get("fresh") is not True or (frame.get("lang") or "python") != "python"):
            return False
        self.start_job(frame)
        self.js_last = False
        del self.spares["python"]
        self.drop_spares()  # the zygote ends them (and nothing is handed now)
        self.adopt(spare[0], spare[1], "python")
        self.take("python", spare[0])
        return True

    def take(self, lang, pid):
        """Tells the zygote the job took its spare of lang, pid: it ends the
        others and waits for this one."""
        try:
            self.zygote.sock.send(json.dumps({"type": "take", "lang": lang, "pid": pid}).encode())
        except OSError:
            self.zygote_gone()

    def refuse_direct(self, frame):
        """A direct exec this cannot adopt (a host that broke the protocol:
        files or a job before it, not a fresh Python job): the spare that
        may have started it is killed, the job fails, and the sandbox ends."""
        try:
            os.kill(self.handed, signal.SIGKILL)
        except OSError:
            pass
        self.handed = None
        if self.job is None:
            self.start_job(frame)
        self.fail_zygote("the host sent a direct exec it may not send here")

    def adopt(self, pid, fds, lang):
        """Makes the executor of pid, whose ends are fds (channel, stdout,
        stderr), the running one."""
        chan = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fileno=fds[0])  # a socketpair's end
        chan.setblocking(False)
        for fd in fds[1:]:
            fl = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, fl | os.O_NONBLOCK)
        self.ex = _Executor(pid, chan, {fds[1]: "stdout", fds[2]: "stderr"}, not self.fresh, lang)
        self.xbuf = _FrameBuffer(MAX_CALL + 4096)
        self.to_ex = bytearray()

    def drop_spares(self):
        """Closes the ends of the spares held (the zygote ends them)."""
        self.handed = None
        while self.spares:
            _close_all(self.spares.popitem()[1][1])

    def take_spares(self, frame, fds):
        """Keeps the spares' ends a ready or spared message handed over;
        False (fds closed) when the message does not match them."""
        if _int(frame.get("data_zygote")) > 1:
            self.data_zygote = frame["data_zygote"]
        self.data_lazy = self.data_zygote is None and frame.get("data_lazy") is True
        handed = frame.get("handed")
        ok = isinstance(handed, list) and len(fds) == 3 * len(handed)
        langs = set()
        for entry in handed if ok else ():
            ok = (isinstance(entry, list) and len(entry) == 2 and entry[0] in ("python", "javascript") and entry[0] not in langs
                  and _int(entry[1]) > 1)
            if not ok:
                break
            langs.add(entry[0])
        if not ok:
            _close_all(fds)
            return False
        self.drop_spares()
        for i, (lang, pid) in enumerate(handed):
            self.spares[lang] = (pid, fds[3 * i:3 * i + 3])
        return True

    def on_zygote(self):
        try:
            msg, fds, _, _ = socket.recv_fds(self.zygote.sock, 4096, 6)
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
        if kind in ("ready", "spared") and not self.take_spares(frame, fds):
            self.fail_zygote("the code's parent process handed over the wrong spares")
        elif kind == "ready" and self.hello is not None:
            self.hello["spares"] = _spares(frame)
            self.send_host(self.hello)
            self.hello = None
        elif kind == "forked" and self.pending is not None and self.ex is None:
            pid = frame.get("pid")
            if self.data_lazy and _int(frame.get("data_zygote")) > 1:
                # Started for this job: the sweep spares it from now on.
                self.data_zygote, self.data_lazy = frame["data_zygote"], False
            if frame.get("handed") is True and not fds:
                # The spare the zygote announced after this job was sent.
                spare = self.spares.pop(self.pending_lang, None)
                if spare is None or spare[0] != pid:
                    _close_all(spare[1] if spare else ())
                    self.fail_zygote("the code's parent process named a spare it did not hand over")
                fds = spare[1]
            elif len(fds) != 3:
                _close_all(fds)
                self.fail_zygote("the code's parent process sent an executor without its ends")
            self.drop_spares()  # the zygote ends them
            self.adopt(pid, fds, self.pending_lang)
            fd, self.pending_fd = self.pending_fd, None
            self.exec_to_executor(self.pending, fd)
            self.pending = None
        elif kind == "spared":
            if self.retired:
                self.drop_spares()
            elif self.job is None and self.ex is None and self.pending is None:
                # Swept, and the next job's process waits (of these languages).
                self.send_host({"type": "ready", "spares": _spares(frame)})
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
            if self.fresh and self.reset_ok and self.ex.exited is None:
                # Answered at once: the process's end and the sweep follow,
                # off the job's path, and the next job waits for them. (Once
                # its end is known, executor_gone answers as before.)
                self.result = done
                self.finish(done, files=self.collect())
                self.answered = True
            elif self.fresh:
                self.result = done  # sent once the job's process is gone
            else:
                self.finish(done, files=self.collect())
        else:
            self.fail("the code sent an unexpected %r frame" % (str(kind)[:40],))

    def finish(self, done, last=False, files=None):
        self.drain()
        if files is not None:
            sent, notes = files
            for name, data in sent:
                self.send_host({"type": "file", "job": self.job, "name": name, "data": base64.b64encode(data).decode("ascii")})
            if notes:
                done = dict(done, notes=notes)
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
        self.refuse_held()
        self.exit()

    def fail_zygote(self, why):
        self.kill_all()
        if self.job is not None:
            self.finish({"status": "error", "exit_code": -1, "error": "the sandbox broke: " + why}, last=True)
        self.refuse_held()
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
        the result it sent, unless that was sent already), and a fresh job's
        leftovers are swept."""
        if self.answered:
            self.answered = False
            self.result = None
            self.end_executor()
            if not self.sweep():
                self.retire()
                return
            self.spare()
            held, self.held = self.held, []
            for frame in held:
                self.on_host(frame)
            return
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
        files = self.collect() if self.job is not None else None
        clean = self.result is not None and self.fresh and self.sweep()
        self.result = None
        self.finish(done, last=not clean, files=files)
        if not clean:
            self.exit()
        self.spare()

    def spare(self):
        try:
            # Clean: the next job's executors may start.
            self.zygote.sock.send(json.dumps({"type": "spare", "javascript": self.js_last}).encode())
        except OSError:
            self.zygote_gone()

    def retire(self):
        """The sweep after an answered job found damage: this sandbox runs no
        further job. The host hears it as a done that ran nothing (not_run),
        for the job it sent meanwhile, if any, and runs that job elsewhere."""
        self.retired = True
        self.refuse_held()
        self.not_run("")  # an idle sandbox that speaks is not offered again

    def refuse_held(self):
        """Answers the jobs the host sent while the last one's sweep was due:
        none of them ran (a job answered early whose process then broke the
        protocol must not fail the next one)."""
        held, self.held = self.held, []
        for frame in held:
            if frame.get("type") == "exec":
                fd = self.channel_of(frame)
                if fd is not None:
                    os.close(fd)
                self.not_run(frame.get("job"))

    def not_run(self, job):
        self.send_host({"type": "done", "job": job if isinstance(job, str) else "", "status": "error", "exit_code": -1,
                        "error": "the sandbox retired before running the job", "not_run": True, "last": True})

    def read_rest(self):
        """Reads what an exited executor left in its channel (non-blocking: a
        process it left behind may hold the channel open)."""
        ex = self.ex
        while ex is not None and ex is self.ex:
            try:
                data = self.recv(ex.chan)
            except OSError:
                return
            if not data:
                return
            self.from_executor(ex, data)

    def from_executor(self, ex, data):
        """Handles bytes read from executor ex: its frames, until one ends it."""
        try:
            frames = self.xbuf.feed(data)
        except ValueError as e:
            self.fail(str(e))
        for frame in frames:
            self.on_executor(frame)
            if self.ex is not ex:
                return

    # -- files out ----------------------------------------------------------------
    def collect(self):
        """The files the job wrote under out/ of the workspace (a session's: the
        new or changed ones), within the job's bounds, and a note for each thing
        not kept. The code is hostile: names are bytes, nothing is followed,
        only regular files are opened (without blocking), and no more is read
        of one than its bound."""
        max_files, max_file, max_total = self.limits
        max_files = max_files or 100
        max_file = max_file or (8 << 20)
        max_total = max_total or (32 << 20)
        files, notes = [], []
        total = [0]
        looked = [0]
        stop = [None]  # why the walk ended early
        now_seen = {}

        def note(text):
            if len(notes) < MAX_NOTES:
                notes.append(text[:300])
            elif len(notes) == MAX_NOTES:
                notes.append("more files were not kept: only the first %d reasons are listed" % MAX_NOTES)

        def walk(dfd, prefix, depth):
            try:
                it = os.scandir(dfd)
            except OSError as e:
                note("out/%s could not be listed: %s" % (prefix, e.strerror))
                return
            with it:
                for entry in it:
                    looked[0] += 1
                    if looked[0] > MAX_SCAN:
                        stop[0] = "out/ holds more than %d entries: the rest were not looked at" % MAX_SCAN
                        return
                    raw = os.fsencode(entry.name)
                    try:
                        part = raw.decode("utf-8")
                    except UnicodeDecodeError:
                        note("out/%s%r: the name is not UTF-8, so the file was not kept" % (prefix, raw))
                        continue
                    name = prefix + part
                    if any(ord(c) < 32 or ord(c) == 127 for c in part) or len(name.encode()) > 255:
                        note("out/%r: the name holds control characters or is too long, so the file was not kept" % name)
                        continue
                    try:
                        st = os.stat(entry.name, dir_fd=dfd, follow_symlinks=False)
                    except OSError as e:
                        note("out/%s: %s" % (name, e.strerror))
                        continue
                    mode = st.st_mode
                    if stat.S_ISLNK(mode):
                        note("out/%s is a symbolic link: links are not followed, so it was not kept" % name)
                        continue
                    if stat.S_ISDIR(mode):
                        if depth >= 7:
                            note("out/%s is nested too deep: it was not looked into" % name)
                            continue
                        try:
                            sub = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
                        except OSError as e:
                            note("out/%s could not be opened: %s" % (name, e.strerror))
                            continue
                        try:
                            walk(sub, name + "/", depth + 1)
                        finally:
                            os.close(sub)
                        if stop[0]:
                            return
                        continue
                    if not stat.S_ISREG(mode):
                        note("out/%s is a %s, not a regular file: it was not kept" % (name, _kind(mode)))
                        continue
                    key = (st.st_ino, st.st_size, st.st_mtime_ns)
                    now_seen[name] = key
                    if not self.fresh and self.collected.get(name) == key:
                        continue  # a session's file sent by an earlier job, unchanged
                    if len(files) >= max_files:
                        stop[0] = "the job wrote more than %d files under out/: the rest were not kept" % max_files
                        return
                    if st.st_size > max_file:
                        note("out/%s is %d bytes, over the limit of %d bytes per file: it was not kept" % (name, st.st_size, max_file))
                        continue
                    if total[0] + st.st_size > max_total:
                        note("out/%s: the files would be over %d bytes together, so it was not kept" % (name, max_total))
                        continue
                    data = _read_regular(dfd, entry.name, st, max_file)
                    if isinstance(data, str):
                        note("out/%s: %s" % (name, data))
                        continue
                    total[0] += len(data)
                    files.append((name, data))

        try:
            top = os.open(os.path.join(self.workspace, "out"), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return files, notes
        except OSError as e:
            if e.errno == errno.ENOTDIR or e.errno == errno.ELOOP:
                note("out is not a directory: nothing was kept")
            else:
                note("out could not be opened: %s" % e.strerror)
            return files, notes
        try:
            walk(top, "", 0)
        finally:
            os.close(top)
        if stop[0]:
            notes.append(stop[0])
        if not self.fresh:
            self.collected = now_seen
        return files, notes

    # -- between jobs -------------------------------------------------------------
    def strangers(self):
        """Processes of the container other than the supervisor and the
        zygotes."""
        mine = {self.pid, self.zygote.pid, self.data_zygote}
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
        any sign of damage (a leftover process, something in WRITABLE that
        cannot be removed, System V IPC objects, a stopped zygote, memory still held)
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
                # A heading, and a line for each object.
                if len(_read_small("/proc/sysvipc/" + kind).splitlines()) > 1:
                    clean = False
            except OSError:
                pass
        for pid in (self.zygote.pid, self.data_zygote):
            if pid is None:
                continue
            try:
                state = _read_small("/proc/%d/stat" % pid).rsplit(b")", 1)[1].split()[0]
                if state not in (b"S", b"R"):
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
                if not ex.ended:
                    rl.append(ex.chan.fileno())
                    if self.to_ex:
                        wl.append(ex.chan.fileno())
                rl += list(ex.pipes)
            readable, writable, _ = select.select(rl, wl, [])
            if ex is not None and ex is self.ex and ex.chan.fileno() in writable:
                self.flush_executor()
            for fd in readable:
                if fd == host_fd:
                    data = self.recv_host()
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
                        data = self.recv(ex.chan)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        ex.ended = True  # its exit is reported by the zygote
                        continue
                    self.from_executor(ex, data)
                else:
                    self.drain([fd])


# Room for the file descriptors one read of the host's connection may bring
# (one at a time: a read stops at a message that carries any).
_ANC_SPACE = socket.CMSG_SPACE(4 * 4)

# Bounds of the files collected after a job (the host checks them again).
MAX_SCAN = 10000  # entries of out/ looked at
MAX_HELD = 1024  # host frames held while a job's sweep runs (its input files and exec)
MAX_NOTES = 20


def _close_all(fds):
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _spares(frame):
    """The languages whose executor the zygote started ahead, from its ready
    or spared message (known names only)."""
    got = frame.get("spares")
    return [lang for lang in ("python", "javascript") if isinstance(got, list) and lang in got]


def _int(v):
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def _kind(mode):
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device node"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "special file"


def _read_regular(dfd, name, st, limit):
    """Reads a regular file without following links or blocking; returns its
    bytes, or why not (a str)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
    except OSError as e:
        return "could not be opened: %s" % e.strerror
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or now.st_ino != st.st_ino:
            return "changed while it was read: it was not kept"
        chunks, n = [], 0
        while n <= limit:
            b = os.read(fd, min(1 << 20, limit + 1 - n))
            if not b:
                break
            chunks.append(b)
            n += len(b)
        if n > limit:
            return "grew over the limit of %d bytes while it was read: it was not kept" % limit
        return b"".join(chunks)
    except OSError as e:
        return "could not be read: %s" % e.strerror
    finally:
        os.close(fd)


def _place(workspace, name, data):
    """Writes an input file under the workspace, creating its directories,
    following no link; returns why not (a str), or None."""
    if not isinstance(name, str) or not isinstance(data, str):
        return "a file frame without a name or data"
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts) or len(parts) > 8:
        return "%r is not a relative path" % name[:80]
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return "%s: its data is not base64" % name
    try:
        fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        return "the workspace: %s" % e.strerror
    try:
        for p in parts[:-1]:
            try:
                os.mkdir(p, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            sub = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = sub
        try:
            os.unlink(parts[-1], dir_fd=fd)  # a session's earlier file, or a link left there
        except FileNotFoundError:
            pass
        out = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=fd)
        with os.fdopen(out, "wb") as f:
            f.write(raw)
        return None
    except OSError as e:
        return "%s: %s" % (name, e.strerror or e)
    finally:
        os.close(fd)


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


# The cgroup files of the container's memory use and limit (v2, v1): the
# pair that answered last goes first.
_MEMORY_FILES = [("/sys/fs/cgroup/memory.current", "/sys/fs/cgroup/memory.max"),
                 ("/sys/fs/cgroup/memory/memory.usage_in_bytes", "/sys/fs/cgroup/memory/memory.limit_in_bytes")]


def _memory_held():
    """Whether the container still holds over half its memory limit after a
    job's processes are gone and its files wiped (cgroup v2 or v1)."""
    for i, (cur, lim) in enumerate(_MEMORY_FILES):
        try:
            used = int(_read_small(cur))
            limit = _read_small(lim).strip()
        except (OSError, ValueError):
            continue
        if i:
            _MEMORY_FILES.insert(0, _MEMORY_FILES.pop(i))
        if limit == b"max" or not limit.isdigit() or int(limit) >= 1 << 60:
            return False
        return used > int(limit) // 2
    return False


# The descriptors of the files the sweep reads after every job, by path
# (_read_small). Opened by the supervisor after it forked the zygote, so no
# code process holds them.
_KEPT = {}
MAX_KEPT = 16


def _read_small(path, limit=1 << 16):
    """The first limit bytes (one read) of a file of /proc or /sys that the
    sweep reads after every job. Its descriptor is kept and read from offset
    0 (pread): such files are made anew by a read from their start, so a
    read is one system call, not an open, two reads and a close, each dear
    in a virtual machine. A kept /proc/PID file stays bound to the process
    it was opened for: once that process is gone its read fails, even if a
    new one has its pid."""
    fd = _KEPT.get(path)
    if fd is None:
        if len(_KEPT) >= MAX_KEPT:
            _close_all(_KEPT.values())
            _KEPT.clear()
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        _KEPT[path] = fd
    try:
        return os.pread(fd, limit, 0)
    except OSError:
        del _KEPT[path]
        os.close(fd)
        raise
