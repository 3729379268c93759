"""RMSNorm wrapped in its casts (Hugging Face `LlamaRMSNorm` in an f16 / bf16 model):
`gamma * cast(rms_norm(cast(x, f32), ones), f16)` (either operand order of the multiply) -> `rms_norm(x, gamma)`
in x's dtype, recorded as `canonicalize_norm.rms_norm_casts`.

Validity: `rms_norm` on a half-precision x computes its statistics and the normalization in float32 (the
reference widens to float32, `runtime.reference._stats`; MLX's `fast.rms_norm` accumulates in float32), which
is what the casts spell; the product with gamma is then rounded to the half dtype once instead of twice
(normalized value, then the product): the numbers differ by at most one rounding of the half dtype, within its
tolerance. Conditions (each checked): the inner norm has a gamma of ones and no beta, its input is `cast` of a
half-precision x to float32, the outer cast goes back to x's dtype, gamma is `[H]` in x's dtype, the cast and
the norm have one user each, and `eps` is not 0 when rounded to x's dtype (an epsilon that rounds to 0 would
let a zero row divide by 0 in the dtype's own kernels). A chain that fails a condition is left as it is, and
`refusals` names the cast and the condition.
"""

from __future__ import annotations

import numpy as np

from ...ir import DType, Graph, Node, Op, Rewriter
from ..guard import NOT_RECOGNIZED
from ..trace import Match, Rejection

RULE = "canonicalize_norm.rms_norm_casts"
_HALF = (DType.f16, DType.bf16)


def _ones(g: Graph, i: int) -> bool:
    """`i` is a const of ones (the gamma canonicalize_norm gives a norm written without one)."""
    n = g[i]
    if n.op != Op.CONST or isinstance(n.attrs.get("value"), bool):
        return False
    try:
        return bool(np.all(np.asarray(n.attrs.get("value"), np.float64) == 1.0))
    except (TypeError, ValueError):
        return False


def _candidate(g: Graph, mul: Node) -> tuple[Node, Node, Node, int] | None:
    """`(outer cast, rms_norm, inner cast, gamma id)` when `mul` is gamma * cast(rms_norm(cast(x)))."""
    if mul.op != Op.MUL or len(mul.inputs) != 2:
        return None
    for k in (0, 1):
        out, gamma = g[mul.inputs[k]], mul.inputs[1 - k]
        if out.op != Op.CAST or g[out.inputs[0]].op != Op.RMS_NORM:
            continue
        norm = g[out.inputs[0]]
        inner = g[norm.inputs[0]]
        if inner.op == Op.CAST and len(norm.inputs) == 2 and _ones(g, norm.inputs[1]):
            return out, norm, inner, gamma
    return None


def _why_not(g: Graph, mul: Node, out: Node, norm: Node, inner: Node, gamma: int) -> str:
    x = g[inner.inputs[0]]
    if x.dtype not in _HALF or inner.dtype != DType.f32:
        return f"cast (node {inner.id}) turns {x.dtype} into {inner.dtype}; needs a half dtype widened to f32"
    if out.dtype != x.dtype:
        return f"cast (node {out.id}) returns {out.dtype}; needs x's dtype {x.dtype}"
    if g[gamma].shape != (norm.shape[-1],) or g[gamma].dtype != x.dtype:
        return (f"gamma (node {gamma}) is {g[gamma].dtype}{list(g[gamma].shape)}; needs "
                f"{x.dtype}[{norm.shape[-1]}]")
    for n in (inner, norm, out):
        if len(g.users(n.id)) != 1 or g.is_output(n.id):
            return f"{n.op.value} (node {n.id}) has another reader; the casts would be computed anyway"
    if float(np.asarray(norm.attrs["eps"], x.dtype.numpy if x.dtype != DType.bf16 else np.float32)) == 0.0:
        return f"eps {norm.attrs['eps']} rounds to 0 in {x.dtype}"
    if norm.attrs.get("axis", -1) not in (-1, norm.rank - 1):
        return f"rms_norm (node {norm.id}) normalizes axis {norm.attrs.get('axis')}; needs the last axis"
    return ""


def absorb_casts(g: Graph, pass_name: str = "canonicalize_norm") -> tuple[Graph, list[Match], list[Rejection]]:
    """`g` with every cast-wrapped RMSNorm rewritten to `rms_norm(x, gamma)` in x's dtype (see the module doc),
    one `Match` each, and a `Rejection` naming the cast for every wrapped norm left as it is."""
    found, refused = [], []
    for n in g:
        c = _candidate(g, n)
        if c is None:
            continue
        why = _why_not(g, n, *c)
        if why:
            out, norm, inner, gamma = c
            refused.append(Rejection(pass_name, RULE, n.id, "guard", "casts_absorbable",
                                     f"rms_norm (node {norm.id}) is wrapped in casts that stay: {why}",
                                     {"mul": n.id, "cast_out": out.id, "norm": norm.id, "cast_in": inner.id,
                                      "gamma": gamma}, (inner.id,), (), n.path,
                                     "compute the norm in x's dtype (statistics in f32 are the kernel's job)",
                                     inner.id, NOT_RECOGNIZED, "absorb this cast form too"))
        else:
            found.append((n, *c))
    if not found:
        return g, [], refused
    rw = Rewriter(g, pass_name)
    matches = []
    for mul, out, norm, inner, gamma in found:
        with rw.provenance([inner.id, norm.id, out.id, mul.id]):
            new = rw.emit(Op.RMS_NORM, [inner.inputs[0], gamma], eps=norm.attrs["eps"], axis=-1)
        rw.remove([inner.id, norm.id, out.id])
        rw.replace(mul.id, new)
        matches.append(Match(pass_name, RULE, mul.id, {"mul": mul.id, "cast_out": out.id, "norm": norm.id,
                                                       "cast_in": inner.id, "gamma": gamma}, new, mul.path))
    return rw.finish(), matches, refused


__all__ = ["RULE", "absorb_casts"]
