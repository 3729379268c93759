"""The one bounded child-process helper: every process rlxviz runs a user's file (or native code a file can crash)
in is started, limited and reaped here, on the bottom floor so that `models` (the importer), `ir` (lint's host
node checks), `session` (loads) and the app (timing jobs) all use it.

Two kinds of child, one set of limits:

* **A fork** (`forked`): a check over data this process already holds (the importer's whole-model validation,
  lint's host node checks: ONNX's native shape inference, which a hostile file can crash). It shares the parent's
  memory copy-on-write, writes nothing to the terminal, and is killed past its wall time; `cpu_s` caps its CPU
  time too (`RLIMIT_CPU`, no core dump). A failure is a `ForkedFailure` (the signal, or that it timed out).
* **A fresh interpreter** (`spawn`): the fork server's zygote (`ir.forkserver`), whose forks run a user's load or
  a timing job (`session.isolated.run_isolated`, which speaks the pickled request/reply protocol over the child's
  stdin/stdout), or such a child itself where the zygote cannot fork. Started from one long-lived thread
  (`_SPAWNER`), it asks the kernel first to kill it when the parent dies (`PR_SET_PDEATHSIG`), before any import.

The limits, for either kind:

* CPU time (`cap_cpu` in a child that does one job; `Deadline` for a budget checked between steps in-process), with
  a wall-clock backstop of `WALL_FACTOR` times it: a busy machine does not refuse a good file, a stopped or
  starved child still ends;
* address space (`cap_address_space`: what the child holds at the start plus an allowance);
* job concurrency (`JobSlots`: at most N jobs of a kind at once across a server's sessions).

Time limits are counted in CPU time, with a wall-clock backstop: a limit in wall-clock time refuses a good file on
a busy machine (a 175-node export was refused because "the import has taken over 120 s" while other work held the
cores). What a hostile file can do is make the loader *compute* for long, which CPU time measures whatever the
machine's load; a process that is stopped or starved, and so uses no CPU, is still ended by the backstop.
"""

from __future__ import annotations

import math
import os
import resource
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType

WALL_FACTOR = 10.0
"""The wall-clock backstop is this many times the CPU-time limit: a stopped (SIGSTOP) or starved process ends."""

CPU_GRACE_SECONDS = 5
"""Seconds of CPU time past the soft limit before the kernel kills a child whose native code ignores SIGXCPU."""


class CpuTimeExceeded(BaseException):
    """Raised in a child past its `cap_cpu` budget (a BaseException: no loader's `except Exception` swallows it)."""


def _on_xcpu(signum: int, frame: FrameType | None) -> None:
    raise CpuTimeExceeded("the CPU-time limit was reached")


