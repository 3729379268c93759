"""`canonicalize_exported.bias_then_table_mask`: two additive score terms, one a mask table folded at import, summed
into one attention mask operand (`(s + a) + b -> s + (a + b)`); its validity condition is stated with the other
rules of the pass in `export_forms`' docstring. Also the readers of constants and the fill test (`fill_absorbs`)
the pass's rules share."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ...ir import DType, Graph, Node, Op, Rewriter
from ...ir.infer import broadcast
from ..guard import ILLEGAL, NOT_RECOGNIZED, NOTHING_TO_CHANGE, Ctx, Guard, guard
from ..pattern import P
from ..rule import QUIET, Fail, Rule, reports

F32_MIN = float(np.finfo(np.float32).min)

LOWEST = {DType.f16: (-65504.0, 16.0), DType.bf16: (-(2 - 2.0**-7) * 2.0**127, 2.0**119),
          DType.f32: (F32_MIN, 2.0**103), DType.f64: (float(np.finfo(np.float64).min), 2.0**970)}
"""Each float dtype's lowest finite value (`finfo(dtype).min`, the padding fill transformers writes in the scores'
dtype) and half its last step: `s + lowest` rounds to `lowest` exactly for |s| below it (round to nearest, ties to
even: the lowest value has an odd mantissa, so |s| at the half step rounds away from it; f16's -65504, step 32: the
sum is the fill only for |s| < 16 and overflows to -inf for s <= -16)."""


def const_entries(node: Node) -> tuple[float, ...] | None:
    """Every entry of a const node (a scalar, or the tuple a small constant holds, e.g. `[0.0]`), else None."""
    if node.op != Op.CONST:
        return None
    v = node.attrs.get("value")
    vals = v if isinstance(v, tuple) else (v,)
    try:
        return tuple(float(x) for x in vals)
    except (TypeError, ValueError):
        return None


def is_score_matmul(g: Graph, i: int) -> bool:
    """A score matmul, or one scaled by mul/div."""
    n = g[i]
    if n.op in (Op.MUL, Op.DIV):
        return any(g[j].op == Op.MATMUL and g[j].rank >= 3 for j in n.inputs)
    return n.op == Op.MATMUL and n.rank >= 3


WIDE = 2.0 ** 60
"""Half a step of the fill at or above which `s + fill == fill` for every realistic score (f32: 2^103, bf16: 2^119;
f16: 16)."""


def lowest(c: Ctx, mask: str) -> tuple[float, float] | None:
    """`(finfo(dtype).min, half its step)` of the mask role `mask`'s float dtype (`LOWEST`); None for another dtype."""
    return LOWEST.get(c[mask].dtype)


def min_absorbs(dtype: DType) -> bool:
    """The lowest value of `dtype` absorbs every realistic score: half its step is at least `WIDE` (f32, bf16, f64;
    not f16, whose -65504 absorbs only |s| < 16); true for a dtype with no such value (`LOWEST`)."""
    low = LOWEST.get(dtype)
    return low is None or low[1] >= WIDE


def fill_absorbs(c: Ctx, mask: str) -> bool:
    """The fill of where mask `mask`, its dtype's lowest value (`bias_fills`), absorbs every realistic score
    (`min_absorbs`). A mask table whose only fill is -inf absorbs in any dtype (`_table_absorbs`)."""
    return min_absorbs(c[mask].dtype)


def absorbs_guard(mask: str, tail: str, kind: str, fix: str = "",
                  check: Callable[[Ctx], bool] | None = None) -> Guard:
    """`fill_absorbs`: the fill of `mask` absorbs every realistic score (f16's lowest value does not); `tail` says
    what the sum is then, `kind` and `fix` as the rule's form makes them; `check` the test when the fill is not
    always the dtype's lowest value (default `fill_absorbs`: a where mask whose fill `bias_fills` checked)."""
    return guard("fill_absorbs", check or (lambda c: fill_absorbs(c, mask)),
                 lambda c: f"{c.d(mask)} is {c[mask].dtype}: s + finfo({c[mask].dtype}).min "
                           f"({lowest(c, mask)[0]:.9g}) rounds to that fill only for |s| < {lowest(c, mask)[1]:g} "
                           f"(half its step) and to -inf for s <= -{lowest(c, mask)[1]:g}, so in {c[mask].dtype} "
                           f"{tail}",
                 NOTHING_TO_CHANGE + ": the sum is exact in its dtype, the rewrite would not be",
                 requires=(mask, "s"), kind=kind, fix=fix)


