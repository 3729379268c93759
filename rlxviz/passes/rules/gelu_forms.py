"""`canonicalize_gelu`: GELU written as primitives -> `gelu` (erf) / `gelu_tanh`.

* `canonicalize_gelu.erf`: `0.5 * x * (1 + erf(x / sqrt(2)))` (or `erf(x * 1/sqrt(2))`) -> `gelu(x)`.
* `canonicalize_gelu.tanh`: `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))` with `x^3` as
  `pow(x, 3)`, `x*x*x` or the factored `x * (1 + 0.044715 * x*x)` -> `gelu_tanh(x)`.

The outer product `0.5 * x * (1 + t)` is accepted in any association (`(0.5*x)*(1+t)`, `x*(0.5*(1+t))`,
`((1+t)*x)*0.5`, `x*(1+t)/2`, ...). Anchored on the `erf` / `tanh` node, so each chain is one candidate.
Validity: the constants equal the formula's to 1e-6 relative (guard `gelu_constants`, which names the
constant that differs); then the rewrite changes only rounding (tests compare with the reference on
random and large-magnitude inputs).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ...ir import Graph, Node, Op, Rewriter
from ..engine import rule_pass
from ..guard import ILLEGAL, Ctx, guard
from ..pattern import P, const_value, is_const
from ..rule import QUIET, Fail, Rule, reports

SQRT_HALF = 1.0 / math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
CUBIC = 0.044715


def _const(g: Graph, i: int) -> float | None:
    return const_value(g[i]) if is_const(g[i]) else None


def _split_const(g: Graph, n: Node) -> tuple[int, float] | None:
    """`(operand, constant)` of a binary op with one scalar-const operand."""
    a, b = n.inputs
    if _const(g, b) is not None and _const(g, a) is None:
        return a, _const(g, b)  # type: ignore[return-value]
    if _const(g, a) is not None and _const(g, b) is None:
        return b, _const(g, a)  # type: ignore[return-value]
    return None


def _is_cube(g: Graph, n: Node, x: int) -> bool:
    if n.op == Op.POW:
        return n.inputs[0] == x and _const(g, n.inputs[1]) == 3.0
    if n.op != Op.MUL:
        return False
    a, b = (g[i] for i in n.inputs)
    return (a.id == x and b.op == Op.MUL and b.inputs == (x, x)) or (b.id == x and a.op == Op.MUL
                                                                    and a.inputs == (x, x))


def _inner_nodes(g: Graph, n: Node, x: int) -> list[int]:
    """Ids of the nodes computing `x^3` / `x*x` below `n` (absorbed with the chain)."""
    out = []
    stack = [n.id]
    while stack:
        i = stack.pop()
        m = g[i]
        if i == x or m.op in (Op.CONST, Op.INPUT, Op.PARAM) or i in out:
            continue
        out.append(i)
        stack.extend(m.inputs)
    return out


@reports(reads=("fn",), binds=("arg", "x"))
def _erf_arg(c: Ctx) -> Fail | None:
    g, arg = c.graph, c.graph[c["fn"].inputs[0]]
    if arg.op not in (Op.MUL, Op.DIV):
        return QUIET
    sc = _split_const(g, arg)
    if sc is None or (arg.op == Op.DIV and sc[0] != arg.inputs[0]):  # x / k, not k / x
        return QUIET
    x, k = sc
    c.bindings.update(arg=arg.id, x=x)
    c.data["constants"] = [("1/sqrt(2)", k if arg.op == Op.MUL else 1.0 / k if k else math.inf, SQRT_HALF)]
    c.data["inner"] = [arg.id]
    return None


@reports(reads=("fn",), binds=("arg", "x"))
def _tanh_arg(c: Ctx) -> Fail | None:
    g, arg = c.graph, c.graph[c["fn"].inputs[0]]
    if arg.op != Op.MUL or (sc := _split_const(g, arg)) is None:
        return QUIET
    inner_id, k1 = sc
    inner = g[inner_id]
    consts = [("sqrt(2/pi)", k1, SQRT_2_OVER_PI)]
    if inner.op == Op.ADD:  # x + 0.044715 * x^3
        a, b = inner.inputs
        for x, term in ((a, g[b]), (b, g[a])):
            if term.op == Op.MUL and (tc := _split_const(g, term)) is not None and _is_cube(g, g[tc[0]], x):
                consts.append(("0.044715", tc[1], CUBIC))
                break
        else:
            return QUIET
    elif inner.op == Op.MUL:  # x * (1 + 0.044715 * x*x)
        a, b = inner.inputs
        for x, poly in ((a, g[b]), (b, g[a])):
            if poly.op != Op.ADD or (pc := _split_const(g, poly)) is None:
                continue
            term = g[pc[0]]
            if term.op == Op.MUL and (tc := _split_const(g, term)) is not None and g[tc[0]].op == Op.MUL \
                    and g[tc[0]].inputs == (x, x):
                consts += [("1", pc[1], 1.0), ("0.044715", tc[1], CUBIC)]
                break
        else:
            return QUIET
    else:
        return QUIET
    c.bindings.update(arg=arg.id, x=x)
    c.data["constants"] = consts
    c.data["inner"] = [arg.id, *_inner_nodes(g, inner, x)]
    return None


@reports(reads=("fn", "x"), binds=("one", "out"))
def _outer_product(c: Ctx) -> Fail | None:
    """Bind `one = 1 + fn` and the multiplications by `x` and `0.5` above it (any association)."""
    g, fn, x = c.graph, c.id("fn"), c.id("x")
    one = next((u for u in g.users(fn) if u.op == Op.ADD and _other_const(g, u, fn) is not None), None)
    if one is None:
        return QUIET
    c.bindings["one"] = one.id
    c.data["constants"].append(("1", _other_const(g, one, fn), 1.0))
    cur, have_x, half, muls = one.id, False, 1.0, []
    for _ in range(2):
        users = g.users(cur)
        if len(users) != 1 or users[0].op not in (Op.MUL, Op.DIV):
            break
        u = users[0]
        o = g[u.inputs[1] if u.inputs[0] == cur else u.inputs[0]]
        if u.op == Op.DIV:  # (...) / 2
            if u.inputs[0] != cur or not is_const(o) or not const_value(o):
                break
            half /= const_value(o)  # type: ignore[operator]
        elif o.id == x and not have_x:
            have_x = True
        elif is_const(o):
            half *= const_value(o) or 0.0
        elif o.op == Op.MUL and not have_x and (sc := _split_const(g, o)) is not None and sc[0] == x \
                and len(g.users(o.id)) == 1:
            have_x, half = True, half * sc[1]
            muls.append(o.id)
        else:
            break
        muls.append(u.id)
        cur = u.id
        if have_x and math.isclose(half, 0.5, rel_tol=1e-6):
            break
    if not have_x:
        return QUIET
    c.data["constants"].append(("0.5", half, 0.5))
    c.bindings["out"] = cur
    c.data["inner"] += muls
    return None


def _other_const(g: Graph, n: Node, i: int) -> float | None:
    a, b = n.inputs
    o = b if a == i else a
    return _const(g, o)


def _constants_ok(c: Ctx) -> bool:
    return all(math.isclose(have, want, rel_tol=1e-6) for _, have, want in c.data["constants"])


def _constants_explain(c: Ctx) -> str:
    bad = [f"{name} is {have:.9g}" for name, have, want in c.data["constants"]
           if not math.isclose(have, want, rel_tol=1e-6)]
    return f"{c.d('fn')} sits in a GELU-shaped chain but {', '.join(bad)}; needs the GELU constants to 1e-6"


_CONSTANTS = guard("gelu_constants", _constants_ok, _constants_explain,
                   "use the exact GELU constants (0.5, 1/sqrt(2) or sqrt(2/pi), 0.044715)", requires=("fn",),
                   kind=ILLEGAL)


_INNER = tuple(f"inner{k}" for k in range(8))


@reports(reads=("fn", "one", "out"), binds=("inner*",))
def _bind_inner(c: Ctx) -> Fail | None:
    """Bind the chain's other nodes as `inner0..` so the engine's `absorbed_escape` checks them too."""
    nodes = [i for i in dict.fromkeys(c.data["inner"]) if i not in (c.id("fn"), c.id("one"), c.id("out"))]
    if len(nodes) > len(_INNER):
        return QUIET
    c.bindings.update(zip(_INNER, nodes, strict=False))
    return None


def _rewrite(op: Op) -> Callable[[Ctx, Rewriter], int]:
    def rewrite(c: Ctx, rw: Rewriter) -> int:
        absorbed = [c.id(r) for r in ("fn", "one", *_INNER, "out") if r in c]
        with rw.provenance(absorbed):
            new = rw.emit(op, [c.id("x")])
        rw.remove([a for a in absorbed if a != c.id("out")])
        rw.replace(c.id("out"), new)
        return new
    return rewrite


ERF = Rule("canonicalize_gelu.erf", P(Op.ERF, name="fn"),
           steps=(_erf_arg, _outer_product, _bind_inner, _CONSTANTS),
           result="out", absorb=("fn", "one", *_INNER, "out"), rewrite=_rewrite(Op.GELU),
           doc="0.5 * x * (1 + erf(x / sqrt(2))) -> gelu")
TANH = Rule("canonicalize_gelu.tanh", P(Op.TANH, name="fn"),
            steps=(_tanh_arg, _outer_product, _bind_inner, _CONSTANTS),
            result="out", absorb=("fn", "one", *_INNER, "out"), rewrite=_rewrite(Op.GELU_TANH),
            doc="0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) -> gelu_tanh")

canonicalize_gelu = rule_pass("canonicalize_gelu", [ERF, TANH], "GELU written as primitives -> gelu / gelu_tanh")

__all__ = ["ERF", "TANH", "canonicalize_gelu"]
