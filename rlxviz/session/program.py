"""What the backend runs, read from the backend: MLX's own primitives of a graph version's lowered program.

A graph version is lowered (`runtime.executor.MlxExecutor.bind`: the per-call part of the program, its
arguments evaluated first) and called once without evaluating; the lazy output arrays' graph is what MLX
will execute. `mx.export_to_dot` writes that graph (one `rectangle` node per primitive, in MLX's own
order), and its primitive names are read back here. A `mx.compile`d function appears as one primitive
named `Compiled...` (one kernel for the fused elementwise chain); a `mx.fast` op that falls back on a
device (e.g. `mx.fast.layer_norm` on the CPU in MLX 0.32) appears as the primitives of its fallback.
Nothing here is a table of assumptions: a different MLX version or device gives a different list.

Bytes (`ProgramBytes`) come from the same lazy graph: rlxviz's kernels module walks it
(`kernels.program_tape`: every primitive with the shape, dtype and nbytes of each input and output, as
MLX's arrays give them). Where that module is not built, `mx.export_function`'s trace gives the same
records except that it inlines `mx.compile`d functions (their internal intermediates are then counted:
an upper bound; `ProgramBytes.source` says which reading it is).
"""

from __future__ import annotations

import io
import math
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

MODELLED_EXTRA: dict[tuple[str, str], int] = {("cpu", "AddMM"): 2}
"""Traffic a primitive moves inside its kernel that the graph does not show, in multiples of its output's
bytes, by (device, primitive): MLX 0.32's CPU `AddMM` first fills its output with the broadcast bias, then
lets BLAS read and rewrite it (beta = 1): one more write and one more read of the output than the graph's
`inputs -> output`. A **model** of MLX's source (`mlx/backend/cpu/matmul.cpp`), kept apart
(`ProgramBytes.modelled`) from the bytes read off the graph."""

GATHERS = frozenset({"Gather", "GatherAxis"})
"""Primitives whose first input (the table) is read only where the indices point (`ProgramBytes`)."""

_PRIMITIVE = re.compile(r'\[label ="([^"]+)", shape=rectangle\]')


TapeArray = tuple[Any, list[int] | tuple[int, ...], str, int]
"""One array of a program record: `(id, shape, dtype name, nbytes)`."""
TapeRecord = tuple[str, list[TapeArray], list[TapeArray]]
"""One primitive of a program: `(name, inputs, outputs)`, inputs before readers."""


@dataclass(frozen=True)
class KernelBytes:
    """One non-view primitive's traffic: `read` (bytes of its distinct inputs' storage, each once) and
    `written` (bytes of its outputs), from the arrays' nbytes in MLX's graph; `modelled` (`MODELLED_EXTRA`)."""

    name: str
    read: int
    written: int
    modelled: int = 0


@dataclass(frozen=True)
class ProgramBytes:
    """Bytes one call of a lowered program moves, per kernel, read from MLX's graph of that call.

    Conventions: every non-view primitive (`VIEWS`) is one kernel that reads each distinct input once and
    writes each output once (its compulsory traffic: caches and in-kernel re-reads are not seen); a view
    moves nothing, and reading through it costs at most the storage under it (a `Broadcast` bias of `[N]`
    read as `[B, S, N]` costs `N` elements; a `Slice` costs the slice); a gather (`GATHERS`) reads the rows it
    takes, at most its output's bytes of its table (an embedding lookup does not read the whole vocabulary).
    Evaluated arguments (inputs,
    weights) and constants are leaves: read by the kernels that use them, never written.

    Attributes:
        device: `cpu` or `gpu`.
        kernels: one `KernelBytes` per non-view primitive, in MLX's order.
        source: which reading of MLX's graph the records came from (module docstring).
        exact_compiled: False where compiled functions were inlined (the export trace): an upper bound.
    """

    device: str
    kernels: tuple[KernelBytes, ...]
    source: str
    exact_compiled: bool = True

    @property
    def read(self) -> int:
        return sum(k.read for k in self.kernels)

    @property
    def written(self) -> int:
        return sum(k.written for k in self.kernels)

    @property
    def from_graph(self) -> int:
        """Bytes read plus bytes written, as MLX's graph gives them."""
        return self.read + self.written

    @property
    def modelled(self) -> int:
        """Bytes added by `MODELLED_EXTRA` (a model of a primitive's implementation, not read from MLX)."""
        return sum(k.modelled for k in self.kernels)

    @property
    def total(self) -> int:
        """`from_graph + modelled`: the bytes the roofline's x axis divides by."""
        return self.from_graph + self.modelled

    def by_primitive(self) -> dict[str, int]:
        """Primitive name -> total bytes (graph + modelled), largest first."""
        out: Counter[str] = Counter()
        for k in self.kernels:
            out[k.name] += k.read + k.written + k.modelled
        return dict(out.most_common())

    def __str__(self) -> str:
        s = f"{self.total:,} B per call on {self.device} ({len(self.kernels)} kernels: {self.read:,} B read + " \
            f"{self.written:,} B written, from MLX's graph"
        s += f"; + {self.modelled:,} B modelled, CPU AddMM's bias pre-fill)" if self.modelled else ")"
        return s + ("" if self.exact_compiled else " [compiled functions inlined: an upper bound]")


