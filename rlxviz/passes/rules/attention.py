"""Attention fusions: `fuse_sdpa` (HF primitives -> packed `attention`) and `fuse_attention_block`.

`fuse_sdpa` has no RLX counterpart: RLX's BERT builder emits a packed `Attention` directly
(docs/rlx.md §5.1), so Hugging Face graphs never reach its block fusions. The pattern is what
`BertSelfAttention` traces to::

    q_heads = transpose(reshape(q, [B, S, nh, dh]), [0, 2, 1, 3])        (same for k, v)
    scores  = matmul(q_heads, transpose(k_heads, [0, 1, 3, 2]))
    scores  = div(scores, sqrt(dh))   or   mul(scores, 1/sqrt(dh))       (optional)
    scores  = add(scores, mask)                                          (optional)
    ctx     = reshape(transpose(matmul(softmax(scores, -1), v_heads), [0, 2, 1, 3]), [B, S, nh*dh])

Q and K may also be scaled by a constant before the scores (CLIP and Whisper scale the projected Q by
1/sqrt(dh), Whisper's reference code scales both heads by dh**-0.25): the pre-scales are folded into the
attention's `scale` (the product of all factors; None when it equals the default 1/sqrt(dh)), so a
pre-scaled Q with unscaled scores gets the default scale and the block fusion still applies.
A scale further down K's (or Q's) path (after K's own transpose, after `repeat_kv`, between the head reshape
and transpose) is first moved next to the head split (`scale_path.hoist_scales`, bit-exact), so it folds too.

-> `attention(q, k, v[, mask], num_heads=nh, head_dim=dh)`. The mask guard traces HF's extended
mask `reshape(mul(sub(1, cast(m)), fill), [B, 1, 1, S])` back to the integer keep mask and emits
`mask="keep", mask_fill=fill` with the `[B, S]` cast as operand (RLX's `Custom` form, which the
block fusions require); any other mask stays `additive` and the soft rejection `mask_form` says why.

Validity (numbers equal for every input): the fused op adds `(1 - mask) * fill` to the scaled scores,
the unfused formula itself, in the mask's dtype (the guard requires cast, sub, mul and reshape to
share it), so it holds for every integer mask, 0/1 or not: a row whose mask is all zeros is shifted
by `fill` everywhere and, softmax being shift-invariant, attends normally in both forms (a binary
keep mask would make that row uniform: `tests/test_numerics.py`, case 05). Constants are read as
their dtype holds them (a `bool` 4.0 is 1.0; `typed_value`). The scale is a finite, non-zero scalar
constant (guard `scale_finite`); it is recorded as the default `None` only within 1e-6 relative of
1/sqrt(head_dim), and as 1.0 when the scores are not scaled. An additive mask of any other form is
kept as an operand and added as is (broadcast to `[B, heads, Sq, Sk]`, checked by shape inference).
Rounding may differ by the order of the scale (scores * scale vs scores / c), a few float32 ulps.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ...ir import DType, Op, Rewriter
from ...ir.rewrite import common_path
from ..engine import Pass, rule_pass, stage
from ..guard import (
    COMPILER_ONLY,
    ILLEGAL,
    NOT_RECOGNIZED,
    Ctx,
    Guard,
    all_single_use,
    guard,
)
from ..pattern import P, is_const
from ..rule import Fail, Rule, Shape, Soft, User, reports
from ..trace import layer_of
from . import where_mask
from .block import BLOCK, fuse_attention_block, size_gate, tokens
from .gqa import explain_heads, heads_match, kv_heads_pattern, kv_repeat_guard, num_kv_heads, repeat_roles
from .head_layout import CANONICAL_HEADS_PASS, REPEAT_BROADCAST_KV_PASS
from .head_norm import HOIST_HEAD_NORMS_PASS
from .heads import UNFOLD_HEADS_PASS
from .kv_cache import PACK_CACHE_PASS
from .rope_casts import CAST_HEADS_PASS, CAST_ROTATION_PASS
from .rope_heads import ROPE_HEADS_PASS
from .rope_pairs import ROPE_PAIRS_PASS
from .scale_path import HOIST_SCALES_PASS, SCALAR_SCALES_PASS
from .sdpa_forms import latent_heads, rope_on_heads
from .sdpa_mask import expanded_per_query, mask_form, model_term, score_term, typed_value
from .where_mask import where_scores

# -- fuse_sdpa -----------------------------------------------------------------------------------


def _prescaled(inner: P, tag: str) -> P:
    """`inner * c`, `c * inner` or `inner / c` for a scalar constant c: a Q or K scaled before the scores."""
    c = P.var(f"{tag}_scale_c", where=is_const, what="a scalar constant")
    return P(Op.MUL, inner, c, name=f"{tag}_prescale", commutative=True) | P(Op.DIV, inner, c, name=f"{tag}_prescale")


def _heads(tag: str, prescale: bool = False) -> P:
    """The head split `transpose(reshape(t), [0, 2, 1, 3])`; with `prescale`, t or the heads may be scaled by a
    constant (CLIP/Whisper apply 1/sqrt(head_dim) to Q, or head_dim**-0.25 to both Q and K)."""
    src = (_prescaled(P.var(tag), tag) | P.var(tag)) if prescale else P.var(tag)
    heads = P(Op.TRANSPOSE, P(Op.RESHAPE, src, name=f"{tag}_reshape"), name=f"{tag}_heads")
    return (_prescaled(heads, tag) | heads) if prescale else heads


_QK = P(Op.MATMUL, _heads("q", True), P(Op.TRANSPOSE, kv_heads_pattern("k", _heads("k", True)), name="k_t"),
        name="qk")
_CONST = P.var("scale_c", where=is_const, what="a scalar constant")
_SCALED = (P(Op.DIV, _QK, _CONST, name="scale") | P(Op.MUL, _QK, _CONST, name="scale", commutative=True) | _QK)
_BIASED = P(Op.ADD, _SCALED, P.var("bias"), name="bias_add", commutative=True)
"""Scores plus the model's own term before a where-mask (BLOOM's ALiBi, `baddbmm`): the bias joins the mask."""
_SCORES = (P(Op.ADD, _SCALED, P.var("mask"), name="mask_add") | P(Op.ADD, P.var("mask"), _SCALED, name="mask_add")
           | where_scores(_BIASED) | where_scores(where_mask.inner_where(_SCALED)) | where_scores(_SCALED) | _SCALED)
_INTERNAL = ("q_prescale", "q_reshape", "q_heads", "k_prescale", "k_reshape", "k_heads", "k_t", "qk", "scale",
             "mask_add", "bias_add", "inner_where", "mask_where", "softmax", "v_reshape", "v_heads", "pv", "merge_t",
             *repeat_roles("k"),
             *repeat_roles("v"))
_VIEWS = ("q_reshape", "q_heads", "k_reshape", "k_heads", "k_t", "v_reshape", "v_heads")
"""The head split (and K's transpose) of Q, K and V: layout views of the packed attention's operands, which it
reads unsplit (`[B, S, heads*head_dim]`). Another reader of one (a later layer reading this layer's K/V heads:
cross-layer KV sharing, Gemma 3n / CLA) keeps it: the rule's `shared` roles, kept by `_kept_views`."""


def _kept_views(c: Ctx, rw: Rewriter, absorbed: Sequence[int]) -> set[int]:
    """The absorbed nodes the rewrite keeps: a head-split view (`_VIEWS`) that a node outside the match still reads
    (one that no earlier match of this pass removed) or that is a graph output, and every absorbed node such a kept
    node reads. Exact: a kept node computes what it computed before, for the readers it had."""
    g = c.graph
    views = {c.id(r) for r in _VIEWS if r in c}
    inside = set(absorbed)
    kept: set[int] = set()
    grew = True
    while grew:
        grew = False
        for i in inside - kept:
            outside = g.is_output(i) or any(
                u.id in kept or (u.id not in inside and not rw.removed(u.id)) for u in g.users(i))
            if outside and (i in views or any(u.id in kept for u in g.users(i))):
                kept.add(i)
                grew = True
    return kept


def _split_ok(c: Ctx, tag: str) -> bool:
    r, t, x = c[f"{tag}_reshape"], c[f"{tag}_heads"], c[tag]
    return (x.rank >= 3 and r.rank == 4 and r.shape[:2] == x.shape[:2]
            and r.shape[2] * r.shape[3] == math.prod(x.shape[2:]) and t.attrs["perm"] == (0, 2, 1, 3))


def _packed(c: Ctx, rw: Rewriter, tag: str) -> int:
    """Q/K/V as the attention takes them, `[B, S, heads*head_dim]`: the head split's source, or a reshape of it when
    it holds the heads on more axes (BLOOM's and ModernBERT's fused QKV `[B, S, H, 1, d]`). Exact: a reshape to
    `[B, S, H, d]` reads the same row-major order whether or not its source is first reshaped to `[B, S, H*d]`."""
    x = c[tag]
    if x.rank == 3:
        return c.id(tag)
    return rw.emit(Op.RESHAPE, [c.id(tag)], shape=(*x.shape[:2], math.prod(x.shape[2:])))


def _split_guard(tag: str) -> Guard:
    return guard(f"{tag}_head_split", lambda c: _split_ok(c, tag),
                 lambda c: f"{c.d(tag + '_heads')} splits {c.d(tag)} {list(c[tag].shape)} as reshape "
                           f"{list(c[tag + '_reshape'].shape)} + transpose {list(c[tag + '_heads'].attrs['perm'])}; "
                           f"needs reshape [B, S, heads, head_dim] + transpose [0, 2, 1, 3] of a packed [B, S, H]",
                 "write the head split as view(B, S, heads, head_dim).permute(0, 2, 1, 3)",
                 requires=(f"{tag}_heads", f"{tag}_reshape", tag), kind=NOT_RECOGNIZED,
                 fix=f"teach fuse_sdpa this {tag.upper()} head-split layout (a canonical head-split pass)")


def _odd_heads(c: Ctx) -> int:
    """The head split the `heads_consistent` failure is about: K when its head_dim or head count is off, else V."""
    q, k, v = (c[f"{t}_reshape"].shape[2:] for t in "qkv")
    return c.id("v_reshape") if k[1] == q[1] and v != k else c.id("k_reshape")


def _merge_ok(c: Ctx) -> bool:
    q, out = c["q_reshape"], c["merge"]
    return c["merge_t"].attrs["perm"] == (0, 2, 1, 3) and out.shape == (q.shape[0], q.shape[1], q.shape[2] * q.shape[3])



FACTORS = (("scale", "scale_c"), ("q_prescale", "q_scale_c"), ("k_prescale", "k_scale_c"))


def _factor(c: Ctx, op_role: str, const_role: str) -> float:
    """The factor a scaling node applies (1.0 when the role is unbound): `x * v` -> v, `x / v` -> 1/v, with
    v read as its dtype holds it (`typed_value`)."""
    if op_role not in c:
        return 1.0
    v = typed_value(c[const_role])
    assert v is not None
    with np.errstate(divide="ignore"):
        return float(np.float64(1.0) / v) if c[op_role].op == Op.DIV else v


def _scale_factor(c: Ctx) -> float:
    """The product of the score scale and any Q/K pre-scale."""
    s = 1.0
    for op_role, const_role in FACTORS:
        s *= _factor(c, op_role, const_role)
    return s


def _scale_ok(c: Ctx) -> bool:
    return all(math.isfinite(f) and f != 0.0 for f in (_factor(c, o, k) for o, k in FACTORS))


def _bad_scale(c: Ctx) -> int | None:
    """The scaling node whose factor is zero or not finite (the guard's subject)."""
    for o, k in FACTORS:
        f = _factor(c, o, k)
        if not (math.isfinite(f) and f != 0.0):
            return c.id(o)
    return None


def _explain_scale(c: Ctx) -> str:
    parts = ", ".join(f"{c.d(o)} by {_factor(c, o, k)} ({c[k].dtype} constant)" for o, k in FACTORS if o in c)
    return f"the scores are scaled: {parts}; every factor must be finite and non-zero"


def _scale(c: Ctx) -> float | None:
    """The attention `scale` attr: the product of the score scale and any Q/K pre-scale; None when it is
    the default 1/sqrt(head_dim) (within 1e-6 relative). softmax((a*q) @ (b*k)^T * s) == softmax(a*b*s * q @ k^T):
    the same numbers up to rounding (exactly the same when the factors are powers of two)."""
    s = _scale_factor(c)
    d = c["q_reshape"].shape[3]
    if math.isclose(s, 1.0 / math.sqrt(d), rel_tol=1e-6):
        return None
    if "qk" in c and c["qk"].dtype == DType.f16 and np.float16(s) == np.float16(1.0 / math.sqrt(d)):
        return None  # the exporter's 1/sqrt(d) as float16 rounds it (0.353515625 for d = 8): the scores are scaled
        # in float16 either way, by the same float16 number (the default scale rounds to it in every runtime)
    return s


@reports("prescale_single_use", kind=ILLEGAL, reads=("q", "q_prescale", "q_reshape", "k", "k_prescale",
                                                      "k_reshape"), binds=("q", "k"))
def _prescale_kept(c: Ctx) -> Fail | None:
    """A pre-scale read elsewhere stays outside the attention (soft): the attention reads the scaled tensor."""
    for t in ("q", "k"):
        pre = f"{t}_prescale"
        if pre not in c or (len(c.users(pre)) == 1 and not c.graph.is_output(c.id(pre))):
            continue
        if c[f"{t}_reshape"].inputs[0] != c.id(pre):
            continue  # scaled after the head split: internals_single_use names it
        users = ", ".join(c.name_of(u.id) for u in c.users(pre))
        c.data.setdefault("soft", []).append(Fail(
            "guard", "prescale_single_use", f"{c.d(pre)} (the pre-scaled {t.upper()}) is also read by {users}; it "
            f"stays outside the attention, which reads the scaled {t.upper()} with its own scale", (c.id(pre),), (),
            f"let the pre-scaled {t.upper()} feed only the head split", subject=c.id(pre), kind=ILLEGAL))
        c.bindings[t] = c.bindings.pop(pre)
        c.bindings.pop(f"{t}_scale_c", None)
    return None


def _sdpa_build(c: Ctx) -> tuple[Op, list[int], dict]:
    r = c["q_reshape"]
    ins = [c.id("q"), c.id("k"), c.id("v")]
    kind = "none"
    if "mask_where" in c:
        kind = "additive" if where_mask.is_additive(c) else "keep"
        ins.append(c.id("mask_cond"))  # replaced by the keep or additive operand in _sdpa_rewrite
    elif "mask" in c:
        kind = "keep" if "keep" in c.data else "additive"
        ins.append(c.data.get("keep", c.id("mask")))
    return Op.ATTENTION, ins, {"num_heads": r.shape[2], "head_dim": r.shape[3], "mask": kind, "scale": _scale(c),
                               "num_kv_heads": num_kv_heads(c), "mask_fill": c.data.get("fill")}


def _operands(c: Ctx, rw: Rewriter, ins: list[int], attrs: dict) -> None:
    """Q/K/V (`_packed`) and the mask operand as the attention reads them, written into `ins`; a where-mask's
    condition becomes the keep or additive operand (`where_mask`)."""
    ins[:3] = [_packed(c, rw, t) for t in "qkv"]
    if "mask_where" in c:
        additive = attrs["mask"] == "additive"
        if "bias_add" in c:  # where(m, s + b, fill) == s + where(m, b, fill): where_mask.biased_operand
            ins[3] = where_mask.biased_operand(c, rw)
        elif "inner_where" in c:  # where(m, where(k, s, f2), f) == s + where(m, where(k, 0, f2), f)
            ins[3] = where_mask.nested_operand(c, rw)
        else:
            ins[3] = where_mask.additive_operand(c, rw) if additive else where_mask.keep_operand(c, rw)
    elif "keep_from" in c.data:
        ins[3] = rw.cast(c.data["keep_from"], c.data["keep_dtype"])


def _sdpa_rewrite(c: Ctx, rw: Rewriter) -> int:
    """`_sdpa_build`'s node; a where-mask's condition becomes the keep operand first (`where_mask`)."""
    op, ins, attrs = _sdpa_build(c)
    absorbed = [c.id(r) for r in (*_INTERNAL, "merge") if r in c]
    kept = _kept_views(c, rw, absorbed)
    absorbed = [a for a in absorbed if a not in kept]
    g, layer = c.graph, layer_of(c["softmax"].path)
    own = [a for a in absorbed if layer_of(g[a].path) == layer]  # a view of another layer's K/V: not its path
    with rw.provenance(absorbed, None if len(own) == len(absorbed) or not own else
                       common_path([g[a].path for a in own])):
        with rw.absorbing():  # the operands it makes (Q/K/V views, the mask) replace nothing: only the product does
            _operands(c, rw, ins, attrs)
        new = rw.emit(op, ins, **attrs)
    rw.remove([a for a in absorbed if a != c.id("merge")])
    rw.replace(c.id("merge"), new)
    return new


PV_FORM_FIX = ("teach fuse_sdpa this probabilities-times-V form (the softmax's reader as matmul(probs, V heads), "
               "an op on V's heads read as part of V)")
MERGE_FORM_FIX = ("a packed attention whose output stays in heads-first layout [B, heads, S, head_dim] (the attention "
                  "op, then a reshape and a transpose back: the same numbers)")
MERGE_RESHAPE_FIX = ("a packed attention whose output stays in heads layout [B, S, heads, head_dim] (the attention op, "
                     "then a reshape back to the transposed heads: the same numbers), or the head merge read through a "
                     "concat on the heads axis (reshape(concat(a, b, axis=2)) == concat(reshape(a), reshape(b), "
                     "axis=-1): ConvBERT's convolution heads joined to its attention heads)")
"""The compiler fixes of `SDPA`'s structure steps past the softmax. The transposed heads read by something else than
the head-merge reshape (ConvBERT's mixed attention concatenates its convolution heads to them on the heads axis, then
merges all heads at once) are the model's own structure, not a lookalike: the attention is HF's, only its merge is
shared with another branch. Only rewriting the model's code (each branch merged before a concat on the last axis, the
same numbers) would give the attention a merge of its own; rlxviz asks no model to be rewritten for an exact layout
identity it could read itself, so the refusal's one fix is the compiler's (`COMPILER_ONLY`): a gap in rlxviz's ops,
not a near-miss."""

SDPA = Rule(
    "fuse_sdpa.hf_attention", P(Op.SOFTMAX, name="softmax", where=lambda n: n.rank == 4),
    steps=(
        guard("softmax_last_axis", lambda c: c["softmax"].attrs.get("axis", -1) in (-1, 3),
              lambda c: f"{c.d('softmax')} is over axis {c['softmax'].attrs.get('axis')}; needs the key axis (-1)",
              requires=("softmax",), kind=NOT_RECOGNIZED,
              fix="none for attention: a softmax over another axis is not key-axis attention"),
        rope_on_heads,
        score_term,
        latent_heads,
        Shape("scores_form", "softmax", P(Op.SOFTMAX, _SCORES, name="softmax"),
              "scores must be matmul(q_heads, transpose(k_heads)) [scaled] [+ mask]"),
        User("pv_form", "pv", "softmax", P(Op.MATMUL, P.var("softmax"), kv_heads_pattern("v", _heads("v")), name="pv"),
             "matmul(softmax, v_heads)", fix=PV_FORM_FIX),
        User("merge_form", "merge_t", "pv", P(Op.TRANSPOSE, name="merge_t"), "transpose (merge heads)",
             fix=MERGE_FORM_FIX),
        User("merge_reshape", "merge", "merge_t", P(Op.RESHAPE, name="merge"), "reshape to [B, S, H]",
             fix=MERGE_RESHAPE_FIX, remedy=COMPILER_ONLY),
        _prescale_kept,
        _split_guard("q"),
        guard("k_layout", lambda c: c["k_t"].attrs["perm"] == (0, 1, 3, 2) and _split_ok(c, "k"),
              lambda c: f"K reaches {c.d('k_t')} as reshape {list(c['k_reshape'].shape)} + transpose "
                        f"{list(c['k_heads'].attrs['perm'])} + transpose {list(c['k_t'].attrs['perm'])}; needs "
                        f"[B, S, heads, head_dim] -> [0, 2, 1, 3] -> [0, 1, 3, 2]",
              "transpose K with k_heads.transpose(-1, -2)", requires=("k_t", "k_reshape", "k_heads", "k"),
              kind=NOT_RECOGNIZED, fix="canonicalize K's layout (compose its transposes) before matching"),
        _split_guard("v"),
        kv_repeat_guard(),
        guard("heads_consistent", heads_match, lambda c: f"at {c.name_of(_odd_heads(c))}: {explain_heads(c)}",
              requires=("q_reshape", "k_reshape", "v_reshape"),
              reads=(*repeat_roles("k"), *repeat_roles("v")), kind=NOT_RECOGNIZED, subject=_odd_heads,
              fix="none: Q, K and V must share head_dim, and Q's heads must be a multiple of the kv heads"),
        guard("merge_layout", _merge_ok,
              lambda c: f"{c.d('merge')} merges heads with transpose {list(c['merge_t'].attrs['perm'])} to "
                        f"{list(c['merge'].shape)}; needs transpose [0, 2, 1, 3] + reshape [B, S, heads*head_dim]",
              requires=("merge", "merge_t", "q_reshape"), kind=NOT_RECOGNIZED,
              fix="teach fuse_sdpa this head-merge layout"),
        all_single_use(tuple(r for r in _INTERNAL if r not in _VIEWS), "internals_single_use",
                       "attention intermediates must not be read elsewhere",
                       "keep the read intermediate beside the packed attention (computed again for its other reader), "
                       "or an attention op that also returns it"),
        *where_mask.guards(),
        guard("scale_finite", _scale_ok, _explain_scale, "scale the scores by a finite, non-zero constant",
              kind=ILLEGAL, reads=tuple(r for pair in FACTORS for r in pair), subject=_bad_scale,
              fix="none: the packed attention's scale is a finite, non-zero number",
              no_model_fix=lambda c: "an infinite or zero factor is what the model computes (every score the "
                                     "same, or NaN): another factor changes its numbers"),
        Soft(mask_form),
    ),
    result="merge", absorb=(*_INTERNAL, "merge"), build=_sdpa_build, rewrite=lambda c, rw: _sdpa_rewrite(c, rw),
    shared=_VIEWS,
    doc="HF head split (+ Q/K pre-scale) + matmul/scale/mask/softmax/matmul + merge -> packed attention "
        "(keep mask traced)")

_sdpa_rules = rule_pass("fuse_sdpa", [SDPA], "")

CANONICALIZATIONS = (("unfold_heads", UNFOLD_HEADS_PASS), ("canonical_heads", CANONICAL_HEADS_PASS),
                     ("hoist_head_norms", HOIST_HEAD_NORMS_PASS), ("cast_rotation", CAST_ROTATION_PASS),
                     ("cast_heads", CAST_HEADS_PASS), ("rope_heads", ROPE_HEADS_PASS), ("rope_pairs", ROPE_PAIRS_PASS),
                     ("cast_rotated_heads", CAST_HEADS_PASS), ("repeat_broadcast_kv", REPEAT_BROADCAST_KV_PASS),
                     ("pack_cache", PACK_CACHE_PASS), ("scalar_scales", SCALAR_SCALES_PASS),
                     ("hoist_scales", HOIST_SCALES_PASS), ("uninvert_where", where_mask.UNINVERT_WHERE_PASS))
"""`fuse_sdpa`'s exact canonicalizations in the order they run, each a stage (`fuse_sdpa/NAME`, its own trace step)
before `SDPA`: folded-heads chains lifted to the 4-D head layout (`heads.unfold_heads`); exported head layouts (a
gather or view of a fused QKV) read as a plain head split (`head_layout.canonical_heads`); a QK-norm on the heads
moved in front of the split (`head_norm.hoist_head_norms`); a half-precision model's float32 rotation between casts
read with its casts moved off the rotation and the head split (`rope_casts`: `cast_rotation`, `cast_heads`, and
`cast_rotated_heads` again after the rope rewrites); RoPE written on the heads (`rope_heads.rope_heads`) and
its interleaved form (`rope_pairs.rope_pairs`) to the rope op; one broadcast K/V head as `repeat_kv`
(`head_layout.repeat_broadcast_kv`); a decode step's KV-cache concat read packed (`kv_cache.pack_cache`); `[1]`-shaped
Q/K scales as scalars (`scale_path.scalar_scales`) moved next to the head split (`scale_path.hoist_scales`);
inverted where-masks un-inverted (`where_mask.uninvert_where`). Each is a rule pass recording under `fuse_sdpa`, so
what it refuses is its own rule's near miss."""

fuse_sdpa = Pass("fuse_sdpa", _sdpa_rules.fn, (SDPA,), doc="Hugging Face scaled-dot-product attention -> packed "
                 "attention op (heads folded into the batch lifted to [B, H, S, d] first, Q/K scales moved next to "
                 "the head split)", product="packed attention", recognizes_families=("attention", "where_mask"),
                 quantization=("attention", "the packed attention op computes the scores in float: a layer whose "
                                            "quantized attention stayed primitives rounds them"),
                 listed_for=(("grouped_query", "grouped-query"), ("attention", "")),
                 stages=tuple(stage("fuse_sdpa", name, p) for name, p in CANONICALIZATIONS))


__all__ = ["BLOCK", "CANONICALIZATIONS", "FACTORS", "SDPA", "expanded_per_query", "fuse_attention_block", "fuse_sdpa",
           "model_term", "size_gate", "tokens", "typed_value"]
