"""One graph version under several MLX lowerings, timed in paired rounds (is a lowering choice worth it?).

`session.time_versions` compares graph versions under one lowering; this compares **lowerings** of one
graph (e.g. the CPU's default against `mx.compile` of each FusedTransformerLayer, or of the whole graph),
with the same statistics: interleaved rounds kept in order, so `session.paired_verdict` /
`compare_versions` read them (median per-round ratio, bootstrap interval, "within noise").
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir import Graph
from .program import ProgramPrimitives
from .timing import VersionTiming


@dataclass(frozen=True)
class Lowering:
    """One way to run a graph on MLX: lowering options and whether the whole graph is `mx.compile`d.

    Attributes:
        label: the row's name in a timing table.
        options: `runtime.lowering.LoweringOptions` (None: the device's choice).
        compile_graph: wrap the whole graph in `mx.compile` (`runtime.executor.MlxExecutor`).
    """

    label: str
    options: Any = None
    compile_graph: bool = False


def time_lowerings(graph: Graph, feeds: Mapping[str, Any], weights: Mapping[str, Any] | None,
                   lowerings: Sequence[Lowering], warmup: int = 1, repeat: int = 21,
                   device: str = "cpu") -> tuple[list[VersionTiming], list[ProgramPrimitives]]:
    """Time `graph` under each lowering in interleaved rounds (round k calls every lowering once, the
    starting one rotating) and read each lowering's MLX program.

    Args:
        graph: one graph version. feeds / weights: its inputs and params (NumPy or MLX arrays) by name.
        lowerings: at least one; the first is the baseline of `err_unfused` and `speedup`.
        warmup: untimed rounds (0..MAX_WARMUP). repeat: timed rounds (1..MAX_REPEAT; a verdict needs 21).
        device: `cpu` or `gpu`.

    Returns:
        `(rows, programs)`: one `VersionTiming` per lowering (`index` its position, `err_unfused` the largest
        |output - the first lowering's output|, `samples_ms` in round order) and its `ProgramPrimitives`
        (MLX's primitives of one call; `bytes` not read).

    Raises:
        SessionError: `repeat` or `warmup` outside its bound; ValueError: no lowerings.
        DeviceError: unknown device or no GPU here. KeyError / ValueError: as `MlxExecutor.bind`.
    """
    from ..runtime.executor import MlxExecutor
    from ..runtime.mlx_backend import mx
    from ..runtime.timing import summarize, timing_context
    from .defaults import check_rounds
    from .program import mlx_primitives

    check_rounds(repeat, warmup)
    if not lowerings:
        raise ValueError("[time_lowerings] give at least one lowering")
    built = []
    for lw in lowerings:
        ex = MlxExecutor(lw.options, lw.compile_graph, device)
        prog, args = ex.bind(graph, feeds, weights)
        mx.eval(args)
        t = time.perf_counter()
        outs = prog.fn(*args)
        mx.eval(outs)
        built.append((ex, prog, args, time.perf_counter() - t, [np.array(o.astype(mx.float32)) for o in outs]))
    for _ in range(warmup):
        for _ex, prog, args, *_ in built:
            mx.eval(prog.fn(*args))
    samples: list[list[float]] = [[] for _ in built]
    n = len(built)
    for k in range(repeat):
        for j in range(n):
            i = (j + k) % n
            _ex, prog, args, *_ = built[i]
            t = time.perf_counter()
            mx.eval(prog.fn(*args))
            samples[i].append(time.perf_counter() - t)
    base_out = built[0][4]
    rows, programs = [], []
    nodes = len(graph.compute_nodes())
    base_median = None
    for i, (lw, (ex, _prog, _args, first, outs), s) in enumerate(zip(lowerings, built, samples, strict=True)):
        t = summarize(s, first, timing_context(ex))
        base_median = base_median or t.median_ms
        err = max((float(np.abs(a - b).max()) for a, b in zip(outs, base_out, strict=True)), default=0.0)
        rows.append(VersionTiming(i, lw.label, nodes, t.median_ms, t.min_ms, t.first_call_ms, iqr_ms=t.iqr_ms,
                                  speedup=base_median / t.median_ms, context=t.context, err_unfused=err,
                                  samples_ms=t.samples_ms))
        programs.append(mlx_primitives(graph, feeds, weights, executor=ex, bytes=False))
    return rows, programs


__all__ = ["Lowering", "time_lowerings"]
