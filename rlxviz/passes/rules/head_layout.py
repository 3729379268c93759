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

The rules (`CANONICAL_HEADS`, `REPEAT_BROADCAST_KV`, stages of `fuse_sdpa` run by the engine) have no refusal of
their own: a chain that is no head split, or a matmul that broadcasts no single head, is no candidate (a quiet
step), and what then keeps the attention from packing is named by `fuse_sdpa.hf_attention`'s guards
(`k_layout`, `v_head_split`, `heads_consistent`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from weakref import WeakKeyDictionary

import numpy as np

from ...ir import Graph, Node, Op, Rewriter
from ..engine import rule_pass
from ..guard import Ctx
from ..pattern import P
from ..rule import QUIET, Fail, Rule, reports
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


def token_columns(g: Graph, i: int) -> tuple[int, np.ndarray, tuple[int, ...]] | None:
    """`(root, cols, chain)` when node `i` `[B, S, n]` is computed from a rank-3 `root` `[B, S, W]` by movement ops
    (`_MOVES`, a gather's index a constant) such that element `[b, s, c]` is root element `[b, s, cols[c]]` for every
    token (the same columns in every row: a per-token column selection, e.g. GPT-NeoX's Q read through its per-head
    `[q, k, v]` view, split and merged again); `chain` the movement nodes from the root's reader to `i`. None when `i`
    is no such selection (some element comes from another token's row, a root of more than `MAX_INDEX` elements)."""
    n = g[i]
    if n.rank != 3:
        return None
    b, s, _ = n.shape
    chain = _chain(g, i, b, s)
    if chain is None:
        return None
    root, moves = chain[0], chain[1:]
    w = root.shape[2]
    if b * s * w > MAX_INDEX:
        return None
    got = np.arange(b * s * w, dtype=np.int64).reshape(b, s, w)
    try:
        for m in moves:
            got = _apply(g, m, got)
    except (ValueError, IndexError):
        return None
    if got.shape != n.shape:
        return None
    rows = (np.arange(b, dtype=np.int64)[:, None, None] * s + np.arange(s)[None, :, None]) * w
    cols = got - rows
    if not (np.all((cols >= 0) & (cols < w)) and np.array_equal(cols, np.broadcast_to(cols[:1, :1], cols.shape))):
        return None
    return root.id, cols[0, 0].copy(), tuple(m.id for m in moves)


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


_PENDING: WeakKeyDictionary[Rewriter, set[int]] = WeakKeyDictionary()
"""Per rewriter (one pass's sweep): the nodes its matches read that go once nothing but removed nodes reads them
(`remove_shared`)."""


def remove_shared(rw: Rewriter, shared: Sequence[int]) -> None:
    """Remove each node of `shared` (and of earlier matches' in this sweep of `rw`) once no survivor reads it and it
    is no graph output: what several matches read (the tables of Q's and K's rotations, a fused QKV's chain) goes
    with the last of them."""
    g = rw.graph
    pending = _PENDING.setdefault(rw, set())
    pending.update(shared)
    changed = True
    while changed:
        changed = False
        for i in sorted(pending):
            if not rw.removed(i) and not g.is_output(i) and all(rw.removed(u.id) for u in g.users(i)):
                rw.remove([i])
                changed = True


HEADS = P((Op.TRANSPOSE, Op.GATHER, Op.NARROW, Op.RESHAPE), name="heads", where=lambda n: n.rank == 4)
"""A movement op giving rank-4 heads (the anchor of `CANONICAL_HEADS`)."""


@reports(reads=("heads",), binds=("root", "chain*"))
def _find_split(c: Ctx) -> Fail | None:
    """Bind the non-standard head split the heads are (`_moved_heads`: `root` and its movement `chain0`, ...), read
    by a matmul (V, or K through its transpose); quiet otherwise (no candidate: a standard split needs nothing, a
    chain that is no per-token layout is no head split)."""
    g = c.graph
    hs = _moved_heads(g, c["heads"]) if _matmul_operand(g, c["heads"]) else None
    if hs is None:
        return QUIET
    c.bindings["root"] = hs.root
    for k, i in enumerate(hs.chain):
        c.bindings[f"chain{k}"] = i
    return None


def _canonical(c: Ctx, rw: Rewriter) -> int:
    """The standard head split of the root's column block, or of `reshape(transpose(heads))` for another layout;
    a block's chain removed once nothing else reads it."""
    g, n = c.graph, c["heads"]
    hs = head_split(g, n.id)
    assert hs is not None, "bound by _find_split"
    b, nh, s, d = n.shape
    with rw.provenance(list(hs.chain)):
        if hs.block:
            new = emit_heads(rw, hs.root, hs, g[hs.root].shape[2])
        else:
            same = rw.emit(n.op, list(n.inputs), **dict(n.attrs))  # n itself, read by the copy
            packed = rw.reshape(rw.transpose(same, (0, 2, 1, 3)), (b, s, nh * d))
            new = rw.transpose(rw.reshape(packed, (b, s, nh, d)), (0, 2, 1, 3))
    rw.replace(n.id, new)
    remove_shared(rw, hs.chain if hs.block else ())
    return new


CANONICAL_HEADS = Rule(RULE, HEADS, steps=(_find_split,), result="heads", absorb=("heads",), rewrite=_canonical,
                       doc="a head split written as another movement chain -> the standard split of its block")

CANONICAL_HEADS_PASS = rule_pass("fuse_sdpa", [CANONICAL_HEADS], "head splits read as the standard split")
"""The rule as a stage of `fuse_sdpa` (`engine.compose`)."""


def canonical_heads(g: Graph) -> tuple[Graph, list[Match]]:
    """`g` with every non-standard head split read by a matmul rewritten to the standard one: of the column block
    of the root (`narrow`), or, when the heads are no column block, of `reshape(transpose(heads, [0, 2, 1, 3]),
    [B, S, nh*d])` (module doc). The `CANONICAL_HEADS` rule run by the engine."""
    return CANONICAL_HEADS_PASS.rewrite(g)


def _one_head(g: Graph, i: int) -> bool:
    n = g[i]
    return n.rank == 4 and n.shape[1] == 1 and head_split(g, i) is not None


SCORES_MATMUL = P(Op.MATMUL, P.var("a"), P.var("b"), name="matmul", where=lambda n: n.rank == 4 and n.shape[1] != 1)
"""A rank-4 matmul over more than one head (the anchor of `REPEAT_BROADCAST_KV`)."""


@reports(reads=("matmul", "a", "b"), binds=("kv", "step*"))
def _find_one_head(c: Ctx) -> Fail | None:
    """Bind the one K/V head the matmul broadcasts (`kv`) and the path from it to the operand (`step0`, ...):
    the query side has the matmul's heads, the other operand one head, or H heads by an `expand` of one; quiet
    otherwise (no candidate)."""
    g, m, a, b = c.graph, c["matmul"], c["a"], c["b"]
    if a.shape[1] != m.shape[1] or b.shape[1] not in (1, m.shape[1]):
        return QUIET
    path = _to_one_head(g, b)
    if path is None or not (b.shape[1] == 1 or any(g[i].op == Op.EXPAND for i in path)):
        return QUIET
    c.bindings["kv"] = path[0]
    for k, i in enumerate(path[1:]):
        c.bindings[f"step{k}"] = i
    return None


def _repeat(c: Ctx, rw: Rewriter) -> int:
    """`repeat_kv` of the one head, the path's transpose and scales replayed on it, the matmul on that."""
    g, m = c.graph, c["matmul"]
    ops = [i for r, i in c.bindings.items() if r.startswith("step") and r[4:].isdigit()]
    path = [c.id("kv"), *ops]
    kv = path[0]
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
    return new


REPEAT_BROADCAST_KV = Rule(RULE, SCORES_MATMUL, steps=(_find_one_head,), result="matmul", absorb=("matmul",),
                           rewrite=_repeat, doc="one K/V head broadcast by the matmul -> repeat_kv")

REPEAT_BROADCAST_KV_PASS = rule_pass("fuse_sdpa", [REPEAT_BROADCAST_KV], "one broadcast K/V head as repeat_kv")
"""The rule as a stage of `fuse_sdpa` (`engine.compose`)."""


def repeat_broadcast_kv(g: Graph) -> tuple[Graph, list[Match]]:
    """`g` with one K or V head broadcast over the query heads by the score or PV matmul (Falcon's multi-query
    `q [B, H, S, d] @ transpose(k [B, 1, S, d])`, `p [B, H, S, S] @ v [B, 1, S, d]`) written as `repeat_kv`
    (`reshape(expand(reshape(kv, [B, 1, 1, S, d]), [B, 1, H, S, d]), [B, H, S, d])`), the form `fuse_sdpa` reads as
    `num_kv_heads=1`. Exact: a matmul broadcasts a size-1 batch axis by repeating it. The head may also be
    repeated by an `expand` of its size-1 head axis to H (GPT-BigCode's multi-query K/V sliced from a fused
    `c_attn`, expanded to every head): `expand` repeats the one head, as `repeat_kv` does, so it is dropped from
    the replayed path. One `fuse_sdpa.head_layout` match per matmul: the `REPEAT_BROADCAST_KV` rule run by the
    engine."""
    return REPEAT_BROADCAST_KV_PASS.rewrite(g)


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


__all__ = ["CANONICAL_HEADS", "CANONICAL_HEADS_PASS", "HEADS", "MAX_INDEX", "REPEAT_BROADCAST_KV",
           "REPEAT_BROADCAST_KV_PASS", "RULE", "SCORES_MATMUL", "HeadSplit", "canonical_heads", "emit_heads",
           "head_split", "remove_shared", "repeat_broadcast_kv", "token_columns"]
