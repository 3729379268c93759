"""`where`-based boolean attention masks in `fuse_sdpa`: `softmax(where(keep, scores, fill))`.

GPT-2-era and hand-written attention masks the scores with `where(keep, scores, finfo(f32).min)` instead of
adding a bias. `attention(mask="keep")` is defined as exactly that (`where(mask > 0.5, scores, finfo(f32).min)`,
rlxviz.runtime.reference), so the rewrite to a keep mask `cast(reshape(keep, [B, Sk]), f32)` is exact when:

* `where_mask_fill`: the fill is `finfo(dtype).min` in the scores' dtype (f32: `finfo(f32).min`; bf16 is
  refused, its rounding of the fill is not checked here). Another fill (-1e4, -1e9, -inf) gives different numbers
  where a kept score is within ~104 of the fill, and -inf turns a fully masked row into NaN where the keep
  mask gives uniform weights;
* `where_mask_per_key`: the condition is a bool `[B, 1, 1, Sk]` padding mask (one value per key). A mask that
  varies over queries (causal `[1, 1, Sq, Sk]`) or heads has no keep-mask form.
"""

from __future__ import annotations

import numpy as np

from ...ir import DType, Op, Rewriter
from ..guard import ILLEGAL, NOT_RECOGNIZED, Ctx, Guard, guard
from ..pattern import P, const_value, is_const

NEG = float(np.finfo(np.float32).min)


def where_scores(scaled: P) -> P:
    """`where(cond, scaled_scores, fill)` with a scalar-constant fill."""
    return P(Op.WHERE, P.var("mask_cond"), scaled, P.var("mask_fill", where=is_const, what="a scalar constant"),
             name="mask_where")


def _per_key(c: Ctx) -> bool:
    cond, q, k = c["mask_cond"], c["q_reshape"], c["k_reshape"]
    return cond.dtype == DType.bool and cond.shape == (q.shape[0], 1, 1, k.shape[1])


def _lowest(c: Ctx) -> float:
    d = c["mask_where"].dtype
    return float(np.finfo(d.numpy).min) if d.is_float and d != DType.bf16 else NEG


def _fill_ok(c: Ctx) -> bool:
    """The fill, as its dtype holds it, is the lowest finite value of the scores' dtype (what the keep mask
    uses: an f16 const of finfo(f32).min is -inf, which makes a fully masked row NaN)."""
    fill, where = c["mask_fill"], c["mask_where"]
    v = const_value(fill)
    if v is None or fill.dtype != where.dtype or not where.dtype.is_float or where.dtype == DType.bf16:
        return False
    with np.errstate(over="ignore"):
        return float(np.asarray(v).astype(fill.dtype.numpy)) == _lowest(c)


def guards() -> tuple[Guard, ...]:
    return (
        guard("where_mask_per_key", _per_key,
              lambda c: f"the where condition {c.d('mask_cond')} is {c['mask_cond'].dtype}{list(c['mask_cond'].shape)}"
                        f"; a keep mask needs bool [{c['q_reshape'].shape[0]}, 1, 1, {c['k_reshape'].shape[1]}] "
                        f"(one value per key)",
              "mask padding per key ([B, 1, 1, Sk]); a causal where-mask has no keep-mask form here",
              requires=("mask_where",), reads=("mask_cond", "q_reshape", "k_reshape"), kind=NOT_RECOGNIZED,
              subject=lambda c: c.id("mask_cond"), fix="a causal or per-query mask kind for where-masks"),
        guard("where_mask_fill", _fill_ok,
              lambda c: f"the where fill {c.d('mask_fill')} is {c['mask_fill'].dtype} {const_value(c['mask_fill'])} "
                        f"on {c['mask_where'].dtype} scores; the keep mask fills masked scores with the scores' "
                        f"finfo(dtype).min ({_lowest(c):.9g}), and another fill gives different numbers",
              "fill with torch.finfo(scores.dtype).min", requires=("mask_where",), reads=("mask_fill", "mask_where"),
              kind=ILLEGAL, subject=lambda c: c.id("mask_fill")),
    )


def keep_operand(c: Ctx, rw: Rewriter) -> int:
    """Emit the keep mask `[B, Sk]` f32 (1 = attend) from the where condition."""
    b, sk = c["q_reshape"].shape[0], c["k_reshape"].shape[1]
    return rw.cast(rw.reshape(c.id("mask_cond"), (b, sk)), DType.f32)


__all__ = ["NEG", "guards", "keep_operand", "where_scores"]
