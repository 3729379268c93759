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
rotation the rope op computes: not rewritten. A node of the form read elsewhere keeps the form as it is.

The rule (`ROPE_HEADS`, run by the engine as a stage of `fuse_sdpa`): anchor an add; the step `_find_rotation`
binds the form (quiet when the add is none: not a candidate), `find_partial` the heads it rotates; then each
condition above is a named guard, so a refusal is the rule's own near miss: `cos_table` / `sin_table` (a table the
rope op reads, its halves equal), `heads_rank` (`[B, nh, S, d]` heads), `tables_alike` (both tables laid out
alike), `one_dtype`, and the engine's `absorbed_escape` (no node of the form read elsewhere). `fuse_sdpa`'s
`rope_on_heads` quotes the refusal (`engine.refusal`). Each rewrite is a `fuse_sdpa.rope_heads` match.
"""

from __future__ import annotations

import numpy as np

from ...ir import Graph, Node, Op, Rewriter
from ..engine import rule_pass
from ..guard import NOT_RECOGNIZED, Ctx, Guard, _dynamic, guard
from ..pattern import P, is_const
from ..rule import QUIET, Fail, Rule, reports
from ..trace import Match
from .head_layout import HeadSplit, head_split, remove_shared

RULE = "fuse_sdpa.rope_heads"
CORE = ("plain", "rotated", "rotate_half", "neg", "hi", "lo")
"""The roles of the form's own nodes (`_rotation`'s order): `h * cos4`, `rotate_half(h) * sin4`, the concat, the
neg, `h[..., d/2:]` and `h[..., :d/2]`."""


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
    compared exactly), or equal by construction where the walk stops (`equal_by_map`: a table computed at run time
    and repeated by movement ops); else why not, one line."""
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
        elif equal_by_map(g, n.id, pairs):
            return ""
        else:
            return f"{n.op.value} (node {n.id}) {list(n.shape)} is neither concat(t, t) nor a constant"


MAX_MAP = 1 << 20
"""The most elements of a table whose element map `equal_by_map` evaluates (an int64 array of 8 MiB)."""
_MOVES = (Op.RESHAPE, Op.TRANSPOSE, Op.EXPAND, Op.NARROW, Op.GATHER)
_UNIFORM = (Op.CAST, Op.COS, Op.SIN, Op.NEG)


def const_index(g: Graph, i: int) -> np.ndarray | None:
    """The integer values of a const or of a param whose values the graph carries (a gather's index table)."""
    n = g[i]
    v = n.attrs.get("value") if n.op == Op.CONST else g.param_value(i)
    if v is None or isinstance(v, float):
        return None
    a = np.asarray(v)
    return a.astype(np.int64) if a.dtype.kind in "iu" else None


def _element_map(g: Graph, i: int, depth: int = 24) -> np.ndarray | None:
    """Node i as a map of the elements of the node it is computed from (each element of that source numbered): i is
    reached from the source through movement ops (reshape, transpose, expand, narrow, gather by a constant index)
    and uniform elementwise ops (cast, cos, sin, neg, a product with a scalar constant), which give equal outputs
    for equal inputs; so two entries of the map that are equal hold equal values. None for any other op on the way,
    or a source over `MAX_MAP` elements."""
    n = g[i]
    if depth == 0 or int(np.prod(n.shape)) > MAX_MAP:
        return None
    if n.op in _UNIFORM:
        return _element_map(g, n.inputs[0], depth - 1)
    if n.op in (Op.MUL, Op.DIV) and len(n.inputs) == 2 and is_const(g[n.inputs[1]]) \
            and int(np.prod(g[n.inputs[1]].shape)) == 1:
        return _element_map(g, n.inputs[0], depth - 1)
    if n.op == Op.MUL and len(n.inputs) == 2 and is_const(g[n.inputs[0]]) and int(np.prod(g[n.inputs[0]].shape)) == 1:
        return _element_map(g, n.inputs[1], depth - 1)
    if n.op not in _MOVES:
        return np.arange(int(np.prod(n.shape)), dtype=np.int64).reshape(n.shape)  # the source: every element its own
    a = _element_map(g, n.inputs[0], depth - 1)
    return None if a is None else move_map(n, a, const_index(g, n.inputs[1]) if n.op == Op.GATHER else None)