def _tableconst_entries(g: Graph, i: int) -> np.ndarray | None:
    """The values of a param the graph carries (`Graph.values`) or of a const (scalar or small tuple), else None."""
    n = g[i]
    if n.op == Op.PARAM:
        v = g.param_value(i)
        return None if v is None else np.asarray(v, np.float64)
    vals = const_entries(n)
    return None if vals is None else np.asarray(vals, np.float64)


def _saturating(g: Graph, i: int) -> tuple[float, ...]:
    """The fills a mask table node i may hold where it masks, beside 0: -inf, and the lowest value of its own dtype
    (`finfo(dtype).min`, `LOWEST`: transformers writes the fill in the scores' dtype; f32's, bf16's -3.3895e38,
    f16's -65504), read as float64."""
    low = LOWEST.get(g[i].dtype)
    return (-math.inf,) if low is None else (low[0], -math.inf)


def _is_mask_table(g: Graph, i: int) -> bool:
    """Node i is a constant table (param or const) every entry of which is 0 or a saturating fill (`_saturating`)."""
    v = _tableconst_entries(g, i)
    return v is not None and v.size > 0 and bool(np.isin(v, (0.0, *_saturating(g, i))).all())


def _table_absorbs(g: Graph, i: int) -> bool:
    """Mask table i's fills absorb every realistic addend: each is -inf (any finite one) or its dtype's lowest value
    where half that value's step is at least `WIDE` (f32, bf16; f16's -65504 absorbs only |x| < 16)."""
    v = _tableconst_entries(g, i)
    return v is not None and (bool(np.isin(v, (0.0, -math.inf)).all()) or min_absorbs(g[i].dtype))


@reports(reads=("add",), binds=("s", "sum", "a", "b"))
def _two_terms(c: Ctx) -> Fail | None:
    """Bind `(s + a) + b` at the anchor (either operand order at both adds), read by a softmax: `s` a (scaled)
    score matmul, `a` and `b` two additive terms of which at least one is a constant table (a param or const: a mask
    folded at import). Quiet otherwise (another sum, or terms computed at run time: `bias_then_mask`'s where-mask or
    no mask)."""
    g = c.graph
    add = c["add"]
    if add.rank != 4 or not any(u.op == Op.SOFTMAX for u in g.users(add.id)):
        return QUIET  # only the scores a softmax reads (a residual sum is no score term)
    for si, bi in (add.inputs, add.inputs[::-1]):
        inner = g[si]
        if inner.op != Op.ADD or len(add.inputs) != 2:
            continue
        for s_, a in (inner.inputs, inner.inputs[::-1]):
            if is_score_matmul(g, s_) and not is_score_matmul(g, a) and \
                    any(g[t].op in (Op.PARAM, Op.CONST) for t in (a, bi)):
                c.bindings["s"], c.bindings["sum"], c.bindings["a"], c.bindings["b"] = s_, si, a, bi
                return None
    return QUIET


@reports(reads=("a", "b"), binds=("table",))
def _the_table(c: Ctx) -> Fail | None:
    """Bind `table` to the term that is a mask table (`_is_mask_table`), one whose fills absorb first
    (`_table_absorbs`: then the other term may be anything); unbound when neither is (`mask_table` refuses)."""
    g = c.graph
    tables = [c.id(r) for r in ("a", "b") if _is_mask_table(g, c.id(r))]
    if tables:
        c.bindings["table"] = next((t for t in tables if _table_absorbs(g, t)), tables[0])
    return None


def _table_why(c: Ctx) -> str:
    g = c.graph
    parts = []
    for r in ("a", "b"):
        v = _tableconst_entries(g, c.id(r))
        if v is None:
            what = "a table whose values are not known" if c[r].op == Op.PARAM else "computed at run time"
            parts.append(f"{c.d(r)} {list(c[r].shape)} is {what}")
        else:
            odd = v[~np.isin(v, (0.0, *_saturating(g, c.id(r))))]
            parts.append(f"{c.d(r)} {list(c[r].shape)} holds {float(odd.flat[0]):.9g}")
    return ("; ".join(parts) + ": neither term is a mask table of 0 and its dtype's lowest value (finfo(dtype).min) "
            "or -inf, so (s + a) + b, rounded twice, is not s + (a + b)")


