"""Timing and numerical equivalence of graph versions on MLX.

`time_version` forces `mx.eval` inside the timed loop (MLX is lazy: without it only graph
construction would be timed) and reports the first call — which builds the program, traces it
and, with `compile_graph`, compiles it — separately from the steady state.
`time_versions_interleaved` times several versions in interleaved rounds (each round calls every
version once, in a rotated order), so a load spike from other processes hits all versions alike;
speed-ups are ratios of the interleaved medians. Every `Timing` records where it ran
(`TimingContext`: device, float32 precision policy, BLAS, MLX version).
`equivalence` compares a version's MLX outputs to the NumPy reference of the unfused graph.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir import Graph
from ..kernels.blas import active_blas
from ..kernels.mlx_backend import mx
from .executor import MlxExecutor, default_executor
from .lowering import LoweringOptions
from .reference import run_reference


@dataclass(frozen=True)
class TimingContext:
    """Where a timing was taken.

    Attributes:
        device: `cpu` or `gpu`.
        precision: float32 matmul policy, `f32` or `tf32` (`precision.PrecisionPolicy.matmuls`).
        blas: the CBLAS MLX's CPU matmul calls (`blas.BlasRecord`), with its thread count.
        mlx: MLX version.
        cpu_streams: CPU streams the row-parallel kernels use (1 = off).
        kernels: which of rlxviz's own CPU kernels ran (`kernels_line`); "" where they do not apply (GPU).
    """

    device: str
    precision: str
    blas: str
    mlx: str
    cpu_streams: int
    kernels: str = ""

    def __str__(self) -> str:
        return (f"MLX {self.mlx} on {self.device}, {self.precision} matmuls, BLAS {self.blas}, "
                f"{self.cpu_streams} CPU stream{'s' if self.cpu_streams != 1 else ''}"
                + (f"; {self.kernels}" if self.kernels else ""))


def kernels_line(executor: MlxExecutor) -> str:
    """One line for a timing header: rlxviz's CPU kernels' status and the ones this executor ran, e.g.
    `rlxviz CPU kernels: cached (avx512, 2 threads), ran attention, bias+gelu`; "" on the GPU."""
    if executor.device != "cpu":
        return ""
    from .. import kernels

    if not executor.options.kernels:
        return "rlxviz CPU kernels: off (lowering option kernels=False); fused ops run MLX's composed lowering"
    st = kernels.status()
    ran = sorted(executor.emitter.kernels_ran)
    if not st.available:
        return str(st)
    return f"{st}, ran {', '.join(ran)}" if ran else f"{st}, none ran (no fused op they take)"


def timing_context(executor: MlxExecutor) -> TimingContext:
    """The `TimingContext` of runs on `executor`."""
    return TimingContext(executor.device, executor.precision.matmuls, str(active_blas() or "unknown"), mx.__version__,
                         executor.options.cpu_streams or 1, kernels_line(executor))


@dataclass(frozen=True)
class Timing:
    """Wall-clock timing of one graph version, in milliseconds.

    Attributes:
        median_ms / min_ms: over `repeat` timed calls (each ends with `mx.eval` of all outputs).
        iqr_ms: interquartile range (p75 - p25) of the timed calls.
        first_call_ms: the first call on a fresh program (program build + trace + compile + run).
        samples_ms: every timed call, in the order the calls ran (round k of interleaved versions is
            element k of each: `session.paired_verdict` pairs them by position, so they are never sorted).
        context: device, precision policy and BLAS of the run (None when not recorded).
    """

    median_ms: float
    min_ms: float
    iqr_ms: float
    first_call_ms: float
    samples_ms: tuple[float, ...] = field(repr=False, default=())
    context: TimingContext | None = None

    def __str__(self) -> str:
        return (f"median {self.median_ms:.2f} ms (min {self.min_ms:.2f}, IQR {self.iqr_ms:.2f}), "
                f"first call {self.first_call_ms:.1f} ms")


def summarize(samples_s: Sequence[float], first_s: float, context: TimingContext | None = None) -> Timing:
    """A `Timing` from per-call seconds (at least one, in call order) and the first call's seconds;
    `samples_ms` keeps the call order (the rounds stay paired across interleaved versions). The IQR is p75 - p25
    interpolated linearly (`method="inclusive"`, NumPy's `percentile` default): the quartiles the timing table and
    its whiskers show (`session.timing.VersionTiming.quartiles`), so the busy rule reads the span shown beside it (the
    exclusive method made 3 rounds' IQR their whole range, twice the p25..p75 shown)."""
    ms = [s * 1e3 for s in samples_s]
    q = statistics.quantiles(ms, n=4, method="inclusive") if len(ms) >= 2 else [ms[0], ms[0], ms[0]]
    return Timing(statistics.median(ms), min(ms), q[2] - q[0], first_s * 1e3, tuple(ms), context)


def _fresh(ex: MlxExecutor, graph: Graph, feeds_mx: Mapping[str, Any], weights: Mapping[str, Any] | None
           ) -> tuple[Any, list[Any], float]:
    """Drop `graph`'s cached program and static values, then build, bind and run it once:
    `(program, args, seconds of that first call)`. A static value another version already made from the same
    weights (`runtime.static_share`: a weight concatenation) is reused, not made again, so it is not in that time."""
    key = (ex.key_of(graph), ex.options, ex.compile_graph)
    ex._programs.pop(key, None)  # fresh program: first call pays build + trace + compile + static part
    ex._static.pop((key[0], ex.options), None)
    t = time.perf_counter()
    prog, args = ex.bind(graph, feeds_mx, weights)
    mx.eval(prog.fn(*args))
    return prog, args, time.perf_counter() - t


def _feeds_mx(feeds: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v if isinstance(v, mx.array) else mx.array(np.asarray(v)) for k, v in feeds.items()}
    mx.eval(list(out.values()))
    return out


def time_version(graph: Graph, feeds: Mapping[str, Any], weights: Mapping[str, Any] | None = None,
                 warmup: int = 3, repeat: int = 20, executor: MlxExecutor | None = None) -> Timing:
    """Time running `graph` on MLX.

    Args:
        graph: any graph version (fused or not).
        feeds / weights: NumPy or MLX arrays by name; converted once, outside the timed loop.
        warmup: untimed calls after the first call.
        repeat: timed calls.
        executor: defaults to `default_executor()`; its program cache entry for `graph` is
            dropped first so the first call includes the build and compile cost.

    Returns:
        `Timing` (median/min/IQR of the timed calls, first-call cost separately).
    """
    ex = executor or default_executor()
    prog, args, first = _fresh(ex, graph, _feeds_mx(feeds), weights)
    for _ in range(warmup):
        mx.eval(prog.fn(*args))
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        mx.eval(prog.fn(*args))
        samples.append(time.perf_counter() - t)
    return summarize(samples, first, timing_context(ex))


@dataclass(frozen=True)
class InterleavedTimings:
    """Versions timed in interleaved rounds on one executor.

    Attributes:
        timings: one `Timing` per version, in the order given (median/min/IQR over the rounds).
        rounds: timed rounds; each round called every version once.
        context: device, precision policy, BLAS of the run.
    """

    timings: tuple[Timing, ...]
    rounds: int
    context: TimingContext

    def speedup(self, i: int, base: int = 0) -> float:
        """How many times faster version `i` is than version `base`: ratio of the interleaved medians."""
        return self.timings[base].median_ms / self.timings[i].median_ms


def time_versions_interleaved(graphs: Sequence[Graph], feeds: Mapping[str, Any],
                              weights: Mapping[str, Any] | None = None, rounds: int = 10, warmup: int = 1,
                              device: str | None = None, options: LoweringOptions | None = None,
                              executor: MlxExecutor | None = None,
                              on_version: Callable[[int], None] | None = None,
                              extra: Sequence[tuple[Graph, MlxExecutor]] = ()) -> InterleavedTimings:
    """Time graph versions in interleaved rounds on one device.

    Each version is first built and run once (its first-call cost), then `warmup` untimed rounds,
    then `rounds` timed rounds; round k calls version `(j + k) % n` at step j, so every version sees
    the same share of a busy machine and of every position in the round. Use
    `InterleavedTimings.speedup` (ratio of the interleaved medians) for speed-ups.

    Args:
        graphs: versions of one model (same inputs and params).
        feeds / weights: NumPy or MLX arrays by name, converted once outside the timed calls.
        rounds: timed rounds (>= 1). warmup: untimed rounds (>= 0).
        device: `cpu` / `gpu` / None (the GPU when present); ignored when `executor` is given.
        options: lowering options for a new executor (None: the device's choice).
        executor: run on this executor instead of a new one.
        on_version: called with a version's index before it is built and first run (progress).
        extra: more (graph, executor) pairs timed in the same rounds, each on its own executor (e.g. the final
            version on MLX's own lowering beside the versions on rlxviz's kernels); their `Timing`s follow the
            versions' in `timings`, each with its own executor's context. The rotation covers them too.

    Raises:
        ValueError: `rounds < 1`, `warmup < 0` or no graphs.
        DeviceError: the device is unknown or not available here.
    """
    if rounds < 1 or warmup < 0 or not graphs:
        raise ValueError(f"need rounds >= 1, warmup >= 0 and at least one graph, got rounds={rounds}, "
                         f"warmup={warmup}, {len(graphs)} graphs")
    ex = executor or MlxExecutor(options, device=device)
    feeds_mx = _feeds_mx(feeds)
    built = []
    for j, g in enumerate(graphs):
        if on_version is not None:
            on_version(j)
        built.append(_fresh(ex, g, feeds_mx, weights))
    built += [_fresh(other, g, feeds_mx, weights) for g, other in extra]
    n = len(built)
    for _ in range(warmup):
        for prog, args, _first in built:
            mx.eval(prog.fn(*args))
    samples: list[list[float]] = [[] for _ in built]
    for k in range(rounds):
        for j in range(n):
            i = (j + k) % n
            prog, args, _first = built[i]
            t = time.perf_counter()
            mx.eval(prog.fn(*args))
            samples[i].append(time.perf_counter() - t)
    ctx = timing_context(ex)
    contexts = [ctx] * len(graphs) + [timing_context(other) for _, other in extra]
    return InterleavedTimings(tuple(summarize(s, b[2], c) for s, b, c in zip(samples, built, contexts, strict=True)),
                              rounds, ctx)


@dataclass(frozen=True)
class OutputDiff:
    """How far one output is from the reference.

    Attributes:
        max_abs: max |mlx - ref|.
        max_rel: max |mlx - ref| / max(|ref|, atol) (relative error, guarded near zero).
        ok: the shapes agree, both sides are finite (NaN or inf never counts as a match), and
            `np.allclose(mlx, ref, rtol, atol)`.
    """

    index: int
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float
    ok: bool


def diff(got: np.ndarray, ref: np.ndarray, index: int = 0, rtol: float = 1e-4, atol: float = 1e-5) -> OutputDiff:
    """Compare one output array with its reference (float64 arithmetic)."""
    if got.shape != ref.shape:
        return OutputDiff(index, tuple(ref.shape), float("inf"), float("inf"), False)
    g, r = got.astype(np.float64), ref.astype(np.float64)
    err = np.abs(g - r)
    max_abs = float(err.max()) if err.size else 0.0
    max_rel = float((err / np.maximum(np.abs(r), atol)).max()) if err.size else 0.0
    finite = bool(np.isfinite(g).all() and np.isfinite(r).all())
    ok = finite and bool(np.allclose(g, r, rtol=rtol, atol=atol))
    if not finite:
        max_abs = max_rel = float("nan")
    return OutputDiff(index, tuple(ref.shape), max_abs, max_rel, ok)


def equivalence(version: Graph, feeds: Mapping[str, Any], weights: Mapping[str, Any] | None = None,
                reference_graph: Graph | None = None, rtol: float = 1e-4, atol: float = 1e-5,
                executor: MlxExecutor | None = None,
                reference_outputs: Sequence[np.ndarray] | None = None) -> list[OutputDiff]:
    """Compare `version` run on MLX with the NumPy reference of `reference_graph` (the unfused graph).

    Args:
        version: the graph version to check.
        reference_graph: the unfused graph (default: `version` itself, run by the reference).
        reference_outputs: precomputed reference outputs (skips running the reference).
        rtol / atol: tolerance for `OutputDiff.ok`.

    Returns:
        One `OutputDiff` per graph output (max abs and max rel error).

    Raises:
        ValueError: the versions have different numbers of outputs.
    """
    feeds_np = {k: np.asarray(v) for k, v in feeds.items()}
    if reference_outputs is None:
        reference_outputs = run_reference(reference_graph or version, feeds_np, weights)
    got = (executor or default_executor()).run(version, feeds_np, weights)
    if len(got) != len(reference_outputs):
        raise ValueError(f"version has {len(got)} outputs, reference has {len(reference_outputs)}")
    return [diff(g, r, i, rtol, atol) for i, (g, r) in enumerate(zip(got, reference_outputs, strict=True))]
