"""`canonicalize_gelu`: GELU written as primitives -> `gelu` (erf) / `gelu_tanh`.

* `canonicalize_gelu.erf`: `0.5 * x * (1 + erf(x / sqrt(2)))` (or `erf(x * 1/sqrt(2))`) -> `gelu(x)`.
* `canonicalize_gelu.tanh`: `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))` -> `gelu_tanh(x)`, the
  tanh's argument read as a polynomial in `x` (`polynomial`), so every association and factoring is one form:
  `pow(x, 3)`, `x*x*x`, the factored `x * (1 + 0.044715 * x*x)`, BLOOM's `(0.79788456 * x) * (1 + 0.044715 * x *
  x)`, FastGELU's `x * 0.7978845608 * (1 + 0.044715 * x * x)`, the distributed `k * x + k * 0.044715 * x^3`.

* `canonicalize_gelu.sigmoid`: the same GELU through `0.5 * (1 + tanh(z)) == sigmoid(2z)`: `x * sigmoid(2 *
  sqrt(2/pi) * (x + 0.044715 * x^3))` (the argument read as for tanh) -> `gelu_tanh(x)`.

The outer product `0.5 * x * (1 + t)` is accepted in any association (`(0.5*x)*(1+t)`, `x*(0.5*(1+t))`,
`((1+t)*x)*0.5`, `x*(1+t)/2`, ...). Anchored on the `erf` / `tanh` node, so each chain is one candidate.
Validity: the constants equal the formula's to 1e-6 relative, or, in a chain computed in float16 / bfloat16
(the erf / tanh / sigmoid node's dtype), to that dtype's machine epsilon (2^-10 / 2^-7): exporters write the
constants as the dtype rounds them (sqrt(2) as 1.4140625, sqrt(2/pi) as 0.79785, 0.044715 as 0.044708), each
within half an ulp, a product or ratio of two within one (guard `gelu_constants`, which names the
constant that differs; for tanh the argument's x coefficient is sqrt(2/pi), its x^3 coefficient over it 0.044715, and
every other power has coefficient 0); then the rewrite changes only rounding: the same real function, evaluated
in another order (BLOOM's 0.79788456 is sqrt(2/pi) to 1e-8; float32 holds both as the same number). No written
form is bit-exact against the op: the NumPy reference evaluates `gelu_tanh` partly in float64, MLX's kernel in its
own order (the sigmoid form also rounds `sigmoid(2z)` where the op rounds `0.5 * (1 + tanh(z))`). Measured
(2026-12-02, `tests/test_forms.py::test_tanh_gelu_forms_become_gelu_tanh_within_the_stated_bound`, 7 argument
forms x 5 outer products (3 tanh, 2 sigmoid), x in [-12, 12], N(0, 1) and N(0, 1e3)): largest |diff| / max(1, |y|)
1.5e-7 on the reference and 1.8e-7 on MLX (about 1.5 float32 ulps); no form is bit-exact on every input (equal
only where the GELU saturates); the test asserts 5e-7. In half precision the op computes with the exact constants
where the chain used rounded ones: the argument moves by at most one ulp of the dtype, which the chain's own
rounding (about 6 roundings to that dtype) already exceeds; `tests/test_epilogue_forms.py` judges f16 forms with
the f16 precision policy.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ...ir import DType, Graph, Node, Op, Rewriter
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


_POLY_OPS = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.NEG, Op.POW})
MAX_DEGREE = 5


def _subtree(g: Graph, root: int, limit: int = 16) -> list[int]:
    """Ids of the arithmetic nodes (`_POLY_OPS`) under `root`, `root` first, at most `limit` (breadth first)."""
    out, todo = [], [root]
    while todo and len(out) < limit:
        i = todo.pop(0)
        if i in out or g[i].op not in _POLY_OPS:
            continue
        out.append(i)
        todo.extend(g[i].inputs)
    return out


def polynomial(g: Graph, root: int, x: int) -> dict[int, float] | None:
    """The tanh argument `root` as a polynomial in node `x`, `{power: coefficient}`, or None when it is not one.

    Reads add, sub, neg, mul, pow by a constant integer 0..5, and div by a scalar constant, over `x` and scalar
    constants; any other leaf, a degree above `MAX_DEGREE` or a division by a non-constant returns None. Exact in
    the algebra of reals: the coefficients are the products and sums of the graph's constants (in float64)."""
    memo: dict[int, dict[int, float] | None] = {}

    def mul(a: dict[int, float], b: dict[int, float]) -> dict[int, float] | None:
        out: dict[int, float] = {}
        for pa, ca in a.items():
            for pb, cb in b.items():
                if pa + pb > MAX_DEGREE:
                    return None
                out[pa + pb] = out.get(pa + pb, 0.0) + ca * cb
        return out

    def walk(i: int, depth: int) -> dict[int, float] | None:
        if i in memo:
            return memo[i]
        n, res = g[i], None
        if i == x:
            res = {1: 1.0}
        elif (k := _const(g, i)) is not None:
            res = {0: float(k)}
        elif depth < 12 and n.op in _POLY_OPS:
            ps = [walk(j, depth + 1) for j in n.inputs]
            if all(p is not None for p in ps):
                a = ps[0]
                b = ps[1] if len(ps) > 1 else None
                if n.op == Op.NEG:
                    res = {p: -c for p, c in a.items()}
                elif n.op in (Op.ADD, Op.SUB):
                    sign = 1.0 if n.op == Op.ADD else -1.0
                    res = dict(a)
                    for p, c in b.items():
                        res[p] = res.get(p, 0.0) + sign * c
                elif n.op == Op.MUL:
                    res = mul(a, b)
                elif n.op == Op.DIV and set(b) == {0} and b[0]:
                    res = {p: c / b[0] for p, c in a.items()}
                elif n.op == Op.POW and set(b) == {0} and float(b[0]).is_integer() and 0 <= b[0] <= MAX_DEGREE:
                    res = {0: 1.0}
                    for _ in range(int(b[0])):
                        res = mul(res, a) if res is not None else None
        memo[i] = res
        return res

    return walk(root, 0)