def move_map(n: Node, a: np.ndarray, index: np.ndarray | None = None) -> np.ndarray | None:
    """`a` (an element map of `n`'s first operand) carried through movement op `n`: reshape, transpose, expand,
    narrow, or a gather by the constant `index`; None for another op, a gather without its index, or shapes that
    do not fit `n`'s."""
    try:
        if n.op == Op.RESHAPE:
            out = a.reshape(n.shape)
        elif n.op == Op.TRANSPOSE:
            out = a.transpose(n.attrs["perm"])
        elif n.op == Op.EXPAND:
            out = np.broadcast_to(a, n.shape)
        elif n.op == Op.NARROW:
            ax, st = n.attrs["axis"] % a.ndim, n.attrs["start"]
            out = np.take(a, range(st, st + n.attrs["length"]), axis=ax)
        elif n.op == Op.GATHER and index is not None:
            out = np.take(a, index, axis=n.attrs.get("axis", 0) % a.ndim)
        else:
            return None
    except (ValueError, IndexError):
        return None
    return out if out.shape == n.shape else None


def equal_by_map(g: Graph, i: int, pairs: bool = False) -> bool:
    """Every row of table node i has two equal halves (`pairs`: equal neighbours) by construction: its element map
    (`_element_map`) repeats each entry so. Exact: equal map entries are the same element of the source, carried
    by the same ops (a table computed from `position_ids` at run time, repeated by a gather: optimum's exports)."""
    m = _element_map(g, i)
    if m is None or not m.ndim or m.shape[-1] % 2:
        return False
    half = m.shape[-1] // 2
    a, b = (m[..., 0::2], m[..., 1::2]) if pairs else (m[..., :half], m[..., half:])
    return bool(np.array_equal(a, b)) and m.size > 1


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


def _dims(c: Ctx) -> tuple[int, int, int]:
    """`(S, r, B)` of the bound rotation: the heads' sequence length and batch (0 and 1 when the heads are no
    `[B, nh, S, d]`; `heads_rank` refuses those) and the rotated width r."""
    split = c["split"]
    four = split.rank == 4
    return (split.shape[2] if four else 0), c["h"].shape[-1], (split.shape[0] if four else 1)


@reports(reads=("rope_sum",), binds=("h", "cos4", "sin4", *CORE))
def _find_rotation(c: Ctx) -> Fail | None:
    """Bind the rotation `h * cos4 + rotate_half(h) * sin4` summed by the anchor (`_rotation`); quiet when the add
    is none (not a candidate: most adds are residuals)."""
    found = _rotation(c.graph, c["rope_sum"])
    if found is None:
        return QUIET
    h, _, cos4, sin4, core = found
    c.bindings["h"], c.bindings["cos4"], c.bindings["sin4"] = h, cos4, sin4
    for role, i in zip(CORE, core, strict=True):
        c.bindings[role] = i
    return None


@reports(reads=("rope_sum", "h"), binds=("split", "h_part", "pass", "tail"))
def find_partial(c: Ctx) -> Fail | None:
    """Bind `split`, the heads the rotation reads: `h` itself, or for partial rotary (`partial_rotary`) the heads
    `h = split[..., :r]` is narrowed from, with `h_part` (that narrow), `pass` (`split[..., r:]`) and `tail` (the
    `concat(rotated, pass)` the rewrite replaces). Only binds; never refuses."""
    found = partial_rotary(c.graph, c["rope_sum"], c.id("h"), c["h"].shape[-1])
    if found is None:
        c.bindings["split"] = c.id("h")
        return None
    heads, extra, tail = found
    c.bindings["split"], c.bindings["h_part"], c.bindings["pass"], c.bindings["tail"] = heads, extra[1], extra[2], tail
    return None


