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

`fuse_attention_block` (docs/rlx.md §2.3.2, newer revision): QKV `FusedMatMulBiasAct(None)` ->
narrows at 0/H/2H of the last axis -> `attention(keep | additive)` -> out-projection `FusedMatMulBiasAct(None)`
-> `FusedAttentionBlock`. RLX gates the whole graph on "any input has dim0*dim1 <= 64"; here the
gate is the pipeline parameter `fab_max_tokens`, checked per anchor on that attention's batch*seq,
and the rejection states both numbers. Canonical default: no gate (MLX runtime fusion pays at every
size); the `rlx` profile sets RLX's 64.

The QKV and output projections may each be a `FusedMatMulBiasAct(activation=None)` or a bare `matmul`
(Whisper's K, GPT-style bias-less models): a bare one gets a zero bias operand `expand(0.0, [N])`.

Validity: the block's decomposition (`ir.fused.attention_block`) is the matched chain itself
(linear, narrows at 0/H/2H, attention with the same mask operand, mask kind and `mask_fill`, linear); it
requires the default scale (guard `default_scale`) and a keep or additive mask (guard `mask_kind_keep`; the block's
attribute `mask`, `additive` adds the operand to the scaled scores as the attention does, broadcast to
`[B, heads, S, S]`: a TorchScript sdpa padding mask `[B, 1, S, S]`, a causal table, a band), so it holds for every
input, fully masked rows included (the same op computes them). A zero bias is exact:
`x + 0 == x` for every x (finite, infinite or NaN; -0.0 + 0 gives +0.0, which compares equal).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...ir import DType, Graph, Node, Op, Rewriter
from ...ir.ops import BINARY, BLOCK_MASK_KINDS, COMPARE, UNARY, kv_heads, operand_roles
from ...ir.rewrite import common_path
from ..engine import Pass, PassResult, compose, refusal, rule_pass, staged
from ..guard import (
    ILLEGAL,
    MODEL_TERM,
    NOT_RECOGNIZED,
    Ctx,
    Guard,
    all_single_use,
    attr_eq,
    guard,
    not_output,
    single_user,
    size_le,
    user_count,
)
from ..pattern import P, const_value, is_const
from ..rope_forms import interleaved_rope, rotate_half_rope
from ..rule import QUIET, Fail, Rule, Shape, Soft, User, reports
from ..score_terms import ALIBI, CONTENT_POSITION, RELATIVE_BIAS, SINKS, SOFT_CAP, additive_term, score_terms
from ..trace import Rejection, layer_of
from . import where_mask
from .gqa import explain_heads, heads_match, kv_heads_pattern, kv_repeat_guard, num_kv_heads, repeat_roles
from .head_layout import CANONICAL_HEADS_PASS, REPEAT_BROADCAST_KV_PASS
from .head_norm import HOIST_HEAD_NORMS_PASS
from .heads import unfold_heads
from .kv_cache import PACK_CACHE_PASS
from .rope_casts import CAST_HEADS_PASS, CAST_ROTATION_PASS
from .rope_heads import ROPE_HEADS, ROPE_HEADS_PASS
from .rope_pairs import ROPE_PAIRS, ROPE_PAIRS_PASS
from .scale_path import HOIST_SCALES_PASS, SCALAR_SCALES_PASS
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


def typed_value(node: Node) -> float | None:
    """A scalar const's value as its dtype holds it (a `bool` const of 4.0 is 1.0, an f16 one is rounded),
    else None. The attrs keep the literal; the numbers use this."""
    v = const_value(node)
    if v is None:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.asarray(v).astype(node.dtype.numpy))


_FACTORS = (("scale", "scale_c"), ("q_prescale", "q_scale_c"), ("k_prescale", "k_scale_c"))


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
    for op_role, const_role in _FACTORS:
        s *= _factor(c, op_role, const_role)
    return s


def _scale_ok(c: Ctx) -> bool:
    return all(math.isfinite(f) and f != 0.0 for f in (_factor(c, o, k) for o, k in _FACTORS))


def _bad_scale(c: Ctx) -> int | None:
    """The scaling node whose factor is zero or not finite (the guard's subject)."""
    for o, k in _FACTORS:
        f = _factor(c, o, k)
        if not (math.isfinite(f) and f != 0.0):
            return c.id(o)
    return None


def _explain_scale(c: Ctx) -> str:
    parts = ", ".join(f"{c.d(o)} by {_factor(c, o, k)} ({c[k].dtype} constant)" for o, k in _FACTORS if o in c)
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


def model_term(m: Node, g: Graph | None = None, heads: int = 0) -> str:
    """Why the additive score term `m` cannot be a padding keep mask, or "": a padding mask varies only along the
    batch and the key axis (`[B, 1, 1, Sk]`), so a term with more than one row per head (`[.., H, .., ..]`: ALiBi,
    a relative position bias) or per query (`[.., .., Sq, Sk]`: a causal or sliding-window band) is the model's
    own: the attention takes it as an additive operand, unchanged. With the graph, the term's kind is named
    (`score_terms.additive_term`: ALiBi, relative position bias, ...)."""
    shape = (1,) * max(0, 4 - m.rank) + tuple(m.shape)
    rows, queries = shape[-3], shape[-2]
    term = additive_term(g, m.id, heads or rows) if g is not None else None
    kind = f"; score term {term.kind}: {term.formula}" if term is not None and term.kind in (ALIBI, RELATIVE_BIAS) \
        else ""
    if rows > 1:
        return (f"it has one row per head ({rows} heads: a per-head bias such as ALiBi or a relative position "
                f"bias){kind}")
    if queries > 1:
        return (f"it has one row per query ({queries} queries: a causal or sliding-window band, or a position "
                f"bias){kind}")
    return ""