def _one_dtype_ok(c: Ctx) -> bool:
    """s, a and b are f32, or share a dtype whose table `fill_absorbs` refuses (f16's lowest value: no second
    refusal with a fix that would not be true)."""
    dts = {c[r].dtype for r in ("s", "a", "b")}
    return dts == {DType.f32} or (len(dts) == 1 and not _table_absorbs(c.graph, c.id("table")))


def _dtypes_why(c: Ctx) -> str:
    got = f"{c.d('s')} is {c['s'].dtype}, {c.d('a')} {c['a'].dtype} and {c.d('b')} {c['b'].dtype}"
    if len({c[r].dtype for r in ("s", "a", "b")}) > 1:
        return f"{got}: the two sums round in other dtypes than each other; needs f32 scores and terms"
    return f"{got}; needs f32: the rule rewrites f32 sums only (the table's fill absorbs in {c['s'].dtype} too)"


TWO_TERMS_FIX = "an attention op that adds the two score terms in the model's order"
"""The compiler fix of `fill_absorbs` where a rule would reassociate `(s + a) + b` (`bias_then_mask`, this rule)."""

TABLE_DTYPE_FIX = ("the same rewrite for scores and terms of one dtype, exact there where the table's fill absorbs "
                   "(bf16's lowest value every |x| < 2^119; -inf every finite addend, where s + a does not overflow)")
"""The compiler fix of `scores_f32`, which fails only where the table's fill absorbs (`fill_absorbs` refuses f16's
lowest value first): bf16 tables of bf16's min, and tables of 0 and -inf in any float dtype."""


BIAS_THEN_TABLE_MASK = Rule(
    "canonicalize_exported.bias_then_table_mask", P(Op.ADD, name="add"),
    steps=(
        _two_terms,
        guard("mask_table", lambda c: _is_mask_table(c.graph, c.id("a")) or _is_mask_table(c.graph, c.id("b")),
              _table_why, "nothing to change in the model: two real-valued score terms are summed as written",
              requires=("b", "a"), kind=ILLEGAL,
              fix="none: reassociating two real-valued terms changes the rounding"),
        _the_table,
        absorbs_guard("table", "(s + a) + b rounds otherwise than s + (a + b) where the table masks", ILLEGAL,
                      TWO_TERMS_FIX, check=lambda c: _table_absorbs(c.graph, c.id("table"))),
        guard("scores_f32", _one_dtype_ok, _dtypes_why, requires=("s", "a", "b", "table"), kind=NOT_RECOGNIZED,
              fix=TABLE_DTYPE_FIX),
        guard("terms_no_widen", lambda c: broadcast(c["s"].shape, broadcast(c["a"].shape, c["b"].shape))
              == c["s"].shape,
              lambda c: f"the terms {c.d('a')} {list(c['a'].shape)} and {c.d('b')} {list(c['b'].shape)} widen the "
                        f"scores {c.d('s')} {list(c['s'].shape)}: the attention's additive operand broadcasts to "
                        "the scores' [B, heads, Sq, Sk]", requires=("s", "a", "b"), kind=ILLEGAL,
              subject=lambda c: c.id("b") if broadcast(c["s"].shape, c["b"].shape) != c["s"].shape else c.id("a"),
              fix="none: a term wider than the scores is no attention mask"),
    ),
    result="add", absorb=("sum", "add"),
    rewrite=lambda c, rw: _terms_summed(c, rw),
    doc="(scores + a) + b, a or b a mask table of 0 and its dtype's min / -inf -> scores + (a + b)",
    form="mask table summed first")


def _terms_summed(c: Ctx, rw: Rewriter) -> int:
    with rw.provenance([c.id("sum"), c.id("add")]):
        term = rw.emit(Op.ADD, [c.id("a"), c.id("b")])
        out = rw.emit(Op.ADD, [c.id("s"), term])
    rw.remove([c.id("sum")])
    rw.replace(c.id("add"), out)
    return out


__all__ = ["BIAS_THEN_TABLE_MASK", "F32_MIN", "LOWEST", "TABLE_DTYPE_FIX", "TWO_TERMS_FIX", "WIDE", "absorbs_guard",
           "const_entries", "fill_absorbs", "is_score_matmul", "lowest", "min_absorbs"]
