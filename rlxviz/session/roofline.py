"""FLOPs, bytes moved and arithmetic intensity, per op and per graph version (the roofline's two axes).

Conventions (the same as `traffic`): every compute node's output is written once and read once per
operand use; the static part of a program (nodes that read only params and constants, e.g. a Q|K|V weight
`concat`, computed once per set of weights by `runtime.executor.build_program`) is not per-call traffic.
FLOPs count multiply-adds as 2 (a matmul `[M, K] x [K, N]` is `2*M*K*N`), every arithmetic elementwise op
as 1 per output element, a transcendental as the arithmetic of the formulation the CPU lowering runs
(`TRANSCENDENTAL_FLOPS`, counted from `runtime.fast`: erf 25, so exact GELU 29 per element), a reduction
as 1 per input element, `softmax` as its exp plus 4, `layer_norm` / `rms_norm` as 8 / 6 per element,
data movement as 0; a fused op counts its decomposition (`unfuse`). These counts are a **model** of the
arithmetic (MLX's GPU `mx.erf` is another formulation of about the same size), not a hardware counter.
FLOPs are counted on each version's decomposition: a fusion changes none (canonicalizing a primitive norm into
`layer_norm` or removing dead code may, slightly). A version's bytes are **read from MLX** when `roofline`
is given the inputs: the bytes of the program MLX runs for one call (`program.ProgramBytes`: each kernel's
distinct inputs read once and outputs written once, from MLX's graph, plus CPU AddMM's modelled bias
pre-fill); without inputs they are a **model**, the input's bytes minus what each pass saves in the program
MLX's own lowering executes (`executed_traffic_saved`, `shared_input_saved`; rlxviz's CPU kernels not modelled).
`machine_ridge` measures where this machine's roofline bends.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..ir import Graph, Node, Op
from ..ir.ops import ELEMENTWISE, ERF_FLOPS, EXP_FLOPS, FUSED, SPECS, TANH_FLOPS, op_flops_per
from ..passes.trace import Trace
from .traffic import executed_traffic_saved, shared_input_saved

TRANSCENDENTAL_FLOPS: dict[Op, int] = {op: s.flops for op, s in SPECS.items()
                                      if op in ELEMENTWISE and isinstance(s.flops, int) and s.flops > 1}
"""FLOPs per output element of the transcendental ops, counted from the CPU formulation (`runtime.fast`); derived
from `ir.ops.SPECS` (`OpSpec.flops`)."""


def op_flops(graph: Graph, node: Node) -> int:
    """FLOPs of one primitive node (conventions in the module docstring; `OpSpec.flops`). Fused ops: see
    `graph_flops`.

    Raises:
        ValueError: a fused op (count its decomposition with `graph_flops`).
    """
    return op_flops_per(graph, node)


def _static(graph: Graph) -> set[int]:
    """Nodes computed once per set of weights (params, constants and nodes reading only those)."""
    static: set[int] = set()
    for n in graph:
        if n.op in (Op.PARAM, Op.CONST) or (n.op != Op.INPUT and n.inputs and all(i in static for i in n.inputs)):
            static.add(n.id)
    return static


def graph_flops(graph: Graph) -> int:
    """FLOPs of one call of `graph` (fused ops counted through their decomposition; static nodes excluded)."""
    if any(n.op in FUSED for n in graph):
        from ..passes import run_pass

        graph = run_pass(graph, "unfuse")
    static = _static(graph)
    return sum(op_flops(graph, n) for n in graph.compute_nodes() if n.id not in static)


@dataclass(frozen=True)
class OpCost:
    """One node's roofline point: `flops`, `bytes` (its output written once plus every operand read once)."""

    node: int
    op: str
    flops: int
    bytes: int

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.bytes if self.bytes else 0.0


def op_costs(graph: Graph) -> list[OpCost]:
    """Per compute node of a primitive graph, in graph order (static nodes excluded)."""
    static = _static(graph)
    return [OpCost(n.id, n.op.value, op_flops(graph, n), n.nbytes + sum(graph[i].nbytes for i in n.inputs))
            for n in graph.compute_nodes() if n.id not in static]


def program_bytes(graph: Graph) -> int:
    """Bytes one call of a primitive `graph` writes and reads (module conventions)."""
    return sum(c.bytes for c in op_costs(graph))


@dataclass(frozen=True)
class VersionRoofline:
    """One graph version: `flops` per call, bytes moved by the program MLX runs on `device` (`bytes`) and by
    one ideal kernel per fused op (`ideal_bytes`, a model); `bytes_source` says where `bytes` came from:
    `MLX's graph` (read from the lowered program, `program.ProgramBytes.total`) or `model` (`traffic`)."""

    index: int
    label: str
    flops: int
    bytes: int
    ideal_bytes: int
    bytes_source: str = "model"

    @property
    def intensity(self) -> float:
        """FLOPs per byte of the executed program."""
        return self.flops / self.bytes

    @property
    def ideal_intensity(self) -> float:
        return self.flops / self.ideal_bytes