def _table_step(c: Ctx, name: str) -> Fail | None:
    """Bind the table the rope op reads for `name` (cos or sin), or refuse naming why the table node is none."""
    s, r, b = _dims(c)
    i = c.id(f"{name}4")
    t = _table(c.graph, i, s, r, b)[0]
    if t is not None:
        c.bindings[name] = t
        return None
    return Fail("guard", f"{name}_table",
                f"its {name} table: {_table_why(c.graph, i, s, r, b)} (the rope op reads one half of an [S, {r}] "
                f"table)", (i,), (), "give the rotation its table as concat(t, t) of one [S, r/2] table t, or as a "
                "constant whose halves the graph carries", subject=i, kind=NOT_RECOGNIZED,
                fix="fuse_sdpa.rope_heads reads this table form (its halves known equal)")


@reports("cos_table", reads=("cos4", "split", "h"), binds=("cos",))
def _cos_table(c: Ctx) -> Fail | None:
    return _table_step(c, "cos")


@reports("sin_table", reads=("sin4", "split", "h"), binds=("sin",))
def _sin_table(c: Ctx) -> Fail | None:
    return _table_step(c, "sin")


def _layout(c: Ctx, name: str) -> tuple[bool, bool]:
    """(half, per batch row) of the bound `name` table: the `[S, r/2]` half (True) or a full-width table, and one
    table per batch row or one for every row."""
    s, r, b = _dims(c)
    return _table(c.graph, c.id(f"{name}4"), s, r, b)[2], _per_row(c.graph, c.id(name))


def _tables_alike_why(c: Ctx) -> str:
    (ch, cr), (sh, sr) = _layout(c, "cos"), _layout(c, "sin")
    what = {True: "an [S, r/2] half doubled by concat", False: "a full-width table"}
    rows = {True: "one per batch row", False: "one for every batch row"}
    return (f"its cos table {c.d('cos')} is {what[ch]}, {rows[cr]}, and its sin table {c.d('sin')} {what[sh]}, "
            f"{rows[sr]}; the rope op reads both tables alike")


TABLES_ALIKE = guard("tables_alike", lambda c: _layout(c, "cos") == _layout(c, "sin"), _tables_alike_why,
                     "write cos and sin the same way (both concat(t, t), or both full-width; both per row or not)",
                     requires=("cos", "sin"), reads=("cos4", "sin4", "split", "h"), kind=NOT_RECOGNIZED,
                     fix="fuse_sdpa.rope_heads converts one table layout to the other")


def one_dtype(roles: tuple[str, ...], optional: tuple[str, ...]) -> Guard:
    """`one_dtype`: the nodes bound to `roles` (and to `optional` ones, when bound) share one dtype: the rope op
    computes in the dtype of its operand x, and every product of the form is rounded to it."""
    def bound(c: Ctx) -> list[str]:
        family = [k for r in optional if r.endswith("*") for k in c.bindings if _dynamic(k, frozenset((r,)))]
        return [*roles, *(r for r in optional if not r.endswith("*") and r in c), *family]

    def why(c: Ctx) -> str:
        by: dict[str, list[str]] = {}
        for r in bound(c):
            by.setdefault(c[r].dtype.value, []).append(c.label(r))
        return ("the form computes in " + ", ".join(f"{d} ({', '.join(rs)})" for d, rs in by.items())
                + "; the rope op computes in one dtype")

    return guard("one_dtype", lambda c: len({c[r].dtype for r in bound(c)}) == 1, why,
                 "compute the rotation and its tables in one dtype (cast the tables once, outside the form)",
                 requires=roles, optional=optional, kind=NOT_RECOGNIZED,
                 fix="a rope op that rounds between mixed dtypes as the form does")


