"""RoPE written on the heads (Hugging Face's eager `apply_rotary_pos_emb`) -> the `rope` op on the projection.

Hugging Face LLaMA / Mistral / Qwen (and GPT-NeoX's partial rotary) rotate Q and K after the head split:

    h     = transpose(reshape(x, [B, S, nh, d]), [0, 2, 1, 3])                       x: [B, S, nh*d]
    cos4  = reshape(concat(cos, cos, axis=-1), [1, 1, S, d])                          cos, sin: [S, d/2]
    out   = h * cos4 + concat(-h[..., d/2:], h[..., :d/2], axis=-1) * sin4            (rotate_half)

`rope_heads` rewrites `out` to `transpose(reshape(rope(x, cos, sin, head_dim=d, n_rot=d), [B, S, nh, d]),
[0, 2, 1, 3])`, so `fuse_sdpa` packs the attention (reading the rotated projection) and `fuse_attention_block`
can take the rotation as its `has_rope`. Partial rotary (GPT-NeoX, Phi): `h_rot = h[..., :r]` rotated as above
with `[S, r/2]` tables and `concat(out_rot, h[..., r:], axis=-1)` -> `rope(..., n_rot=r)`.

Recognized: the multiplies and the sum in either operand order; the tables as `concat(t, t)` on the last axis of
a rank-2 `[S, r/2]` t, optionally reshaped to `[1, 1, S, r]` (or `[1, S, r]`), or as a full-width `[S, r]`,
`[1, S, r]` or `[1, 1, S, r]` table whose two halves are equal; with a batch B > 1, also one table per batch row
(RoPE at `position_ids` that differ by row: optimum's decoder exports, left padding's cumsum), `[B, S, r/2]` t
(`[B, 1, S, r]` after the concat) or a full-width `[B, S, r]` / `[B, 1, S, r]` table with equal halves, which the
rope op reads as its `[B, S, r/2]` per-row table (guard: read through reshapes, row gathers, casts,
cos/sin and scalar products down to `concat(t, t)` or a param whose values the graph carries, `Graph.values`,
compared exactly; refused naming the first entry that differs, or that the values are not known), which the rope
op reads as `reshape(narrow(t, -1, 0, r/2), [S, r/2])`; the narrows on the last axis. The heads may be any
per-token layout of a `[B, S, W]` projection (`head_layout.head_split`: a column block, as Falcon's gather of its
fused QKV, is read by the rope op as `narrow(qkv, -1, a, nh*d)`; another layout, as GPT-NeoX's per-head
`[q, k, v]`, as `reshape(transpose(heads, [0, 2, 1, 3]), [B, S, nh*d])`, a copy).

Validity (numbers equal, bit for bit on the reference): the rope op computes `[x1 c - x2 s, x2 c + x1 s]` per
head with `c = cos[p, :r/2]` at sequence position p; the form computes `x1 c + (-x2) s` and `x2 c + x1 s`, and
`a + (-b) == a - b`, `(-x) s == -(x s)` exactly in IEEE arithmetic. The rope op reads row p of its table operand
at position p, and the form reads row p of `concat(t, t)` (or of a full table whose halves are that t): so t must
have exactly S rows and r/2 columns (guarded),
whatever computes it (a cached table, or `gather(table, position_ids)` for any ids: the gathered rows are t);
x, both tables and every node of the form share one dtype. A table whose halves are not one table is no
rotation the rope op computes: not rewritten (`fuse_sdpa`'s `rope_on_heads` names it).
A node of the form read elsewhere keeps the form as it is. Each rewrite is a `fuse_sdpa.rope_heads` match.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...ir import Graph, Node, Op, Rewriter
from ..pattern import is_const
from ..trace import Match
from .head_layout import HeadSplit, head_split

RULE = "fuse_sdpa.rope_heads"


@dataclass(frozen=True)
class _Form:
    result: int  # the node the rotated heads replace (the add, or the partial form's concat)
    split: int  # the heads [B, nh, S, d] the rotation reads
    heads: HeadSplit | None  # `split` as a column block of a projection, when it is one
    cos: int
    sin: int
    half: bool  # the tables are the [S, r/2] halves (True) or full-width tables with equal halves (False)
    n_rot: int
    core: tuple[int, ...]  # the form's own nodes, read only inside the form (the result excluded)
    shared: tuple[int, ...]  # the table and head-split nodes, removed when nothing else reads them


def _last(n: Node) -> int:
    return n.rank - 1


def _narrow(g: Graph, i: int, src: int, start: int, length: int) -> bool:
    n = g[i]
    return (n.op == Op.NARROW and n.inputs[0] == src and n.attrs["axis"] in (-1, _last(n))
            and n.attrs["start"] == start and n.attrs["length"] == length)


def _halves(g: Graph, i: int, pairs: bool = False) -> str:
    """"" when every row of table node i has two equal halves on its last axis (`pairs`: equal neighbours,
    `t[..., 2i] == t[..., 2i + 1]`, the interleaved form's `repeat_interleave` tables), read through ops that move
    or pick rows and keep the last axis, or act elementwise (reshape, gather, narrow, transpose, cast, cos, sin, a
    scalar product) down to `concat(t, t)` (halves) or a param whose values the graph carries (`Graph.values`,
    compared exactly); else why not, one line."""
    n = g[i]
    while True:
        if not pairs and n.op == Op.CONCAT and len(set(n.inputs)) == 1 and len(n.inputs) == 2 \
                and n.attrs["axis"] in (-1, _last(n)):
            return ""
        if n.op == Op.PARAM:
            return _param_halves(g, n, pairs)
        if n.op == Op.MUL and len(n.inputs) == 2 and sum(is_const(g[j]) for j in n.inputs) == 1:
            n = g[next(j for j in n.inputs if not is_const(g[j]))]
        elif _keeps_rows(g, n):
            n = g[n.inputs[0]]
        else:
            return f"{n.op.value} (node {n.id}) {list(n.shape)} is neither concat(t, t) nor a constant"


def _keeps_rows(g: Graph, n: Node) -> bool:
    """`n` moves, picks or maps elements of its first operand and keeps its last axis as it is."""
    last = _last(n)
    return ((n.op == Op.RESHAPE and g[n.inputs[0]].shape[-1:] == n.shape[-1:]) or n.op in (Op.CAST, Op.COS, Op.SIN)
            or (n.op == Op.GATHER and n.attrs.get("axis", 0) % n.rank != last and g[n.inputs[0]].rank == n.rank)
            or (n.op == Op.NARROW and n.attrs["axis"] % n.rank != last)
            or (n.op == Op.TRANSPOSE and n.attrs["perm"][-1] == last))


def _param_halves(g: Graph, n: Node, pairs: bool = False) -> str:
    name = f"param {n.attrs['name']!r} {list(n.shape)}"
    what = "neighbour pairs" if pairs else "two halves"
    v = g.param_value(n.id)
    if v is None:
        return (f"the values of {name} are not known to the pass (not among the small constants the importer "
                f"carries), so its {what} are not known to be equal")
    v = np.asarray(v)
    if not v.ndim or v.shape[-1] % 2:
        return f"{name} has an odd last axis"
    half = v.shape[-1] // 2
    a, b = (v[..., 0::2], v[..., 1::2]) if pairs else (v[..., :half], v[..., half:])
    diff = np.argwhere(a != b)
    if not len(diff):
        return ""
    at = tuple(int(j) for j in diff[0])
    return (f"the {what} of {name} differ (at {list(at)} the first holds {float(a[at]):.9g}, the second "
            f"{float(b[at]):.9g}), so it is no table the rope op reads")


def _table(g: Graph, i: int, s: int, r: int, b: int = 1) -> tuple[int | None, list[int], bool]:
    """`(t, nodes, half)` for table node i of a rotation over r dims at S = s: `concat(t, t)` on the last axis of
    a `[s, r/2]` table t, optionally reshaped to `[1, 1, s, r]` / `[1, s, r]` (`half`: the rope op reads t); or a
    full-width `[s, r]` / `[1, s, r]` / `[1, 1, s, r]` table i with equal halves (`_halves`; not `half`: the rope op
    reads its first half); with batch `b` > 1 also one table per batch row (RoPE at `position_ids` that differ by
    row): `concat(t, t)` of a `[b, s, r/2]` t reshaped to `[b, 1, s, r]`, or a full-width `[b, s, r]` /
    `[b, 1, s, r]` table with equal halves; `(None, [], False)` otherwise."""
    nodes = []
    n = g[i]
    rows = (1, b) if b > 1 else (1,)
    if n.op == Op.RESHAPE and n.shape in {*((k, 1, s, r) for k in rows), *((k, s, r) for k in rows)}:
        nodes.append(n.id)
        n = g[n.inputs[0]]
    if n.op == Op.CONCAT and len(n.inputs) == 2 and n.inputs[0] == n.inputs[1] and n.attrs["axis"] in (-1, _last(n)):
        t = g[n.inputs[0]]
        if t.shape == (s, r // 2) or (b > 1 and t.shape == (b, s, r // 2)):
            return t.id, [*nodes, n.id], True
    full = {(s, r), *((k, s, r) for k in rows), *((k, 1, s, r) for k in rows)}
    if g[i].shape in full and not _halves(g, i):
        return i, [], False
    return None, [], False


def _per_row(g: Graph, t: int) -> bool:
    """Table t holds one table per batch row (`[B > 1, ...]` of rank 3 or 4)."""
    return g[t].rank in (3, 4) and g[t].shape[0] > 1


def _table_why(g: Graph, i: int, s: int, r: int, b: int = 1) -> str:
    """Why table node i is no `[S, r/2]` table the rope op reads, or ""."""
    t = g[i]
    if _table(g, i, s, r, b)[0] is not None:
        return ""
    per_row = t.rank in (3, 4) and t.shape[0] > 1 and t.shape[-2:] == (s, r) and (t.rank == 3 or t.shape[1] == 1)
    if per_row and t.shape[0] != b:
        return (f"{t.op.value} (node {t.id}) {list(t.shape)} is a table per batch row of {t.shape[0]} rows for a "
                f"batch of {b}: the rope op reads one [S, {r // 2}] table, or one per batch row")
    if not per_row and t.shape not in ((s, r), (1, s, r), (1, 1, s, r)):
        return f"{t.op.value} (node {t.id}) {list(t.shape)} is no [S, {r}] table of S = {s} rows"
    return _halves(g, i)


def _half_table(rw: Rewriter, t: int, half: bool, s: int, r: int) -> int:
    """The `[s, r/2]` table the rope op reads (`[B, s, r/2]` for one table per batch row): t, or the first half of the
    full-width table t."""
    tn = rw.lookup(t)
    if half:
        return t
    shape = (tn.shape[0], s, r // 2) if tn.rank in (3, 4) and tn.shape[0] > 1 else (s, r // 2)
    return rw.reshape(rw.narrow(t, tn.rank - 1, 0, r // 2), shape)


def _other(n: Node, i: int) -> int | None:
    if n.op != Op.MUL or len(n.inputs) != 2 or i not in n.inputs:
        return None
    return n.inputs[1] if n.inputs[0] == i else n.inputs[0]


def _rotation(g: Graph, add: Node) -> tuple[int, int, int, int, list[int]] | None:
    """`(h, r, cos4, sin4, nodes)` when `add` is `h * cos4 + rotate_half(h) * sin4` (r = h's last dim)."""
    if add.op != Op.ADD or len(add.inputs) != 2:
        return None
    for pi, ri in (add.inputs, add.inputs[::-1]):
        plain, rot = g[pi], g[ri]
        cat = next((g[i] for i in rot.inputs if g[i].op == Op.CONCAT), None) if rot.op == Op.MUL else None
        if plain.op != Op.MUL or cat is None or len(cat.inputs) != 2 or cat.attrs["axis"] not in (-1, _last(cat)):
            continue
        neg, lo = g[cat.inputs[0]], cat.inputs[1]
        if neg.op != Op.NEG or g[neg.inputs[0]].op != Op.NARROW:
            continue
        h = g[neg.inputs[0]].inputs[0]
        r = g[h].shape[-1]
        if r % 2 or not _narrow(g, neg.inputs[0], h, r // 2, r // 2) or not _narrow(g, lo, h, 0, r // 2):
            continue
        cos4, sin4 = _other(plain, h), _other(rot, cat.id)
        if cos4 is not None and sin4 is not None:
            return h, r, cos4, sin4, [plain.id, rot.id, cat.id, neg.id, neg.inputs[0], lo]
    return None


def partial_rotary(g: Graph, add: Node, h: int, r: int) -> tuple[int, list[int], int] | None:
    """`(heads, core, result)` when the rotation `add` of `h = heads[..., :r]` is partial rotary:
    `concat(add, heads[..., r:], axis=-1)` (GPT-NeoX, Phi); `core` the form's extra nodes, `result` the concat.
    None when h is the whole heads (GPT-NeoX's Q with full rotary: the first d of a per-head [q, k, v])."""
    hn, users = g[h], g.users(add.id)
    if hn.op != Op.NARROW or hn.attrs["start"] != 0 or hn.attrs["axis"] not in (-1, _last(hn)) or len(users) != 1 \
            or g[hn.inputs[0]].shape[-1] <= r:
        return None
    heads, tail = hn.inputs[0], users[0]
    d = g[heads].shape[-1]
    if tail.op == Op.CONCAT and len(tail.inputs) == 2 and tail.inputs[0] == add.id and \
            tail.attrs["axis"] in (-1, _last(tail)) and _narrow(g, tail.inputs[1], heads, r, d - r):
        return heads, [add.id, h, tail.inputs[1]], tail.id
    return None


def _form(g: Graph, add: Node) -> _Form | None:
    """The rotation whose sum is `add`, full or partial (see the module doc), or None."""
    found = _rotation(g, add)
    if found is None:
        return None
    h, r, cos4, sin4, core = found
    split, result = h, add.id
    if (partial := partial_rotary(g, add, h, r)) is not None:
        split, extra, result = partial
        core += extra
    if g[split].rank != 4:
        return None
    hs = head_split(g, split)
    bsz, s = g[split].shape[0], g[split].shape[2]
    cos, cos_nodes, c_half = _table(g, cos4, s, r, bsz)
    sin, sin_nodes, s_half = _table(g, sin4, s, r, bsz)
    if cos is None or sin is None or c_half != s_half or _per_row(g, cos) != _per_row(g, sin) \
            or len({g[i].dtype for i in (split, cos, sin, *core, result)}) != 1:
        return None
    inside = {*core, result}
    if any(g.is_output(i) or any(u.id not in inside for u in g.users(i)) for i in core):
        return None  # a product of the form is read elsewhere: the form stays (rope_on_heads names it)
    chain = hs.chain if hs is not None and hs.block else ()  # another layout: the copy reads the heads
    return _Form(result, split, hs, cos, sin, c_half, r, tuple(core), (*cos_nodes, *sin_nodes, *chain))


def why_not(g: Graph, add: int) -> str:
    """Why the rotation summed by node `add` was not rewritten (for `rope_on_heads`' message), or ""."""
    found = _rotation(g, g[add])
    if found is None:
        return ""
    h, r, cos4, sin4, _ = found
    hn = g[h]
    s = hn.shape[2] if hn.rank == 4 else 0
    bsz = hn.shape[0] if hn.rank == 4 else 1
    for name, i in (("cos", cos4), ("sin", sin4)):
        if why := _table_why(g, i, s, r, bsz):
            return f"its {name} table: {why} (the rope op reads one half of an [S, {r}] table)"
    if _form(g, g[add]) is None:
        return ("a product of the form is read elsewhere, or its dtypes differ, or it is not on a head split (a "
                "column block of a [B, S, W] projection)")
    return ""


def _packed(rw: Rewriter, g: Graph, f: _Form) -> int:
    """The heads `f.split` `[B, nh, S, d]` as the packed `[B, S, nh*d]` the rope op reads: the column block of the
    projection it splits (`head_layout.head_split`), else `reshape(transpose(heads, [0, 2, 1, 3]))` (a copy)."""
    b, nh, s, d = g[f.split].shape
    hs = f.heads
    if hs is None or not hs.block:
        return rw.reshape(rw.transpose(f.split, (0, 2, 1, 3)), (b, s, nh * d))
    w = g[hs.root].shape[2]
    return hs.root if (hs.start, nh * d) == (0, w) else rw.narrow(hs.root, 2, hs.start, nh * d)


def rope_heads(g: Graph) -> tuple[Graph, list[Match]]:
    """`g` with every rotation written on the heads rewritten to the `rope` op (see the module doc), and one `Match`
    per rewrite; `(g, [])` when there is none."""
    forms = [f for n in g if (f := _form(g, n)) is not None]
    if not forms:
        return g, []
    rw = Rewriter(g, "fuse_sdpa")
    results = {f.result for f in forms}
    gone = {i for f in forms for i in f.core}
    changed = True
    while changed:  # tables shared by Q and K (and head splits) go once nothing else reads them
        changed = False
        for i in {i for f in forms for i in f.shared} - gone:
            if not g.is_output(i) and all(u.id in gone or u.id in results for u in g.users(i)):
                gone.add(i)
                changed = True
    matches = []
    for f in forms:
        b, nh, s, d = g[f.split].shape
        with rw.provenance([*f.core, f.result]):
            x = _packed(rw, g, f)
            cos, sin = (_half_table(rw, t, f.half, s, f.n_rot) for t in (f.cos, f.sin))
            rot = rw.emit(Op.ROPE, [x, cos, sin], head_dim=d, n_rot=f.n_rot)
            heads = rw.transpose(rw.reshape(rot, (b, s, nh, d)), (0, 2, 1, 3))
        rw.replace(f.result, heads)
        matches.append(Match("fuse_sdpa", RULE, f.result, {"rope_sum": f.result, "head_split": f.split}, rot,
                             g[f.result].path))
    rw.remove(sorted(gone - results))
    return rw.finish(), matches


__all__ = ["RULE", "rope_heads", "why_not"]
