"""Where a refused attention scale came from: `scale_origin` names the Q/K pre-scale and score-scale nodes that
`fuse_sdpa` folded into the packed attention's `scale` (and scales further up the operands' path it could not
fold), appended to `fuse_attention_block`'s `default_scale` refusal by the pipeline (`pipeline._in_run`). Text
only: it changes no graph.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ...ir import Graph, Node, Op
from ..pattern import is_const
from ..refusal_kinds import NOTHING_TO_CHANGE, rounding_not_offered
from ..trace import Rejection
from .attention import FACTORS as _FACTORS
from .block import PRE_ROPE_SCALE_FIX, PRE_ROPE_SCALE_GAP
from .sdpa_mask import typed_value

ROLE_NAMES = {"q_prescale": "Q pre-scale", "k_prescale": "K pre-scale", "scale": "scores' scale"}
"""How a text names each scale role of `fuse_sdpa` (`attention.FACTORS`)."""


def scale_origin(steps: Sequence[Any], r: Rejection) -> str:
    """Where a refused attention scale came from (`default_scale`): the Q/K pre-scale and score-scale nodes that
    `fuse_sdpa` (an earlier step of `steps`, the `PassStep`s before the rejection) folded into the attention's
    `scale`, each with its factor, their product, and whether 1/sqrt(head_dim) is applied twice. "" when the
    attention was not built by `fuse_sdpa` in this run or its scale had one factor of no interest."""
    if r.guard != "default_scale":
        return ""
    attn = r.bindings.get("attn", r.anchor)
    for k in range(len(steps) - 1, -1, -1):
        step = steps[k]
        m = next((m for m in step.matches if m.pass_name == "fuse_sdpa" and m.fused == attn), None)
        if m is None:
            continue
        g, b = _pass_input(steps, k), m.bindings
        parts, product = [], 1.0
        for op_role, const_role in (*_FACTORS[1:], _FACTORS[0]):  # in dataflow order: Q, K, then the scores
            if op_role not in b or const_role not in b:
                continue
            node, const = _scale_nodes(g, step.before, b[op_role], b[const_role])
            v = typed_value(const) if const is not None else None
            if node is None or v is None:
                return ""
            f = 1.0 / v if node.op == Op.DIV else v
            product *= f
            how = f"/ {v:.6g} (factor {f:.6g})" if node.op == Op.DIV else f"* {f:.6g}"
            where = f"node {node.id}" + ("" if node.id in g else f", made by {node.pass_name or 'fuse_sdpa'}") + (
                f", {node.path}" if node.path else "")
            parts.append(f"{ROLE_NAMES[op_role]} {node.op.value} ({where}) {how}")
        packed = step.after.get(m.fused) if m.fused is not None else None
        d = packed.attrs.get("head_dim") if packed is not None else None
        upstream, rope = _default_upstream(step.after, packed, d)
        earlier = ""
        if upstream:  # e.g. ESM: Q scaled before its RoPE; the rotation sits between, so fuse_sdpa folds nothing
            found = _found_words(upstream)
            total = product * math.prod(f for _, _, f in upstream)
            default = 1.0 / math.sqrt(d)
            needs = ("fuse_sdpa needs to fold the Q pre-scale through the RoPE" if rope and _q_only(upstream) else
                     "the block needs a scale attribute")
            verdict = (f"with them the scores are scaled by 1/sqrt({d}) in all, so scaling them again would apply it "
                       f"twice; no model change is needed, {needs}"
                       if math.isclose(total, default, rel_tol=1e-3) else
                       f"with them the scores are scaled by {total:.6g} in all, not 1/sqrt({d}) = {default:.6g}")
            earlier = (f"; the scores are scaled earlier on the operands' path: {found}, where fuse_sdpa cannot fold "
                       f"it (a rotation or another op sits between): {verdict}")
        if not parts:
            # the model's own choice (T5 folds the scale into its weights): scaling the scores alone would change
            # every output, so the message says what the block lacks (newcomer run 20); the fix line is the checked
            # fold, which scales Q's weight too (`scale_fold`)
            return earlier or ("; the scores are not scaled (scale 1.0), the model's own choice (e.g. T5 folds it "
                               "into its weights); the block has no scale attribute to keep 1.0")
        out = f"; fuse_sdpa folded it from {', '.join(parts)}"
        if len(parts) > 1:  # (a q)(b k)^T s == a b s (q k^T): every factor multiplies the scores
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


def _scale_nodes(g: Graph, matched: Graph, op_id: int, const_id: int) -> tuple[Node | None, Node | None]:
    """The scaling node `op_id` and its constant `const_id` that `fuse_sdpa` matched (in `matched`, the graph its
    last stage left), named in the user's graph `g` where they are there: a pre-scale a stage re-made (K's,
    hoisted through its transpose and KV repeat by `hoist_scales`: Granite's) is the user's node it absorbed that
    reads the same constant. The re-made node itself when no such node exists; `(None, None)` when neither graph
    holds them."""
    node = g[op_id] if op_id in g else matched[op_id] if op_id in matched else None
    const = g[const_id] if const_id in g else matched[const_id] if const_id in matched else None
    if node is not None and node.id not in g:
        mine = [g[i] for i in node.absorbed if i in g and g[i].op == node.op and const_id in g[i].inputs]
        node = mine[0] if len(mine) == 1 else node
    return node, const


def _found_words(upstream: Sequence[tuple[str, Node, float]]) -> str:
    """`Q mul (node 35, PATH) * 0.353553, ...`: the scales `_upstream_scales` found, in words."""
    return ", ".join(f"{side} {n.op.value} (node {n.id}{', ' + n.path if n.path else ''}) * {f:.6g}"
                     for side, n, f in upstream)


def _q_only(upstream: Sequence[tuple[str, Node, float]]) -> bool:
    return bool(upstream) and all(side == "Q" for side, _, _ in upstream)


def _default_upstream(g: Graph, packed: Node | None, d: int | None
                      ) -> tuple[list[tuple[str, Node, float]], bool]:
    """The attention-scale factors (1/sqrt(`d`) or its square root) `_upstream_scales` finds on `packed`'s operand
    paths in `g`, and whether a RoPE lies on the Q path walked; `([], False)` without `packed` or `d`."""
    if packed is None or not d:
        return [], False
    found = _upstream_scales(g, packed)
    keep = [(side, n, f) for side, n, f in found[0]
            if any(math.isclose(f, d ** e, rel_tol=1e-3) for e in (-0.5, -0.25))]
    return keep, found[1]


def pre_rope_scale(steps: Sequence[Any], r: Rejection) -> tuple[Node, float, int] | None:
    """`(mul node, factor, head_dim)` when `r`, a `default_scale` refusal, is ESM's form: the packed attention that
    `fuse_sdpa` built keeps scale 1.0 (it folded no factor) because the default 1/sqrt(head_dim) is applied to Q
    alone, by one scalar mul before a RoPE on Q's path (`PRE_ROPE_SCALE_GAP`); None otherwise (Granite's attention
    multiplier, a scale applied twice, no RoPE between)."""
    if r.guard != "default_scale":
        return None
    attn = r.bindings.get("attn", r.anchor)
    for k in range(len(steps) - 1, -1, -1):
        m = next((m for m in steps[k].matches if m.pass_name == "fuse_sdpa" and m.fused == attn), None)
        if m is None:
            continue
        packed = steps[k].after.get(m.fused) if m.fused is not None else None
        d = packed.attrs.get("head_dim") if packed is not None else None
        if packed is None or packed.attrs.get("scale") not in (1.0,):
            return None
        upstream, rope = _default_upstream(steps[k].after, packed, d)
        if not rope or len(upstream) != 1 or not _q_only(upstream) or not math.isclose(
                upstream[0][2], 1.0 / math.sqrt(d), rel_tol=1e-3):
            return None
        return upstream[0][1], upstream[0][2], int(d)
    return None


def pre_rope_hint(node: Node, factor: float, d: int) -> str:
    """The fix line of a `pre_rope_scale` refusal: nothing to change in the model (its scale is the default), and
    whether moving the mul after the RoPE by hand would keep the numbers exactly (a power-of-two factor) or only up
    to rounding."""
    exact = factor != 0.0 and math.isfinite(factor) and math.frexp(abs(factor))[0] == 0.5
    where = f"node {node.id}" + (f", {node.path}" if node.path else "")
    op = node.op.value
    # the model needs no change; moving the mul is named as a workaround (`policy.WORKAROUND`'s words), so the line
    # does not say "nothing to change" and then propose a change (newcomer run 19); one that rounds differently has
    # no check here, so it is not offered (`refusal_kinds.rounding_not_offered`, the words of every such form)
    workaround = (f"a workaround in the model, not needed: moving that {op} after the RoPE would keep the numbers "
                  f"exactly here: {factor:.6g} is a power of two and RoPE is linear" if exact else
                  rounding_not_offered(f"moving that {op} after the RoPE",
                                       f"{factor:.6g} is not a power of two, though RoPE is linear"))
    return (f"{NOTHING_TO_CHANGE}: its scale is the default 1/sqrt({d}) = {factor:.6g}, applied to Q by {op} "
            f"({where}) before its RoPE, which fuse_sdpa does not fold through ({workaround})")


def _pass_input(steps: Sequence[Any], k: int) -> Any:
    """The graph `fuse_sdpa` started from when `steps[k]` is its own step: the input of its first stage step
    (`fuse_sdpa/unfold_heads`, ...), so a scale node one of its stages made is no node of the user's graph."""
    while k > 0 and steps[k - 1].is_stage and steps[k - 1].family == steps[k].family:
        k -= 1
    return steps[k].before


