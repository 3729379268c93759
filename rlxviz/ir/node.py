"""Immutable IR nodes.

A node has one output tensor (RLX `Node`, docs/rlx.md §1.1). Nodes are frozen: a pass builds new
nodes instead of mutating old ones, so every graph version stays a valid snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .dtype import DType
from .infer import TensorType
from .ops import Op


@dataclass(frozen=True, slots=True, eq=True)
class Node:
    """One operation in a graph.

    Attributes:
        id: stable integer id, unique within a graph and never reused across its versions.
        op: the operation.
        inputs: operand node ids, in the order the op defines (see `ops.operand_roles`).
        shape: static output shape, e.g. `(batch, seq, hidden)`.
        dtype: output element type.
        attrs: op attributes; values are int, float, str, bool, None or tuples of those. Treat as read-only.
        path: provenance — the model path the node came from, e.g. `encoder.layer.3.attention.self.query`.
        pass_name: the pass that created the node (`""` for nodes built by a model builder).
        absorbed: for a node created by a rewrite, ids of the original nodes it replaced.
    """

    id: int
    op: Op
    inputs: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: DType
    attrs: dict[str, Any] = field(default_factory=dict)
    path: str = ""
    pass_name: str = ""
    absorbed: tuple[int, ...] = ()

    @property
    def type(self) -> TensorType:
        return TensorType(self.shape, self.dtype)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def name(self) -> str | None:
        """The binding name of an input or param (`None` for other ops)."""
        return self.attrs.get("name") if self.op in (Op.INPUT, Op.PARAM) else None

    @property
    def nbytes(self) -> int:
        """Size of the output tensor in bytes."""
        n = 1
        for d in self.shape:
            n *= d
        return n * self.dtype.itemsize

    def replace(self, **changes: Any) -> Node:
        """A copy with `changes` applied (dataclasses.replace)."""
        return replace(self, **changes)
