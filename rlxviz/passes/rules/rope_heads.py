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
a rank-2 `[S, r/2]` t, optionally reshaped to `[1, 1, S, r]` (or `[1, S, r]`); the narrows on the last axis.

Validity (numbers equal, bit for bit on the reference): the rope op computes `[x1 c - x2 s, x2 c + x1 s]` per
head with `c = cos[p, :r/2]` at sequence position p; the form computes `x1 c + (-x2) s` and `x2 c + x1 s`, and
`a + (-b) == a - b`, `(-x) s == -(x s)` exactly in IEEE arithmetic. The rope op reads row p of its table operand
at position p, and the form reads row p of `concat(t, t)`: so t must have exactly S rows and r/2 columns (guarded),
whatever computes it (a cached table, or `gather(table, position_ids)` for any ids: the gathered rows are t);
x, both tables and every node of the form share one dtype. A table whose halves are not one table is no
rotation the rope op computes: not rewritten (`fuse_sdpa`'s `rope_on_heads` names it).
A node of the form read elsewhere keeps the form as it is. Each rewrite is a `fuse_sdpa.rope_heads` match.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import Graph, Node, Op, Rewriter
from ..trace import Match

RULE = "fuse_sdpa.rope_heads"


@dataclass(frozen=True)
class _Form:
    result: int  # the node the rotated heads replace (the add, or the partial form's concat)
    x: int  # the packed projection [B, S, nh*d]
    split: int  # the head split transpose
    cos: int
    sin: int
    n_rot: int
    core: tuple[int, ...]  # the form's own nodes, read only inside the form (the result excluded)
    shared: tuple[int, ...]  # the table and head-split nodes, removed when nothing else reads them


def _last(n: Node) -> int:
    return n.rank - 1


def _narrow(g: Graph, i: int, src: int, start: int, length: int) -> bool:
    n = g[i]
    return (n.op == Op.NARROW and n.inputs[0] == src and n.attrs["axis"] in (-1, _last(n))
            and n.attrs["start"] == start and n.attrs["length"] == length)


def _table(g: Graph, i: int, s: int, r: int) -> tuple[int | None, list[int]]:
    """`(t, nodes)` when node i is `concat(t, t)` on the last axis of a `[s, r/2]` table t, optionally reshaped to
    `[1, 1, s, r]` / `[1, s, r]`; `(None, [])` otherwise."""
    nodes = []
    n = g[i]
    if n.op == Op.RESHAPE and n.shape in ((1, 1, s, r), (1, s, r)):
        nodes.append(n.id)
        n = g[n.inputs[0]]
    if n.op != Op.CONCAT or len(n.inputs) != 2 or n.inputs[0] != n.inputs[1] or n.attrs["axis"] not in (-1, 1):
        return None, []
    t = g[n.inputs[0]]
    if t.rank != 2 or t.shape != (s, r // 2):
        return None, []
    return t.id, [*nodes, n.id]


def _head_split(g: Graph, i: int) -> tuple[int, int] | None:
    """`(x, S)` when node i is `transpose(reshape(x [B, S, nh*d], [B, S, nh, d]), [0, 2, 1, 3])`."""
    t = g[i]
    if t.op != Op.TRANSPOSE or tuple(t.attrs["perm"]) != (0, 2, 1, 3):
        return None
    r = g[t.inputs[0]]
    if r.op != Op.RESHAPE or r.rank != 4:
        return None
    x = g[r.inputs[0]]
    b, s, nh, d = r.shape
    return (x.id, s) if x.rank == 3 and x.shape == (b, s, nh * d) else None


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


def _form(g: Graph, add: Node) -> _Form | None:
    """The rotation whose sum is `add`, full or partial (see the module doc), or None."""
    found = _rotation(g, add)
    if found is None:
        return None
    h, r, cos4, sin4, core = found
    split, result = h, add.id
    hs = _head_split(g, h)
    if hs is None:  # partial rotary: h = heads[..., :r], then concat(out, heads[..., r:])
        hn, users = g[h], g.users(add.id)
        if hn.op != Op.NARROW or hn.attrs["start"] != 0 or hn.attrs["axis"] not in (-1, _last(hn)) or len(users) != 1:
            return None
        split, tail = hn.inputs[0], users[0]
        hs = _head_split(g, split)
        d = g[split].shape[-1]
        if hs is None or tail.op != Op.CONCAT or len(tail.inputs) != 2 or tail.inputs[0] != add.id or \
                tail.attrs["axis"] not in (-1, _last(tail)) or not _narrow(g, tail.inputs[1], split, r, d - r):
            return None
        core += [add.id, h, tail.inputs[1]]
        result = tail.id
    x, s = hs
    cos, cos_nodes = _table(g, cos4, s, r)
    sin, sin_nodes = _table(g, sin4, s, r)
    if cos is None or sin is None or len({g[i].dtype for i in (x, cos, sin, *core, result)}) != 1:
        return None
    inside = {*core, result}
    if any(g.is_output(i) or any(u.id not in inside for u in g.users(i)) for i in core):
        return None  # a product of the form is read elsewhere: the form stays (rope_on_heads names it)
    shared = (*cos_nodes, *sin_nodes, split, g[split].inputs[0])
    return _Form(result, x, split, cos, sin, r, tuple(core), shared)


def why_not(g: Graph, add: int) -> str:
    """Why the rotation summed by node `add` was not rewritten (for `rope_on_heads`' message), or ""."""
    found = _rotation(g, g[add])
    if found is None:
        return ""
    _, r, cos4, sin4, _ = found
    for name, i in (("cos", cos4), ("sin", sin4)):
        t = g[i]
        if _table(g, i, t.shape[-2] if t.rank >= 2 else 0, r)[0] is None:
            return (f"its {name} table {t.op.value} (node {t.id}) {list(t.shape)} is not concat(t, t) of one "
                    f"[S, {r // 2}] table, so its two halves are not known to be equal (the rope op reads one half)")
    if _form(g, g[add]) is None:
        return "a product of the form is read elsewhere, or its dtypes differ, or it is not on a head split"
    return ""


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
        reshape = g[g[f.split].inputs[0]]
        with rw.provenance([*f.core, f.result]):
            rot = rw.emit(Op.ROPE, [f.x, f.cos, f.sin], head_dim=reshape.shape[3], n_rot=f.n_rot)
            heads = rw.transpose(rw.reshape(rot, reshape.shape), (0, 2, 1, 3))
        rw.replace(f.result, heads)
        matches.append(Match("fuse_sdpa", RULE, f.result, {"rope_sum": f.result, "head_split": f.split}, rot,
                             g[f.result].path))
    rw.remove(sorted(gone - results))
    return rw.finish(), matches


__all__ = ["RULE", "rope_heads", "why_not"]
