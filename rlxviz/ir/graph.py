"""Graphs: an ordered set of immutable nodes, the graph outputs, and cached use-def maps.

Improves on RLX's `Graph` (docs/rlx.md §1.1, §7.1–7.2): `users` is O(1) from a def-use index built
once per snapshot, and graph outputs count as uses in one place (`use_count`, `is_output`).
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from .node import Node
from .ops import FUSED, Op
from .printer import format_graph

NodeRef = Node | int
SMALL_VALUE = 1 << 18
"""The most elements of a param value a graph carries in `Graph.values` (1 MiB at f32: a RoPE table of 2048
positions x 128 dims, not a BERT-base weight matrix, so hashing them for cache keys and pickling them stays cheap)."""


class GraphError(ValueError):
    """A graph is malformed (dangling id, cycle, arity, attribute or shape error).

    The message names the node and quotes the IR lines around it.
    """

    def __init__(self, message: str, node_id: int | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.node_id = node_id
        self.reason = reason  # the problem alone, one line (`%1 (gelu): declared type ...`), when known


class GraphValues(Mapping[str, Any]):
    """`Graph.values`: param name -> NumPy value, read-only, shared by every version of a graph, with its content
    digest made once (`digest`: names, dtypes, shapes and bytes of every value) so each version's `Graph.digest`
    does not hash the arrays again. The arrays are the importer's and must not be written to."""

    __slots__ = ("_items", "_digest")

    def __init__(self, items: Mapping[str, Any] | None = None) -> None:
        self._items: dict[str, Any] = dict(items or {})
        self._digest: str | None = None

    def __getitem__(self, name: str) -> Any:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"GraphValues({', '.join(self._items)})"

    @property
    def digest(self) -> str:
        """sha256 (hex) of every value's name, dtype, shape and bytes, in name order ("" when there are none)."""
        if self._digest is None:
            if not self._items:
                self._digest = ""
            else:
                h = hashlib.sha256()
                for name in sorted(self._items):
                    v = self._items[name]
                    h.update(f"{name}:{v.dtype}:{v.shape}".encode())
                    h.update(v.tobytes())
                self._digest = h.hexdigest()
        return self._digest


NO_VALUES = GraphValues()


def _id(ref: NodeRef) -> int:
    return ref.id if isinstance(ref, Node) else ref


