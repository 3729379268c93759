"""What running a graph needs at its peak, known from shapes and dtypes alone (no allocation).

The limit itself is the session's limits record (`rlxviz.session.Limits`: `--max-memory-mb`, else
`$RLXVIZ_MAX_MEMORY_MB`, else 2048 MiB), the same for the CLI, the app and the notebooks; it calls
`peak_memory` before anything is allocated. The model is the one the executors implement
(`runtime.reference`, `runtime.executor`): inputs and params are allocated up front and stay live;
each compute node's output is allocated when it runs, while its operands are still live, and freed
after its last user; graph outputs are never freed. Temporaries inside one op's kernel are not counted.
What a command holds beyond one run (the MLX copies, the float64 oracle of `time`, the saved outputs) is
`workload_peak`'s: the one estimate `run`, `time`, `explain`, the app and the notebooks check.

Model builders check their config's sizes the same way before building (`check_bytes`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from .graph import Graph
from .node import Node
from .ops import Op

MIB = 1 << 20


class MemoryBudgetError(ValueError):
    """A model whose memory need exceeds the limit; the message says what and how to raise it."""


def node_bytes(node: Node, itemsize: int | None = None) -> int:
    """Bytes of `node`'s output as the executors hold it: elements x max(IR itemsize, NumPy itemsize)
    (bf16 is computed as float32 by the reference); with `itemsize`, elements x max(that, the dtype's)
    (8: the float64 oracle of `time`)."""
    n = 1
    for d in node.shape:
        n *= d
    own = max(node.dtype.itemsize, node.dtype.numpy.itemsize)
    return n * (own if itemsize is None else max(own, itemsize))


def format_bytes(n: int) -> str:
    """Bytes as a short human string (B, KiB, MiB, GiB, TiB)."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class MemoryPeak:
    """`peak_memory`'s result.

    Attributes:
        peak_bytes: most bytes live at once during a run (inputs + params + live intermediates).
        leaf_bytes: bytes of inputs, params and consts (live for the whole run).
        at_node: id of the node whose output allocation reaches the peak (None: the leaves alone).
        largest: the node with the largest output.
    """

    peak_bytes: int
    leaf_bytes: int
    at_node: int | None
    largest: Node | None


def peak_memory(graph: Graph, itemsize: int | None = None, unloaded: Collection[str] = ()) -> MemoryPeak:
    """Peak live bytes of one run of `graph` in node order (see the module docstring for the model); with
    `itemsize`, every tensor counted at least that many bytes an element (`node_bytes`). Params named in
    `unloaded` (weights left in their file, `models.onnx.weights`) count nothing: the command never reads them."""
    leaves = [n for n in graph if n.op in (Op.INPUT, Op.CONST)
              or n.op == Op.PARAM and not (unloaded and n.attrs.get("name") in unloaded)]
    leaf_bytes = sum(node_bytes(n, itemsize) for n in leaves)
    remaining = {n.id: graph.use_count(n) for n in graph}
    outputs = set(graph.outputs)
    size: dict[int, int] = {}
    live = peak = leaf_bytes
    at: int | None = None
    largest = max(graph, key=node_bytes, default=None)
    for n in graph:
        if n.op in (Op.INPUT, Op.PARAM, Op.CONST):
            continue
        size[n.id] = b = node_bytes(n, itemsize)
        live += b
        if live > peak:
            peak, at = live, n.id
        for i in set(n.inputs):
            remaining[i] -= 1
            if remaining[i] == 0 and i in size and i not in outputs:
                live -= size[i]
        if remaining[n.id] == 0 and n.id not in outputs:  # a dead node: freed at once
            live -= b
    return MemoryPeak(peak, leaf_bytes, at, largest)


WORKLOADS = {
    "load": "the weights and one run's live tensors",
    "run": "the weights, one run's live tensors and the saved outputs",
    "run-mlx": "the NumPy weights, their MLX copies, one run's live tensors on MLX and the saved outputs",
    "time": "the NumPy weights, every input set with its float64 oracle and unfused outputs kept for the error "
            "check, the oracle's run in float64, the MLX leaves and two versions' live tensors",
    "export": "the weights, their ONNX initializers, the serialized model and one run's live tensors",
}
"""What each workload holds at its peak (`workload_peak`), as refusals name it."""

EXPORT_PARAM_COPIES = 4
"""Copies of the params `export` holds beside one run's tensors at its peak (`workload_peak`)."""

MAX_INPUT_SETS = 8
"""Input sets `time` may check at once (the battery's kinds, `runtime.battery.KINDS`, plus the user's arrays)."""

SLACK_BYTES, SLACK_FRACTION = 32 * MIB, 1 / 16
"""Added to every executed workload's count: allocator pages, the parser's and executor's own objects, NumPy
temporaries inside one op (e.g. random weights drawn before their cast)."""


def workload_peak(graph: Graph, workload: str = "load", input_sets: int = MAX_INPUT_SETS,
                  unloaded: Collection[str] = (), shared: Collection[str] = ()) -> tuple[int, MemoryPeak]:
    """Bytes a command holds at its peak for `graph`, counted from shapes and dtypes alone (an upper bound: every
    copy the executors materialize is counted as live at once), and the graph's own `peak_memory`.

    Workloads (`WORKLOADS`): `load` (explain, render, ir, export: random weights, plus one run's live tensors,
    as every front end checks on load); `run` (the NumPy reference: the run's peak, plus the outputs twice:
    the float32 copy and the archive `np.savez` writes); `run-mlx` (the NumPy weights kept next to the MLX
    run's own peak, leaves copied, plus the outputs twice); `time` (the NumPy weights; `input_sets` copies of
    the inputs, each set's oracle output in float64 and unfused output kept for the error check; the oracle's
    run in float64 (`oracle_peak`: values at 8 bytes an element, params widened one at a time); the MLX peak,
    its leaves converted once, plus a second version's live tensors (the unfused and the timed version); and the
    error check's float64 temporaries, four outputs' worth; the weight concatenations a fused version holds,
    `concat_bytes`); `export` (one run's live tensors and
    `EXPORT_PARAM_COPIES` more copies of the params: the random weights' float64 draws, the ONNX initializers, the
    serialized model, the bytes written). Broadcasts and expands are node outputs, so counted in every run.
    Executed workloads add `SLACK_BYTES` and `SLACK_FRACTION` of their count. `unloaded` (the `load` workload
    only): params that the command never reads (`peak_memory`), not counted. `shared` (`run-mlx` and `time`):
    params whose NumPy array becomes a view of their MLX copy (weights read from an external-data file, on the
    CPU: `MlxExecutor._host_view`), counted once.

    Raises:
        ValueError: an unknown workload.
    """
    if workload not in WORKLOADS:
        raise ValueError(f"unknown memory workload {workload!r}; one of {', '.join(WORKLOADS)}")
    if workload == "load":
        p = peak_memory(graph, unloaded=unloaded)
        return p.peak_bytes, p
    p = peak_memory(graph)
    outs = [graph[i] for i in set(graph.outputs)]
    out, out64 = sum(node_bytes(n) for n in outs), sum(node_bytes(n, 8) for n in outs)
    once = sum(node_bytes(n) for n in graph if n.op == Op.PARAM and n.attrs.get("name") in shared) if shared else 0
    if workload == "export":  # measured: a 381 MiB param, 2.0 GB peak (the weights and three copies of them)
        params = sum(node_bytes(n) for n in graph if n.op == Op.PARAM)
        need = p.peak_bytes + EXPORT_PARAM_COPIES * params
    elif workload == "run":
        need = p.peak_bytes + 2 * out
    elif workload == "run-mlx":
        need = p.leaf_bytes - once + p.peak_bytes + 2 * out
    else:
        inputs = sum(node_bytes(n) for n in graph if n.op == Op.INPUT)
        kept = input_sets * (inputs + out64 + out)
        live = p.peak_bytes - p.leaf_bytes  # a second version's live tensors; the MLX leaves are converted once
        need = p.leaf_bytes - once + kept + oracle_peak(graph) + p.peak_bytes + live + 4 * out64 + concat_bytes(graph)
    return need + SLACK_BYTES + int(need * SLACK_FRACTION), p


def oracle_peak(graph: Graph) -> int:
    """Bytes the float64 oracle (`runtime.reference.run_oracle`) adds to the float32 weights it reads: its inputs,
    consts and live values at 8 bytes an element, and the float64 copies of the params it holds at once (each is
    widened at its first use and dropped after its last: counted as the two largest; a table only gathered from
    is not widened, its gathered rows are)."""
    params = [n for n in graph if n.op == Op.PARAM]
    base = peak_memory(graph, itemsize=8, unloaded={n.attrs.get("name") for n in params}).peak_bytes
    users: dict[int, list[tuple[Node, int]]] = {}
    for n in graph:
        for k, i in enumerate(n.inputs):
            users.setdefault(i, []).append((n, k))
    widened = sorted((node_bytes(n, 8) for n in params
                      if not (users.get(n.id) and all(u.op == Op.GATHER and k == 0 for u, k in users[n.id]))),
                     reverse=True)
    return base + sum(widened[:2])


def concat_bytes(graph: Graph) -> int:
    """Bytes of the weight concatenations the pipeline may make, which the MLX executor holds once as static values
    (`runtime.static_share`) beside the weights: the params read as the right operand of two or more matmuls with
    the same left operand (`fuse_shared_input_matmul`'s Q|K|V, `fuse_swiglu`'s gate|up)."""
    groups: dict[int, list[int]] = {}
    for n in graph:
        if n.op == Op.MATMUL and len(n.inputs) == 2 and graph[n.inputs[1]].op == Op.PARAM:
            groups.setdefault(n.inputs[0], []).append(node_bytes(graph[n.inputs[1]]))
    return sum(sum(g) for g in groups.values() if len(g) > 1)


def check_bytes(parts: Iterable[tuple[str, int]], max_bytes: int, source: str) -> int:
    """Refuse a model whose named parts (e.g. `("params", 4e9)`) together exceed `max_bytes`, before
    anything is built. Returns the total bytes.

    Raises:
        MemoryBudgetError: over the limit; the message names the largest part.
    """
    items = list(parts)
    total = sum(b for _, b in items)
    if total > max_bytes:
        name, b = max(items, key=lambda x: x[1])
        raise MemoryBudgetError(f"{source}: needs {format_bytes(total)} ({name} alone {format_bytes(b)}), over the "
                                f"limit of {format_bytes(max_bytes)}; raise RLXVIZ_MAX_MEMORY_MB (CLI: "
                                "--max-memory-mb) if the machine has the memory")
    return total


__all__ = ["MAX_INPUT_SETS", "MIB", "SLACK_BYTES", "SLACK_FRACTION", "WORKLOADS", "MemoryBudgetError", "MemoryPeak",
           "check_bytes", "concat_bytes", "format_bytes", "node_bytes", "oracle_peak", "peak_memory", "workload_peak"]