def _cubic_arg(factor: float, name: str) -> Callable[[Ctx], Fail | None]:
    """The step reading the tanh's (`factor` 1) or the sigmoid's (`factor` 2: `0.5 * (1 + tanh(z)) == sigmoid(2z)`)
    argument as a polynomial `a1 * x + a3 * x^3` in some node `x` read at least twice under it (the nearest such
    node that makes the argument a polynomial): every association and factoring exporters write, `sqrt(2/pi) * (x +
    0.044715 * x^3)`, BLOOM's `(0.79788456 * x) * (1 + 0.044715 * x * x)`, `x * k * (1 + ...)`, the distributed `k *
    x + k * 0.044715 * x^3`, `pow(x, 3)` or `x*x*x`. The constants checked are a1 (as `factor * sqrt(2/pi)`, shown
    as `name`) and a3 / a1 (as 0.044715); any other power must have coefficient 0, and a3 must not be 0 (a sigmoid
    of `k * x` alone is the swish family, `activations.py`)."""

    @reports(reads=("fn",), binds=("arg", "x"))
    def step(c: Ctx) -> Fail | None:
        g, arg = c.graph, c.graph[c["fn"].inputs[0]]
        if arg.op not in _POLY_OPS:
            return QUIET
        nodes = _subtree(g, arg.id)
        reads: dict[int, int] = {}
        for i in nodes:
            for j in g[i].inputs:
                reads[j] = reads.get(j, 0) + 1
        for x in (j for j in dict.fromkeys(j for i in nodes for j in g[i].inputs) if reads[j] >= 2):
            if _const(g, x) is not None or (poly := polynomial(g, arg.id, x)) is None:
                continue
            a1, a3 = poly.get(1, 0.0), poly.get(3, 0.0)
            if not a1 or not a3 or any(abs(v) > 1e-12 * abs(a1) for p, v in poly.items() if p not in (1, 3)):
                continue
            c.bindings.update(arg=arg.id, x=x)
            c.data["constants"] = [(name, a1, factor * SQRT_2_OVER_PI), ("0.044715", a3 / a1, CUBIC)]
            c.data["inner"] = [arg.id, *_inner_nodes(g, arg, x)]
            return None
        return QUIET

    step.__name__ = f"_{name}_arg"
    return step