class Graph:
    """A dataflow graph of `Node`s in topological order, with its outputs.

    Graphs are immutable: passes produce new graphs with `Rewriter`. `digest` is the graph's content identity
    (its IR text and its values), the key of every cache of something derived from a graph. Node ids are
    stable across versions; `next_id` is the first id a rewrite may allocate. `values` maps param names to
    the NumPy values the importer knew for small params (at most `SMALL_VALUE` elements: constant tables, masks;
    read-only, shared by every version of the graph), so a guard can check a constant table's entries; a graph
    built without them has none (an empty `GraphValues`) and such guards refuse with "values not known".

    Example:
        >>> from rlxviz.ir import Builder
        >>> b = Builder("tiny"); x = b.input("x", (2, 4)); y = b.relu(x); b.output(y)
        >>> g = b.build(); [n.op.value for n in g]
        ['input', 'relu']
    """

    __slots__ = ("name", "outputs", "next_id", "values", "_nodes", "_users", "_pos", "_digest")

    def __init__(self, nodes: Iterable[Node], outputs: Sequence[int], name: str = "graph",
                 next_id: int | None = None, values: Mapping[str, Any] | None = None) -> None:
        self._nodes: dict[int, Node] = {}
        for n in nodes:
            if n.id in self._nodes:
                raise GraphError(f"duplicate node id %{n.id}", n.id)
            self._nodes[n.id] = n
        self.outputs: tuple[int, ...] = tuple(outputs)
        self.name = name
        self.next_id = max(next_id or 0, max(self._nodes, default=-1) + 1)
        self.values: GraphValues = values if isinstance(values, GraphValues) else \
            GraphValues(values) if values else NO_VALUES
        self._users: dict[int, tuple[int, ...]] | None = None
        self._pos: dict[int, int] | None = None
        self._digest: str | None = None

    @property
    def digest(self) -> str:
        """The graph's content identity: sha256 (hex, 32 digits) of its IR text (`format_graph`: name, node ids,
        ops, operands, attributes, types, paths, pass names, absorbed ids, outputs, `next_id`) and of the values
        it carries (`GraphValues.digest`). Made once per graph (graphs are immutable; each node's line is made once
        per node, so the versions of a pipeline run share that work).

        Node ids are part of it on purpose: caches keyed by it hold node ids (live sets, node maps, bindings), and a
        graph whose ids differ names different nodes. Two graphs with equal digests are interchangeable for every
        derived view; a rebuilt graph with the same content hits the same cache entries."""
        if self._digest is None:
            h = hashlib.sha256(format_graph(self).encode())
            h.update(self.values.digest.encode())
            self._digest = h.hexdigest()[:32]
        return self._digest

    # -- container protocol -------------------------------------------------------------------
    def __getitem__(self, ref: NodeRef) -> Node:
        try:
            return self._nodes[_id(ref)]
        except KeyError:
            raise GraphError(f"no node %{_id(ref)} in graph {self.name!r}", _id(ref)) from None

    def __contains__(self, ref: object) -> bool:
        return isinstance(ref, Node | int) and _id(ref) in self._nodes

    def __iter__(self) -> Iterator[Node]:
        return iter(self._nodes.values())

    def __len__(self) -> int:
        return len(self._nodes)

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self)} nodes, outputs={list(self.outputs)})"

    @property
    def nodes(self) -> list[Node]:
        """All nodes in topological order."""
        return list(self._nodes.values())

    def get(self, ref: NodeRef) -> Node | None:
        return self._nodes.get(_id(ref))

    # -- use-def ------------------------------------------------------------------------------
    def _index(self) -> dict[int, tuple[int, ...]]:
        if self._users is None:
            users: dict[int, list[int]] = {i: [] for i in self._nodes}
            for n in self._nodes.values():
                for i in dict.fromkeys(n.inputs):
                    if i in users:
                        users[i].append(n.id)
            self._users = {k: tuple(v) for k, v in users.items()}
        return self._users

    def users(self, ref: NodeRef) -> tuple[Node, ...]:
        """Nodes that read `ref`, each once, in graph order. Graph outputs are not nodes: see `use_count`."""
        return tuple(self._nodes[u] for u in self._index().get(_id(ref), ()))

    def use_count(self, ref: NodeRef) -> int:
        """Number of user nodes plus the number of times `ref` is a graph output."""
        i = _id(ref)
        return len(self._index().get(i, ())) + self.outputs.count(i)

    def is_output(self, ref: NodeRef) -> bool:
        return _id(ref) in self.outputs

    def operands(self, ref: NodeRef) -> tuple[Node, ...]:
        """The operand nodes of `ref`, in order."""
        return tuple(self[i] for i in self[ref].inputs)

    def position(self, ref: NodeRef) -> int:
        """Index of `ref` in topological order."""
        if self._pos is None:
            self._pos = {k: i for i, k in enumerate(self._nodes)}
        return self._pos[_id(ref)]

    # -- views ----------------------------------------------------------------------------------
    def leaves(self, op: Op | None = None) -> list[Node]:
        """Input, param and const nodes (or only those of `op`)."""
        return [n for n in self if n.op in (Op.INPUT, Op.PARAM, Op.CONST) and (op is None or n.op == op)]

    @property
    def inputs(self) -> list[Node]:
        return self.leaves(Op.INPUT)

    @property
    def params(self) -> list[Node]:
        return self.leaves(Op.PARAM)

    def compute_nodes(self) -> list[Node]:
        return [n for n in self if n.op not in (Op.INPUT, Op.PARAM, Op.CONST)]

    def op_counts(self) -> dict[str, int]:
        """Histogram of op names over compute nodes, most frequent first."""
        counts: dict[str, int] = {}
        for n in self.compute_nodes():
            counts[n.op.value] = counts.get(n.op.value, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def fused_op_counts(self) -> dict[str, int]:
        """`op_counts` restricted to fused ops (the op table's `FUSED` family), most frequent first."""
        return {k: v for k, v in self.op_counts().items() if Op(k) in FUSED}

    def find(self, op: Op) -> list[Node]:
        return [n for n in self if n.op == op]

    def with_outputs(self, outputs: Sequence[int]) -> Graph:
        """The same nodes with different outputs (e.g. to expose an intermediate)."""
        return Graph(self._nodes.values(), outputs, self.name, self.next_id, self.values)

    def with_values(self, values: Mapping[str, Any]) -> Graph:
        """The same graph carrying `values` (param name -> NumPy array) for guards that read constants."""
        return Graph(self._nodes.values(), self.outputs, self.name, self.next_id, values)

    def param_value(self, ref: NodeRef) -> Any | None:
        """The value of param node `ref` when the graph carries it (`values`), else None."""
        n = self[ref]
        return self.values.get(n.attrs["name"]) if n.op == Op.PARAM else None

    def topo_sorted(self) -> Graph:
        """The same graph with nodes re-ordered so every operand precedes its users (stable).

        Raises:
            GraphError: a dangling operand or a cycle; the message names a node on the cycle.
        """
        order = toposort(self._nodes)
        return Graph((self._nodes[i] for i in order), self.outputs, self.name, self.next_id, self.values)


def toposort(nodes: dict[int, Node], key: dict[int, tuple[int, ...]] | None = None) -> list[int]:
    """Stable topological order of `nodes` (Kahn's algorithm), O((N + E) log N): the project's one
    topological sort (`Graph.topo_sorted`, `lint` and `Rewriter.finish` call it).

    Args:
        nodes: id -> node.
        key: among ready nodes the smallest key goes first (e.g. a rewrite places new nodes where
            their pattern was); default: the order of `nodes`.

    Raises:
        GraphError: an operand id does not exist, or the nodes contain a cycle (named).
    """
    indeg = {}
    users: dict[int, list[int]] = {i: [] for i in nodes}
    for n in nodes.values():
        deps = set(n.inputs)
        for d in deps:
            if d not in nodes:
                raise GraphError(f"%{n.id} ({n.op.value}) uses %{d}, which does not exist", n.id)
            users[d].append(n.id)
        indeg[n.id] = len(deps)
    pos: dict[int, Any] = key if key is not None else {k: (i,) for i, k in enumerate(nodes)}
    ready = [(pos[i], i) for i, d in indeg.items() if d == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(ready, (pos[u], u))
    if len(order) != len(nodes):
        stuck = next(i for i in nodes if indeg[i] > 0)
        cycle = _find_cycle(nodes, stuck)
        raise GraphError("cycle: " + " -> ".join(f"%{c}" for c in cycle), cycle[0])
    return order


def _find_cycle(nodes: dict[int, Node], start: int) -> list[int]:
    """A cycle reachable from `start` by following operands (iterative DFS), as ids, first == last."""
    path: list[int] = [start]
    on_path = {start: 0}
    done: set[int] = set()
    stack = [iter(nodes[start].inputs)]
    while stack:
        nxt = next(stack[-1], None)
        if nxt is None:
            stack.pop()
            popped = path.pop()
            done.add(popped)
            del on_path[popped]
            continue
        if nxt in on_path:
            return [*path[on_path[nxt]:], nxt]
        if nxt in done or nxt not in nodes:
            continue
        on_path[nxt] = len(path)
        path.append(nxt)
        stack.append(iter(nodes[nxt].inputs))
    return [start, start]
