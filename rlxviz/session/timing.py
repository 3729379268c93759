"""Timing every graph version of a run on MLX, each with a verdict from the input battery.

One function (`time_versions`) for every front end: versions a pass left unchanged are listed with
`same_as` and not re-timed; every other version is timed in interleaved rounds and runs, in the
graph's dtype, on every input set (`input_sets`: the user's arrays and/or the battery), compared with
the float64 oracle and with the unfused graph on the same device and dtype (`runtime.compare`), with
tolerances from `runtime.tolerance.TABLE`. NaN never counts as correct. Results are cached by the
trace's content key, the inputs' digest and the run settings.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir import Graph
from ..passes import Trace
from .cache import LRUCache

TIMINGS = LRUCache(maxsize=64)
"""A run's (InterleavedTimings, Verdict per timed version) by (trace key, arrays digest, input sets, warmup,
repeat, device, precision policy), shared by sessions."""

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
        max_abs: max |MLX output - oracle (the unfused graph in float64)| over all outputs and every input
            set (nan when either side holds NaN or infinities).
        err_unfused: max |MLX output - the unfused graph on the same device in the same dtype|.
        ok: `ok` on every input set (`runtime.compare.Verdict`); NaN never counts as correct.
        status / note / broke_on: the verdict: `ok`, `fusion`, `overflow`, `precision` or `nonfinite`, one
            line saying why, and the input set that broke the version (None when ok).
        policy: the precision policy it was judged by (`runtime.tolerance.PrecisionPolicy`).
        finite: both errors are finite (no NaN or infinity on either side).
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
    err_unfused: float | None = None
    status: str | None = None
    note: str = ""
    broke_on: str | None = None
    policy: Any = None
    samples_ms: tuple[float, ...] = ()

    def quartiles(self) -> tuple[float, float]:
        """(p25, p75) of the timed rounds (ms); `(median, median)` when no samples were kept."""
        if not self.samples_ms:
            return (self.median_ms or 0.0, self.median_ms or 0.0)
        q1, q3 = np.percentile(np.asarray(self.samples_ms), [25, 75])
        return float(q1), float(q3)

    @property
    def verdict(self) -> str:
        """`unchanged`, `ok`, or why not (e.g. `fusion changed the numbers on fully_masked_row (...)`)."""
        if self.same_as is not None:
            return "unchanged"
        return "ok" if self.ok else self.note.removeprefix("NO: ")


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
                  device: str | None = None, inputs: Any = None, policy: Any = None) -> list[VersionTiming]:
    """Time every distinct graph version of a run on MLX and check it on a battery of inputs.

    The versions are timed together in interleaved rounds on one device
    (`runtime.timing.time_versions_interleaved`) on `feeds`, so a busy machine slows them alike;
    `speedup` is the ratio of the interleaved medians. Each is then run, in the graph's dtype, on every
    input set and compared twice (`runtime.compare`): with the oracle (the unfused graph in float64)
    and with the unfused graph on the same device and dtype.

    Args:
        trace: the pipeline run; its input graph is the unfused baseline.
        feeds / weights: graph inputs (timed, and the base of the battery) and params by name.
        warmup: untimed rounds after the first call (0..MAX_WARMUP). repeat: timed rounds (1..MAX_REPEAT).
        progress: told before each version is built and first run.
        device: `cpu`, `gpu` or None (the GPU when MLX has one here).
        inputs: the input sets to check (`runtime.battery.Battery` or a list of `InputSet`); default
            `input_sets(trace.input, feeds)`: the whole battery that applies.
        policy: `runtime.tolerance.PrecisionPolicy`; default: the graph's dtype on that device
            (`precision_policy`, TF32 on CUDA included).

    Returns:
        One `VersionTiming` per version of `trace.versions()`, in order.

    Raises:
        SessionError: `repeat` or `warmup` outside its bound (`defaults.check_rounds`).
        DeviceError: the device is unknown or not available here (a ValueError, one line).
        Whatever the MLX runtime raises for a version it cannot run (NotImplementedError, MemoryError, ...).
    """
    from ..runtime.compare import attribute_changes, baselines, check_version
    from ..runtime.executor import MlxExecutor
    from ..runtime.timing import time_versions_interleaved
    from .defaults import check_rounds
    from .tolerance import precision_policy

    check_rounds(repeat, warmup)
    ex = MlxExecutor(device=device)
    sets = input_sets(trace.input, feeds) if inputs is None else inputs
    items = tuple(sets.sets if hasattr(sets, "sets") else sets)
    policy = policy or precision_policy(trace.input, ex)
    versions = trace.versions()
    distinct = [i for i in range(len(versions)) if i == 0 or trace.steps[i - 1].changed]
    data = arrays_digest(feeds, weights, *(s.feeds for s in items))
    key = (trace.key, data, tuple(s.name for s in items), warmup, repeat, ex.device, policy)
    hit = TIMINGS.get(key)
    if hit is None:
        def told(j: int) -> None:
            if progress is not None:
                progress(distinct[j], len(versions), versions[distinct[j]][0])

        run = time_versions_interleaved([versions[i][1] for i in distinct], feeds, weights, rounds=repeat,
                                        warmup=warmup, executor=ex, on_version=told)
        runner = ex.run
        bases = baselines(trace.input, items, weights, runner)
        judged = attribute_changes([versions[i][0] for i in distinct],
                                   [check_version(versions[i][1], bases, weights, policy, runner) for i in distinct])
        hit = TIMINGS.put(key, (run, judged))
    run, judged = hit
    rows: list[VersionTiming] = []
    last = 0
    for i, (label, g) in enumerate(versions):
        compute = len(g.compute_nodes())
        if i not in distinct:
            rows.append(VersionTiming(i, label, compute, same_as=last))
            continue
        j = distinct.index(i)
        t, v = run.timings[j], judged[j]
        finite = bool(np.isfinite(v.err_oracle) and np.isfinite(v.err_unfused))
        rows.append(VersionTiming(i, label, compute, t.median_ms, t.min_ms, t.first_call_ms, v.err_oracle, v.ok,
                                  finite=finite, iqr_ms=t.iqr_ms, speedup=run.speedup(j), context=t.context,
                                  err_unfused=v.err_unfused, status=v.status, note=v.note, broke_on=v.broke_on,
                                  policy=policy, samples_ms=tuple(t.samples_ms)))
        last = i
    return rows


def input_sets(graph: Graph, feeds: Mapping[str, np.ndarray], user: Any = None, battery: bool = True) -> Any:
    """The input sets a check runs: the user's arrays first (an `InputSet`, see `runtime.battery.load_inputs`),
    then the battery derived from `feeds` (`runtime.battery.battery`; only `random` with `battery=False`)."""
    from ..runtime.battery import Battery
    from ..runtime.battery import battery as make

    sets = make(graph, feeds) if battery else make(graph, feeds, kinds=("random",))
    if user is None:
        return sets
    rest = tuple(s for s in sets.sets if s.name != "random") if battery else ()
    return Battery((user, *rest), sets.skipped if battery else ())


def format_timings(rows: Sequence[VersionTiming]) -> str:
    """The timing table as aligned text (ops per version; ms; max abs error vs the oracle and vs the
    unfused graph on MLX; the verdict, naming the input set that broke a version)."""
    w = max(len(r.label) for r in rows)
    lines = [f"{'#':>2}  {'version':<{w}}  {'ops':>5}  {'median ms':>9}  {'min ms':>8}  {'IQR ms':>7}  "
             f"{'x input':>7}  {'first ms':>8}  {'vs oracle':>9}  {'vs unfused':>10}  ok"]
    for r in rows:
        if r.same_as is not None:
            lines.append(f"{r.index:>2}  {r.label:<{w}}  {r.nodes:>5}  (unchanged: same as #{r.same_as})")
            continue
        iqr = f"{r.iqr_ms:>7.2f}" if r.iqr_ms is not None else f"{'-':>7}"
        speed = f"{r.speedup:>7.2f}" if r.speedup is not None else f"{'-':>7}"
        lines.append(f"{r.index:>2}  {r.label:<{w}}  {r.nodes:>5}  {r.median_ms:>9.2f}  {r.min_ms:>8.2f}  "
                     f"{iqr}  {speed}  {r.first_call_ms:>8.1f}  {r.max_abs:>9.2e}  {r.err_unfused:>10.2e}  {r.note}")
    return "\n".join(lines)


def compare_to_input(row: VersionTiming, base: VersionTiming) -> str:
    """Read one timed version against the input version, in words (for a table read aloud).

    `within noise` when the two interquartile ranges (p25..p75 of the interleaved rounds) overlap: the
    middle halves of the two samples share values, so the rounds do not separate the versions; otherwise
    `N.NNx faster` / `N.NNx slower` (ratio of the medians).

    Raises:
        ValueError: either row was not timed (`same_as` set).
    """
    if row.median_ms is None or base.median_ms is None:
        raise ValueError(f"version {row.index if row.median_ms is None else base.index} was not timed")
    lo, hi = base.quartiles()
    rlo, rhi = row.quartiles()
    if rlo <= hi and lo <= rhi:
        return "within noise"
    ratio = base.median_ms / row.median_ms
    return f"{ratio:.2f}x faster" if ratio > 1 else f"{1 / ratio:.2f}x slower"


__all__ = ["TIMINGS", "Progress", "VersionTiming", "all_finite", "arrays_digest", "compare_to_input", "format_timings",
           "input_sets",
           "nonfinite_arrays", "time_versions"]