def cpu_used() -> float:
    """CPU time (user + system, seconds) this process has used so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cap_cpu(seconds: float, grace: int = CPU_GRACE_SECONDS) -> None:
    """(In a child that does one job) allow `seconds` more CPU time: `RLIMIT_CPU` soft limit at the time used so far
    plus `seconds` (rounded up to whole seconds, as the kernel counts), hard limit `grace` seconds later (never
    above a hard limit already set); SIGXCPU raises `CpuTimeExceeded` in the main thread.

    Raises:
        ValueError: `seconds` is not positive.
    """
    if not seconds > 0:
        raise ValueError(f"[cap_cpu] seconds must be positive, got {seconds!r}")
    soft = math.ceil(cpu_used() + seconds)
    _, hard_now = resource.getrlimit(resource.RLIMIT_CPU)
    hard = soft + grace if hard_now == resource.RLIM_INFINITY else min(soft + grace, hard_now)
    signal.signal(signal.SIGXCPU, _on_xcpu)
    resource.setrlimit(resource.RLIMIT_CPU, (min(soft, hard), hard))


class Deadline:
    """A CPU-time budget of the calling thread with a wall-clock backstop, started at construction.

    Args:
        cpu_s: CPU seconds the work may use (`time.thread_time` of this thread).
        wall_factor: the backstop is `wall_factor * cpu_s` seconds of wall time.
    """

    def __init__(self, cpu_s: float, wall_factor: float = WALL_FACTOR) -> None:
        self.cpu_s, self.wall_s, self.wall_factor = cpu_s, cpu_s * wall_factor, wall_factor
        self._cpu0, self._wall0 = time.thread_time(), time.monotonic()

    def exceeded(self) -> str:
        """"" while within both limits, else which one was passed, as a phrase: `taken over 120 s of CPU time` or
        `taken over 1200 s of wall time (10x its 120 s CPU-time limit: the process was stopped or starved)`."""
        if time.thread_time() - self._cpu0 > self.cpu_s:
            return f"taken over {self.cpu_s:g} s of CPU time"
        if time.monotonic() - self._wall0 > self.wall_s:
            return (f"taken over {self.wall_s:g} s of wall time ({self.wall_factor:g}x its {self.cpu_s:g} s "
                    f"CPU-time limit: the process was stopped or starved)")
        return ""


# -- address space -----------------------------------------------------------------------------------------------

def address_space() -> int:
    """This process's virtual address space now, in bytes (`/proc/self/statm`; 0 where there is none)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def cap_address_space(extra: int) -> None:
    """(In the child) limit the address space to what it holds now plus `extra` bytes (never above a hard limit
    already set)."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = address_space() + extra
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def children_cpu() -> float:
    """CPU seconds used by this process's reaped children (a child's counts once it is waited for)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


# -- a forked child ----------------------------------------------------------------------------------------------

def _limit_cpu(seconds: float) -> None:
    """(In a forked child, whose CPU time starts at 0) `RLIMIT_CPU` at `seconds` rounded up (never above a hard limit
    already set), no core file: past it the kernel's SIGXCPU ends the child."""
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = max(1, math.ceil(seconds))
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


class ForkedFailure(Exception):
    """A forked check that gave no text: killed by a signal (`signal`: its name), past its deadline (`timed_out`),
    or failed."""

    def __init__(self, signal_name: str = "", timed_out: bool = False, seconds: float = 0.0) -> None:
        super().__init__(signal_name or ("timed out" if timed_out else "failed"))
        self.signal, self.timed_out, self.seconds = signal_name, timed_out, seconds

    def said(self) -> str:
        """`crashed (SIGSEGV)`, `took over 20 s` or `failed`."""
        return (f"crashed ({self.signal})" if self.signal else f"took over {self.seconds:g} s" if self.timed_out
                else "failed")


def forked(check: Callable[[], str], seconds: float, cpu_s: float | None = None) -> str:
    """Run `check` in a forked child and return its text (the importer's whole-model validation and lint's host
    node checks: native code a hostile file can crash). The child shares the parent's memory copy-on-write,
    writes nothing to the terminal, and is killed at `seconds` of wall time. With `cpu_s`, it may use that much CPU
    time (`RLIMIT_CPU`, whole seconds: past it the kernel ends it with SIGXCPU, leaving no core file). Only where
    `os.fork` exists.

    Raises:
        ForkedFailure: the child was killed by a signal, ran past `seconds`, or its check raised.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run the check, write its text, leave without running any Python cleanup
        os.close(r)
        import faulthandler

        faulthandler.disable()  # a crash is reported by the parent in one line, not as a dump on stderr
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        code = 0
        try:
            if cpu_s is not None:
                _limit_cpu(cpu_s)
            data = check().encode("utf-8", "replace")
            while data:
                data = data[os.write(w, data):]
        except BaseException:  # noqa: BLE001 - anything else: say nothing, the parent reports a failed check
            code = 1
        os._exit(code)
    os.close(w)
    deadline = time.monotonic() + seconds
    chunks: list[bytes] = []
    os.set_blocking(r, False)
    ended = False  # the pipe's end of file: the child is leaving (it writes its text, then exits)
    try:
        while True:
            try:
                while chunk := os.read(r, 1 << 16):  # drained while waiting: a long text cannot block the child
                    chunks.append(chunk)
                ended = True
            except BlockingIOError:
                pass
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise ForkedFailure(timed_out=True, seconds=seconds)
            if ended:  # between closing its pipe and its exit: a moment
                time.sleep(0.0005)
            else:  # woken by its text or its end of file (a check takes a few ms; a fixed sleep added ~5 ms each)
                select.select([r], [], [], 0.05)
        try:
            while chunk := os.read(r, 1 << 16):
                chunks.append(chunk)
        except BlockingIOError:
            pass
    finally:
        os.close(r)
    if os.WIFSIGNALED(status):
        raise ForkedFailure(signal.Signals(os.WTERMSIG(status)).name)
    if os.WEXITSTATUS(status):
        raise ForkedFailure()
    return b"".join(chunks).decode("utf-8", "replace")


# -- a fresh interpreter -----------------------------------------------------------------------------------------

_PARENT_ENV = "RLXVIZ_ISOLATED_PARENT"
PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal the kernel sends this process when its parent dies (Linux)."""
_PROLOGUE = ("import os, signal, sys\n"
             "if sys.platform.startswith('linux'):\n"
             "    import ctypes\n"
             f"    ctypes.CDLL(None).prctl({PR_SET_PDEATHSIG}, signal.SIGKILL)\n"
             f"    if os.environ.get({_PARENT_ENV!r}) != str(os.getppid()): os._exit(1)\n")