def expanded_per_query(g: Graph, m: Node, depth: int = 8) -> Node | None:
    """The `expand` that makes the score term `m` `[.., 1, Sq, Sk]` from one row per batch (`[.., 1, 1, Sk]`), or
    None: `m` is computed elementwise (casts, arithmetic, compares, `where`) from that expand and scalars only, so
    its Sq rows are equal by construction: a padding mask expanded per query, as transformers' sdpa mask
    (`_prepare_4d_attention_mask_for_sdpa`) and the TorchScript exporter write it, not a band."""
    found: list[Node] = []

    def walk(n: Node, d: int) -> bool:
        if all(x == 1 for x in n.shape):
            return True
        if n.op == Op.EXPAND:
            src = g[n.inputs[0]]
            shape = (1,) * (n.rank - src.rank) + tuple(src.shape)
            if n.rank >= 2 and shape[-2] == 1 and shape[-3:-2] in ((), (1,)):
                found.append(n)
                return True
            return False
        elementwise = n.op in BINARY | UNARY | COMPARE or n.op in (Op.CAST, Op.WHERE)
        return d > 0 and elementwise and bool(n.inputs) and all(walk(g[i], d - 1) for i in n.inputs)

    return found[0] if walk(m, depth) and found else None


@reports("score_term", reads=("softmax",), kind=ILLEGAL)
def _score_term(c: Ctx) -> Fail | None:
    """Name the first score term the attention op cannot take (`score_terms.BLOCKING`: soft-cap, sinks, a
    content-position term) in front of the scores' pattern, with its kind. Illegal: packing would drop the term
    and change the numbers; the term is the model's own, so nothing is to change in the model."""
    terms = [t for t in score_terms(c.graph, c["softmax"]) if t.blocks]
    if not terms:
        return None
    t = terms[0]
    needs = {SOFT_CAP: "a soft-cap attribute (tanh(s / c) * c before the mask)",
             SINKS: "per-head sink logits (one more softmax column, dropped after it)",
             CONTENT_POSITION: "a term computed from Q (disentangled attention)"}[t.kind]
    return Fail("guard", "score_term",
                f"score term {t.kind}: {t.formula}, at {c.name_of(t.node)}; the attention op computes "
                f"softmax(QK^T * scale + mask) @ V and has no {t.kind}, so these scores stay as primitives",
                (t.node,), (), "nothing to change in the model: the term is the model's own", subject=t.node,
                kind=ILLEGAL, fix=f"an attention op that takes {needs}")


@reports("mask_form", "mask_model_term", "where_mask_additive",
         reads=("mask", "q_reshape", "k_reshape", "mask_where", "mask_cond", "mask_fill", "bias_add", "bias",
                "inner_where", "inner_cond", "inner_fill"),
         kinds={"mask_model_term": MODEL_TERM, "where_mask_additive": MODEL_TERM})
def _mask_form(c: Ctx) -> Fail | None:
    """Trace HF's additive mask to the keep mask (soft: otherwise keep it additive). A term that cannot be a
    padding mask (`model_term`) is kept as the attention's additive operand and said so (`mask_model_term`, the
    model's own term: no miss, no advice to rewrite the model). A where-mask that is not per key (causal,
    causal + padding, a band) is kept additive the same way (`where_mask_additive`)."""
    if "bias_add" in c:
        b = c["bias"]
        why = model_term(b, c.graph, c["q_reshape"].shape[2]) or "a term of the model"
        return Fail("guard", "where_mask_additive",
                    f"score term kept in the attention's additive operand where(cond, {c.the('bias', 'bias')}, "
                    f"fill): {b.op.value} {list(b.shape)} is added to the scores before the where-mask; "
                    f"{why} (exact)", (), (), "nothing to change in the model",
                    subject=b.id, kind=MODEL_TERM, fix="")
    if "inner_where" in c:
        return Fail("guard", "where_mask_additive", where_mask.nested_note(c), (), (),
                    "nothing to change in the model", subject=c.id("mask_cond"), kind=MODEL_TERM, fix="")
    if "mask_where" in c and where_mask.is_additive(c):
        return Fail("guard", "where_mask_additive", where_mask.additive_note(c), (), (),
                    "nothing to change in the model", subject=c.id("mask_cond"), kind=MODEL_TERM, fix="")
    if "mask" not in c:
        return QUIET
    g = c.graph
    m = c["mask"]
    b, s = c["q_reshape"].shape[0], c["k_reshape"].shape[1]
    chain = []
    why = None
    if m.op == Op.MUL and m.shape == (b, 1, 1, s) and _reshaped_first(c, m, b, s):
        return None
    term = model_term(m, g, c["q_reshape"].shape[2])
    if term and m.shape[-3:-2] in ((), (1,)) and (ex := expanded_per_query(g, m)) is not None:
        src = "" if ex.id == m.id else f", computed from {c.name_of(ex.id)}"
        return Fail("guard", "mask_model_term",
                    f"additive mask kept as the attention's operand: {c.the('mask', 'mask')} is {m.op.value} "
                    f"{list(m.shape)}{src}, a padding mask expanded per query (equal "
                    f"rows, the TorchScript / sdpa form), not a band; the fused attention adds it as it is (exact), "
                    f"and FusedAttentionBlock / FusedTransformerLayer take it as their additive mask operand",
                    (), (), "nothing to change in the model", subject=m.id, kind=MODEL_TERM, fix="")
    if term:
        return Fail("guard", "mask_model_term",
                    f"additive score term kept as the attention's operand: {c.the('mask', 'mask')} is {m.op.value} "
                    f"{list(m.shape)}; {term}, so it is not a padding mask and the fused attention adds it as it is "
                    f"(exact)", (), (), "nothing to change in the model", subject=m.id, kind=MODEL_TERM, fix="")
    if m.op != Op.RESHAPE or m.shape != (b, 1, 1, s):
        why = f"{c.the('mask', 'mask')} is {m.op.value} {list(m.shape)}, not reshape(..., [{b}, 1, 1, {s}])"
    else:
        mul = g[m.inputs[0]]
        chain.append(mul)
        neg_id = next((i for i in mul.inputs if is_const(g[i])), None) if mul.op == Op.MUL else None
        sub_id = next((i for i in mul.inputs if i != neg_id), None) if neg_id is not None else None
        sub = g[sub_id] if sub_id is not None else None
        neg = typed_value(g[neg_id]) if neg_id is not None else None
        if neg is None or not neg <= -1e4:
            why = f"{mul.op.value} (node {mul.id}) is not mul(..., big_negative <= -1e4)"
        elif (sub is None or sub.op != Op.SUB or not is_const(g[sub.inputs[0]])
              or typed_value(g[sub.inputs[0]]) != 1.0):
            why = f"node {sub_id} is not sub(1, mask)"
        else:
            cast = g[sub.inputs[1]]
            if cast.op != Op.CAST or cast.shape != (b, s) or g[cast.inputs[0]].dtype.is_float:
                why = f"{cast.op.value} (node {cast.id}) is not cast(integer keep mask [{b}, {s}])"
            elif not cast.dtype == sub.dtype == mul.dtype == m.dtype:
                why = (f"the mask is computed in {sub.dtype}/{mul.dtype} from a {cast.dtype} cast; the fused "
                       f"op computes (1 - mask) * fill in the mask's dtype")
            else:
                c.data["keep"] = cast.id
                c.data["fill"] = neg
                return None
    return Fail("guard", "mask_form", f"additive mask kept: {why}", (m.id,), (),
                "pass the integer attention_mask through HF's extended-mask formula to get a keep mask",
                subject=m.id, kind=NOT_RECOGNIZED,
                fix="recognize this mask formula (e.g. a where-based boolean mask) as a keep mask")


