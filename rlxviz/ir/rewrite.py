"""`Rewriter`: build the next version of a graph from matched rewrites, in one linear sweep.

Improves on RLX's private rewriter (docs/rlx.md §2.1, §7.8): nodes are never copied twice, a value
that is removed while still used is an error instead of a silent redirect, and every new node
records the pass that made it and the ids it absorbed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .builder import NodeEmitter
from .emitter import Ref, normalize_attrs
from .graph import Graph, GraphError, toposort
from .infer import TensorType
from .node import Node
from .ops import Op


class RewriteError(GraphError):
    """A rewrite removed a node that something outside the rewrite still uses."""


def common_path(paths: Sequence[str]) -> str:
    """Longest common dotted prefix, e.g. `encoder.layer.3` for the nodes of one layer."""
    parts = [p.split(".") for p in paths if p]
    if not parts:
        return ""
    return ".".join(os.path.commonprefix(parts))


def _identity(op: Op, inputs: Sequence[int], attrs: dict[str, Any]) -> tuple | None:
    """What makes two emitted nodes one value: op, operand ids and (canonical) attributes; None when an attribute
    is not hashable (such a node is never reused)."""
    key = (op, tuple(int(i) for i in inputs), tuple(sorted(attrs.items())))
    try:
        hash(key)
    except TypeError:
        return None
    return key


class Rewriter(NodeEmitter):
    """Collects new nodes and replacements against `graph`; `finish()` returns the new graph.

    New ids start at `graph.next_id`, so ids stay unique across all versions of a graph.

    Example:
        >>> rw = Rewriter(g, "fuse_matmul_bias_act")          # doctest: +SKIP
        >>> new = rw.fuse(Op.FUSED_MATMUL_BIAS_ACT, (x, w, b), {"activation": "gelu"},
        ...               absorbed=(mm, add, act))              # doctest: +SKIP
        >>> g2 = rw.finish()                                   # doctest: +SKIP
    """

    def __init__(self, graph: Graph, pass_name: str) -> None:
        super().__init__(graph.next_id)
        self.graph = graph
        self.pass_name = pass_name
        self._replace: dict[int, int] = {}
        self._remove: set[int] = set()
        self._anchor: dict[int, int] = {}
        self._place: tuple[int, ...] = ()
        self._made: dict[tuple, int] = {}

    def lookup(self, i: int) -> Node:
        n = self._created.get(i)
        return n if n is not None else self.graph[i]

    @contextmanager
    def provenance(self, absorbed: Sequence[int], path: str | None = None) -> Iterator[None]:
        """Nodes emitted inside record `absorbed` and a path (default: the absorbed nodes' common path), and are
        placed where the last of `absorbed` was."""
        saved = self.path, self.absorbed, self._place
        self.absorbed = self._place = tuple(absorbed)
        self.path = path if path is not None else common_path([self.graph[i].path for i in absorbed])
        try:
            yield
        finally:
            self.path, self.absorbed, self._place = saved

    @contextmanager
    def absorbing(self, absorbed: Sequence[int] = ()) -> Iterator[None]:
        """Inside a `provenance`: nodes emitted here record `absorbed` (default: nothing) as the nodes they replace,
        keeping the provenance's path and place. For the nodes a rewrite makes around its product that replace
        nothing (a `concat` of weights, the `narrow`s of a packed result), so no label, inspector or IR text says
        they absorbed the match's nodes: only the product does."""
        saved = self.absorbed
        self.absorbed = tuple(absorbed)
        try:
            yield
        finally:
            self.absorbed = saved

    def _add(self, op: Op, inputs: Sequence[int], t: TensorType, attrs: dict[str, Any]) -> int:
        i = super()._add(op, inputs, t, attrs)
        if self._place:
            self._anchor[i] = max(self.graph.position(a) for a in self._place)
        return i

    def emit(self, op: Op, inputs: Sequence[int], **attrs: Any) -> int:
        """Append `op(inputs)`, or return the node this rewriter already made with the same op, operands and
        attributes (and that no call removed or replaced since): a rewrite never makes two identical nodes for one
        value (two matches of a rule reading one table, each narrowing it, share one narrow; `rope_heads`). The
        reused node keeps the provenance it was made with, placed where the first rewrite that reads it is. Raises
        ShapeError when the types do not fit."""
        key = _identity(op, inputs, normalize_attrs(op, attrs))
        made = self._made.get(key) if key is not None else None
        if made is not None and not self.removed(made):
            if self._place and made in self._anchor:  # placed before the first of the rewrites that read it
                self._anchor[made] = min(self._anchor[made], max(self.graph.position(a) for a in self._place))
            return Ref(made)
        i = super().emit(op, inputs, **attrs)
        if key is not None:
            self._made[key] = int(i)
        return i

    def replace(self, old: int, new: int) -> None:
        """Uses of `old` (and graph outputs) now read `new`; `old` is removed."""
        self._replace[old] = new

    def replaced(self, i: int) -> bool:
        """Whether `replace(i, ...)` was called: the readers of `i` read another value now."""
        return i in self._replace

    def removed(self, i: int) -> bool:
        """Whether an earlier call of this rewriter removed or replaced `i` (a later match of the same pass then
        need not keep `i` alive for that reader)."""
        return i in self._remove or i in self._replace

    def remove(self, ids: Sequence[int]) -> None:
        """Remove `ids`; `finish` fails if anything outside still reads them."""
        self._remove.update(ids)

    def fuse(self, op: Op, inputs: Sequence[int], attrs: dict, *, absorbed: Sequence[int],
             result: int | None = None, path: str | None = None) -> int:
        """Replace the subgraph `absorbed` by one `op` node whose value stands for `result`
        (default: the last absorbed node). Returns the new node id."""
        result = absorbed[-1] if result is None else result
        with self.provenance(absorbed, path):
            new = self.emit(op, inputs, **attrs)
        self.remove([a for a in absorbed if a != result])
        self.replace(result, new)
        return new

    def fuse_packed(self, op: Op, inputs: Sequence[int], attrs: dict, *, absorbed: Sequence[int],
                    results: Sequence[int], path: str | None = None) -> int:
        """A multi-output rewrite: replace the subgraph `absorbed` by one `op` node that produces the values of
        every node in `results` (each absorbed), packed in that order on the last axis, and one `narrow` per
        result that reads its slice back; each result's readers then read its `narrow`. Returns the new node's id.

        Raises:
            RewriteError: the new node's type is not the results' types packed on the last axis (the op's type
                rule disagrees with what it replaces), or a result is not absorbed.
        """
        if not results or any(r not in absorbed for r in results):
            raise RewriteError(f"{self.pass_name}: every result of a multi-output rewrite is absorbed; results "
                               f"{list(results)}, absorbed {list(absorbed)}", results[0] if results else None)
        with self.provenance(absorbed, path):
            new = self.emit(op, inputs, **attrs)
            t, parts = self.lookup(new).type, [self.graph[r].type for r in results]
            lead, axis = parts[0].shape[:-1], len(parts[0].shape) - 1
            if (t.shape != (*lead, sum(p.shape[-1] for p in parts)) or any(p.shape[:-1] != lead for p in parts)
                    or any(p.dtype != t.dtype for p in parts)):
                raise RewriteError(f"{self.pass_name}: {op.value} gives {t}, not the results "
                                   f"{', '.join(map(str, parts))} packed on the last axis", new)
            start, slices = 0, []
            for p in parts:
                slices.append(self.narrow(new, axis, start, p.shape[-1]))
                start += p.shape[-1]
        self.remove([a for a in absorbed if a not in results])
        for r, s in zip(results, slices, strict=True):
            self.replace(r, s)
        return new

    def resolve(self, i: int) -> int:
        """The id whose value now stands for `i`: `i` followed through every `replace` (itself if none).

        Raises:
            RewriteError: the replacements form a cycle.
        """
        return self._resolve(i)

    def _resolve(self, i: int) -> int:
        seen = 0
        while i in self._replace:
            i = self._replace[i]
            seen += 1
            if seen > len(self._replace):
                raise RewriteError(f"replacement cycle through %{i}", i)
        return i

    def finish(self) -> Graph:
        """The rewritten graph, in a stable topological order (new nodes where their pattern was).

        Raises:
            RewriteError: a removed node is still read by a surviving node or is a graph output.
        """
        gone = self._remove | set(self._replace)
        keyed: dict[int, tuple[int, int, int]] = {}
        nodes: dict[int, Node] = {}
        for n in self.graph:
            if n.id in gone:
                continue
            nodes[n.id] = self._remap(n, gone)
            keyed[n.id] = (self.graph.position(n), 0, 0)
        for seq, n in enumerate(self._created.values()):
            if n.id in gone:
                continue
            nodes[n.id] = self._remap(n, gone)
            anchor = self._anchor.get(n.id, max((keyed[i][0] for i in n.inputs if i in keyed), default=0))
            keyed[n.id] = (anchor, 1, seq)
        outputs = []
        for o in self.graph.outputs:
            r = self._resolve(o)
            if r in gone:
                raise RewriteError(f"graph output %{o} was removed by {self.pass_name}", o)
            outputs.append(r)
        try:
            order = toposort(nodes, keyed)
        except GraphError as e:
            raise RewriteError(f"{self.pass_name}: {e}", e.node_id) from e
        return Graph((nodes[i] for i in order), outputs, self.graph.name, self._next, self.graph.values)

    def _remap(self, n: Node, gone: set[int]) -> Node:
        ins = tuple(self._resolve(i) for i in n.inputs)
        for old, new in zip(n.inputs, ins, strict=True):
            if new in gone:
                raise RewriteError(
                    f"{self.pass_name}: %{old} was removed but %{n.id} ({n.op.value}) still uses it", n.id)
        return n if ins == n.inputs else n.replace(inputs=ins)
