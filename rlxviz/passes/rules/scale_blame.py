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
from ..trace import Rejection
from .attention import FACTORS as _FACTORS
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
            if b[op_role] not in g or b[const_role] not in g:  # a scale lifted by unfold_heads: a new node
                continue
            node, v = g[b[op_role]], typed_value(g[b[const_role]])
            if v is None:
                return ""
            f = 1.0 / v if node.op == Op.DIV else v
            product *= f
            how = f"/ {v:.6g} (factor {f:.6g})" if node.op == Op.DIV else f"* {f:.6g}"
            where = f"node {node.id}" + (f", {node.path}" if node.path else "")
            parts.append(f"{ROLE_NAMES[op_role]} {node.op.value} ({where}) {how}")
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


__all__ = ["ROLE_NAMES", "scale_origin"]
