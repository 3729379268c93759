"""Timing graph versions in a child process (no Panel import), bounded in wall time and address space.

Why a process: the app's server runs other Python threads (its event loop, other sessions' jobs). The MLX
runtime builds every call op by op from Python and releases the GIL in `mx.eval`; each release lets a busy
Python thread hold the GIL for up to `sys.getswitchinterval()` (5 ms) before the timing thread gets it back,
so a version timed from a server thread is charged for other threads' work
(`benchmarks/bench_app_vs_cli_timing.py --cause` measures it). A child process has a GIL of its own.

Why bounded: a version may run what a file says (a host op), and one job must never hold the server or another
session. Each job runs through `session.run_isolated` (a fresh interpreter from `ir.bounded`, the helper every
isolation uses): its own child, killed past `timing_seconds()` (`RLXVIZ_TIMING_SECONDS`), its address space capped
from the memory budget. At most `max_jobs()` (`RLXVIZ_TIMING_JOBS`, held as `bounded.JobSlots`) run at once across
sessions; a session's own jobs already run one at a time (`jobs.Runner`), so one session's stuck job delays no
other session while a slot is free.

The child runs what `rlxviz time` runs: `session.time_versions` (every version timed in interleaved rounds, median,
min, IQR, speed-up, where it ran), measuring anew; on the CPU one more program shares those rounds, the final version
on MLX's own lowering, for the fusion / kernels split.

Example:
    >>> run = time_in_worker(trace, feeds, weights, warmup=2, repeat=10)   # doctest: +SKIP
    >>> run.rows[0].median_ms, run.rows[0].iqr_ms, run.pid                  # doctest: +SKIP
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir.bounded import JobSlots


@dataclass(frozen=True)
class WorkerTiming:
    """The rows of one timing request and the process that measured them.

    Attributes:
        rows: `session.VersionTiming` per version of the trace (`trace.versions()` order).
        pid: the child process's id (not the server's: the timing ran outside the server's GIL).
        split: on the CPU, `session.FusionAndKernels` of this run (`fusion_and_kernels_of`: the input's and the final
            version's rows are `rows`' own, the final version on MLX's own lowering was timed in the same paired
            rounds), or why it failed (a str: the versions' rows stand); None on the GPU, where rlxviz's kernels do
            not run.
        measured_at: when the measurement ended (seconds since the epoch, `time.time()` in the child); 0: not known.
        session: which app session asked for it (`Measurements.token`; "" when not known): a stored run shown in
            another session says it was measured there (`measure.reuse_note`).
    """

    rows: list[Any]
    pid: int
    split: Any = None
    measured_at: float = 0.0
    session: str = ""


FORCE_BUSY_ENV = "RLXVIZ_FORCE_BUSY"
"""A test hook: with this set (to 1) in the server's environment, every timing run reads as made on a busy machine
(`force_busy`), so a browser test sees the busy verdict without a machine busy on cue. Unset in normal use."""
FORCED_SLOWDOWN = 3.0
"""How much slower `force_busy` makes every round but each row's fastest: 3x puts each median at 3x its minimum,
past `session.timing.BUSY_RATIO` (2x)."""


def force_busy(rows: list[Any]) -> list[Any]:
    """`rows` (`session.VersionTiming`) as a busy machine would leave them: every timed round but the fastest made
    `FORCED_SLOWDOWN` times slower, the median, IQR and speed-up recomputed from the rounds (the minimum kept);
    rows with fewer than 3 rounds or not timed are kept. Only for `FORCE_BUSY_ENV`; raises nothing."""
    from dataclasses import replace

    out = []
    for r in rows:
        s = np.asarray(r.samples_ms, float)
        if r.median_ms is None or len(s) < 3:
            out.append(r)
            continue
        slow = np.where(np.arange(len(s)) == int(np.argmin(s)), s, s * FORCED_SLOWDOWN)
        q1, q3 = np.percentile(slow, [25, 75])
        out.append(replace(r, samples_ms=tuple(float(v) for v in slow), median_ms=float(np.median(slow)),
                           iqr_ms=float(q3 - q1)))
    base = next((r.median_ms for r in out if r.index == 0 and r.median_ms), None)
    return [replace(r, speedup=base / r.median_ms) if base and r.median_ms and r.speedup is not None else r
            for r in out]


def _force_busy_split(split: Any) -> Any:
    """`session.FusionAndKernels` with its rows `force_busy`'d and its verdicts and warning recomputed from them."""
    from dataclasses import replace

    from ..session.timing import busy_warning, paired_verdict

    if split is None or isinstance(split, str):
        return split
    rows = force_busy(list(split.rows))
    return replace(split, rows=rows, fusion=paired_verdict(rows[0], rows[1]), kernels=paired_verdict(rows[1], rows[2]),
                   total=paired_verdict(rows[0], rows[2]), warning=busy_warning(*rows))


def _time(trace: Any, feeds: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray], warmup: int, repeat: int,
          device: str | None, inputs: Any) -> WorkerTiming:
    """(In the child) `session.time_versions_and_own`, measuring anew: every version and, on the CPU, the final
    version on MLX's own lowering in the same paired rounds, so the fusion / kernels split
    (`lowerings.fusion_and_kernels_of`) is made of the very rows the chart draws, with one machine check."""
    from ..session import lowerings, timing

    timing.TIMINGS.clear()
    extra = {} if inputs is None else {"inputs": inputs}
    rows, own = timing.time_versions_and_own(trace, feeds, weights, warmup=warmup, repeat=repeat, device=device,
                                             own_lowering=True, **extra)
    if os.environ.get(FORCE_BUSY_ENV):  # the test hook: the run as a busy machine leaves it
        rows = force_busy(rows)
        own = force_busy([own])[0] if not isinstance(own, str) and own is not None else own
    split: Any = own  # None (not on the CPU) or why the own-lowering row is missing (a str: the versions stand)
    if own is not None and not isinstance(own, str):
        try:
            split = lowerings.fusion_and_kernels_of(rows, own, trace.input)
        except ValueError as e:  # the input or the final version not timed: the versions' rows stand
            split = f"{type(e).__name__}: {e}"
    return WorkerTiming(rows, os.getpid(), split, measured_at=time.time())


