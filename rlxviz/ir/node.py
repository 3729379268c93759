"""Immutable IR nodes.

A node has one output tensor (RLX `Node`, docs/rlx.md §1.1). Nodes are frozen: a pass builds new
nodes instead of mutating old ones, so every graph version stays a valid snapshot. A node's attributes are a
`FrozenAttrs` (an immutable, hashable dict), so a node, and a graph (`Graph.digest`), has a content identity.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, NoReturn

from .dtype import DType
from .infer import TensorType
from .ops import Op


def _frozen(v: Any) -> Any:
    """`v` with every list (at any depth) turned into a tuple: the one form of a sequence attribute."""
    if isinstance(v, list) or (isinstance(v, tuple) and any(isinstance(x, list | tuple) for x in v)):
        return tuple(_frozen(x) for x in v)
    return v


class FrozenAttrs(dict[str, Any]):
    """A node's attributes: a `dict` that cannot change (assignment, `del`, `update`, `pop`, `clear`,
    `setdefault`, `|=` raise `TypeError`), hashable, with list values (at any depth) stored as tuples.

    Reads are a dict's (`attrs["k"]`, `.get`, `in`, iteration, `dict(attrs)`, `{**attrs}`, `json.dumps`), and it
    compares equal to a plain dict with the same items. To change an attribute build a new node:
    `node.with_attrs(k=v)`. Raises `TypeError` from `hash` when a value is unhashable (not an IR value).
    """

    __slots__ = ("_hash",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        dict.__init__(self, *args, **kwargs)
        for k, v in dict.items(self):
            if isinstance(v, list | tuple):
                dict.__setitem__(self, k, _frozen(v))
        self._hash: int | None = None

    def _immutable(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("node attributes are immutable: build a new node (node.with_attrs(k=v) or "
                        "node.replace(attrs=...))")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = __ior__ = _immutable  # type: ignore

    def __hash__(self) -> int:  # type: ignore[override]
        if self._hash is None:
            self._hash = hash(frozenset(dict.items(self)))
        return self._hash

    def __reduce__(self) -> tuple[Any, ...]:  # pickle, copy and deepcopy rebuild it instead of assigning items
        return (FrozenAttrs, (dict(self),))

    def __copy__(self) -> FrozenAttrs:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenAttrs:
        return self

    def __repr__(self) -> str:
        return dict.__repr__(self)


EMPTY_ATTRS = FrozenAttrs()


@dataclass(frozen=True, slots=True, eq=True)
class Node:
    """One operation in a graph.

    Attributes:
        id: stable integer id, unique within a graph and never reused across its versions.
        op: the operation.
        inputs: operand node ids, in the order the op defines (see `ops.operand_roles`).
        shape: static output shape, e.g. `(batch, seq, hidden)`.
        dtype: output element type.
        attrs: op attributes, a `FrozenAttrs` (any mapping given is copied into one, lists becoming tuples);
            values are int, float, str, bool, None or tuples of those. Immutable: `with_attrs` builds a new node.
        path: provenance — the model path the node came from, e.g. `encoder.layer.3.attention.self.query`.
        pass_name: the pass that created the node (`""` for nodes built by a model builder).
        absorbed: for a node created by a rewrite, ids of the original nodes it replaced.
    """

    id: int
    op: Op
    inputs: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: DType
    attrs: FrozenAttrs = EMPTY_ATTRS
    path: str = ""
    pass_name: str = ""
    absorbed: tuple[int, ...] = ()
    _line: str | None = field(default=None, init=False, repr=False, compare=False)
    """The node's IR line, made once by `printer.format_node` (a node never changes, so neither does its line)."""

    def __post_init__(self) -> None:
        if type(self.attrs) is not FrozenAttrs:
            object.__setattr__(self, "attrs", FrozenAttrs(self.attrs))

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
    def is_mask_input(self) -> bool:
        """An attention-mask graph input: an input of rank 2 or more whose name contains `mask` (`attention_mask`,
        `encoder_attention_mask`), as models and exporters name it."""
        return self.op == Op.INPUT and self.rank >= 2 and "mask" in str(self.attrs.get("name", "")).lower()

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

    def with_attrs(self, **changes: Any) -> Node:
        """A copy whose attributes are this node's with `changes` over them (the way to change an attribute)."""
        return replace(self, attrs=FrozenAttrs({**self.attrs, **changes}))