def _reshaped_first(c: Ctx, mul: Node, b: int, s: int) -> bool:
    """transformers' own order, `mul(sub(1, cast(reshape(m, [B, 1, 1, S]))), fill)` (the mask unsqueezed, then
    cast and scaled): recognized as the keep mask `m` with `mask_fill=fill` (True, `c.data` set). Exact:
    elementwise ops keep every element's position, so it equals `reshape(mul(sub(1, cast(m)), fill), [B, 1, 1,
    S])`, the form below, element for element; the keep operand `cast(m)` in the mask's dtype is made by the
    rewrite (`keep_from`). False for anything else (the checks below then name what differs)."""
    g = c.graph
    neg_id = next((i for i in mul.inputs if is_const(g[i])), None)
    if neg_id is None:
        return False
    neg, sub = typed_value(g[neg_id]), g[next(i for i in mul.inputs if i != neg_id)]
    if neg is None or not neg <= -1e4 or sub.op != Op.SUB or not is_const(g[sub.inputs[0]]) \
            or typed_value(g[sub.inputs[0]]) != 1.0:
        return False
    cast = g[sub.inputs[1]]
    if cast.op != Op.CAST or g[cast.inputs[0]].op != Op.RESHAPE:
        return False
    src = g[g[cast.inputs[0]].inputs[0]]
    if src.shape != (b, s) or src.dtype.is_float or not cast.dtype == sub.dtype == mul.dtype:
        return False
    c.data["keep_from"], c.data["keep_dtype"], c.data["fill"] = src.id, cast.dtype, neg
    c.data["keep"] = c.id("mask")  # a placeholder: _sdpa_rewrite puts cast(m) there
    return True


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
        new = rw.emit(op, ins, **attrs)
    rw.remove([a for a in absorbed if a != c.id("merge")])
    rw.replace(c.id("merge"), new)
    return new


def _scores_matmul(g: Graph, softmax: Node) -> Node | None:
    """The `Q @ K^T` matmul under a softmax, through at most three mask adds / scale muls or divs."""
    todo = [(softmax.inputs[0], 0)]
    while todo:
        i, d = todo.pop()
        n = g[i]
        if n.op == Op.MATMUL and n.rank == 4:
            return n
        if d < 3 and n.op in (Op.ADD, Op.MUL, Op.DIV, Op.WHERE):
            todo += [(j, d + 1) for j in n.inputs]
    return None


def _under(g: Graph, n: Node) -> list[Node]:
    """`n` and what a rotation reaches the scores through: a transpose, a cast (a half-precision model's rotation in
    float32), a scalar-constant scale, the rotated part of a partial-rotary `concat(rot, pass)` (up to three steps)."""
    out = [n]
    for _ in range(3):
        if n.op in (Op.TRANSPOSE, Op.CAST) or (n.op == Op.CONCAT and len(n.inputs) == 2):
            n = g[n.inputs[0]]
        elif n.op in (Op.MUL, Op.DIV) and len(n.inputs) == 2 and sum(is_const(g[i]) for i in n.inputs) == 1:
            n = g[next(i for i in n.inputs if not is_const(g[i]))]
        else:
            break
        out.append(n)
    return out


def _score_operands(g: Graph, softmax: Node) -> list[tuple[str, Node]]:
    """The nodes under Q ("Q") and K ("K", past its transpose) that feed the scores matmul of `softmax` (`_under`),
    [] when the scores are no matmul the pattern reads."""
    mm = _scores_matmul(g, softmax)
    if mm is None:
        return []
    k = g[mm.inputs[1]]
    k = g[k.inputs[0]] if k.op == Op.TRANSPOSE else k
    return [(who, m) for who, n in (("Q", g[mm.inputs[0]]), ("K", k)) for m in _under(g, n)]


@reports("rope_on_heads", reads=("softmax",))
def _rope_on_heads(c: Ctx) -> Fail | None:
    """Name RoPE written on the heads (`q * cos + rotate_half(q) * sin` after the head split) in front of the
    scores: the HF pattern takes Q and K straight from the head split, so the rotation is what blocks it."""
    g = c.graph
    operands = _score_operands(g, c["softmax"])
    if not operands:
        return None
    twos = [(who, r) for who, n in operands if (r := interleaved_rope(g, n)) is not None]
    if twos:
        who, (add, cat) = twos[0]
        both = " and K" if len({w for w, _ in twos}) == 2 else ""
        return Fail("guard", "rope_on_heads",
                    f"{who}{both} rotated by RoPE written interleaved (rotate_every_two, GPT-J): {c.name_of(add)} = "
                    f"h * cos + rotate_every_two(h) * sin (pairs h[2i], h[2i+1]: {c.name_of(cat)}); the rope op "
                    f"rotates them with rope(interleaved=True), but fuse_sdpa.rope_pairs did not rewrite it: "
                    f"{refusal(ROPE_PAIRS, g, add) or 'a product of the form is read elsewhere'}", (add,), (),
                    "nothing to change in the model: an interleaved rotation keeps its attention as primitives",
                    subject=add, kind=NOT_RECOGNIZED,
                    fix="fuse_sdpa.rope_pairs rewrites h * cos + rotate_every_two(h) * sin with neighbour-equal "
                        "[S, d] tables whose values are known and no other reader of its products; teach it this "
                        "form")
    found = [(who, rotate_half_rope(g, n)) for who, n in operands]
    found = [(who, r) for who, r in found if r is not None]
    if not found:
        return None
    who, (add, cat) = found[0]
    both = " and K" if len({w for w, _ in found}) == 2 else ""
    why = refusal(ROPE_HEADS, g, add)
    return Fail("guard", "rope_on_heads",
                f"{who}{both} rotated by RoPE written on the heads: {c.name_of(add)} = h * cos + rotate_half(h) * sin "
                f"(rotate_half: {c.name_of(cat)}); the attention pattern takes Q and K straight from the head split"
                + (f"; fuse_sdpa.rope_heads did not rewrite it: {why}" if why else ""),
                (add,), (), "apply the rope op to the Q/K projections before the head split (rlxviz's rope op, "
                "NeoX half split), so the attention packs", subject=add, kind=NOT_RECOGNIZED,
                fix="fuse_sdpa.rope_heads rewrites h * cos + rotate_half(h) * sin with cos = concat(t, t) of an "
                    "[S, d/2] table and no other reader of its products; teach it this form")


