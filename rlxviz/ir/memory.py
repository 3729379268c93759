"""What running a graph needs at its peak, known from shapes and dtypes alone (no allocation).

The limit itself is the session's limits record (`rlxviz.session.Limits`: `--max-memory-mb`, else
`$RLXVIZ_MAX_MEMORY_MB`, else 2048 MiB), the same for the CLI, the app and the notebooks; it calls
`peak_memory` before anything is allocated. The model is the one the executors implement
(`runtime.reference`, `runtime.executor`): inputs and params are allocated up front and stay live;
each compute node's output is allocated when it runs, while its operands are still live, and freed
after its last user; graph outputs are never freed. Temporaries inside one op's kernel are not counted.

Model builders check their config's sizes the same way before building (`check_bytes`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .graph import Graph
from .node import Node
from .ops import Op

MIB = 1 << 20


class MemoryBudgetError(ValueError):
    """A model whose memory need exceeds the limit; the message says what and how to raise it."""


def node_bytes(node: Node) -> int:
    """Bytes of `node`'s output as the executors hold it: elements x max(IR itemsize, NumPy itemsize)
    (bf16 is computed as float32 by the reference)."""
    n = 1
    for d in node.shape:
        n *= d
    return n * max(node.dtype.itemsize, node.dtype.numpy.itemsize)


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


def peak_memory(graph: Graph) -> MemoryPeak:
    """Peak live bytes of one run of `graph` in node order (see the module docstring for the model)."""
    leaves = [n for n in graph if n.op in (Op.INPUT, Op.PARAM, Op.CONST)]
    leaf_bytes = sum(node_bytes(n) for n in leaves)
    remaining = {n.id: graph.use_count(n) for n in graph}
    outputs = set(graph.outputs)
    size: dict[int, int] = {}
    live = peak = leaf_bytes
    at: int | None = None
    largest = max(graph, key=node_bytes, default=None)
    for n in graph:
        if n.op in (Op.INPUT, Op.PARAM, Op.CONST):
            continue
        size[n.id] = b = node_bytes(n)
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


__all__ = ["MIB", "MemoryBudgetError", "MemoryPeak", "check_bytes", "format_bytes", "node_bytes", "peak_memory"]