HEADS_RANK = guard("heads_rank", lambda c: c["split"].rank == 4,
                   lambda c: f"the rotated heads {c.d('split')} are {list(c['split'].shape)}; the rope op rotates "
                             f"heads [B, nh, S, d] split from a [B, S, W] projection",
                   "rotate the heads after the head split ([B, nh, S, d])", requires=("split",),
                   kind=NOT_RECOGNIZED, fix="fuse_sdpa.rope_heads reads rotations on other head layouts")

def _packed(rw: Rewriter, g: Graph, split: int, hs: HeadSplit | None) -> int:
    """The heads `split` `[B, nh, S, d]` as the packed `[B, S, nh*d]` the rope op reads: the column block of the
    projection it splits (`head_layout.head_split`), else `reshape(transpose(heads, [0, 2, 1, 3]))` (a copy)."""
    b, nh, s, d = g[split].shape
    if hs is None or not hs.block:
        return rw.reshape(rw.transpose(split, (0, 2, 1, 3)), (b, s, nh * d))
    w = g[hs.root].shape[2]
    return hs.root if (hs.start, nh * d) == (0, w) else rw.narrow(hs.root, 2, hs.start, nh * d)


def _rewrite(c: Ctx, rw: Rewriter) -> int:
    """The rope op on the packed heads, back to the heads' layout; the form removed, and its tables and head split
    once nothing else reads them."""
    g = c.graph
    s, r, bsz = _dims(c)
    b, nh, _, d = c["split"].shape
    partial = "tail" in c
    core = [c.id(k) for k in CORE] + ([c.id("rope_sum"), c.id("h_part"), c.id("pass")] if partial else [])
    result = c.id("tail") if partial else c.id("rope_sum")
    cos, cos_nodes, half = _table(g, c.id("cos4"), s, r, bsz)
    _, sin_nodes, _ = _table(g, c.id("sin4"), s, r, bsz)
    hs = head_split(g, c.id("split"))
    with rw.provenance([*core, result]):
        with rw.absorbing():  # its operands (the packed heads, the half tables) replace nothing: only the rope does
            x = _packed(rw, g, c.id("split"), hs)
            tables = [_half_table(rw, t, half, s, r) for t in (c.id("cos"), c.id("sin"))]
        rot = rw.emit(Op.ROPE, [x, *tables], head_dim=d, n_rot=r)
        heads = rw.transpose(rw.reshape(rot, (b, s, nh, d)), (0, 2, 1, 3))
    rw.replace(result, heads)
    rw.remove(core)
    chain = hs.chain if hs is not None and hs.block else ()  # another layout: the copy reads the heads
    remove_shared(rw, (*cos_nodes, *sin_nodes, *chain))
    return rot


ROPE_HEADS = Rule(
    RULE, P(Op.ADD, name="rope_sum"),
    steps=(_find_rotation, find_partial, _cos_table, _sin_table, HEADS_RANK, TABLES_ALIKE,
           one_dtype(("split", "cos", "sin", *CORE, "rope_sum"), ("h_part", "pass", "tail"))),
    result=("tail", "rope_sum"), absorb=(*CORE, "rope_sum", "h_part", "pass", "tail"), rewrite=_rewrite,
    labels={"rope_sum": "rotation", "split": "heads"},
    doc="RoPE written on the heads (h * cos + rotate_half(h) * sin) -> the rope op on the projection")

ROPE_HEADS_PASS = rule_pass("fuse_sdpa", [ROPE_HEADS], "RoPE written on the heads -> the rope op")
"""The rule as a stage of `fuse_sdpa` (`engine.compose`): its matches and its refusals, the rule's near misses."""


def rope_heads(g: Graph) -> tuple[Graph, list[Match]]:
    """`g` with every rotation written on the heads rewritten to the `rope` op (see the module doc), and one `Match`
    per rewrite; `(g, [])` when there is none. The `ROPE_HEADS` rule run by the engine."""
    return ROPE_HEADS_PASS.rewrite(g)


__all__ = ["RULE", "ROPE_HEADS", "ROPE_HEADS_PASS", "find_partial", "one_dtype", "rope_heads"]
