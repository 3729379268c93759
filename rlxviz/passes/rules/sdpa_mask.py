"""The score terms and masks `fuse_sdpa.hf_attention` reads: the keep-mask trace (`mask_form`), the model's own
additive terms it keeps as the attention's operand (`model_term`, `expanded_per_query`), and the score terms the
attention op cannot take (`score_term`). Guards and readers only: the rewrite is `attention._sdpa_rewrite`.

Validity: as stated in `attention.py` (the fused op adds `(1 - mask) * fill`, the unfused formula itself, in the
mask's dtype; an additive term is kept as an operand and added as is).
"""

from __future__ import annotations

import numpy as np

from ...ir import Graph, Node, Op
from ...ir.ops import BINARY, COMPARE, UNARY
from ..guard import ILLEGAL, MODEL_TERM, NOT_RECOGNIZED, Ctx
from ..pattern import const_value, describe, is_const
from ..rule import QUIET, Fail, reports
from ..score_terms import (
    ALIBI,
    BAND,
    CONTENT_POSITION,
    RELATIVE_BIAS,
    SINKS,
    SOFT_CAP,
    additive_term,
    mask_input,
    score_terms,
)
from . import where_mask


def typed_value(node: Node) -> float | None:
    """A scalar const's value as its dtype holds it (a `bool` const of 4.0 is 1.0, an f16 one is rounded),
    else None. The attrs keep the literal; the numbers use this."""
    v = const_value(node)
    if v is None:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.asarray(v).astype(node.dtype.numpy))



def model_term(m: Node, g: Graph | None = None, heads: int = 0) -> str:
    """Why the additive score term `m` cannot be a per-key keep mask, or "": a padding mask varies only along the
    batch and the key axis (`[B, 1, 1, Sk]`), so a term with more than one row per head (`[.., H, .., ..]`: ALiBi,
    a relative position bias) or per query (`[.., .., Sq, Sk]`: a causal or sliding-window band) is the model's
    own: the attention takes it as an additive operand, unchanged. Such a term may still hold padding (a causal mask
    and'ed with `attention_mask`, as gpt-neox's legacy export builds it), so the words never call it "not a padding
    mask": it is not a per-key mask such as padding alone. With the graph, the term's kind is named
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
def score_term(c: Ctx) -> Fail | None:
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
def mask_form(c: Ctx) -> Fail | None:
    """Trace HF's additive mask to the keep mask (soft: otherwise keep it additive). A term that cannot be a
    padding mask (`model_term`) is kept as the attention's additive operand and said so (`mask_model_term`, the
    model's own term: no miss, no advice to rewrite the model). A where-mask that is not per key (causal,
    causal + padding, a band) is kept additive the same way (`where_mask_additive`)."""
    if "bias_add" in c:
        b = c["bias"]
        term, why = _added_term(c, b)
        return Fail("guard", "where_mask_additive",
                    f"score term kept in the attention's additive operand where(cond, {term}, "
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
                    f"{list(m.shape)}; {term}, so it is not a per-key mask such as padding alone (it may hold "
                    f"padding as well); the fused attention adds it as it is (exact)", (), (),
                    "nothing to change in the model", subject=m.id, kind=MODEL_TERM, fix="")
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


def _added_term(c: Ctx, b: Node) -> tuple[str, str]:
    """The term `b` added to the scores before a where-mask, named by what it is, and why it is one: a mask
    built from a mask input (`score_terms.mask_input`) is "the additive padding mask" (one value per batch row
    and key) or "the additive mask" (more rows: padding with a band); any other term, and a position term built
    from the mask too (BLOOM's ALiBi reads `attention_mask`'s cumsum), is "the bias"."""
    heads = c["q_reshape"].shape[2]
    why = model_term(b, c.graph, heads)
    src = mask_input(c.graph, b.id)
    kind = additive_term(c.graph, b.id, heads)
    if src is None or (kind is not None and kind.kind != BAND):
        return c.the("bias", "bias"), why or "a term of the model"
    built = f"built from input {src.name} (node {src.id})"
    if why:
        return f"the {describe(b, 'additive mask')}", f"{why}, {built}"
    return (f"the {describe(b, 'additive padding mask')}",
            f"the padding mask, {built}: one value per batch row and key")


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


__all__ = ["expanded_per_query", "mask_form", "model_term", "score_term", "typed_value"]
