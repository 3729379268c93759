"""Timing every graph version of a run on MLX, each with a verdict against the NumPy reference.

One function (`time_versions`) for every front end: versions a pass left unchanged are listed with
`same_as` and not re-timed; a version is `ok` when its outputs are within `tolerance()` of the
reference of the unfused graph and finite (NaN never counts as correct). Results are cached by the
trace's content key, the inputs' digest and the run settings.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..passes import Trace
from .cache import LRUCache
from .tolerance import tolerance

TIMINGS = LRUCache(maxsize=64)
"""A run's (InterleavedTimings, diffs per timed version, reference finite) by (trace key, arrays digest, warmup,
repeat, device, precision, tolerance), shared by sessions."""

Progress = Callable[[int, int, str], None]
"""`progress(done, total, label)`: called before each version is timed."""


@dataclass
class VersionTiming:
    """One row of the per-version timing table.

    Attributes:
        index / label: position in `trace.versions()` and its label (`input`, `after fuse_sdpa`, ...).
        nodes: ops (compute nodes) in the version.
        median_ms / min_ms / iqr_ms / first_call_ms: MLX timing (ms) over interleaved rounds
            (`runtime.timing.time_versions_interleaved`), None when `same_as` is set.
        speedup: the input version's median / this version's median (interleaved medians).
        context: where it ran (`runtime.timing.TimingContext`: device, precision policy, BLAS).
        max_abs: max |MLX output - NumPy reference of the unfused graph| over all outputs (nan when either
            side holds NaN or infinities).
        ok: every output within `tolerance()` and every output, of the version and of the reference, finite.
        finite: the version's outputs and the reference outputs hold only finite values.
        same_as: index of an earlier identical version (the pass changed nothing; not re-timed).
    """

    index: int
    label: str
    nodes: int
    median_ms: float | None = None
    min_ms: float | None = None
    first_call_ms: float | None = None
    max_abs: float | None = None
    ok: bool | None = None
    same_as: int | None = None
    finite: bool = True
    iqr_ms: float | None = None
    speedup: float | None = None
    context: Any = None

    @property
    def verdict(self) -> str:
        """`unchanged`, `ok`, `outside tolerance` or `not finite`."""
        if self.same_as is not None:
            return "unchanged"
        return "ok" if self.ok else "outside tolerance" if self.finite else "not finite"


def all_finite(arrays: Iterable[np.ndarray]) -> bool:
    """True when every float array holds only finite values (integer arrays always do)."""
    return all(np.isfinite(a).all() for a in map(np.asarray, arrays) if a.dtype.kind in "fc")


def nonfinite_arrays(arrays: Mapping[str, np.ndarray]) -> list[str]:
    """Names of the float arrays holding NaN or infinities (e.g. a checkpoint's corrupted weights)."""
    return [k for k, a in arrays.items() if np.asarray(a).dtype.kind in "fc" and not np.isfinite(a).all()]


def arrays_digest(*groups: Mapping[str, np.ndarray]) -> str:
    """A content hash of named arrays (names, dtypes, shapes and bytes), for cache keys."""
    h = hashlib.sha256()
    for arrays in groups:
        for k in sorted(arrays):
            a = np.ascontiguousarray(arrays[k])
            h.update(f"{k}:{a.dtype}:{a.shape};".encode())
            h.update(a.tobytes())
    return h.hexdigest()[:24]


def time_versions(trace: Trace, feeds: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray],
                  warmup: int = 1, repeat: int = 5, progress: Progress | None = None,
                  device: str | None = None) -> list[VersionTiming]:
    """Time every distinct graph version of a run on MLX and judge it against the reference.

    The versions are timed together in interleaved rounds on one device
    (`runtime.timing.time_versions_interleaved`), so a busy machine slows them alike; `speedup` is the
    ratio of the interleaved medians.

    Args:
        trace: the pipeline run; its input graph is the reference, run once by the NumPy interpreter.
        feeds / weights: graph inputs and params by name.
        warmup: untimed rounds after the first call. repeat: timed rounds (>= 1).
        progress: told before each version is built and first run.
        device: `cpu`, `gpu` or None (the GPU when MLX has one here). The tolerance is the larger of
            `tolerance()` and the device's precision policy's (TF32 on CUDA is looser).

    Returns:
        One `VersionTiming` per version of `trace.versions()`, in order.

    Raises:
        DeviceError: the device is unknown or not available here (a ValueError, one line).
        Whatever the MLX runtime raises for a version it cannot run (NotImplementedError, MemoryError, ...).
    """
    from ..runtime import equivalence, run_reference
    from ..runtime.executor import MlxExecutor
    from ..runtime.timing import time_versions_interleaved

    ex = MlxExecutor(device=device)
    rtol, atol = tolerance()
    rtol, atol = max(rtol, ex.precision.rtol), max(atol, ex.precision.atol)
    versions = trace.versions()
    distinct = [i for i in range(len(versions)) if i == 0 or trace.steps[i - 1].changed]
    key = (trace.key, arrays_digest(feeds, weights), warmup, repeat, ex.device, ex.precision.name, rtol, atol)
    hit = TIMINGS.get(key)
    if hit is None:
        def told(j: int) -> None:
            if progress is not None:
                progress(distinct[j], len(versions), versions[distinct[j]][0])

        run = time_versions_interleaved([versions[i][1] for i in distinct], feeds, weights, rounds=repeat,
                                        warmup=warmup, executor=ex, on_version=told)
        ref = run_reference(trace.input, dict(feeds), dict(weights))
        judged = []
        for i in distinct:
            with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: reported as not finite, not warned
                judged.append(equivalence(versions[i][1], feeds, weights, reference_outputs=ref, rtol=rtol, atol=atol,
                                          executor=ex))
        hit = TIMINGS.put(key, (run, judged, all_finite(ref)))
    run, judged, ref_finite = hit
    rows: list[VersionTiming] = []
    last = 0
    for i, (label, g) in enumerate(versions):
        compute = len(g.compute_nodes())
        if i not in distinct:
            rows.append(VersionTiming(i, label, compute, same_as=last))
            continue
        j = distinct.index(i)
        t, diffs = run.timings[j], judged[j]
        max_abs = max(d.max_abs for d in diffs)
        finite = ref_finite and bool(np.isfinite(max_abs))  # |got - ref| is nan/inf exactly when a side is not finite
        rows.append(VersionTiming(i, label, compute, t.median_ms, t.min_ms, t.first_call_ms, max_abs,
                                  finite and all(d.ok for d in diffs), finite=finite, iqr_ms=t.iqr_ms,
                                  speedup=run.speedup(j), context=t.context))
        last = i
    return rows


