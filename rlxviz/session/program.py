"""What the backend runs, read from the backend: MLX's own primitives of a graph version's lowered program.

A graph version is lowered (`runtime.executor.MlxExecutor.bind`: the per-call part of the program, its
arguments evaluated first) and called once without evaluating; the lazy output arrays' graph is what MLX
will execute. `mx.export_to_dot` writes that graph (one `rectangle` node per primitive, in MLX's own
order), and its primitive names are read back here. A `mx.compile`d function appears as one primitive
named `Compiled...` (one kernel for the fused elementwise chain); a `mx.fast` op that falls back on a
device (e.g. `mx.fast.layer_norm` on the CPU in MLX 0.32) appears as the primitives of its fallback.
Nothing here is a table of assumptions: a different MLX version or device gives a different list.
"""

from __future__ import annotations

import io
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..ir import Graph
from ..passes.trace import Trace

VIEWS = frozenset({"Broadcast", "BroadcastAxes", "Reshape", "Transpose", "ExpandDims", "Squeeze", "Slice",
                   "AsStrided", "Split", "Flatten", "Unflatten", "StopGradient", "Depends"})
"""Primitives that MLX evaluates as a view of their input when the layout allows it (no kernel, no bytes);
a later kernel that needs a contiguous copy still pays for it (`Copy` / `Contiguous` are counted as kernels)."""

_PRIMITIVE = re.compile(r'\[label ="([^"]+)", shape=rectangle\]')


@dataclass(frozen=True)
class ProgramPrimitives:
    """The primitives MLX runs for one call of one graph version.

    Attributes:
        device: `cpu` or `gpu` (where the program was lowered).
        primitives: every primitive name, in MLX's topological order (`mx.export_to_dot`).
    """

    device: str
    primitives: tuple[str, ...]

    @property
    def count(self) -> int:
        """Primitives in the program (views included)."""
        return len(self.primitives)

    @property
    def kernels(self) -> int:
        """Primitives that are not views (`VIEWS`): an upper bound on the kernels launched per call."""
        return sum(1 for p in self.primitives if p not in VIEWS)

    @property
    def compiled(self) -> int:
        """Primitives that are one `mx.compile`d kernel (`Compiled...`)."""
        return sum(1 for p in self.primitives if p.startswith("Compiled"))

    def counts(self) -> dict[str, int]:
        """Primitive name -> how many, most frequent first."""
        return dict(Counter(self.primitives).most_common())

    def __str__(self) -> str:
        top = ", ".join(f"{k} x{v}" for k, v in list(self.counts().items())[:6])
        return f"{self.count} MLX primitives on {self.device} ({self.kernels} not views): {top}"


def dot_primitives(dot: str) -> tuple[str, ...]:
    """Primitive names from the text `mx.export_to_dot` writes (one per `shape=rectangle` node, in order)."""
    return tuple(_PRIMITIVE.findall(dot))


def mlx_primitives(graph: Graph, feeds: Mapping[str, Any], weights: Mapping[str, Any] | None = None,
                   device: str = "cpu", executor: Any = None) -> ProgramPrimitives:
    """MLX's primitives for one call of `graph`, read from the lazy graph of its lowered program.

    Args:
        graph: a graph version (fused ops are lowered as `runtime.lowering` lowers them on `device`).
        feeds / weights: NumPy or MLX arrays by name (their values do not change the list; their shapes do).
        device: `cpu` or `gpu`; ignored when `executor` is given.
        executor: a `runtime.executor.MlxExecutor` to lower with (its programs and weights are cached).

    Raises:
        DeviceError: the device is unknown or not available here.
        KeyError / ValueError: a missing input or param, or a shape that differs from the graph's.
    """
    import mlx.core as mx

    from ..runtime.executor import MlxExecutor

    ex = executor or MlxExecutor(device=device)
    prog, args = ex.bind(graph, feeds, weights)
    mx.eval(args)  # the arguments' own conversions (dtype casts) are not part of a call
    outs = prog.fn(*args)
    buf = io.StringIO()
    mx.export_to_dot(buf, *outs)
    return ProgramPrimitives(ex.device, dot_primitives(buf.getvalue()))


@dataclass(frozen=True)
class VersionPrimitives:
    """One row per graph version: its label, graph ops (compute nodes) and the MLX program's primitives."""

    index: int
    label: str
    ops: int
    program: ProgramPrimitives


def version_primitives(trace: Trace, feeds: Mapping[str, Any], weights: Mapping[str, Any] | None = None,
                       device: str = "cpu") -> list[VersionPrimitives]:
    """`mlx_primitives` of every version of `trace` (version 0: its input), on one executor.

    Raises:
        As `mlx_primitives`.
    """
    from ..runtime.executor import MlxExecutor

    ex = MlxExecutor(device=device)
    return [VersionPrimitives(i, label, len(g.compute_nodes()), mlx_primitives(g, feeds, weights, executor=ex))
            for i, (label, g) in enumerate(trace.versions())]


def format_primitives(rows: list[VersionPrimitives]) -> str:
    """The per-version table as aligned text: graph ops, MLX primitives, non-view primitives, compiled kernels."""
    w = max(len(r.label) for r in rows)
    lines = [f"{'#':>2}  {'version':<{w}}  {'graph ops':>9}  {'MLX prims':>9}  {'not views':>9}  {'compiled':>8}"]
    for r in rows:
        p = r.program
        lines.append(f"{r.index:>2}  {r.label:<{w}}  {r.ops:>9}  {p.count:>9}  {p.kernels:>9}  {p.compiled:>8}")
    return "\n".join(lines)


__all__ = ["VIEWS", "ProgramPrimitives", "VersionPrimitives", "dot_primitives", "format_primitives",
           "mlx_primitives", "version_primitives"]
