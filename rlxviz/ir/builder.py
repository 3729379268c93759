"""`Builder`: write a graph the way the model reads (`b.matmul(x, w)`, `b.layer_norm(...)`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .dtype import DType
from .emitter import Emitter, Ref, Scalar, _freeze, normalize_attrs
from .graph import Graph
from .infer import ShapeError, TensorType, infer
from .node import Node
from .ops import Op, const_shape


class NodeEmitter(Emitter[int]):
    """Shared machinery of `Builder` and `Rewriter`: values are node ids; each emitted node gets
    its type inferred and carries the current provenance (`path`, `pass_name`, `absorbed`)."""

    def __init__(self, next_id: int = 0) -> None:
        self._created: dict[int, Node] = {}
        self._next = next_id
        self.path = ""
        self.pass_name = ""
        self.absorbed: tuple[int, ...] = ()

    def lookup(self, i: int) -> Node:
        """The node with id `i` (created here or pre-existing)."""
        return self._created[i]

    def shape_of(self, v: int) -> tuple[int, ...]:
        return self.lookup(v).shape

    def dtype_of(self, v: int) -> DType:
        return self.lookup(v).dtype

    def _add(self, op: Op, inputs: Sequence[int], t: TensorType, attrs: dict[str, Any]) -> int:
        i = self._next
        self._next += 1
        self._created[i] = Node(i, op, tuple(int(x) for x in inputs), tuple(t.shape), t.dtype, attrs,
                                self.path, self.pass_name, self.absorbed)
        return Ref(i)

    def emit(self, op: Op, inputs: Sequence[int], **attrs: Any) -> int:
        """Append `op(inputs)`; raises ShapeError (with the model path) when the types do not fit."""
        attrs = normalize_attrs(op, attrs)
        try:
            t = infer(op, attrs, [self.lookup(i).type for i in inputs])
        except ShapeError as e:
            where = f" at {self.path}" if self.path else ""
            raise ShapeError(f"{e}{where}") from None
        return self._add(op, inputs, t, attrs)

    def const(self, value: Scalar | Sequence[Scalar], dtype: DType = DType.f32) -> int:
        """A constant of any rank: a number, or (nested) sequences of numbers; raises ShapeError when ragged."""
        v: Any = _freeze(tuple(value) if isinstance(value, Sequence) else value)
        shape = const_shape(v)
        if shape is None:
            raise ShapeError(f"[const] ragged or non-numeric payload {v!r}")
        return self._add(Op.CONST, (), TensorType(shape, DType(dtype)), {"value": v})


class Builder(NodeEmitter):
    """Builds a `Graph` node by node; `scope` sets the model path recorded on each node.

    Example:
        >>> b = Builder("mlp")
        >>> x = b.input("x", (2, 8, 16))
        >>> with b.scope("fc"):
        ...     y = b.gelu(b.linear(x, b.param("fc.weight", (16, 32)), b.param("fc.bias", (32,))))
        >>> b.output(y); g = b.build(); g[y].path, g[y].shape
        ('fc', (2, 8, 32))
    """

    def __init__(self, name: str = "graph") -> None:
        super().__init__()
        self.name = name
        self._scopes: list[str] = []
        self._outputs: list[int] = []

    def lookup(self, i: int) -> Node:
        try:
            return self._created[i]
        except KeyError:
            raise ValueError(f"[Builder] %{i} is not a node of this builder") from None

    @contextmanager
    def scope(self, name: str | int) -> Iterator[None]:
        """Nodes emitted inside get `path` extended by `name` (e.g. `encoder.layer.3`)."""
        self._scopes.append(str(name))
        self.path = ".".join(self._scopes)
        try:
            yield
        finally:
            self._scopes.pop()
            self.path = ".".join(self._scopes)

    def input(self, name: str, shape: Sequence[int], dtype: DType | str = DType.f32) -> int:
        """A runtime-fed tensor, bound by `name` at execution."""
        return self._add(Op.INPUT, (), TensorType(tuple(int(d) for d in shape), DType(dtype)), {"name": name})

    def param(self, name: str, shape: Sequence[int], dtype: DType | str = DType.f32) -> int:
        """A weight, bound by `name` from the model's weight dict at execution."""
        return self._add(Op.PARAM, (), TensorType(tuple(int(d) for d in shape), DType(dtype)), {"name": name})

    def output(self, *ids: int) -> None:
        """Mark `ids` as graph outputs (in order)."""
        for i in ids:
            self.lookup(i)
        self._outputs.extend(int(i) for i in ids)

    def build(self) -> Graph:
        """The finished graph. Raises ValueError when no output was marked."""
        if not self._outputs:
            raise ValueError(f"[Builder] graph {self.name!r} has no outputs; call b.output(...)")
        return Graph(self._created.values(), self._outputs, self.name, self._next)