_SCALE_WALK_OPS = frozenset({Op.TRANSPOSE, Op.RESHAPE, Op.EXPAND, Op.CAST, Op.NARROW, Op.CONCAT, Op.NEG, Op.ADD,
                             Op.SUB, Op.MUL, Op.DIV, Op.ROPE})
"""Ops the scale search walks up through from an attention's Q/K operand: layout moves and the arithmetic a RoPE is
written with (`q * cos + rotate_half(q) * sin`); it stops at anything else (a projection's matmul, a norm)."""


def _upstream_scales(g: Graph, attn: Node, depth: int = 24) -> tuple[list[tuple[str, Node, float]], bool]:
    """Scalar constant scales (`x * c`, `c * x`, `x / c`) on the paths of `attn`'s Q and K operands up to the
    first op outside `_SCALE_WALK_OPS` (at most `depth` nodes a side): `[(side, node, factor)]`, and whether the Q
    side's walk passed a rope op. What a scale
    advice must look for before it says the scores are not scaled (ESM scales Q before its RoPE); the caller keeps
    the factors of an attention scale (1/sqrt(head_dim), or its square root on each side), not a dequantization's."""
    out: list[tuple[str, Node, float]] = []
    rope = False
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
            rope = rope or (side == "Q" and n.op == Op.ROPE)
            consts = [j for j in n.inputs if is_const(g[j]) and g[j].shape in ((), (1,))]
            if n.op in (Op.MUL, Op.DIV) and len(n.inputs) == 2 and len(consts) == 1:
                v = typed_value(g[consts[0]])
                if v not in (None, 0.0) and not (n.op == Op.DIV and consts[0] == n.inputs[0]):
                    out.append((side, n, 1.0 / v if n.op == Op.DIV else v))
            todo += [j for j in n.inputs if not is_const(g[j])]
    return out, rope


__all__ = ["PRE_ROPE_SCALE_FIX", "PRE_ROPE_SCALE_GAP", "ROLE_NAMES", "pre_rope_hint", "pre_rope_scale",
           "scale_origin"]
