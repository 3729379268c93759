"""A fork server (a "zygote", as Android's and Python's `multiprocessing.forkserver`): children that start in
milliseconds with the loader's modules already imported, instead of a fresh interpreter paying ~2.9 s of CPU for
them (numpy, onnx, onnx.reference and rlxviz's importer, on a 2-core AMD EPYC).

The zygote is a fresh interpreter (`bounded.spawn`'s prologue: the kernel kills it when the server dies) that imports
the `preload` modules once, then loops, single-threaded, on a Unix socket (a `SOCK_SEQPACKET` socketpair, its end
passed with `pass_fds`). Per request it receives the child's stdin and stdout (`SCM_RIGHTS`) with the server's
environment and folder now, `os.fork`s, and answers the child's pid; it reaps its children (`os.wait4` on SIGCHLD,
woken through `signal.set_wakeup_fd`) and reports each exit: pid, wait status and CPU seconds (`rusage`). A kill
goes through the zygote too, which kills only a child it has not reaped: a pid is never signalled after it could
have been reused.

The child closes the control socket, puts its pipes on fds 0 and 1, restores the default signal handlers, asks the
kernel to kill it when the zygote dies (`PR_SET_PDEATHSIG`; the zygote itself dies with the server), takes the
server's environment variables and folder, and runs `main` (without importing anything again), then `os._exit`s:
it never returns into the zygote's loop.

Why a fork of the zygote is safe where a fork of the server is not: the server has threads (Bokeh's, the session
workers, the spawner) and their locks, which a fork copies held and never releases; the zygote runs no thread of
Python's (checked before each fork) and no lock is held while it forks. The native threads of OpenBLAS's pool
(numpy's) are shut down by its own `pthread_atfork` handler before a fork and started again on use in the child.
MLX is never imported here: a timing job imports it in the child, after the fork. What is not as in a fresh
interpreter: a module that read an environment variable at import read the zygote's, from its start.

Measured (benchmarks/bench_isolated_start.py: 10 back-to-back `load_isolated` calls of esm.qdyn.onnx, 299 KB, each
a new copy so that the cache misses, from cold; a 2-core AMD EPYC that other helpers' jobs loaded, load average
1-5): a fresh interpreter per child (before) 18.8 s wall and 20.6 s of the children's CPU, ~1.9 s a call; forks of
the zygote 3.5 s wall and 3.7 s of CPU (the zygote's imports, once, included), ~180 ms a call after the first, of
which the load itself is ~125 ms in process. A fork takes ~5 ms; a call that does nothing ~15 ms.

Example:
    >>> zygote = ForkServer("rlxviz.session.isolated.serve", ("numpy",))   # doctest: +SKIP
    >>> child = zygote.fork()   # a Popen-like `Forked`: pid, stdin, stdout, poll(), wait(), kill(), cpu_s
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from .bounded import PR_SET_PDEATHSIG, spawn

FORK_WAIT_SECONDS = 120.0
"""Wall seconds a fork request waits for the zygote's answer (its imports first, on a new zygote); past it the
zygote is stopped and the request fails (the caller starts a fresh interpreter instead)."""

KILL_WAIT_SECONDS = 10.0
"""Wall seconds `Forked.wait` waits for the exit of a child it killed before it stops the zygote (a stopped
zygote: its children die with it)."""

_MAX_MESSAGE = 1 << 20
"""Bytes of the largest message on the control socket (a fork request carries the environment variables)."""

_PID = struct.Struct("<Qq")  # token, pid (or -errno)
_EXIT = struct.Struct("<qid")  # pid, wait status, CPU seconds


class ForkServerError(OSError):
    """The zygote could not fork a child: it is gone, did not answer, or its fork failed."""


# -- the zygote's side --------------------------------------------------------------------------------------------

def zygote(fd: int, preload: Sequence[str], main: str) -> None:
    """(The zygote's main) import `preload` and `main` (`package.module.function`), then serve fork and kill requests
    on the socket `fd` until the server closes it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the server, which stops the zygote
    ctl = socket.socket(fileno=fd)
    for name in preload:
        importlib.import_module(name)
    module, _, name = main.rpartition(".")
    target = getattr(importlib.import_module(module), name)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # a handler, so that the wakeup fd is written
    live: set[int] = set()
    while True:
        ready = select.select([ctl, wake_r], [], [])[0]
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 512):
                    pass
        _reap(ctl, live)
        if ctl not in ready:
            continue
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, _MAX_MESSAGE, 2)
        except OSError:
            os._exit(0)
        if not msg:
            os._exit(0)  # the server closed its end
        if msg[:1] == b"K":
            (pid,) = struct.unpack("<q", msg[1:9])
            if pid in live:  # not reaped yet: the pid is still this child's
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        elif msg[:1] == b"F":
            token = struct.unpack_from("<Q", msg, 1)[0]
            env, cwd = pickle.loads(msg[9:])
            pid = _fork(target, fds, env, cwd, (ctl, wake_r, wake_w))
            if pid > 0:
                live.add(pid)
            ctl.send(b"P" + _PID.pack(token, pid))
        else:
            for f in fds:
                os.close(f)


