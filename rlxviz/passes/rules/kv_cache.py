"""A decode step's KV cache, `concat(past, new_heads)` in the head layout, read as the head split of a packed concat.

Hugging Face's `DynamicCache.update` appends this step's K (and V) heads to the cache on the sequence axis:

    k_all = concat(past_key [B, h, P, d], transpose(reshape(k [B, S, h*d], [B, S, h, d]), [0, 2, 1, 3]), axis=2)

and the attention reads `k_all` (S = 1 for a decode step). The packed `attention` op takes K as `[B, Sk, h*d]`, so
`pack_cache` gives the attention its own `transpose(reshape(concat(merge(past), k, axis=1), [B, P+S, h, d]),
[0, 2, 1, 3])` with `merge(past) = reshape(transpose(past, [0, 2, 1, 3]), [B, P, h*d])`, and `fuse_sdpa` packs the
attention with `Sq = S`, `Sk = P + S` (the cache returned as the present key/value keeps its own concat).

Validity (numbers equal, bit for bit): only movement ops; element `[b, j, s, :]` of both is `past[b, j, s, :]` for
s < P and `k[b, s - P, j*d:(j+1)*d]` after. Taken when the concat's second operand is a head split of a packed
`[B, S, h*d]` tensor and its first is `[B, h, P, d]` of the same dtype. Each rewrite is a `fuse_sdpa.pack_cache`
match. FusedAttentionBlock does not take a cache (it projects K and V from the hidden states): its `kv_cache`
guard names it, the model's own structure.
"""

from __future__ import annotations

from ...ir import Graph, Node, Op, Rewriter
from ..trace import Match

RULE = "fuse_sdpa.pack_cache"


def cache_concat(g: Graph, n: Node) -> tuple[int, int] | None:
    """`(past, new)` when `n` is `concat(past [B, h, P, d], head_split(new [B, S, h*d]), axis=2)`, else None."""
    if n.op != Op.CONCAT or len(n.inputs) != 2 or n.rank != 4 or n.attrs["axis"] not in (2, -2):
        return None
    past, heads = (g[i] for i in n.inputs)
    if heads.op != Op.TRANSPOSE or tuple(heads.attrs["perm"]) != (0, 2, 1, 3):
        return None
    r = g[heads.inputs[0]]
    new = g[r.inputs[0]] if r.op == Op.RESHAPE else None
    if new is None or new.rank != 3 or past.rank != 4 or past.dtype != new.dtype:
        return None
    b, s, h, d = r.shape
    if new.shape != (b, s, h * d) or past.shape[:2] != (b, h) or past.shape[3] != d:
        return None
    return past.id, new.id


def pack_cache(g: Graph) -> tuple[Graph, list[Match]]:
    """`g` with every cache concat read in packed form by its readers (see the module doc), and one `Match` per
    concat; `(g, [])` when there is none."""
    found = [(n, cc) for n in g if (cc := cache_concat(g, n)) is not None and g.users(n.id)]
    if not found:
        return g, []
    rw = Rewriter(g, "fuse_sdpa")
    matches = []
    for n, (past, new) in found:
        b, h, p, d = g[past].shape
        s = g[new].shape[1]
        with rw.provenance([n.id]):
            merged = rw.reshape(rw.transpose(past, (0, 2, 1, 3)), (b, p, h * d))
            packed = rw.emit(Op.CONCAT, [merged, new], axis=1)
            heads = rw.transpose(rw.reshape(packed, (b, p + s, h, d)), (0, 2, 1, 3))
            for u in g.users(n.id):
                again = rw.emit(u.op, [heads if i == n.id else i for i in u.inputs], **dict(u.attrs))
                rw.replace(u.id, again)
        if not g.is_output(n.id):
            split = g[n.inputs[1]]
            rw.remove([n.id] + ([split.id, split.inputs[0]] if len(g.users(split.id)) == 1
                                and len(g.users(split.inputs[0])) == 1 else []))
        matches.append(Match("fuse_sdpa", RULE, n.id, {"cache": n.id, "past": past, "new": new}, packed, n.path))
    return rw.finish(), matches


__all__ = ["RULE", "cache_concat", "pack_cache"]
