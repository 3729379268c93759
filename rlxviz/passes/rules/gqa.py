"""Grouped-query attention in `fuse_sdpa`: Hugging Face's `repeat_kv` recognized into `attention(num_kv_heads)`.

HF LLaMA/Mistral/Qwen expand K and V from `kv` heads to `heads = kv * n_rep` before the score matmul::

    k_heads = transpose(reshape(k, [B, S, kv, d]), [0, 2, 1, 3])          # [B, kv, S, d]
    k_rep   = reshape(expand(reshape(k_heads, [B, kv, 1, S, d]), [B, kv, n_rep, S, d]), [B, kv*n_rep, S, d])

so query head i reads kv head `i // n_rep`, which is `attention(..., num_kv_heads=kv)`'s definition. The
pattern pieces here let `fuse_sdpa` accept either form for K and V; the guard `kv_repeat_form` refuses any
other expansion (e.g. a tile, `k.repeat(1, n, 1, 1)`, where query head i reads kv head `i % kv`) and names it,
so no fusion treats expanded K/V as plain multi-head attention over the wider tensor. One exception: with a
single kv head (MQA) the tile `[B, 1, 1, S, d] -> [B, n, 1, S, d] -> [B, n, S, d]` is accepted, because
`i % 1 == i // n == 0`: every query head reads kv head 0 in both forms (the same values for every input).
"""

from __future__ import annotations

from ...ir import Op
from ..guard import NOT_RECOGNIZED, Ctx, Guard, guard
from ..pattern import P

REPEAT_ROLES = ("rep_in", "rep_expand", "rep")


def kv_heads_pattern(tag: str, heads: P) -> P:
    """`heads` (the `[B, kv, S, d]` head split of `tag`), or it expanded by `repeat_kv`."""
    rep = P(Op.RESHAPE, P(Op.EXPAND, P(Op.RESHAPE, heads, name=f"{tag}_rep_in"), name=f"{tag}_rep_expand"),
            name=f"{tag}_rep")
    return heads | rep


def repeat_roles(tag: str) -> tuple[str, ...]:
    return tuple(f"{tag}_{r}" for r in REPEAT_ROLES)


def n_rep(c: Ctx, tag: str) -> int:
    """How many query heads share one kv head of `tag` (1: not repeated): the expanded head count over the
    kv head count (for the tile form of one kv head too, where the expand's axis 2 stays 1)."""
    if f"{tag}_rep" not in c:
        return 1
    out, kv = c[f"{tag}_rep"], c[f"{tag}_reshape"].shape[2]
    return max(out.shape[1] // max(kv, 1), 1) if out.rank == 4 else 1


def _repeat_ok(c: Ctx, tag: str) -> bool:
    """HF's repeat_kv `[B, kv, 1, S, d] -> [B, kv, n, S, d] -> [B, kv*n, S, d]`; with one kv head (MQA) also the
    tile form `[B, 1, 1, S, d] -> [B, n, 1, S, d] -> [B, n, S, d]`: every query head reads kv head 0 in both,
    so the values are the same (a tile of kv > 1 heads is another grouping, i % kv, and is refused)."""
    if f"{tag}_rep" not in c:
        return True
    b, kv, s, d = c[f"{tag}_heads"].shape
    r, x, out = c[f"{tag}_rep_in"], c[f"{tag}_rep_expand"], c[f"{tag}_rep"]
    if out.rank != 4 or x.rank != 5 or out.shape[1] < 1:
        return False
    n = out.shape[1] // kv
    repeat = r.shape == (b, kv, 1, s, d) and x.shape == (b, kv, n, s, d)
    tile_of_one = kv == 1 and r.shape == (b, 1, 1, s, d) and x.shape == (b, n, 1, s, d)
    return (repeat or tile_of_one) and out.shape == (b, kv * n, s, d) and n >= 1


def _explain_repeat(c: Ctx) -> str:
    tag = "k" if not _repeat_ok(c, "k") else "v"
    heads = c[f"{tag}_heads"]
    shapes = " -> ".join(str(list(c[f"{tag}_{r}"].shape)) for r in REPEAT_ROLES)
    b, kv, s, d = heads.shape
    where = f"at {c.d(tag + '_rep')}: "
    return (f"{where}{tag.upper()} heads {list(heads.shape)} are expanded to {list(c[f'{tag}_rep'].shape)} by "
            f"reshape/expand/reshape {shapes}; grouped-query attention needs Hugging Face's repeat_kv "
            f"[{b}, {kv}, 1, {s}, {d}] -> "
            f"[{b}, {kv}, n_rep, {s}, {d}] -> [{b}, {kv}*n_rep, {s}, {d}] (query head i reads kv head i // n_rep)")


def kv_repeat_guard() -> Guard:
    """K and V expansions, when present, are HF's `repeat_kv` (`kv_repeat_form`)."""
    return guard("kv_repeat_form", lambda c: _repeat_ok(c, "k") and _repeat_ok(c, "v"), _explain_repeat,
                 "expand K/V with repeat_kv (x[:, :, None].expand(B, kv, n_rep, S, d).reshape(B, kv*n_rep, S, d)), "
                 "or pass the kv heads to attention unexpanded",
                 reads=("k_heads", "v_heads", *repeat_roles("k"), *repeat_roles("v")), kind=NOT_RECOGNIZED,
                 subject=lambda c: c.id("k_rep" if not _repeat_ok(c, "k") else "v_rep"),
                 fix="recognize this K/V expansion (a tile, where query head i reads kv head i % kv, is another "
                     "grouping)")


def heads_match(c: Ctx) -> bool:
    """q heads = kv heads * n_rep for K and V alike; equal head_dim; K and V have the same kv heads."""
    q, k, v = (c[f"{t}_reshape"].shape[2:] for t in "qkv")
    return (q[1] == k[1] == v[1] and k[0] == v[0] and n_rep(c, "k") == n_rep(c, "v")
            and q[0] == k[0] * n_rep(c, "k"))


def explain_heads(c: Ctx) -> str:
    """The head splits, then only the conditions that fail, each with its numbers."""
    q, k, v = (list(c[f"{t}_reshape"].shape[2:]) for t in "qkv")
    rk, rv = n_rep(c, "k"), n_rep(c, "v")
    rep = f"; K is repeated x{rk}, V x{rv}" if rk > 1 or rv > 1 else ""
    why = []
    if not q[1] == k[1] == v[1]:
        why.append(f"head_dim differs (q {q[1]}, k {k[1]}, v {v[1]})")
    if k[0] != v[0]:
        why.append(f"K has {k[0]} heads, V {v[0]}")
    if rk != rv:
        why.append(f"K is repeated x{rk}, V x{rv}")
    if q[0] != k[0] * rk:
        why.append(f"q heads {q[0]} != kv heads {k[0]} * n_rep {rk} = {k[0] * rk}")
    return f"q/k/v head splits [heads, head_dim] are {q}, {k}, {v}{rep}; " + "; ".join(why) + \
        " (needs q heads = kv heads * n_rep, equal head_dim, K and V alike)"


def num_kv_heads(c: Ctx) -> int | None:
    """The `num_kv_heads` attribute for the packed attention (None: plain multi-head)."""
    kv, h = c["k_reshape"].shape[2], c["q_reshape"].shape[2]
    return None if kv == h else kv


__all__ = ["explain_heads", "heads_match", "kv_heads_pattern", "kv_repeat_guard", "n_rep", "num_kv_heads",
           "repeat_roles"]