def _reap(ctl: socket.socket, live: set[int]) -> None:
    """Reap every child that has exited and report it: `X` pid, wait status, CPU seconds."""
    while live:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            live.clear()
            return
        if pid == 0:
            return
        live.discard(pid)
        ctl.send(b"X" + _EXIT.pack(pid, status, usage.ru_utime + usage.ru_stime))


def _fork(target: Callable[[], Any], fds: list[int], env: dict[str, str], cwd: str, close: tuple) -> int:
    """Fork a child that runs `target` with `fds` (stdin, stdout) as its fds 0 and 1; the child's pid, or -errno."""
    if threading.active_count() != 1 or len(fds) != 2:  # a fork copies other threads' locks held
        for f in fds:
            os.close(f)
        return -1
    zygote_pid = os.getpid()
    try:
        pid = os.fork()
    except OSError as e:
        for f in fds:
            os.close(f)
        return -(e.errno or 1)
    if pid:
        for f in fds:
            os.close(f)
        return pid
    code = 1
    try:  # the child: it never returns into the zygote's loop
        close[0].close()
        signal.set_wakeup_fd(-1)
        os.close(close[1])
        os.close(close[2])
        for s in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_DFL)
        if sys.platform.startswith("linux"):
            import ctypes

            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != zygote_pid:
                os._exit(1)
        os.dup2(fds[0], 0)
        os.dup2(fds[1], 1)
        for f in fds:
            os.close(f)
        os.environ.clear()
        os.environ.update(env)
        with contextlib.suppress(OSError):
            os.chdir(cwd)
        if "numpy" in sys.modules:  # a fresh interpreter seeds NumPy's global generator from the OS: so does each child
            sys.modules["numpy"].random.seed()
        target()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - any failure ends the child, never the zygote
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    return 0  # not reached


# -- the server's side --------------------------------------------------------------------------------------------

