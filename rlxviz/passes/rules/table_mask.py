"""`canonicalize_exported.bias_then_table_mask`: two additive score terms, one a mask table folded at import, summed
into one attention mask operand (`(s + a) + b -> s + (a + b)`); its validity condition is stated with the other
rules of the pass in `export_forms`' docstring. Also the two readers of constants the pass's rules share."""

from __future__ import annotations

import math

import numpy as np

from ...ir import DType, Graph, Node, Op, Rewriter
from ...ir.infer import broadcast
from ..guard import ILLEGAL, NOT_RECOGNIZED, Ctx, guard
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


_SATURATING = (F32_MIN, -math.inf)
"""The fills a mask table may hold where it masks, beside 0: f32's min and -inf (each absorbs any finite f32 added
to it below 2^103: min's ulp is 2^104)."""


def _tableconst_entries(g: Graph, i: int) -> np.ndarray | None:
    """The values of a param the graph carries (`Graph.values`) or of a const (scalar or small tuple), else None."""
    n = g[i]
    if n.op == Op.PARAM:
        v = g.param_value(i)
        return None if v is None else np.asarray(v, np.float64)
    vals = const_entries(n)
    return None if vals is None else np.asarray(vals, np.float64)


def _is_mask_table(g: Graph, i: int) -> bool:
    """Node i is a constant table (param or const) every entry of which is 0 or a saturating fill (`_SATURATING`)."""
    v = _tableconst_entries(g, i)
    return v is not None and v.size > 0 and bool(np.isin(v, (0.0, *_SATURATING)).all())


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


def _table_why(c: Ctx) -> str:
    g = c.graph
    parts = []
    for r in ("a", "b"):
        v = _tableconst_entries(g, c.id(r))
        if v is None:
            what = "a table whose values are not known" if c[r].op == Op.PARAM else "computed at run time"
            parts.append(f"{c.d(r)} {list(c[r].shape)} is {what}")
        else:
            odd = v[~np.isin(v, (0.0, *_SATURATING))]
            parts.append(f"{c.d(r)} {list(c[r].shape)} holds {float(odd.flat[0]):.9g}")
    return ("; ".join(parts) + f": neither term is a mask table of 0 and finfo(f32).min ({F32_MIN:.9g}) or -inf, so "
            f"(s + a) + b, rounded twice, is not s + (a + b)")


BIAS_THEN_TABLE_MASK = Rule(
    "canonicalize_exported.bias_then_table_mask", P(Op.ADD, name="add"),
    steps=(
        _two_terms,
        guard("mask_table", lambda c: _is_mask_table(c.graph, c.id("a")) or _is_mask_table(c.graph, c.id("b")),
              _table_why, "nothing to change in the model: two real-valued score terms are summed as written",
              requires=("b", "a"), kind=ILLEGAL,
              fix="none: reassociating two real-valued terms changes the rounding"),
        guard("scores_f32", lambda c: c["s"].dtype == c["a"].dtype == c["b"].dtype == DType.f32,
              lambda c: f"{c.d('s')} is {c['s'].dtype}, {c.d('a')} {c['a'].dtype} and {c.d('b')} {c['b'].dtype}; "
                        "needs f32 (the fill absorbs f32 sums below 2^103)", requires=("s", "a", "b"),
              kind=NOT_RECOGNIZED, fix="a fill test for the scores' own dtype"),
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
    doc="(scores + a) + b, a or b a mask table of 0 and f32 min / -inf -> scores + (a + b)",
    form="mask table summed first")


def _terms_summed(c: Ctx, rw: Rewriter) -> int:
    with rw.provenance([c.id("sum"), c.id("add")]):
        term = rw.emit(Op.ADD, [c.id("a"), c.id("b")])
        out = rw.emit(Op.ADD, [c.id("s"), term])
    rw.remove([c.id("sum")])
    rw.replace(c.id("add"), out)
    return out


__all__ = ["BIAS_THEN_TABLE_MASK", "F32_MIN", "LOWEST", "const_entries", "is_score_matmul"]