def roofline(trace: Trace, device: str = "cpu", feeds: Mapping[str, Any] | None = None,
             weights: Mapping[str, Any] | None = None) -> list[VersionRoofline]:
    """FLOPs, bytes and intensity of every version of `trace` (version 0 is its input, a primitive graph).

    Args:
        trace: a pipeline run from an unfused graph.
        device: `cpu` or `gpu`.
        feeds / weights: the inputs and params by name (NumPy or MLX arrays). Given, each version's `bytes`
            is read from the program MLX runs (`program.version_primitives`); omitted, it is the model.

    Raises:
        ValueError: unknown device; a fused op in the input graph (start from the unfused model).
        DeviceError / KeyError: as `program.mlx_primitives` (only when `feeds` is given).
    """
    rows = _model_roofline(trace, device)
    if feeds is None:
        return rows
    from .program import version_primitives

    read = version_primitives(trace, feeds, weights, device)
    return [replace(r, bytes=p.program.bytes.total if p.program.bytes else r.bytes, bytes_source="MLX's graph")
            for r, p in zip(rows, read, strict=True)]


def _model_roofline(trace: Trace, device: str) -> list[VersionRoofline]:
    if any(n.op in FUSED for n in trace.input):
        raise ValueError("[roofline] the run's input graph has fused ops: start from the unfused model")
    flops, base = graph_flops(trace.input), program_bytes(trace.input)
    rows = [VersionRoofline(0, "input", flops, base, base)]
    executed = ideal = base
    for k, (step, name) in enumerate(zip(trace.steps, trace.step_names(), strict=True), 1):
        if step.matches and not step.error:
            saved = executed_traffic_saved(step, device)
            reads, _ = shared_input_saved(step)
            executed -= saved.total + reads
            ideal -= saved.ideal.total + reads
        if step.after is not step.before:
            flops = graph_flops(step.after)
        rows.append(VersionRoofline(k, f"after {name}", flops, executed, ideal))
    return rows


@dataclass(frozen=True)
class Ridge:
    """This machine's roofline, measured with the product's timing (`runtime.timing.time_version`).

    Attributes:
        device: `cpu` or `gpu`.
        gflops: FLOP/s of a `[n, n] x [n, n]` f32 matmul graph, in 1e9 per second (median call).
        gbps: bytes/s of an f32 `add` of two `elements`-long vectors (2 reads + 1 write), in 1e9 per second.
            On the CPU MLX runs an elementwise op on **one thread**: this is the bandwidth one MLX CPU kernel
            gets, not the memory system's peak (a multi-threaded stream would reach more).
        matmul_ms / add_ms: the two medians.
    """

    device: str
    gflops: float
    gbps: float
    matmul_ms: float
    add_ms: float

    @property
    def ridge(self) -> float:
        """FLOP per byte where the roofline bends: below it a kernel is bound by memory, above it by compute."""
        return self.gflops / self.gbps


def machine_ridge(device: str = "cpu", n: int = 1024, elements: int = 1 << 23, repeat: int = 7) -> Ridge:
    """Measure peak-ish matmul FLOP/s and streaming bandwidth on MLX (`device`); a rough ridge point.

    The add moves `3 * 4 * elements` bytes (96 MiB at the default, beyond the caches of common CPUs). One
    median of `repeat` calls each: noisy on a busy machine, as every timing is.

    Raises:
        DeviceError: unknown device, or `gpu` where MLX has none.
    """
    import numpy as np

    from ..ir import Builder
    from ..runtime.executor import MlxExecutor
    from ..runtime.timing import time_version

    ex = MlxExecutor(device=device)
    b = Builder("matmul")
    b.output(b.matmul(b.input("a", (n, n)), b.param("w", (n, n))))
    rng = np.random.default_rng(0)
    mm = time_version(b.build(), {"a": rng.standard_normal((n, n), np.float32)},
                      {"w": rng.standard_normal((n, n), np.float32)}, warmup=2, repeat=repeat, executor=ex)
    b = Builder("stream_add")
    b.output(b.add(b.input("x", (elements,)), b.input("y", (elements,))))
    ones = np.ones(elements, np.float32)
    add = time_version(b.build(), {"x": ones, "y": ones}, warmup=2, repeat=repeat, executor=ex)
    return Ridge(ex.device, 2 * n ** 3 / mm.median_ms / 1e6, 12 * elements / add.median_ms / 1e6,
                 mm.median_ms, add.median_ms)


def bound(intensity: float, ridge: Ridge) -> str:
    """`compute` when `intensity` (FLOP/B) is at or above the ridge, else `memory` (the roofline's two regimes).

    A third regime, *overhead-bound*, is not a point on this plot: a program of many small kernels whose
    time is dispatch and launch (compare its time with FLOPs / peak and bytes / bandwidth, `attainable_ms`).
    """
    return "compute" if intensity >= ridge.ridge else "memory"


def attainable_ms(flops: int, nbytes: int, ridge: Ridge) -> float:
    """The roofline's lower bound on a program's time (ms): max(FLOPs / peak, bytes / bandwidth)."""
    return max(flops / (ridge.gflops * 1e6), nbytes / (ridge.gbps * 1e6))


__all__ = ["ERF_FLOPS", "EXP_FLOPS", "TANH_FLOPS", "TRANSCENDENTAL_FLOPS", "OpCost", "Ridge", "attainable_ms",
           "bound", "VersionRoofline",
           "graph_flops", "machine_ridge", "op_costs", "op_flops",
           "program_bytes", "roofline"]