class Forked:
    """A child forked from the zygote, used as a `subprocess.Popen` is: `pid`, `stdin` and `stdout` (binary pipes),
    `poll()`, `wait(timeout)`, `kill()`, `returncode` (Popen's sign: `-N` for signal N), and `cpu_s`, its own CPU
    seconds once it has exited (None before; 0.0 when the zygote died first: no report)."""

    def __init__(self, server: ForkServer, stdin: Any, stdout: Any) -> None:
        self.server, self.stdin, self.stdout = server, stdin, stdout
        self.pid = 0
        self.returncode: int | None = None
        self.cpu_s: float | None = None
        self._exited = threading.Event()
        self._killed_at: float | None = None
        self._lock = threading.Lock()

    def _finish(self, status: int | None, cpu: float) -> None:
        with self._lock:
            if self.returncode is None:
                self.returncode = -signal.SIGKILL if status is None else os.waitstatus_to_exitcode(status)
                self.cpu_s = cpu
        self._exited.set()

    def poll(self) -> int | None:
        """The return code once the exit was reported, else None."""
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The return code, once the child has exited.

        Raises:
            subprocess.TimeoutExpired: not within `timeout` seconds.
        """
        end = None if timeout is None else time.monotonic() + timeout
        while not self._exited.wait(0.5 if end is None else max(0.0, min(0.5, end - time.monotonic()))):
            if self._killed_at is not None and time.monotonic() - self._killed_at > KILL_WAIT_SECONDS:
                self.server.stop()  # the zygote does not answer: stopping it ends its children
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        """SIGKILL the child, through the zygote (which signals only a child it has not reaped)."""
        if self.returncode is None:
            if self._killed_at is None:
                self._killed_at = time.monotonic()
            self.server._kill(self.pid)

    terminate = kill


class ForkServer:
    """A zygote (`zygote`) and its children, seen from the server: `fork()` gives a `Forked` child; `stop()` ends
    the zygote and, with it, every child (each is reported as killed).

    Args:
        main: `package.module.function` that each child runs (`session.isolated.serve`).
        preload: modules the zygote imports once, before it forks.
        key: what the zygote was started for (the interpreter and the import path), for the caller to compare.
    """

    def __init__(self, main: str, preload: Sequence[str], key: Any = None) -> None:
        self.key = key
        self._ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            code = (f"from rlxviz.ir import forkserver; forkserver.zygote({theirs.fileno()}, {tuple(preload)!r}, "
                    f"{main!r})")
            self.proc = spawn(code, pass_fds=(theirs.fileno(),), pipes=False)
        finally:
            theirs.close()
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._tokens = 0
        self._pending: dict[int, tuple[threading.Event, list]] = {}
        self._children: dict[int, Forked] = {}
        self._dead = self._retired = False
        self._reader = threading.Thread(target=self._read, name="rlxviz-forkserver", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        """The zygote's pid."""
        return self.proc.pid

    def alive(self) -> bool:
        """Whether the zygote still serves."""
        return not self._dead and not self._retired and self.proc.poll() is None

    def retire(self) -> None:
        """Fork no more; stop the zygote once every child it forked has exited (now, if none runs)."""
        with self._lock:
            self._retired = True
            idle = not self._children and not self._pending
        if idle:
            self.stop()

    def _read(self) -> None:
        """(Its own thread) dispatch the zygote's answers and exit reports until its end of the socket closes."""
        while True:
            try:
                msg = self._ctl.recv(64)
            except OSError:
                msg = b""
            if not msg:
                break
            if msg[:1] == b"P":
                token, pid = _PID.unpack(msg[1:])
                with self._lock:
                    waiting = self._pending.pop(token, None)
                    if waiting is not None and pid > 0:
                        child = waiting[1][0]
                        child.pid = pid
                        self._children[pid] = child
                if waiting is not None:
                    waiting[1].append(pid)
                    waiting[0].set()
            elif msg[:1] == b"X":
                pid, status, cpu = _EXIT.unpack(msg[1:])
                with self._lock:
                    child = self._children.pop(pid, None)
                    idle = self._retired and not self._children and not self._pending
                if child is not None:
                    child._finish(status, cpu)
                if idle:
                    self.stop()  # retired, its last child gone
        with self._lock:
            self._dead = True
            pending, self._pending = list(self._pending.values()), {}
            children, self._children = list(self._children.values()), {}
        for event, _ in pending:
            event.set()
        for child in children:  # killed by the kernel with the zygote (PR_SET_PDEATHSIG); nobody reports them now
            child._finish(None, 0.0)
        with contextlib.suppress(OSError):
            self._ctl.close()

    def fork(self, timeout: float = FORK_WAIT_SECONDS) -> Forked:
        """A new child, its stdin and stdout pipes to this process.

        Raises:
            ForkServerError: the zygote is gone, did not answer within `timeout` seconds (then it is stopped), or
                could not fork.
        """
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        child = Forked(self, os.fdopen(in_w, "wb"), os.fdopen(out_r, "rb"))
        event: threading.Event = threading.Event()
        answer: list = [child]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        try:
            with self._lock:
                if self._dead or self._retired:
                    raise ForkServerError("the zygote is gone" if self._dead else "the zygote is retired")
                self._tokens += 1
                token = self._tokens
                self._pending[token] = (event, answer)
            message = b"F" + struct.pack("<Q", token) + pickle.dumps((env, os.getcwd()))
            with self._send_lock:
                socket.send_fds(self._ctl, [message], [in_r, out_w])
        except OSError as e:
            with self._lock:
                self._pending.pop(locals().get("token", -1), None)
            _close(child, in_r, out_w)
            raise ForkServerError(f"the zygote took no request: {e}") from None
        os.close(in_r)
        os.close(out_w)
        if not event.wait(timeout):
            self.stop()
            _close(child)
            raise ForkServerError(f"the zygote did not answer in {timeout:g} s")
        if len(answer) < 2 or answer[1] <= 0:
            _close(child)
            raise ForkServerError("the zygote is gone" if len(answer) < 2 else f"the fork failed ({-answer[1]})")
        return child

    def _kill(self, pid: int) -> None:
        with contextlib.suppress(OSError), self._send_lock:
            self._ctl.send(b"K" + struct.pack("<q", pid))

    def stop(self) -> None:
        """Kill the zygote and reap it; its children die with it (each reported killed)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        with contextlib.suppress(OSError):
            self._ctl.shutdown(socket.SHUT_RDWR)
        if threading.current_thread() is not self._reader:
            self._reader.join(10)


def _close(child: Forked, *fds: int) -> None:
    for f in (child.stdin, child.stdout):
        with contextlib.suppress(OSError):
            f.close()
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


__all__ = ["FORK_WAIT_SECONDS", "KILL_WAIT_SECONDS", "ForkServer", "ForkServerError", "Forked", "zygote"]