def format_timings(rows: Sequence[VersionTiming]) -> str:
    """The timing table as aligned text (ops per version; ms; error = max abs vs the reference)."""
    w = max(len(r.label) for r in rows)
    lines = [f"{'#':>2}  {'version':<{w}}  {'ops':>5}  {'median ms':>9}  {'min ms':>8}  {'IQR ms':>7}  "
             f"{'x input':>7}  {'first ms':>8}  {'max abs err':>11}  ok"]
    for r in rows:
        if r.same_as is not None:
            lines.append(f"{r.index:>2}  {r.label:<{w}}  {r.nodes:>5}  (unchanged: same as #{r.same_as})")
            continue
        iqr = f"{r.iqr_ms:>7.2f}" if r.iqr_ms is not None else f"{'-':>7}"
        speed = f"{r.speedup:>7.2f}" if r.speedup is not None else f"{'-':>7}"
        lines.append(f"{r.index:>2}  {r.label:<{w}}  {r.nodes:>5}  {r.median_ms:>9.2f}  {r.min_ms:>8.2f}  "
                     f"{iqr}  {speed}  {r.first_call_ms:>8.1f}  {r.max_abs:>11.2e}  "
                     + ("yes" if r.ok else "NO" if r.finite else "NO (non-finite output)"))
    return "\n".join(lines)


__all__ = ["TIMINGS", "Progress", "VersionTiming", "all_finite", "arrays_digest", "format_timings",
           "nonfinite_arrays", "time_versions"]
