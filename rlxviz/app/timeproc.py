"""Timing graph versions in a separate worker process (no Panel import).

Why a process: the app's server runs other Python threads (its event loop, other sessions' jobs). The MLX
runtime builds every call op by op from Python and releases the GIL in `mx.eval`; each release lets a busy
Python thread hold the GIL for up to `sys.getswitchinterval()` (5 ms) before the timing thread gets it back,
so a version timed from a server thread is charged for other threads' work
(`benchmarks/bench_app_vs_cli_timing.py --cause` measures it). A child process has a GIL of its own.

The worker runs exactly what `rlxviz time` runs: `session.time_versions` (every version timed in
interleaved rounds, median, min, IQR, speed-up, where it ran), with the worker's own timing cache cleared
first so every request measures.

Example:
    >>> run = time_in_worker(trace, feeds, weights, warmup=2, repeat=10)   # doctest: +SKIP
    >>> run.rows[0].median_ms, run.rows[0].iqr_ms, run.pid                  # doctest: +SKIP
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class WorkerTiming:
    """The rows of one timing request and the process that measured them.

    Attributes:
        rows: `session.VersionTiming` per version of the trace (`trace.versions()` order).
        pid: the worker process's id (not the server's: the timing ran outside the server's GIL).
        split: on the CPU, `session.FusionAndKernels` (the input and the final version on MLX's own lowering and
            the final version on rlxviz's kernels, timed together after the versions), or why it failed (a str:
            the versions' rows stand); None on the GPU, where rlxviz's kernels do not run.
    """

    rows: list[Any]
    pid: int
    split: Any = None


def _time(trace: Any, feeds: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray], warmup: int, repeat: int,
          device: str | None, inputs: Any) -> WorkerTiming:
    """(In the worker) `session.time_versions`, measuring anew; on the CPU then `session.fusion_and_kernels` (the
    fusion's share of the speed-up apart from rlxviz's kernels') with the same rounds."""
    from ..session import lowerings, timing

    timing.TIMINGS.clear()
    extra = {} if inputs is None else {"inputs": inputs}
    rows = timing.time_versions(trace, feeds, weights, warmup=warmup, repeat=repeat, device=device, **extra)
    where = next((r.context.device for r in rows if r.context is not None), None)
    split: Any = None
    if where == "cpu":
        try:
            split = lowerings.fusion_and_kernels(trace.input, trace.final, feeds, weights, warmup=warmup,
                                                 repeat=repeat)
        except Exception as e:  # noqa: BLE001 - the versions' timing stands; the split says why it is missing
            split = f"{type(e).__name__}: {e}"
    return WorkerTiming(rows, os.getpid(), split)


_POOL: ProcessPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
_RUN_LOCK = threading.Lock()


def _pool() -> ProcessPoolExecutor:
    """The shared worker (one process, started with `spawn`: no copy of the server's threads or locks)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        return _POOL


def _figures(trace: Any, version: int, kind: str, feeds: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray],
             device: str | None, limits: Any, time_limit_s: float) -> Any:
    """(In the worker) `session.overlays.node_figures`."""
    from ..session.overlays import node_figures

    return node_figures(trace, version, kind, feeds, weights, device=device, limits=limits, time_limit_s=time_limit_s)


def shutdown() -> None:
    """Stop the worker process (the next request starts a new one)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None:
            _POOL.shutdown(wait=False, cancel_futures=True)
        _POOL = None


def time_in_worker(trace: Any, feeds: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray], *,
                   warmup: int = 2, repeat: int = 10, device: str | None = None, inputs: Any = None) -> WorkerTiming:
    """Time every version of `trace` with `session.time_versions` in the worker process.

    Requests from all sessions run one at a time (one worker): two timings at once would share the CPUs and
    slow each other down.

    Args:
        trace: a pipeline `Trace` (pickled to the worker with `feeds` and `weights`).
        feeds / weights: NumPy arrays by name.
        warmup / repeat: untimed and timed interleaved rounds, as `rlxviz time --warmup/--repeat`.
        device: `cpu`, `gpu` or None (MLX's default), as `rlxviz time --device`.
        inputs: the input sets the versions are judged on (`session.input_sets`; None: the session's default).

    Returns:
        `WorkerTiming`: the rows and the worker's pid.

    Raises:
        RuntimeError: the worker process died (e.g. killed for memory); the next request starts a new one.
        Whatever the runtime raised in the worker (MemoryError, NotImplementedError, DeviceError, ...).
    """
    with _RUN_LOCK:
        try:
            return _pool().submit(_time, trace, dict(feeds), dict(weights), warmup, repeat, device, inputs).result()
        except BrokenProcessPool:
            shutdown()
            raise RuntimeError("the timing process stopped (killed for memory?); lower batch or sequence length "
                               "and time again") from None


def figures_in_worker(trace: Any, version: int, kind: str, feeds: Mapping[str, np.ndarray],
                      weights: Mapping[str, np.ndarray], *, device: str | None = None, limits: Any = None,
                      time_limit_s: float = 60.0) -> Any:
    """`session.overlays.node_figures` of version `version` (index into `trace.versions()`) in the worker process,
    one request at a time with the timing runs (a per-node time measured beside another run would be charged for
    it). Raises as `time_in_worker`, and `LimitError` over the memory budget."""
    with _RUN_LOCK:
        try:
            return _pool().submit(_figures, trace, version, kind, dict(feeds), dict(weights), device, limits,
                                  time_limit_s).result()
        except BrokenProcessPool:
            shutdown()
            raise RuntimeError("the timing process stopped (killed for memory?); lower batch or sequence length "
                               "and try the overlay again") from None