@reports("latent_heads", reads=("softmax",))
def _latent_heads(c: Ctx) -> Fail | None:
    """Name multi-head latent attention (DeepSeek-V2/V3's MLA) in front of the scores: Q (and K) reach the score
    matmul as a concat along head_dim of a part without RoPE and a rotated part (`q = concat(q_nope, q_rope)`, K's
    rotated part shared by every head), not as the head split of one projection the pattern reads."""
    g = c.graph
    operands = _score_operands(g, c["softmax"])

    def rotated(i: int) -> bool:
        """A RoPE as the patterns read it, or rotation-shaped: `x * cos + cat(-x2, x1) * sin` with any tables."""
        n = g[i]
        while n.op == Op.TRANSPOSE:  # a rope op on the packed values, back in the head layout
            n = g[n.inputs[0]]
        if n.op == Op.RESHAPE and g[n.inputs[0]].op == Op.ROPE:
            return True
        if n.op == Op.ROPE or rotate_half_rope(g, n) is not None or interleaved_rope(g, n) is not None:
            return True
        return n.op == Op.ADD and any(
            g[m].op == Op.MUL and any(g[j].op == Op.CONCAT and any(g[t].op == Op.NEG for t in g[j].inputs)
                                      for j in g[m].inputs) for m in n.inputs)

    # MLA's order: (the part without RoPE, the rotated part); a partial rotary (GPT-NeoX, Phi) is (rotated, pass)
    cats = [(who, m) for who, m in operands
            if m.op == Op.CONCAT and m.rank == 4 and int(m.attrs.get("axis", -1)) % 4 == 3 and len(m.inputs) == 2
            and rotated(m.inputs[1]) and not rotated(m.inputs[0])]
    if not cats:
        return None
    who, cat = cats[0]
    d1, d2 = (g[i].shape[-1] for i in cat.inputs)
    both = " and K" if len({w for w, _ in cats}) == 2 else ""
    return Fail("guard", "latent_heads",
                f"multi-head latent attention (DeepSeek MLA): {who}{both} = concat(part without RoPE [{d1}], rotated "
                f"part [{d2}]) along head_dim at {c.name_of(cat.id)} (head_dim {d1 + d2}); the attention pattern "
                f"reads Q and K as the head split of one projection, so these scores stay as primitives",
                (cat.id,), (), "nothing to change in the model: the latent attention's heads are its own design",
                subject=cat.id, kind=NOT_RECOGNIZED,
                fix="fuse_sdpa reads heads concatenated along head_dim as one head split (q . k sums over both "
                    "parts: exact)")


SDPA = Rule(
    "fuse_sdpa.hf_attention", P(Op.SOFTMAX, name="softmax", where=lambda n: n.rank == 4),
    steps=(
        guard("softmax_last_axis", lambda c: c["softmax"].attrs.get("axis", -1) in (-1, 3),
              lambda c: f"{c.d('softmax')} is over axis {c['softmax'].attrs.get('axis')}; needs the key axis (-1)",
              requires=("softmax",), kind=NOT_RECOGNIZED,
              fix="none for attention: a softmax over another axis is not key-axis attention"),
        _rope_on_heads,
        _score_term,
        _latent_heads,
        Shape("scores_form", "softmax", P(Op.SOFTMAX, _SCORES, name="softmax"),
              "scores must be matmul(q_heads, transpose(k_heads)) [scaled] [+ mask]"),
        User("pv_form", "pv", "softmax", P(Op.MATMUL, P.var("softmax"), kv_heads_pattern("v", _heads("v")), name="pv"),
             "matmul(softmax, v_heads)"),
        User("merge_form", "merge_t", "pv", P(Op.TRANSPOSE, name="merge_t"), "transpose (merge heads)"),
        User("merge_reshape", "merge", "merge_t", P(Op.RESHAPE, name="merge"), "reshape to [B, S, H]"),
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
              kind=ILLEGAL, reads=tuple(r for pair in _FACTORS for r in pair), subject=_bad_scale,
              fix="none: the packed attention's scale is a finite, non-zero number",
              no_model_fix=lambda c: "an infinite or zero factor is what the model computes (every score the "
                                     "same, or NaN): another factor changes its numbers"),
        Soft(_mask_form),
    ),
    result="merge", absorb=(*_INTERNAL, "merge"), build=_sdpa_build, rewrite=lambda c, rw: _sdpa_rewrite(c, rw),
    shared=_VIEWS,
    doc="HF head split (+ Q/K pre-scale) + matmul/scale/mask/softmax/matmul + merge -> packed attention "
        "(keep mask traced)")

_sdpa_rules = rule_pass("fuse_sdpa", [SDPA], "")