"""The first statements of every fresh child. They make the kernel kill it when the parent dies, however it dies
(SIGKILL included), before the imports that take seconds: a job that never returns never outlives the server
(`prctl(PR_SET_PDEATHSIG)`; a parent already gone by then ends it at once)."""

_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlxviz-spawner")
"""The one long-lived thread that starts every child: Linux sends PR_SET_PDEATHSIG when the *thread* that started
the child ends, so a child started from a short-lived thread (the server's warm-up) would be killed with it."""


def _popen(main: str, pass_fds: tuple[int, ...], pipes: bool) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **{_PARENT_ENV: str(os.getpid())})
    io = subprocess.PIPE if pipes else subprocess.DEVNULL
    return subprocess.Popen([sys.executable, "-c", _PROLOGUE + main], stdin=io, stdout=io, env=env, close_fds=True,
                            pass_fds=pass_fds)


def spawn(main: str, pass_fds: tuple[int, ...] = (), pipes: bool = True) -> subprocess.Popen:
    """A fresh interpreter (`python -c`, not a fork: none of this process's threads or locks) that runs the
    statements `main` after `_PROLOGUE`, with this process's import path, its stdin and stdout pipes to the caller
    (`pipes`; else both /dev/null) and the fds `pass_fds` left open; started from `_SPAWNER`'s thread."""
    return _SPAWNER.submit(_popen, main, tuple(pass_fds), pipes).result()


def stop(proc: subprocess.Popen) -> None:
    """Kill `proc` if it runs, reap it and close its pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for f in (proc.stdin, proc.stdout):
        if f is not None:
            f.close()


# -- job concurrency ---------------------------------------------------------------------------------------------

class JobSlots:
    """At most `count()` jobs of one kind at once, across threads (a server's sessions): `with slots.held(): ...`.
    `count` is read at the first job, once per process (an environment setting)."""

    def __init__(self, count: Callable[[], int]) -> None:
        self._count = count
        self._slots: threading.BoundedSemaphore | None = None
        self._lock = threading.Lock()

    def held(self) -> threading.BoundedSemaphore:
        """The semaphore to hold while a job runs (made at the first call)."""
        with self._lock:
            if self._slots is None:
                self._slots = threading.BoundedSemaphore(self._count())
            return self._slots


__all__ = ["CPU_GRACE_SECONDS", "PR_SET_PDEATHSIG", "WALL_FACTOR", "CpuTimeExceeded", "Deadline", "ForkedFailure",
           "JobSlots", "address_space", "cap_address_space", "cap_cpu", "children_cpu", "cpu_used", "forked", "spawn",
           "stop"]
