"""Head splits written as any chain of data movement, read by the index map the chain computes.

The head split the attention rules match is `transpose(reshape(x [B, S, nh*d], [B, S, nh, d]), [0, 2, 1, 3])`,
with `x` a projection or a column block `narrow(qkv, -1, a, nh*d)` of a fused QKV. Exporters write the same
values other ways: Falcon (multi-query) `transpose(gather(transpose(reshape(qkv, [B, S, H+2, d]), [2, 0, 1, 3]),
[H]), [1, 0, 2, 3])` for K, a `[B, S, 3, H, d]` view with a permute and a gather or narrow, a narrow on the heads
axis, GPT-NeoX's per-head `[q, k, v]` (`narrow(transpose(reshape(qkv, [B, S, H, 3d])), -1, i*d, d)`).
`head_split` reads a chain of `reshape`, `transpose`, `narrow` and `gather` with a constant index from a rank-3
`[B, S, W]` root by the map it computes (each output element's flat index into the root, evaluated on an index
array): the heads are a per-token layout when element `[b, h, s, :]` is read from root row `[b, s, :]`, and a
column block `[a, a + nh*d)` when they equal the standard split of that block.

`canonical_heads` rewrites such a chain read by a matmul (V in `P @ V`, K through its transpose) into the
standard head split of `narrow(root, -1, a, nh*d)` (the narrow left out when the block is all of W), or, for
another per-token layout, of `reshape(transpose(heads, [0, 2, 1, 3]), [B, S, nh*d])`, so `fuse_sdpa`'s pattern
sees it. `repeat_broadcast_kv` writes one K/V head broadcast over the query heads by the matmul as `repeat_kv`.
Validity (numbers equal for every input, bit for bit): every op of both chains only moves elements, and both
read the same root element at every output position (checked on the index map, which is exact); a matmul
broadcasts a size-1 batch axis by repeating it; the chain's nodes read elsewhere stay for those readers. Each
rewrite is a `fuse_sdpa.head_layout` match. Chains over roots of more than `MAX_INDEX` elements are not read (the
map is materialized). An identity transpose of heads is left as written (the `k_layout` guard names it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...ir import Graph, Node, Op, Rewriter
from ..trace import Match

RULE = "fuse_sdpa.head_layout"
MAX_INDEX = 1 << 24
"""The most root elements whose index map `head_split` materializes (int32: 64 MiB; the standard split needs none)."""
_MOVES = (Op.RESHAPE, Op.TRANSPOSE, Op.NARROW, Op.GATHER)


@dataclass(frozen=True)
class HeadSplit:
    """Heads `[B, nh, S, d]` whose row `[b, :, s, :]` is read from token row `[b, s, :]` of `root` `[B, S, W]`:
    the standard head split of the column block `[start, start + nh*d)` of the root when `block`, else
    (`start == -1`) another per-token layout (GPT-NeoX's per-head `[q, k, v]`); `chain` is the chain's nodes from
    the root's reader to the heads (the root excluded)."""

    root: int
    start: int
    nh: int
    d: int
    chain: tuple[int, ...]
    standard: bool  # already transpose(reshape(x, [B, S, nh, d]), [0, 2, 1, 3]) of a rank-3 x

    @property
    def block(self) -> bool:
        return self.start >= 0


def _const_index(g: Graph, i: int) -> np.ndarray | None:
    n = g[i]
    v = n.attrs.get("value") if n.op == Op.CONST else None
    return None if v is None or isinstance(v, float) else np.asarray(v, dtype=np.int64)


def _chain(g: Graph, i: int, b: int, s: int) -> list[Node] | None:
    """The movement nodes from heads `i` back to the first rank-3 `[b, s, W]` value (root first), or None."""
    out: list[Node] = []
    n = g[i]
    while not (n.rank == 3 and n.shape[:2] == (b, s)) or not out:
        if n.op not in _MOVES or len(out) > 8 or (n.op == Op.GATHER and _const_index(g, n.inputs[1]) is None):
            return None
        out.append(n)
        n = g[n.inputs[0]]
    return [n, *reversed(out)]


def _apply(g: Graph, n: Node, a: np.ndarray) -> np.ndarray:
    if n.op == Op.RESHAPE:
        return a.reshape(n.shape)
    if n.op == Op.TRANSPOSE:
        return a.transpose(n.attrs["perm"])
    if n.op == Op.NARROW:
        ax = n.attrs["axis"] % a.ndim
        return np.take(a, range(n.attrs["start"], n.attrs["start"] + n.attrs["length"]), axis=ax)
    idx = _const_index(g, n.inputs[1])
    return np.take(a, idx, axis=n.attrs.get("axis", 0) % a.ndim)


def head_split(g: Graph, i: int) -> HeadSplit | None:
    """The `HeadSplit` node `i` (`[B, nh, S, d]`) is, or None (see the module doc)."""
    h = g[i]
    if h.rank != 4:
        return None
    b, nh, s, d = h.shape
    chain = _chain(g, i, b, s)
    if chain is None:
        return None
    root, moves = chain[0], chain[1:]
    w = root.shape[2]
    ids = tuple(n.id for n in moves)
    if [n.op for n in moves] == [Op.RESHAPE, Op.TRANSPOSE] and tuple(moves[1].attrs["perm"]) == (0, 2, 1, 3) \
            and moves[0].shape == (b, s, nh, d) and w == nh * d:
        return HeadSplit(root.id, 0, nh, d, ids, True)  # the standard split itself: no map to evaluate
    if b * s * w > MAX_INDEX:
        return None
    idx = np.arange(b * s * w, dtype=np.int32).reshape(b, s, w)
    try:
        got = idx
        for n in moves:
            got = _apply(g, n, got)
    except (ValueError, IndexError):
        return None
    if got.shape != (b, nh, s, d):
        return None
    rows = (np.arange(b, dtype=np.int64)[:, None, None, None] * s + np.arange(s)[None, None, :, None]) * w
    if not np.array_equal(got - got % w, np.broadcast_to(rows, got.shape)):
        return None  # some element comes from another token's row: no head layout (e.g. K^T when S == d)
    start = int(got.flat[0]) % w
    want = idx[:, :, start:start + nh * d].reshape(b, s, nh, d).transpose(0, 2, 1, 3) \
        if 0 <= start <= w - nh * d else None
    block = want is not None and np.array_equal(got, want)
    standard = block and [n.op for n in moves] == [Op.RESHAPE, Op.TRANSPOSE] \
        and tuple(moves[1].attrs["perm"]) == (0, 2, 1, 3)
    return HeadSplit(root.id, start if block else -1, nh, d, ids, standard)


def emit_heads(rw: Rewriter, x: int, hs: HeadSplit, w: int) -> int:
    """The standard head split of `hs`'s block of `x` (`x` the root, or a value of the same shape)."""
    b, s = rw.lookup(x).shape[:2]
    if (hs.start, hs.nh * hs.d) != (0, w):
        x = rw.narrow(x, 2, hs.start, hs.nh * hs.d)
    return rw.transpose(rw.reshape(x, (b, s, hs.nh, hs.d)), (0, 2, 1, 3))


def _matmul_operand(g: Graph, n: Node) -> bool:
    """Read as a matmul operand, directly (V) or through one transpose (K^T)."""
    return any(u.op == Op.MATMUL or (u.op == Op.TRANSPOSE and any(v.op == Op.MATMUL for v in g.users(u.id)))
               for u in g.users(n.id))


def _moved_heads(g: Graph, n: Node) -> HeadSplit | None:
    """The `head_split` of heads `n` `[B, nh, S, d]` when it is not already the standard split, else None."""
    if n.rank != 4 or n.op not in (Op.TRANSPOSE, Op.GATHER, Op.NARROW, Op.RESHAPE) or _no_op(g, n):
        return None  # a no-op on heads (an identity transpose) is the model's own layout question: guards name it
    hs = head_split(g, n.id)
    return None if hs is None or hs.standard else hs


def _no_op(g: Graph, n: Node) -> bool:
    return (n.op == Op.TRANSPOSE and tuple(n.attrs["perm"]) == tuple(range(n.rank))) or (
        n.op == Op.NARROW and n.shape == g[n.inputs[0]].shape)


def canonical_heads(g: Graph) -> tuple[Graph, list[Match]]:
    """`g` with every non-standard head split read by a matmul rewritten to the standard one: of the column block
    of the root (`narrow`), or, when the heads are no column block, of `reshape(transpose(heads, [0, 2, 1, 3]),
    [B, S, nh*d])` (module doc)."""
    found = [(n, hs) for n in g if _matmul_operand(g, n) and (hs := _moved_heads(g, n)) is not None]
    if not found:
        return g, []
    rw = Rewriter(g, "fuse_sdpa")
    matches = []
    for n, hs in found:
        b, nh, s, d = n.shape
        with rw.provenance(list(hs.chain)):
            if hs.block:
                new = emit_heads(rw, hs.root, hs, g[hs.root].shape[2])
            else:
                same = rw.emit(n.op, list(n.inputs), **dict(n.attrs))  # n itself, read by the copy
                packed = rw.reshape(rw.transpose(same, (0, 2, 1, 3)), (b, s, nh * d))
                new = rw.transpose(rw.reshape(packed, (b, s, nh, d)), (0, 2, 1, 3))
        rw.replace(n.id, new)
        matches.append(Match("fuse_sdpa", RULE, n.id, {"heads": n.id}, new, n.path))
    gone = {n.id for n, _ in found}
    changed = True
    while changed:  # a block's chain goes once nothing else reads it (the copy of another layout reads it)
        changed = False
        for i in {i for _, hs in found if hs.block for i in hs.chain} - gone:
            if not g.is_output(i) and all(u.id in gone for u in g.users(i)):
                gone.add(i)
                changed = True
    rw.remove(sorted(gone - {n.id for n, _ in found}))
    return rw.finish(), matches


def _one_head(g: Graph, i: int) -> bool:
    n = g[i]
    return n.rank == 4 and n.shape[1] == 1 and head_split(g, i) is not None


def repeat_broadcast_kv(g: Graph) -> tuple[Graph, list[Match]]:
    """`g` with one K or V head broadcast over the query heads by the score or PV matmul (Falcon's multi-query
    `q [B, H, S, d] @ transpose(k [B, 1, S, d])`, `p [B, H, S, S] @ v [B, 1, S, d]`) written as `repeat_kv`
    (`reshape(expand(reshape(kv, [B, 1, 1, S, d]), [B, 1, H, S, d]), [B, H, S, d])`), the form `fuse_sdpa` reads as
    `num_kv_heads=1`. Exact: a matmul broadcasts a size-1 batch axis by repeating it. The head may also be
    repeated by an `expand` of its size-1 head axis to H (GPT-BigCode's multi-query K/V sliced from a fused
    `c_attn`, expanded to every head): `expand` repeats the one head, as `repeat_kv` does, so it is dropped from
    the replayed path. One `fuse_sdpa.head_layout` match per matmul."""
    found = []
    for m in g:
        if m.op != Op.MATMUL or m.rank != 4 or m.shape[1] == 1:
            continue
        a, b = (g[i] for i in m.inputs)
        if a.shape[1] != m.shape[1] or b.shape[1] not in (1, m.shape[1]):
            continue
        path = _to_one_head(g, b)
        if path is not None and (b.shape[1] == 1 or any(g[i].op == Op.EXPAND for i in path)):
            found.append((m, path))
    if not found:
        return g, []
    rw = Rewriter(g, "fuse_sdpa")
    matches = []
    for m, path in found:
        kv, ops = path[0], path[1:]
        bsz, _, s, d = g[kv].shape
        h = m.shape[1]
        with rw.provenance([m.id, *ops]):
            v = rw.reshape(rw.expand(rw.reshape(kv, (bsz, 1, 1, s, d)), (bsz, 1, h, s, d)), (bsz, h, s, d))
            for prev, i in zip(path, ops, strict=False):  # the transpose and scalar scales, now on H heads
                n = g[i]
                if n.op != Op.EXPAND:  # the head expand: v already has the H heads it repeats
                    v = rw.emit(n.op, [v if j == prev else j for j in n.inputs], **dict(n.attrs))
            new = rw.emit(Op.MATMUL, [m.inputs[0], v])
        rw.replace(m.id, new)
        dead = {m.id}
        for i in reversed(ops):  # the old path goes when only the replaced matmul read it
            if not g.is_output(i) and all(u.id in dead for u in g.users(i)):
                rw.remove([i])
                dead.add(i)
        matches.append(Match("fuse_sdpa", RULE, m.id, {"matmul": m.id, "kv_heads": kv}, new, m.path))
    return rw.finish(), matches


def _scalar(g: Graph, i: int) -> bool:
    n = g[i]
    return n.op == Op.CONST and n.rank <= 1 and all(k == 1 for k in n.shape)


def _to_one_head(g: Graph, b: Node) -> list[int] | None:
    """`[kv, ..., b]`: from a one-head head split kv `[B, 1, S, d]` through a transpose of the last two axes,
    products / quotients by a scalar constant and at most one `expand` of the size-1 head axis (every other axis
    kept) to the matmul operand b, or None."""
    path = [b.id]
    n = b
    for _ in range(4):
        if _one_head(g, n.id):
            return path[::-1]
        if n.op == Op.TRANSPOSE and tuple(n.attrs["perm"]) == (0, 1, 3, 2):
            n = g[n.inputs[0]]
        elif n.op in (Op.MUL, Op.DIV) and len(n.inputs) == 2 and _scalar(g, n.inputs[1]):
            n = g[n.inputs[0]]
        elif n.op == Op.MUL and len(n.inputs) == 2 and _scalar(g, n.inputs[0]):
            n = g[n.inputs[1]]
        elif n.op == Op.EXPAND and not any(g[i].op == Op.EXPAND for i in path[:-1]) and _head_expand(g, n):
            n = g[n.inputs[0]]
        else:
            return None
        path.append(n.id)
    return None


def _head_expand(g: Graph, n: Node) -> bool:
    """`n` is `expand(x [B, 1, S, d], [B, H, S, d])`: the head axis (1) repeated, every other axis as it was."""
    src = g[n.inputs[0]].shape
    return n.rank == 4 and len(src) == 4 and src[1] == 1 and src[0] == n.shape[0] and src[2:] == n.shape[2:]


__all__ = ["MAX_INDEX", "RULE", "HeadSplit", "canonical_heads", "emit_heads", "head_split", "repeat_broadcast_kv"]
