"""RoPE as models write it on the heads, recognized (not rewritten): the readings the layer classifier
(`architecture`) and `fuse_sdpa`'s `rope_on_heads` near-miss share, so both name the same form.

* `rotate_half_rope`: Hugging Face's eager `apply_rotary_pos_emb`, `h * cos + rotate_half(h) * sin` with
  `rotate_half(h) = concat(-h[..., d/2:], h[..., :d/2])`;
* `interleaved_rope`: GPT-J's `rotate_every_two`, read by the index map of its movement chain
  (`rules.rope_pairs.every_two`, the reading `fuse_sdpa.rope_pairs` rewrites).
"""

from __future__ import annotations

from ..ir import Graph, Node, Op
from .rules.rope_pairs import every_two


def _rope_products(g: Graph, n: Node) -> list[tuple[Node, Node]]:
    """`(plain, rotated)` readings of `n` as RoPE's `h * cos + rotated(h) * sin`: both orders of an add of two
    products (empty for anything else)."""
    if n.op != Op.ADD or len(n.inputs) != 2:
        return []
    a, b = (g[i] for i in n.inputs)
    return [(p, r) for p, r in ((a, b), (b, a)) if p.op == Op.MUL and r.op == Op.MUL]


def rotate_half_rope(g: Graph, n: Node) -> tuple[int, int] | None:
    """`(add, concat)` when `n` is RoPE written on the heads, `h * cos + rotate_half(h) * sin` with
    `rotate_half(h) = concat(-h[..., d/2:], h[..., :d/2])` (Hugging Face's eager form), else None."""
    for plain, rot in _rope_products(g, n):
        cat = next((g[i] for i in rot.inputs if g[i].op == Op.CONCAT), None)
        if cat is None or len(cat.inputs) != 2:
            continue
        neg = next((g[i] for i in cat.inputs if g[i].op == Op.NEG), None)
        halves = [g[i] if g[i].op == Op.NARROW else g[g[i].inputs[0]] for i in cat.inputs]
        if neg is None or any(h.op != Op.NARROW for h in halves):
            continue
        source = {h.inputs[0] for h in halves}
        if len(source) == 1 and source <= set(plain.inputs):
            return n.id, cat.id
    return None


def interleaved_rope(g: Graph, n: Node) -> tuple[int, int] | None:
    """`(add, rotated)` when `n` is RoPE written interleaved (GPT-J / GPT-NeoX-interleaved `rotate_every_two`):
    `h * cos + rotate_every_two(h) * sin`, pairs `(h[2i], h[2i+1])` rotated, in any spelling (read by the index map
    of its movement chain, `rules.rope_pairs.every_two`, the reading `fuse_sdpa.rope_pairs` rewrites). None
    otherwise."""
    return every_two(g, n)


__all__ = ["interleaved_rope", "rotate_half_rope"]
