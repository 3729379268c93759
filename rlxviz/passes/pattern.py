"""Declarative structural patterns with named captures: `P(Op.ADD, P(Op.MATMUL, name="mm"), P.var("bias"))`.

A pattern is matched against a node and its operands (producer direction). Names capture nodes;
a name used twice must bind the same node (that is how "q, k and v are narrows of the *same* qkv"
is written). On failure the matcher returns a `Miss` naming the role where the structure broke,
what was expected and what was found, so a rule can turn it into a `Rejection` (stage
`structure`). Style follows tinygrad's `UPat` (name-keyed captures) and TVM's DPL (alternatives).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..ir import Graph, Node, Op

Bindings = dict[str, int]


def describe(node: Node, role: str | None = None) -> str:
    """`h1 (node 41, encoder.layer.3...)` or, without a role, `layer_norm (node 41, encoder.layer.3...)`."""
    where = f", {node.path}" if node.path else ""
    return f"{role or node.op.value} (node {node.id}{where})"


def op_label(node: Node) -> str:
    """The op with its telling attribute, e.g. `FusedMatMulBiasAct(activation=None)`."""
    if node.op == Op.FUSED_MATMUL_BIAS_ACT:
        return f"{node.op.value}(activation={node.attrs.get('activation')})"
    if node.op == Op.ATTENTION:
        return f"attention(mask={node.attrs.get('mask')})"
    return node.op.value


@dataclass(frozen=True)
class Miss:
    """Where a structural match broke.

    Attributes:
        role: the pattern role (capture name, or `parent.inputs[i]`) that did not fit.
        node: id of the node found there (None if there was no node, e.g. missing operand).
        expected: what the pattern wanted, e.g. `narrow`.
        found: what was there, e.g. `add (node 12, encoder.layer.0.attention.self.query)`.
        bindings: captures bound before the failure.
        hint: the pattern's hint (e.g. which pass has to run first), if any.
    """

    role: str
    node: int | None
    expected: str
    found: str
    bindings: Bindings = field(default_factory=dict)
    hint: str = ""

    @property
    def message(self) -> str:
        return f"{self.role} is {self.found}; needs {self.expected}"


Check = Callable[[Node], bool]


class P:
    """A structural pattern node.

    Args:
        op: an `Op`, a set of ops, or None for any op.
        *inputs: operand patterns in order; omitted means "any operands".
        name: capture name (the role shown in messages and bindings).
        attrs: attribute constraints, `key -> value` or `key -> predicate(value)`.
        commutative: also try the two operands swapped (binary ops only).
        where: an extra structural predicate on the node.
        what: a description for messages (default: derived from op and attrs).
        hint: appended to a structural rejection at this node (e.g. "run fuse_matmul_bias_act first").

    Example:
        >>> p = P(Op.ADD, P(Op.MATMUL, P.var("x"), P.var("w"), name="mm"), P.var("bias"), name="add",
        ...       commutative=True)
    """

    __slots__ = ("ops", "inputs", "name", "attrs", "commutative", "where", "what", "hint", "alts")

    def __init__(self, op: Op | Iterable[Op] | None = None, *inputs: P, name: str | None = None,
                 attrs: Mapping[str, Any] | None = None, commutative: bool = False, where: Check | None = None,
                 what: str = "", hint: str = "", alts: tuple[P, ...] = ()) -> None:
        self.ops: frozenset[Op] | None = (None if op is None else frozenset({op}) if isinstance(op, Op)
                                          else frozenset(op))
        self.inputs: tuple[P, ...] | None = tuple(inputs) if inputs else None
        self.name = name
        self.attrs = dict(attrs or {})
        self.commutative = commutative
        self.where = where
        self.what = what
        self.hint = hint
        self.alts = alts

    @staticmethod
    def var(name: str, where: Check | None = None, what: str = "") -> P:
        """A wildcard capturing any node as `name` (optionally constrained by `where`)."""
        return P(None, name=name, where=where, what=what)

    def __or__(self, other: P) -> P:
        """Alternatives, tried left to right: `P(Op.DIV, ...) | P(Op.MUL, ...)`."""
        left = self.alts if self.alts and self.ops is None and self.name is None else (self,)
        right = other.alts if other.alts and other.ops is None and other.name is None else (other,)
        return P(None, alts=(*left, *right))

    def describe(self) -> str:
        if self.what:
            return self.what
        if self.alts:
            return " or ".join(a.describe() for a in self.alts)
        if self.ops is None:
            return "any node"
        ops = sorted(o.value for o in self.ops)
        base = ops[0] if len(ops) == 1 else "one of {" + ", ".join(ops) + "}"
        fixed = [f"{k}={v!r}" for k, v in self.attrs.items() if not callable(v)]
        return f"{base}({', '.join(fixed)})" if fixed else base

    def roles(self) -> list[str]:
        """All capture names in this pattern (pre-order)."""
        out = [self.name] if self.name else []
        for p in (*self.alts, *(self.inputs or ())):
            out += [r for r in p.roles() if r not in out]
        return out

    def match(self, graph: Graph, node_id: int, bindings: Bindings | None = None,
              role: str | None = None) -> Bindings | Miss:
        """Match at `node_id`; returns the extended bindings or the first `Miss`."""
        return _match(self, graph, node_id, dict(bindings or {}), role or self.name or "anchor")


def _attr_ok(want: Any, have: Any) -> bool:
    return want(have) if callable(want) else want == have


def _match(p: P, g: Graph, nid: int, b: Bindings, role: str) -> Bindings | Miss:
    node = g[nid]
    here = p.name or role
    if p.alts:
        first: Miss | None = None
        for alt in p.alts:
            r = _match(alt, g, nid, b, role)
            if not isinstance(r, Miss):
                return r
            first = first or r
        assert first is not None
        # report the alternatives together when they all failed at the root
        if first.node == nid:
            return Miss(here, nid, p.describe(), op_label(node) + f" (node {nid})", b, first.hint)
        return first
    if p.name and p.name in b and b[p.name] != nid:
        other = g[b[p.name]]
        return Miss(here, nid, f"the same node as {p.name} ({describe(other)})", describe(node), b, p.hint)
    if p.ops is not None and node.op not in p.ops:
        return Miss(here, nid, p.describe(), describe(node, op_label(node)), b, p.hint)
    for k, want in p.attrs.items():
        if not _attr_ok(want, node.attrs.get(k)):
            return Miss(here, nid, p.describe(), describe(node, f"{op_label(node)} with {k}={node.attrs.get(k)!r}"),
                        b, p.hint)
    if p.where is not None and not p.where(node):
        return Miss(here, nid, p.describe(), describe(node, op_label(node)), b, p.hint)
    if p.name:
        b = {**b, p.name: nid}
    if p.inputs is None:
        return b
    if len(p.inputs) != len(node.inputs):
        return Miss(here, nid, f"{p.describe()} with {len(p.inputs)} operands",
                    describe(node, f"{op_label(node)} with {len(node.inputs)} operands"), b, p.hint)
    orders = [node.inputs]
    if p.commutative and len(node.inputs) == 2:
        orders.append(node.inputs[::-1])
    first_miss: Miss | None = None
    for ins in orders:
        cur: Bindings | Miss = b
        for i, (sub, x) in enumerate(zip(p.inputs, ins, strict=True)):
            cur = _match(sub, g, x, cur, f"{here}.inputs[{i}]")
            if isinstance(cur, Miss):
                break
        if not isinstance(cur, Miss):
            return cur
        first_miss = first_miss or cur
    assert first_miss is not None
    return first_miss


def is_const(node: Node) -> bool:
    """A scalar or 1-element constant."""
    return node.op == Op.CONST and not isinstance(node.attrs.get("value"), tuple)


def const_value(node: Node) -> float | None:
    """The scalar payload of a const node, else None."""
    v = node.attrs.get("value")
    return float(v) if node.op == Op.CONST and isinstance(v, int | float) else None


__all__ = ["Bindings", "Miss", "P", "const_value", "describe", "is_const", "op_label"]
