"""A Q/K norm written on the heads after their transpose (QK-norm), moved in front of the head transpose.

QK-norm models (Qwen3, Gemma 3, OLMo 2, Cohere, OpenELM, Chameleon) normalize Q and K per head over `head_dim`
before RoPE. Most export it on `[B, S, H, d]`, between the head reshape and the head transpose, which `fuse_sdpa`
takes as part of the projection. Some write it after the transpose, on `[B, H, S, d]`; then the scores' operand
is `norm(transpose(reshape(q), [0, 2, 1, 3]))` and the pattern, which takes Q straight from the head split, misses.
Written before the transpose (Qwen3's form), the head split the pattern needs, `transpose(reshape(.))`, has the
norm between its two ops. `hoist_head_norms` rewrites both forms to the norm in front of a plain head split:

    rms_norm(transpose(reshape(x), [0, 2, 1, 3]), gamma)       (after)
    transpose(rms_norm(reshape(x), gamma), [0, 2, 1, 3])       (before)
      ->  transpose(reshape(reshape(rms_norm(reshape(x), gamma), [B, S, H*d]), [B, S, H, d]), [0, 2, 1, 3])

(`layer_norm` alike), after which the scores are plain `QK^T * scale + mask` of normalized heads and pack (the
attention reads the flattened `[B, S, H*d]` normalized projection). A norm on the full projection before the
split (OLMo 2) needs nothing: it is already part of the projection.

Validity (numbers equal, bit for bit, for every input): the norm reduces over the last axis only (`axis` -1 with
gamma / beta of shape `[d]`), and the transpose keeps the last axis in place (`perm[-1]` is the last axis), so every
row of `d` elements is the same row, in the same order, in both forms, normalized by the same reduction and gamma;
the transpose only moves rows, and the added reshape pair `[B, S, H, d] -> [B, S, H*d] -> [B, S, H, d]` reads the
same row-major order back. Taken only when the inner node (the transpose after, the norm before) has one reader
and is no graph output, and the norm's gamma and beta are `[d]`. Each rewrite is reported as a
`fuse_sdpa.hoist_head_norm` match.
"""

from __future__ import annotations

from ...ir import Graph, Node, Op, Rewriter
from ..trace import Match

RULE = "fuse_sdpa.hoist_head_norm"
_NORMS = frozenset({Op.RMS_NORM, Op.LAYER_NORM})


def _norm_of_heads(g: Graph, n: Node) -> bool:
    """`n` is a last-axis norm of rank 4 with `[d]` gamma / beta."""
    return n.op in _NORMS and n.rank == 4 and n.attrs.get("axis", -1) in (-1, 3) \
        and all(g[i].shape == (n.shape[-1],) for i in n.inputs[1:])


def _only_reader(g: Graph, i: int) -> bool:
    return len(g.users(i)) == 1 and not g.is_output(i)


def _plan(g: Graph, n: Node) -> tuple[int, int, Node] | None:
    """`(replaced, head reshape, norm)` when `n` is a head transpose over a normed head reshape (`before`) or a norm
    over a head transpose (`after`), its inner nodes read only inside the form; else None."""
    if n.op == Op.TRANSPOSE and tuple(n.attrs["perm"]) == (0, 2, 1, 3) and _norm_of_heads(g, g[n.inputs[0]]):
        norm = g[n.inputs[0]]
        r = g[norm.inputs[0]]
        if r.op == Op.RESHAPE and g[r.inputs[0]].rank >= 3 and _only_reader(g, norm.id):
            return n.id, r.id, norm
    if _norm_of_heads(g, n):
        t = g[n.inputs[0]]
        if t.op == Op.TRANSPOSE and tuple(t.attrs["perm"]) == (0, 2, 1, 3) and g[t.inputs[0]].op == Op.RESHAPE \
                and g[g[t.inputs[0]].inputs[0]].rank >= 3 and _only_reader(g, t.id):
            return n.id, t.inputs[0], n
    return None


def hoist_head_norms(g: Graph) -> tuple[Graph, list[Match]]:
    """`g` with every QK-norm on the heads made part of the projection in front of a plain head split (module doc),
    and one `Match` per rewrite; `(g, [])` when there is none."""
    plans = [p for n in g if (p := _plan(g, n)) is not None]
    if not plans:
        return g, []
    rw = Rewriter(g, "fuse_sdpa")
    matches = []
    for old, head_reshape, norm in plans:
        r = g[head_reshape]
        b, s, h, d = r.shape
        with rw.provenance([old, norm.id]):
            normed = rw.emit(norm.op, [head_reshape, *norm.inputs[1:]], **dict(norm.attrs))
            flat = rw.emit(Op.RESHAPE, [normed], shape=(b, s, h * d))
            split = rw.emit(Op.RESHAPE, [flat], shape=(b, s, h, d))
            heads = rw.emit(Op.TRANSPOSE, [split], perm=(0, 2, 1, 3))
        rw.replace(old, heads)
        rw.remove([norm.id] if old != norm.id else [norm.inputs[0]])  # the norm (before) or the transpose (after)
        matches.append(Match("fuse_sdpa", RULE, norm.id, {"norm": norm.id, "heads": head_reshape}, None, norm.path))
    return rw.finish(), matches


__all__ = ["RULE", "hoist_head_norms"]
