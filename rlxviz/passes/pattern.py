"""Declarative structural patterns with named captures: `P(Op.ADD, P(Op.MATMUL, name="mm"), P.var("bias"))`.

A pattern is matched against a node and its operands (producer direction). Names capture nodes;
a name used twice must bind the same node (that is how "q, k and v are narrows of the *same* qkv"
is written). On failure the matcher returns a `Miss` naming the role where the structure broke,
what was expected and what was found, so a rule can turn it into a `Rejection` (stage
`structure`). Style follows tinygrad's `UPat` (name-keyed captures) and TVM's DPL (alternatives).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..ir import DType, Graph, Node, Op
from ..ir.ops import SPECS

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
    if node.op == Op.FUSED_SWIGLU and node.attrs.get("activation", "silu") != "silu":  # GeGLU
        return f"{node.op.value}(activation={node.attrs.get('activation')})"
    return node.op.value


@dataclass(frozen=True)
class Miss:
    """Where a structural match broke: the deepest partial match.

    Of all the ways the pattern (with its alternatives) was tried, the one that got furthest from
    the root is reported: the deepest node it reached (`parent`), the operand edge that failed
    (`operand`), what was found at the end of that edge and what the pattern needed *at that depth*
    (alternatives failing at the same edge are merged and deduplicated).

    Attributes:
        role: the pattern role that did not fit: its capture name, or `parent_role.inputs[i]`.
        node: id of the node found there (None if there was no node).
        expected: what the pattern needed there, alternatives joined by " or ", e.g. `div or mul or matmul`.
        found: what was there, e.g. `add (node 12, encoder.layer.0.attention.self.query)`.
        bindings: captures bound before the failure (along the deepest attempt).
        hint: the pattern's hint (e.g. which pass has to run first), if any.
        depth: pattern edges from the root to `node` (0: the root itself did not fit).
        parent: id of the deepest node that matched, whose operand `operand` failed (None at the root).
        parent_role: that node's role, e.g. `k_t`.
        operand: index of the failing operand of `parent`.
        needed: the deduplicated alternatives behind `expected`.
        found_op: the found op as compared with `needed`, e.g. `mul` or `softmax with axis=1`.
    """

    role: str
    node: int | None
    expected: str
    found: str
    bindings: Bindings = field(default_factory=dict)
    hint: str = ""
    depth: int = 0
    parent: int | None = None
    parent_role: str = ""
    operand: int | None = None
    needed: tuple[str, ...] = ()
    found_op: str = ""
    others: tuple[Miss, ...] = ()
    """The deepest alternative that failed at another edge (at most one): another reading of the graph."""

    @property
    def edge(self) -> str:
        """`k_t.inputs[0]` (the failing operand edge), or the role at the root."""
        return f"{self.parent_role}.inputs[{self.operand}]" if self.parent is not None else self.role

    @property
    def message(self) -> str:
        return f"{where(self)} is {self.found}; needs {self.expected}" + also_read(self)


def also_read(m: Miss) -> str:
    """` (read another way: ...)` for the shallower alternatives, or empty."""
    return "".join(f" (read another way: {where(o)} is {o.found}; needs {o.expected})" for o in m.others)


def where(m: Miss, label: Callable[[str], str] = lambda r: r) -> str:
    """`k_t (node 28).inputs[0] (k_heads)`: the failing edge, with the role it was to bind."""
    if m.parent is None:
        return label(m.role)
    own = m.role if not m.role.startswith(f"{m.parent_role}.inputs[") else ""
    tail = f" ({label(own)})" if own else ""
    return f"{label(m.parent_role)} (node {m.parent}).inputs[{m.operand}]{tail}"


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

    Raises:
        RuleError: `op` is not an `Op` (a string such as `"add"` would be read as its letters), an operand is not
            a `P`, or an `attrs` key is an attribute of none of the pattern's ops (`ir.ops.SPECS`): a misspelt
            attribute would make the pattern never match, silently, since anchors are quiet.

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
        _check_spelling(self.ops, op, inputs, attrs or {})
        self.inputs: tuple[P, ...] | None = tuple(inputs) if inputs else None
        self.name = name
        self.attrs = dict(attrs or {})
        self.commutative = commutative
        self.where = where
        self.what = what
        self.hint = hint
        self.alts = alts

    @staticmethod
    def var(name: str, where: Check | None = None, what: str = "", hint: str = "") -> P:
        """A wildcard capturing any node as `name` (optionally constrained by `where`); `hint`: what to do when it
        meets another node than the one `name` is already bound to (a rule's general hint does not say it)."""
        return P(None, name=name, where=where, what=what, hint=hint)

    def __or__(self, other: P) -> P:
        """Alternatives, tried left to right: `P(Op.DIV, ...) | P(Op.MUL, ...)`."""
        left = self.alts if self.alts and self.ops is None and self.name is None else (self,)
        right = other.alts if other.alts and other.ops is None and other.name is None else (other,)
        return P(None, alts=(*left, *right))

    def describe(self) -> str:
        if self.what:
            return self.what
        if self.alts:
            return " or ".join(dict.fromkeys(a.describe() for a in self.alts))
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
        """Match at `node_id`; returns the extended bindings or the deepest `Miss`."""
        return _match(self, graph, node_id, dict(bindings or {}), role or self.name or "anchor", _Edge())


class RuleError(ValueError):
    """A rule is malformed: a guard reads a role its pattern does not bind, an unknown kind, a pattern attribute
    its op does not have, ... (raised when the rule module is imported; re-exported by `passes.guard`)."""


def _check_spelling(ops: frozenset[Any] | None, op: Any, inputs: tuple[Any, ...], attrs: Mapping[str, Any]) -> None:
    """`P.__init__`'s checks (see there)."""
    bad = [o for o in (ops or ()) if not isinstance(o, Op)]
    if bad:
        near = difflib.get_close_matches(str(bad[0]), [o.value for o in Op], n=2)
        guess = f"; did you mean {' or '.join(f'Op({n!r})' for n in near)}?" if near else ""
        raise RuleError(f"[P] op {op!r} is not an Op (write Op.ADD, not a string){guess}")
    if any(not isinstance(i, P) for i in inputs):
        raise RuleError(f"[P] operands must be patterns (P(...), P.var(name)); got {inputs!r}")
    if ops and attrs:
        known = {k for o in ops for k in (SPECS[o].attrs if o in SPECS else ())}
        if all(o in SPECS for o in ops):
            for k in attrs:
                if k not in known:
                    near = difflib.get_close_matches(k, sorted(known), n=2)
                    guess = f"; did you mean {' or '.join(map(repr, near))}?" if near else ""
                    raise RuleError(f"[P] attribute {k!r} is not an attribute of "
                                       f"{', '.join(sorted(o.value for o in ops))} (attributes: "
                                       f"{', '.join(sorted(known)) or 'none'}){guess}")


@dataclass(frozen=True)
class _Edge:
    """How the matcher reached a node: depth, and the user node / role / operand index it came from."""

    depth: int = 0
    parent: int | None = None
    parent_role: str = ""
    operand: int | None = None


def _attr_ok(want: Any, have: Any) -> bool:
    return want(have) if callable(want) else want == have


SAME_NODE = "the same node as "
"""How a `Miss` words a capture bound to one node that met another (`Miss.expected` starts with it)."""


def _miss(e: _Edge, role: str, nid: int, needed: str, found_op: str, found: str, b: Bindings, hint: str) -> Miss:
    return Miss(role, nid, needed, found, b, hint, e.depth, e.parent, e.parent_role, e.operand, (needed,), found_op)


def _deepest(misses: list[Miss]) -> Miss:
    """The miss that got furthest; alternatives failing at that same edge are merged (deduplicated)."""
    best = max(misses, key=lambda m: m.depth)  # first of the deepest
    same = [m for m in misses if (m.depth, m.node, m.parent, m.operand) == (best.depth, best.node, best.parent,
                                                                            best.operand)]
    needed = tuple(dict.fromkeys(n for m in same for n in m.needed))
    hint = next((m.hint for m in same if m.hint), "")
    role = best.role
    if len({m.role for m in same}) > 1:  # alternatives with different capture names: name the edge only
        role = f"{best.parent_role}.inputs[{best.operand}]" if best.parent is not None else best.role
    rest = _merged([m for m in misses if all(m is not s for s in same) and m.depth >= 1])
    others = sorted([*best.others, *(replace(m, others=()) for m in rest)], key=lambda m: -m.depth)
    return replace(best, role=role, needed=needed, expected=" or ".join(needed), hint=hint, others=tuple(others[:1]))


def _merged(misses: list[Miss]) -> list[Miss]:
    """Misses at the same edge merged into one (needed deduplicated), deepest first."""
    out: dict[tuple, Miss] = {}
    for m in sorted(misses, key=lambda m: -m.depth):
        key = (m.depth, m.node, m.parent, m.operand)
        if key in out:
            needed = tuple(dict.fromkeys((*out[key].needed, *m.needed)))
            role = out[key].role if out[key].role == m.role else f"{m.parent_role}.inputs[{m.operand}]"
            out[key] = replace(out[key], role=role, needed=needed, expected=" or ".join(needed))
        else:
            out[key] = m
    return list(out.values())


def _match(p: P, g: Graph, nid: int, b: Bindings, role: str, e: _Edge) -> Bindings | Miss:
    node = g[nid]
    here = p.name or role
    if p.alts:
        misses: list[Miss] = []
        for alt in p.alts:
            r = _match(alt, g, nid, b, role, e)
            if not isinstance(r, Miss):
                return r
            misses.append(r)
        return _deepest(misses)
    if p.name and p.name in b and b[p.name] != nid:
        other = g[b[p.name]]
        return _miss(e, here, nid, f"{SAME_NODE}{p.name} ({describe(other)})", op_label(node),
                     describe(node), b, p.hint)
    if p.ops is not None and node.op not in p.ops:
        return _miss(e, here, nid, p.describe(), op_label(node), describe(node, op_label(node)), b, p.hint)
    for k, want in p.attrs.items():
        have = node.attrs.get(k)
        if not _attr_ok(want, have):
            need = p.what or (p.describe() if not callable(want) else f"{_ops_text(p)} with an allowed {k}")
            found_op = f"{node.op.value}({k}={have!r})"
            return _miss(e, here, nid, need, found_op, describe(node, found_op), b, p.hint)
    if p.where is not None and not p.where(node):
        need = p.what or f"{_ops_text(p)} ({getattr(p.where, '__doc__', None) or 'a further condition'})"
        found_op = op_label(node) if p.what else f"{op_label(node)} (not meeting it)"
        return _miss(e, here, nid, need, found_op, describe(node, found_op), b, p.hint)
    if p.name:
        b = {**b, p.name: nid}
    if p.inputs is None:
        return b
    if len(p.inputs) != len(node.inputs):
        found_op = f"{op_label(node)} with {len(node.inputs)} operands"
        return _miss(e, here, nid, f"{p.describe()} with {len(p.inputs)} operands", found_op,
                     describe(node, found_op), b, p.hint)
    orders = [node.inputs]
    if p.commutative and len(node.inputs) == 2:
        orders.append(node.inputs[::-1])
    misses = []
    for ins in orders:
        cur: Bindings | Miss = b
        for i, (sub, x) in enumerate(zip(p.inputs, ins, strict=True)):
            k = i if ins is node.inputs else len(ins) - 1 - i  # the operand index in the node
            cur = _match(sub, g, x, cur, f"{here}.inputs[{k}]", _Edge(e.depth + 1, nid, here, k))
            if isinstance(cur, Miss):
                break
        if not isinstance(cur, Miss):
            return cur
        misses.append(cur)
    return _deepest(misses)


def _ops_text(p: P) -> str:
    if p.ops is None:
        return "any node"
    ops = sorted(o.value for o in p.ops)
    return ops[0] if len(ops) == 1 else "one of {" + ", ".join(ops) + "}"


def is_const(node: Node) -> bool:
    """A scalar or 1-element constant."""
    return node.op == Op.CONST and not isinstance(node.attrs.get("value"), tuple)


def const_value(node: Node) -> float | None:
    """The scalar payload of a const node as its dtype holds it (what the executors compute with: a
    `bool` const of 4.0 is 1.0, an f16 const of 1e-8 is 0.0), else None."""
    v = node.attrs.get("value")
    if node.op != Op.CONST or not isinstance(v, int | float):
        return None
    if node.dtype in (DType.f32, DType.f64, DType.bf16) and not isinstance(v, bool):
        return float(v)  # computed at (at least) f32: the payload as written, as guard messages quote it
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            return float(np.asarray(v).astype(node.dtype.numpy))
    except (OverflowError, TypeError, ValueError):  # not representable at all: no usable value
        return None


__all__ = ["Bindings", "Miss", "P", "RuleError", "also_read", "const_value", "describe", "is_const", "op_label",
           "where"]