TIMING_SECONDS_ENV = "RLXVIZ_TIMING_SECONDS"
DEFAULT_TIMING_SECONDS = 300.0
"""Wall-time limit (s) on one timing or overlay job unless `RLXVIZ_TIMING_SECONDS` says otherwise."""

TIMING_JOBS_ENV = "RLXVIZ_TIMING_JOBS"
DEFAULT_TIMING_JOBS = 2
"""Timing/overlay jobs that may run at once across sessions unless `RLXVIZ_TIMING_JOBS` says otherwise."""


def _positive(env: str, default: float) -> float:
    raw = os.environ.get(env, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        return default
    return value if value > 0 else default


def timing_seconds() -> float:
    """The wall-time limit (s) on one job: `$RLXVIZ_TIMING_SECONDS` (a positive number), else 300."""
    return _positive(TIMING_SECONDS_ENV, DEFAULT_TIMING_SECONDS)


def max_jobs() -> int:
    """How many jobs may run at once: `$RLXVIZ_TIMING_JOBS` (a positive integer), else 2. Read once per process."""
    return max(1, int(_positive(TIMING_JOBS_ENV, DEFAULT_TIMING_JOBS)))


_SLOTS = JobSlots(max_jobs)
"""The timing/overlay jobs running now, across sessions (`ir.bounded.JobSlots`)."""


def _bounded(fn: Any, *args: Any, what: str) -> Any:
    """`fn(*args)` in its own child through `session.run_isolated`: killed past `timing_seconds()`, its address
    space capped from the memory budget, at most `max_jobs()` at once. Raises `StoppedError` (one line) when
    stopped, else whatever `fn` raised."""
    from ..session import Limits, isolated

    with _SLOTS.held():
        return isolated.run_isolated(fn, *args, timeout_s=None, wall_s=timing_seconds(),
                                     max_bytes=Limits.resolve().max_bytes, what=what, job=isolated.TIMING)


def _figures(trace: Any, version: int, kind: str, feeds: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray],
             device: str | None, limits: Any, time_limit_s: float) -> Any:
    """(In the child) `session.overlays.node_figures`."""
    from ..session.overlays import node_figures

    return node_figures(trace, version, kind, feeds, weights, device=device, limits=limits, time_limit_s=time_limit_s)


def time_in_worker(trace: Any, feeds: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray], *,
                   warmup: int = 2, repeat: int = 10, device: str | None = None, inputs: Any = None) -> WorkerTiming:
    """Time every version of `trace` with `session.time_versions` in a bounded child process.

    Args:
        trace: a pipeline `Trace` (pickled to the child with `feeds` and `weights`).
        feeds / weights: NumPy arrays by name.
        warmup / repeat: untimed and timed interleaved rounds, as `rlxviz time --warmup/--repeat`.
        device: `cpu`, `gpu` or None (MLX's default), as `rlxviz time --device`.
        inputs: the input sets the versions are judged on (`session.input_sets`; None: the session's default).

    Returns:
        `WorkerTiming`: the rows and the child's pid.

    Raises:
        StoppedError: past `timing_seconds()` (the child is killed), out of memory under its cap, or the child died;
            one line naming the model.
        Whatever the runtime raised in the child (MemoryError, NotImplementedError, DeviceError, ...).
    """
    what = f"timing {getattr(trace.input, 'name', '') or 'the model'}"
    return _bounded(_time, trace, dict(feeds), dict(weights), warmup, repeat, device, inputs, what=what)


def figures_in_worker(trace: Any, version: int, kind: str, feeds: Mapping[str, np.ndarray],
                      weights: Mapping[str, np.ndarray], *, device: str | None = None, limits: Any = None,
                      time_limit_s: float = 60.0) -> Any:
    """`session.overlays.node_figures` of version `version` (index into `trace.versions()`) in a bounded child
    process, as `time_in_worker`. Raises as `time_in_worker`, and `LimitError` over the memory budget."""
    return _bounded(_figures, trace, version, kind, dict(feeds), dict(weights), device, limits, time_limit_s,
                    what=f"the {kind} overlay")