def _fuse_sdpa(graph: Graph, params: Mapping[str, Any]) -> PassResult:
    """The exact canonicalizations, in order, then `SDPA`: folded-heads chains lifted to the 4-D head layout
    (`heads.unfold_heads`); exported head layouts (a gather or view of a fused QKV) read as a plain head split
    (`head_layout.canonical_heads`); a QK-norm on the heads moved in front of the split
    (`head_norm.hoist_head_norms`); a half-precision model's float32 rotation between casts read with its casts
    moved off the rotation and the head split (`rope_casts`, before and after the rope rewrites); RoPE written on
    the heads (`rope_heads.rope_heads`) and its interleaved form
    (`rope_pairs.rope_pairs`) to the rope op; one broadcast K/V head as `repeat_kv`
    (`head_layout.repeat_broadcast_kv`); a decode step's KV-cache concat read packed (`kv_cache.pack_cache`);
    `[1]`-shaped Q/K scales as scalars (`scale_path.scalar_scales`) moved next to the head split
    (`scale_path.hoist_scales`).

    Run as one pass (`engine.compose`): its records name only nodes of its input or output graph, never a node one
    stage made and a later one absorbed (a rope `rope_heads` made, then packed into the attention). The rewrites
    written as guarded `Rule`s run as their own rule passes (`*_PASS`), so what they refuse is recorded as their own
    near miss."""
    stages = [staged(unfold_heads), CANONICAL_HEADS_PASS, HOIST_HEAD_NORMS_PASS, CAST_ROTATION_PASS, CAST_HEADS_PASS,
              ROPE_HEADS_PASS, ROPE_PAIRS_PASS, CAST_HEADS_PASS, REPEAT_BROADCAST_KV_PASS, PACK_CACHE_PASS,
              SCALAR_SCALES_PASS, HOIST_SCALES_PASS, where_mask.UNINVERT_WHERE_PASS, _sdpa_rules]
    return compose(graph, params, stages)


fuse_sdpa = Pass("fuse_sdpa", _fuse_sdpa, (SDPA,), doc="Hugging Face scaled-dot-product attention -> packed "
                 "attention op (heads folded into the batch lifted to [B, H, S, d] first, Q/K scales moved next to "
                 "the head split)", product="packed attention")

# -- fuse_attention_block --------------------------------------------------------------------------


def _block_unexpected(mask: str | None) -> str:
    """Why FusedAttentionBlock is not expected of a pre-norm layer whose attention mask is `mask` (not a keep mask)."""
    if mask == "additive":
        return ("FusedAttentionBlock takes this layer's additive mask when the rest of the block matches, but a "
                "pre-norm layer is only expected to pack its attention (the block is expected with a keep mask)")
    return (f"FusedAttentionBlock takes a keep mask or an additive one as its mask operand; this layer's attention "
            f"mask is {mask or 'absent'}")


def tokens(c: Ctx, role: str = "attn") -> tuple[int, str]:
    """batch*seq of the attention bound to `role` (its output is [B, S, H])."""
    b, s = c[role].shape[0], c[role].shape[1]
    return b * s, f"{b}*{s}"


def size_gate(role: str = "attn") -> Guard:
    """The per-anchor batch*seq gate (pipeline param `fab_max_tokens`; None = no gate)."""
    return size_le("fab_max_tokens", lambda c: tokens(c, role), "batch*seq", "attention_size_gate", role,
                   "raise or unset fab_max_tokens (the canonical profile has no gate; the rlx profile uses 64)")


def _widths(c: Ctx) -> tuple[int, int]:
    """(H, KV): the query width and the key/value width of the bound attention (GQA: KV < H)."""
    a = c["attn"].attrs
    return a["num_heads"] * a["head_dim"], kv_heads(a) * a["head_dim"]


def _split_at(c: Ctx) -> bool:
    h, kv = _widths(c)
    rank = c["qkv"].rank
    for r, start, n in (("q", 0, h), ("k", h, kv), ("v", h + kv, kv)):
        a = c[r].attrs
        if a["axis"] not in (-1, rank - 1) or a["start"] != start or a["length"] != n:
            return False
    return c["qkv"].shape[-1] == h + 2 * kv


def _explain_block_scale(c: Ctx) -> str:
    a = c["attn"].attrs
    d = a["head_dim"]
    return (f"{c.d('attn')} has scale={a.get('scale')!r}; the block computes the default 1/sqrt(head_dim) = "
            f"1/sqrt({d}) = {1 / math.sqrt(d):.6g}")


_ROLE_NAMES = {"q_prescale": "Q pre-scale", "k_prescale": "K pre-scale", "scale": "scores' scale"}


def scale_origin(steps: Sequence[Any], r: Rejection) -> str:
    """Where a refused attention scale came from (`default_scale`): the Q/K pre-scale and score-scale nodes that
    `fuse_sdpa` (an earlier step of `steps`, the `PassStep`s before the rejection) folded into the attention's
    `scale`, each with its factor, their product, and whether 1/sqrt(head_dim) is applied twice. "" when the
    attention was not built by `fuse_sdpa` in this run or its scale had one factor of no interest."""
    if r.guard != "default_scale":
        return ""
    attn = r.bindings.get("attn", r.anchor)
    for step in reversed(steps):
        m = next((m for m in step.matches if m.pass_name == "fuse_sdpa" and m.fused == attn), None)
        if m is None:
            continue
        g, b = step.before, m.bindings
        parts, product = [], 1.0
        for op_role, const_role in (*_FACTORS[1:], _FACTORS[0]):  # in dataflow order: Q, K, then the scores
            if op_role not in b or const_role not in b:
                continue
            if b[op_role] not in g or b[const_role] not in g:  # a scale lifted by unfold_heads: a new node
                continue
            node, v = g[b[op_role]], typed_value(g[b[const_role]])
            if v is None:
                return ""
            f = 1.0 / v if node.op == Op.DIV else v
            product *= f
            how = f"/ {v:.6g} (factor {f:.6g})" if node.op == Op.DIV else f"* {f:.6g}"
            where = f"node {node.id}" + (f", {node.path}" if node.path else "")
            parts.append(f"{_ROLE_NAMES[op_role]} {node.op.value} ({where}) {how}")
        packed = step.after.get(m.fused) if m.fused is not None else None
        d = packed.attrs.get("head_dim") if packed is not None else None
        upstream = [(side, n, f) for side, n, f in (_upstream_scales(step.after, packed) if d else [])
                    if any(math.isclose(f, d ** e, rel_tol=1e-3) for e in (-0.5, -0.25))]
        earlier = ""
        if upstream:  # e.g. ESM: Q scaled before its RoPE; the rotation sits between, so fuse_sdpa folds nothing
            found = ", ".join(f"{side} {n.op.value} (node {n.id}{', ' + n.path if n.path else ''}) * {f:.6g}"
                              for side, n, f in upstream)
            total = product * math.prod(f for _, _, f in upstream)
            default = 1.0 / math.sqrt(d)
            verdict = (f"with them the scores are scaled by 1/sqrt({d}) in all, so scaling them again would apply it "
                       "twice; no model change is needed, the block needs a scale attribute"
                       if math.isclose(total, default, rel_tol=1e-3) else
                       f"with them the scores are scaled by {total:.6g} in all, not 1/sqrt({d}) = {default:.6g}")
            earlier = (f"; the scores are scaled earlier on the operands' path: {found}, where fuse_sdpa cannot fold "
                       f"it (a rotation or another op sits between): {verdict}")
        if not parts:
            return earlier or "; the scores are not scaled (scale 1.0): scale them by 1/sqrt(head_dim)"
        out = f"; fuse_sdpa folded it from {', '.join(parts)}"
        if len(parts) > 1:
            out += f": product {product:.6g}"
        if d:
            default = 1.0 / math.sqrt(d)
            if len(parts) > 1 and math.isclose(product, default * default, rel_tol=1e-6):
                out += (f" = (1/sqrt({d}))^2 = 1/{d}: the 1/sqrt(head_dim) scale is applied twice (keep either "
                        f"the pre-scale or the scores' scale)")
            elif math.isclose(product, default, rel_tol=1e-6):
                pass
            elif not earlier:
                out += f", not 1/sqrt({d}) = {default:.6g}"
        return out + earlier
    return ""