def tape_bytes(records: list[TapeRecord], device: str, source: str = "test",
               exact_compiled: bool = True) -> ProgramBytes:
    """`ProgramBytes` of program records (`TapeRecord`s, inputs before readers; conventions in `ProgramBytes`).

    Raises:
        ValueError: a record reads an array that neither an earlier record nor a leaf could give (bad order).
    """
    storage: dict[Any, int] = {}  # array id -> bytes under it (a view: at most its source's)
    kernels = []
    for name, ins, outs in records:
        if name in VIEWS:
            src = storage.get(ins[0][0], ins[0][3]) if ins else 0
            for a in outs:
                storage[a[0]] = min(a[3], src)
            continue
        seen: dict[Any, int] = {}
        written = sum(a[3] for a in outs)
        for k, a in enumerate(ins):
            cost = storage.get(a[0], a[3])
            seen.setdefault(a[0], min(cost, written) if k == 0 and name in GATHERS else cost)
        for a in outs:
            storage[a[0]] = a[3]
        extra = MODELLED_EXTRA.get((device, name), 0) * written
        kernels.append(KernelBytes(name, sum(seen.values()), written, extra))
    return ProgramBytes(device, tuple(kernels), source, exact_compiled)


def _export_records(fn: Any, args: list[Any]) -> list[TapeRecord]:
    """Program records from `mx.export_function`'s callback (compiled functions come out inlined)."""
    import mlx.core as mx

    records: list[TapeRecord] = []

    def arrays(items: list) -> list[TapeArray]:
        return [(n, tuple(shape), str(dt).rsplit(".", 1)[-1], math.prod(shape) * dt.size) for n, shape, dt in items]

    def on_event(d: dict) -> None:
        if d.get("type") == "primitive":
            records.append((d["name"], arrays(d["inputs"]), arrays(d["outputs"])))

    mx.export_function(on_event, fn, *args)
    return records


def program_bytes_of(fn: Any, args: list[Any], device: str) -> ProgramBytes:
    """`ProgramBytes` of one call `fn(*args)` (MLX arrays, evaluated), read from MLX's graph of that call.

    Raises:
        ValueError: MLX's exporter cannot trace a primitive (only without rlxviz's kernels module).
    """
    from .. import kernels

    module = kernels.load()
    if module is not None and hasattr(module, "program_tape"):
        outs = fn(*args)
        return tape_bytes(module.program_tape(list(outs)), device, "MLX's lazy graph (kernels.program_tape)")
    return tape_bytes(_export_records(fn, args), device, "mx.export_function trace", exact_compiled=False)


@dataclass(frozen=True)
class ProgramPrimitives:
    """The primitives MLX runs for one call of one graph version.

    Attributes:
        device: `cpu` or `gpu` (where the program was lowered).
        primitives: every primitive name, in MLX's topological order (`mx.export_to_dot`).
        bytes: what the same program moves (`ProgramBytes`), when read (`mlx_primitives(..., bytes=True)`).
    """

    device: str
    primitives: tuple[str, ...]
    bytes: ProgramBytes | None = None

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