@reports(reads=("fn", "x"), binds=("out",))
def _times_x(c: Ctx) -> Fail | None:
    """Bind `out = x * sigmoid(...)` (either operand order), the sigmoid's one reader."""
    g, fn, x = c.graph, c.id("fn"), c.id("x")
    users = g.users(fn)
    if len(users) != 1 or users[0].op != Op.MUL or set(users[0].inputs) != {fn, x}:
        return QUIET
    c.bindings["out"] = users[0].id
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


HALF_EPS: dict[DType, float] = {DType.f16: 2.0 ** -10, DType.bf16: 2.0 ** -7}
"""Machine epsilon of the half-precision dtypes: the tolerance of a GELU constant in a chain computed in one
(a constant rounded to the dtype is within eps/2 of the formula's; a product or ratio of two, within eps)."""


def _rel_tol(c: Ctx) -> float:
    """1e-6, or the machine epsilon of the chain's dtype (the erf / tanh / sigmoid node's) when it is f16 / bf16."""
    return max(1e-6, HALF_EPS.get(c["fn"].dtype, 0.0))


def _constants_ok(c: Ctx) -> bool:
    tol = _rel_tol(c)
    return all(math.isclose(have, want, rel_tol=tol) for _, have, want in c.data["constants"])


def _constants_explain(c: Ctx) -> str:
    tol = _rel_tol(c)
    bad = [f"{name} is {have:.9g}" for name, have, want in c.data["constants"]
           if not math.isclose(have, want, rel_tol=tol)]
    within = "to 1e-6" if tol == 1e-6 else f"to {tol:.3g} (the rounding of {c['fn'].dtype})"
    return f"{c.d('fn')} sits in a GELU-shaped chain but {', '.join(bad)}; needs the GELU constants {within}"


_CONSTANTS = guard("gelu_constants", _constants_ok, _constants_explain,
                   "use the exact GELU constants (0.5, 1/sqrt(2) or sqrt(2/pi), 0.044715)", requires=("fn",),
                   kind=ILLEGAL,
                   fix="GELU with the model's own constants as an op (and its fused epilogue): with other "
                       "constants it is another activation than GELU",
                   no_model_fix=lambda c: "the model's constants are part of what it computes: writing GELU's "
                                          "exact ones changes its numbers")


_INNER = tuple(f"inner{k}" for k in range(12))


@reports(reads=("fn", "out"), binds=("inner*",), optional=("one",))
def _bind_inner(c: Ctx) -> Fail | None:
    """Bind the chain's other nodes as `inner0..` so the engine's `absorbed_escape` checks them too."""
    named = {c.id(r) for r in ("fn", "one", "out") if r in c}
    nodes = [i for i in dict.fromkeys(c.data["inner"]) if i not in named]
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
           doc="0.5 * x * (1 + erf(x / sqrt(2))) -> gelu", form="gelu")
TANH = Rule("canonicalize_gelu.tanh", P(Op.TANH, name="fn"),
            steps=(_cubic_arg(1.0, "sqrt(2/pi)"), _outer_product, _bind_inner, _CONSTANTS),
            result="out", absorb=("fn", "one", *_INNER, "out"), rewrite=_rewrite(Op.GELU_TANH),
            doc="0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))) -> gelu_tanh", form="gelu_tanh")

SIGMOID = Rule("canonicalize_gelu.sigmoid", P(Op.SIGMOID, name="fn"),
               steps=(_cubic_arg(2.0, "2*sqrt(2/pi)"), _times_x, _bind_inner, _CONSTANTS),
               result="out", absorb=("fn", *_INNER, "out"), rewrite=_rewrite(Op.GELU_TANH),
               doc="x * sigmoid(2 sqrt(2/pi) * (x + 0.044715 x^3)) -> gelu_tanh", form="gelu_tanh")

canonicalize_gelu = rule_pass("canonicalize_gelu", [ERF, TANH, SIGMOID],
                              "GELU written as primitives -> gelu / gelu_tanh", product="gelu / gelu_tanh",
                              recognizes_families=("gelu",),
                              quantization=("breaks", "a GELU whose x / sqrt(2) or erf is rounded to 8 bits is no "
                                                      "GELU"))

__all__ = ["ERF", "SIGMOID", "TANH", "canonicalize_gelu"]