_SCALE_WALK_OPS = frozenset({Op.TRANSPOSE, Op.RESHAPE, Op.EXPAND, Op.CAST, Op.NARROW, Op.CONCAT, Op.NEG, Op.ADD,
                             Op.SUB, Op.MUL, Op.DIV, Op.ROPE})
"""Ops the scale search walks up through from an attention's Q/K operand: layout moves and the arithmetic a RoPE is
written with (`q * cos + rotate_half(q) * sin`); it stops at anything else (a projection's matmul, a norm)."""


def _upstream_scales(g: Graph, attn: Node, depth: int = 24) -> list[tuple[str, Node, float]]:
    """Scalar constant scales (`x * c`, `c * x`, `x / c`) on the paths of `attn`'s Q and K operands up to the
    first op outside `_SCALE_WALK_OPS` (at most `depth` nodes a side): `[(side, node, factor)]`. What a scale
    advice must look for before it says the scores are not scaled (ESM scales Q before its RoPE); the caller keeps
    the factors of an attention scale (1/sqrt(head_dim), or its square root on each side), not a dequantization's."""
    out: list[tuple[str, Node, float]] = []
    for side, start in (("Q", attn.inputs[0]), ("K", attn.inputs[1] if len(attn.inputs) > 1 else None)):
        seen: set[int] = set()
        todo = [start] if start is not None else []
        while todo and len(seen) < depth:
            i = todo.pop()
            if i in seen or i not in g:
                continue
            seen.add(i)
            n = g[i]
            if n.op not in _SCALE_WALK_OPS:
                continue
            consts = [j for j in n.inputs if is_const(g[j]) and g[j].shape in ((), (1,))]
            if n.op in (Op.MUL, Op.DIV) and len(n.inputs) == 2 and len(consts) == 1:
                v = typed_value(g[consts[0]])
                if v not in (None, 0.0) and not (n.op == Op.DIV and consts[0] == n.inputs[0]):
                    out.append((side, n, 1.0 / v if n.op == Op.DIV else v))
            todo += [j for j in n.inputs if not is_const(g[j])]
    return out


def _explain_split(c: Ctx) -> str:
    h, kv = _widths(c)
    got = ", ".join(f"{r}=narrow(axis {c[r].attrs['axis']}, start {c[r].attrs['start']}, len {c[r].attrs['length']})"
                    for r in ("q", "k", "v"))
    width = c["qkv"].shape[-1]
    if width != h + 2 * kv:
        qkv = {c.id(r) for r in ("q", "k", "v")}
        others = [u for u in c.users("qkv") if u.id not in qkv]
        extra = ", ".join(f"{u.op.value} (node {u.id}" + (f", start {u.attrs['start']}, len {u.attrs['length']})"
                                                          if u.op == Op.NARROW else ")") for u in others)
        why = (f": it also feeds {extra}, another projection of the same input merged into it (by "
               f"fuse_shared_input_matmul)" if others else "")
        return (f"{got} of {c.d('qkv')}: the packed projection is {width} wide, not {h}+2*{kv} = {h + 2 * kv}{why}; "
                f"needs exactly Q, K and V at 0/{h}/{h + kv}")
    lens = f"length {h}" if kv == h else f"lengths {h}/{kv}/{kv} (grouped-query)"
    return f"{got} of {c.d('qkv')} {list(c['qkv'].shape)}; needs starts 0/{h}/{h + kv} with {lens} on the last axis"


def _unfused_bias(c: Ctx) -> Node | None:
    """A bare-matmul output projection's bias add that `fuse_matmul_bias_act` did not take (the matmul has
    other readers): the block would compute the product without it, so it is not taken as bias-less."""
    out = c["out"]
    if out.op != Op.MATMUL:
        return None
    g = c.graph
    for u in c.users("out"):
        if u.op == Op.ADD and u.inputs.count(out.id) == 1:
            other = g[next(i for i in u.inputs if i != out.id)]
            if other.shape in ((), (1,), (out.shape[-1],)):
                return u
    return None


def _explain_unfused_bias(c: Ctx) -> str:
    add = _unfused_bias(c)
    assert add is not None
    return (f"the output projection {c.d('out')} is a bare matmul, but its bias add {add.op.value} (node {add.id}) "
            f"was not fused into it ({c.d('out')} has {len(c.users('out'))} users"
            f"{', and is a graph output' if c.graph.is_output(c.id('out')) else ''}); the block would leave the "
            f"bias outside")


