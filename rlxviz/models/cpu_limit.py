"""Time limits on loading a user's file, counted in CPU time, with a wall-clock backstop.

A limit in wall-clock time refuses a good file on a busy machine (a 175-node export was refused because "the import
has taken over 120 s" while other work held the cores). What a hostile file can do is make the loader *compute*
for long, which CPU time measures whatever the machine's load; a process that is stopped or starved, and so uses no
CPU, is still ended by a generous wall-clock backstop (`WALL_FACTOR` times the CPU limit).

* `Deadline`: a CPU-time budget of the calling thread (`time.thread_time`: the import's own work, not other threads
  of a server) with the wall backstop, checked between steps (`Deadline.exceeded`).
* `cap_cpu`: in a child process that does one job, `RLIMIT_CPU` set to the CPU time used so far plus a budget; the
  kernel sends SIGXCPU past it (raised here as `CpuTimeExceeded`) and SIGKILL `CPU_GRACE_SECONDS` later if native
  code never returns to Python.
"""

from __future__ import annotations

import math
import resource
import signal
import time
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


__all__ = ["CPU_GRACE_SECONDS", "WALL_FACTOR", "CpuTimeExceeded", "Deadline", "cap_cpu", "cpu_used"]