def short_primitive(name: str) -> str:
    """A readable label for one primitive name: a `Compiled...` name (MLX joins the names of every primitive the
    compiled function fuses: `CompiledBroadcastMultiplyAddMultiply...`, often 200 characters) becomes
    `Compiled(Multiply x3, Add)`: the capitalized pieces of the name in order of first appearance with their
    counts, `Broadcast` left out (a view inside the kernel). A primitive whose own name has two capitals
    (`LogAddExp`) shows as its pieces. Any other name is returned as it is."""
    if not name.startswith("Compiled") or name == "Compiled":
        return name
    pieces = Counter(w for w in re.findall(r"[A-Z][a-z0-9]*", name[len("Compiled"):]) if w != "Broadcast")
    return "Compiled(" + ", ".join(w if k == 1 else f"{w} x{k}" for w, k in pieces.items()) + ")"


def dot_primitives(dot: str) -> tuple[str, ...]:
    """Primitive names from the text `mx.export_to_dot` writes (one per `shape=rectangle` node, in order)."""
    return tuple(_PRIMITIVE.findall(dot))


def mlx_primitives(graph: Graph, feeds: Mapping[str, Any], weights: Mapping[str, Any] | None = None,
                   device: str = "cpu", executor: Any = None, bytes: bool = True) -> ProgramPrimitives:
    """MLX's primitives for one call of `graph`, read from the lazy graph of its lowered program as every call
    after the first runs it: work done once per program (rlxviz's GEMM packing each weight,
    `RlxvizPackWeights`) is evaluated first and not counted as every call's.

    Args:
        graph: a graph version (fused ops are lowered as `runtime.lowering` lowers them on `device`).
        feeds / weights: NumPy or MLX arrays by name (their values do not change the list; their shapes do).
        device: `cpu` or `gpu`; ignored when `executor` is given.
        executor: a `runtime.executor.MlxExecutor` to lower with (its programs and weights are cached).
        bytes: also read the program's bytes (`ProgramBytes`, `program_bytes_of`).

    Raises:
        DeviceError: the device is unknown or not available here.
        KeyError / ValueError: a missing input or param, or a shape that differs from the graph's.
    """
    import mlx.core as mx

    from ..runtime.executor import MlxExecutor

    ex = executor or MlxExecutor(device=device)
    prog, args = ex.bind(graph, feeds, weights)
    mx.eval(args)  # the arguments' own conversions (dtype casts) are not part of a call
    outs, packed = ex.emitter.with_packing_evaluated(lambda: prog.fn(*args))
    if packed:  # packed once, on the first call, and kept evaluated: the next calls read it
        outs = prog.fn(*args)
    buf = io.StringIO()
    mx.export_to_dot(buf, *outs)
    moved = program_bytes_of(prog.fn, args, ex.device) if bytes else None
    return ProgramPrimitives(ex.device, dot_primitives(buf.getvalue()), moved)


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
    """The per-version table as aligned text: graph ops, MLX primitives, non-view primitives, compiled kernels,
    and the bytes per call read from MLX's graph (`ProgramBytes.from_graph`; modelled bytes in brackets)."""
    w = max(len(r.label) for r in rows)
    lines = [f"{'#':>2}  {'version':<{w}}  {'graph ops':>9}  {'MLX prims':>9}  {'not views':>9}  {'compiled':>8}"
             f"  {'bytes (MLX graph)':>17}  {'+ modelled':>10}"]
    for r in rows:
        p = r.program
        b = p.bytes
        moved = f"{b.from_graph:>17,}  {b.modelled:>10,}" if b else f"{'-':>17}  {'-':>10}"
        lines.append(f"{r.index:>2}  {r.label:<{w}}  {r.ops:>9}  {p.count:>9}  {p.kernels:>9}  {p.compiled:>8}"
                     f"  {moved}")
    if any(r.program.bytes and not r.program.bytes.exact_compiled for r in rows):
        lines.append("bytes: mx.export_function trace, compiled functions inlined (an upper bound)")
    return "\n".join(lines)


__all__ = ["GATHERS", "MODELLED_EXTRA", "VIEWS", "KernelBytes", "ProgramBytes", "ProgramPrimitives", "program_bytes_of",
           "tape_bytes", "VersionPrimitives", "dot_primitives", "format_primitives", "short_primitive",
           "mlx_primitives", "version_primitives"]