def _block_rewrite(c: Ctx, rw: Rewriter) -> int:
    """The FusedAttentionBlock; a projection that is a bare matmul (no bias) gets a zero bias
    `expand(0.0, [N])` as its bias operand: `x @ w + 0 == x @ w` for every input, so the block computes
    the matched chain exactly."""
    attn = c["attn"].attrs
    attrs = {"num_heads": attn["num_heads"], "head_dim": attn["head_dim"], "has_bias": True,
             "has_rope": "q_rope" in c, "num_kv_heads": attn.get("num_kv_heads"), "mask_fill": attn.get("mask_fill")}
    attrs["mask"] = attn["mask"]  # keep or additive (guard mask_kind_keep): the attention's operand, as it is
    absorbed = [c.id(r) for r in ("qkv", "q", "k", "q_rope", "k_rope", "v", "attn", "out") if r in c]
    ins = []
    with rw.provenance(absorbed):
        for r in operand_roles(Op.FUSED_ATTENTION_BLOCK, attrs, 0):
            if r in c:
                ins.append(c.id(r))
            else:  # qkv_b / out_b of a bare matmul projection
                proj = c[r[:-2]]
                ins.append(rw.expand(rw.const(0.0, proj.dtype), (proj.shape[-1],)))
    return rw.fuse(Op.FUSED_ATTENTION_BLOCK, ins, attrs, absorbed=absorbed, result=c.id("out"))


def _projected_from(g: Graph, i: int) -> int | None:
    """The input a Q/K/V operand is projected from: `x` of `matmul(x, w)` / `FusedMatMulBiasAct(x, ...)`, through
    a bias add and a narrow of a packed projection; None when it is not a projection (a norm, a rotation)."""
    for _ in range(4):
        n = g[i]
        if n.op in (Op.MATMUL, Op.FUSED_MATMUL_BIAS_ACT):
            return n.inputs[0]
        if n.op == Op.NARROW:
            i = n.inputs[0]
        elif n.op == Op.ADD:
            mm = [j for j in n.inputs if g[j].op == Op.MATMUL]
            if len(mm) != 1:
                return None
            i = mm[0]
        else:
            return None
    return None


@reports("self_attention", kind=MODEL_TERM, reads=("attn",))
def _self_attention(c: Ctx) -> Fail | None:
    """Q and K/V projected from one input (self-attention). Cross-attention (Q from the decoder, K/V from the
    encoder) is the model's own structure: the block, one QKV projection of one hidden input, cannot hold it."""
    g, attn = c.graph, c["attn"]
    q, k, v = (_projected_from(g, i) for i in attn.inputs[:3])
    if q is None or k is None or v is None or q == k == v:
        return None
    kv = k if k == v else None
    what = (f"K and V from {c.name_of(kv)}" if kv is not None
            else f"K from {c.name_of(k)} and V from {c.name_of(v)}")
    mine, theirs = layer_of(attn.path), {layer_of(g[i].path) for i in attn.inputs[1:3]}
    if mine is not None and None not in theirs and mine not in theirs:  # cross-layer KV sharing (Gemma 3n, CLA)
        owner = ", ".join(map(str, sorted(theirs)))
        return Fail("guard", "self_attention",
                    f"layer {mine}'s attention {c.d('attn')} reads K and V projected in layer {owner} ({what}): "
                    f"cross-layer KV sharing; FusedAttentionBlock projects the K/V of its own layer (one QKV "
                    f"projection)", (), (), "nothing to change in the model: sharing K/V is the model's own "
                    "structure, and the attention stays packed over the shared K/V",
                    subject=attn.inputs[1], kind=MODEL_TERM,
                    fix="the block would need a KV input it does not own: a block variant that takes K/V as "
                        "operands (its own Q projection, another layer's K/V)")
    return Fail("guard", "self_attention",
                f"Q and K/V come from different inputs: Q is projected from {c.name_of(q)}, {what} "
                f"(cross-attention); FusedAttentionBlock is the self-attention of one hidden input (one QKV "
                f"projection)", (), (), "nothing to change in the model: cross-attention keeps its packed attention",
                subject=q, kind=MODEL_TERM, fix="a cross-attention block (a Q projection and a packed K/V projection)")


def _rotated(tag: str) -> P:
    """Q or K of the block: a narrow of the packed QKV projection, or that narrow rotated by the rope op (the
    block's `has_rope`: one cos/sin table pair for Q and K)."""
    narrow = P(Op.NARROW, P.var("qkv"), name=tag)
    return P(Op.ROPE, narrow, P.var("rope_cos"), P.var("rope_sin"), name=f"{tag}_rope") | narrow


@reports("rope_q_and_k", "rope_full_rotary", reads=("attn", "q_rope", "k_rope"))
def _block_rope(c: Ctx) -> Fail | None:
    """The block's RoPE rotates Q and K, every dim of each head (NeoX half split, `n_rot == head_dim`), with the
    attention's head_dim: a rotation of one of them or of part of each head stays outside (named)."""
    ropes = [r for r in ("q_rope", "k_rope") if r in c]
    if not ropes:
        return None
    d = c["attn"].attrs["head_dim"]
    if len(ropes) == 1:
        who = ropes[0][0].upper()
        return Fail("guard", "rope_q_and_k", f"{c.d(ropes[0])} rotates {who} only; FusedAttentionBlock's RoPE rotates "
                    f"Q and K with one cos/sin table pair", (c.id(ropes[0]),), (), "nothing to change in the model: "
                    "the packed attention keeps the rotation as its operand", subject=c.id(ropes[0]),
                    kind=NOT_RECOGNIZED, fix="a block RoPE applied to Q or K alone")
    for r in ropes:
        a = c[r].attrs
        if a["head_dim"] != d or a["n_rot"] != d:
            return Fail("guard", "rope_full_rotary",
                        f"{c.d(r)} rotates {a['n_rot']} of {a['head_dim']} dims per head (partial rotary) on heads "
                        f"of {d}; FusedAttentionBlock's RoPE rotates every dim of each head", (c.id(r),), (),
                        "nothing to change in the model: partial rotary keeps its packed attention",
                        subject=c.id(r), kind=NOT_RECOGNIZED, fix="an n_rot attribute on FusedAttentionBlock")
        if a.get("interleaved", False):
            return Fail("guard", "rope_full_rotary",
                        f"{c.d(r)} rotates interleaved pairs (GPT-J, rotate_every_two); FusedAttentionBlock's RoPE "
                        "rotates the NeoX halves", (c.id(r),), (),
                        "nothing to change in the model: the interleaved rotation keeps its packed attention",
                        subject=c.id(r), kind=NOT_RECOGNIZED, fix="an interleaved attribute on FusedAttentionBlock")
    return None


@reports("kv_cache", kind=MODEL_TERM, reads=("attn",))
def _kv_cache(c: Ctx) -> Fail | None:
    """K or V read through a KV cache (a decode step: `concat(past, this step's K)`, `kv_cache.pack_cache`): the
    block projects K and V from the hidden states only, so it cannot hold the cache (the model's own structure)."""
    g, attn = c.graph, c["attn"]
    for who, i in (("K", attn.inputs[1]), ("V", attn.inputs[2])):
        n = g[i]
        if n.op == Op.CONCAT and len(n.inputs) == 2 and n.attrs["axis"] in (1, -2):
            past = g[g[n.inputs[0]].inputs[0]] if g[n.inputs[0]].op == Op.RESHAPE else g[n.inputs[0]]
            past = g[past.inputs[0]] if past.op == Op.TRANSPOSE else past
            return Fail("guard", "kv_cache",
                        f"{who} is {c.name_of(n.id)}: the cache {c.name_of(past.id)} and this step's {who} (a decode "
                        f"step with a KV cache, {attn.shape[1]} quer{'y' if attn.shape[1] == 1 else 'ies'} against "
                        f"{n.shape[1]} keys); FusedAttentionBlock projects K and V from the hidden states, so the "
                        f"cache stays outside the packed attention's block", (n.id,), (),
                        "nothing to change in the model: the decode step keeps its packed attention", subject=n.id,
                        kind=MODEL_TERM, fix="a block that appends this step's K/V to a cache operand")
    return None


BLOCK = Rule(
    "fuse_attention_block.qkv_attention_out", P(Op.ATTENTION, name="attn"),
    steps=(
        size_gate(),
        guard("mask_kind_keep", lambda c: c["attn"].attrs.get("mask", "none") in BLOCK_MASK_KINDS,
              lambda c: f"{c.d('attn')} has mask={c['attn'].attrs.get('mask', 'none')!r}; FusedAttentionBlock takes "
                        f"a keep or an additive mask operand",
              "the block takes a keep mask or an additive one; a causal or absent mask has no operand for it",
              requires=("attn",), kind=NOT_RECOGNIZED, subject=lambda c: c.id("attn"),
              fix="give FusedAttentionBlock causal and no-mask kinds (no mask operand)"),
        attr_eq("attn", "scale", None, "default_scale", "the block uses 1/sqrt(head_dim)",
                fix="give FusedAttentionBlock a scale attribute", explain=_explain_block_scale),
        _self_attention,
        _kv_cache,
        Shape("qkv_packed", "attn", P(Op.ATTENTION, _rotated("q"), _rotated("k"), P(Op.NARROW, P.var("qkv"), name="v"),
                                      P.var("mask"), name="attn"),
              "q, k and v must be narrows of one QKV projection (q and k may be rotated by one rope): run "
              "fuse_shared_input_matmul first"),
        _block_rope,
        guard("qkv_split", _split_at, _explain_split, "split Q/K/V at 0/H/2H of the last axis",
              requires=("qkv", "attn", "q", "k", "v"), kind=NOT_RECOGNIZED,
              fix="permute the packed weight's columns to Q/K/V order, or slice the extra width off"),
        all_single_use(("q", "k", "v"), "qkv_narrows_single_use",
                       fix="a FusedAttentionBlock that also returns the Q/K/V it projects (Rule.outputs), for their "
                           "other reader (a later layer sharing this layer's K/V)"),
        Shape("qkv_is_fused_linear", "qkv",
              P(Op.FUSED_MATMUL_BIAS_ACT, P.var("hidden"), P.var("qkv_w"), P.var("qkv_b"), name="qkv",
                attrs={"activation": None}, what="FusedMatMulBiasAct(activation=None)")
              | P(Op.MATMUL, P.var("hidden"), P.var("qkv_w"), name="qkv", what="a bias-less matmul"),
              "run fuse_matmul_bias_act first"),
        user_count("qkv", 3, "the q, k and v narrows", "qkv_user_count"),
        not_output("qkv", "qkv_not_output"),
        single_user("attn", "attn_single_user"),
        not_output("attn", "attn_not_output"),
        User("out_is_fused_linear", "out", "attn",
             P(Op.FUSED_MATMUL_BIAS_ACT, P.var("attn"), P.var("out_w"), P.var("out_b"), name="out",
               attrs={"activation": None})
             | P(Op.MATMUL, P.var("attn"), P.var("out_w"), name="out"),
             "the output projection FusedMatMulBiasAct(activation=None) or a bias-less matmul",
             "run fuse_matmul_bias_act first"),
        guard("out_bias_absorbed", lambda c: _unfused_bias(c) is None, _explain_unfused_bias,
              "let the output projection feed only its bias add, so fuse_matmul_bias_act fuses them",
              requires=("out",), kind=NOT_RECOGNIZED, subject=lambda c: c.id("out"),
              fix="take the bias add into the block when the raw product has other readers"),
    ),
    result="out", absorb=("qkv", "q", "k", "q_rope", "k_rope", "v", "attn", "out"), rewrite=_block_rewrite,
    doc="QKV linear -> narrows -> attention(keep|additive) -> out linear -> FusedAttentionBlock (a bias-less QKV or "
        "output projection gets a zero bias: exact)")

fuse_attention_block = rule_pass("fuse_attention_block", [BLOCK], "QKV + attention + out-projection -> "
                                 "FusedAttentionBlock", requires=("fuse_matmul_bias_act",),
                                 product="FusedAttentionBlock", expected_of=("post_ln", "keep_mask"),
                                 excused_by=(("kv_cache", "FusedAttentionBlock projects K and V from the hidden "
                                              "states; this layer's attention reads a KV cache (a decode step)"),),
                                 unexpected=lambda a: _block_unexpected(a.mask))

__all__ = ["BLOCK", "SDPA", "fuse_attention_block", "fuse_sdpa", "scale_origin", "size_gate", "tokens"]
