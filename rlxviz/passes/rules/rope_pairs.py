"""RoPE written interleaved (GPT-J's `rotate_every_two`, how some exporters write LLaMA) -> `rope(interleaved=True)`.

    out = h * cos + rotate_every_two(h) * sin,   rotate_every_two(h)[..., 2i] = -h[..., 2i + 1],
                                                 rotate_every_two(h)[..., 2i + 1] = h[..., 2i]

with `h` the heads `[B, S, nh, r]` (GPT-J rotates before its head transpose) or `[B, nh, S, r]`, and `cos`/`sin`
full-width tables whose neighbours are equal (`repeat_interleave(t, 2)`), viewed as `[1, S, 1, r]` (the first
layout) or `[S, r]`, `[1, S, r]`, `[1, 1, S, r]` (the second), each layout checked on its own sequence axis (a
decode step's `[1, 1, 1, r]` at S = 1 fits the second); with a batch B > 1 also one table per batch row, B in place
of the leading 1 (`position_ids` that differ by row: optimum's decoder-with-past, Cohere's cache offset), which the
rope op reads as `[B, S, r/2]`. The neighbours are equal by the table's values (`Graph.values`) or by construction:
its element map (`rope_heads.equal_by_map`: a table computed at run time, repeated by movement ops and uniform
elementwise ops, every pair the same element of its source). Partial rotary: `h = heads[..., :r]` and
`concat(out, heads[..., r:])`. Exporters write `rotate_every_two` many ways (strided slices, `gather` of a
transposed view with an index table, reshape to pairs, stack and flatten): the rule reads it by the map it
computes, evaluating the chain from `h` (movement ops and `neg`) on a signed index array (element k of h is
k + 1, negated by `neg`), so any chain of those ops that computes `rotate_every_two` is recognized, and nothing
else is.

Rewrite: `rope(x, t_cos, t_sin, head_dim=d, n_rot=r, interleaved=True)` on the packed heads x `[B, S, nh*d]`
(`reshape` of the `[B, S, nh, d]` heads, or of their transpose), back to the heads' layout by `reshape` (and
`transpose`); the tables are the even columns of the full ones (`t[..., 0::2]` as `[S, r/2]`, or `[B, S, r/2]`
per batch row: the rope op reads row p of batch b's table at position p of row b, the entry the form reads).

Validity (numbers equal, bit for bit on the reference): the rope op computes per pair `(x1 c - x2 s, x2 c + x1 s)`
with `c = t_cos[p, i]` at position p; the form computes `x1 c + (-x2) s` and `x2 c + x1 s` with the table's
entries `2i` and `2i + 1`, which are equal (guarded on the values the graph carries, `Graph.values`, or the
table is refused with the entry that differs); `a + (-b) == a - b` and `(-x) s == -(x s)` in IEEE arithmetic. The
tables must have exactly S rows on the heads' sequence axis; x, the tables and every node of the form share one
dtype; a node of the form read elsewhere keeps the form.

The rule (`ROPE_PAIRS`, run by the engine as a stage of `fuse_sdpa`): anchor an add; `_find_rotation` binds the
form, its movement chain as the family `move*` (quiet when the add is none), `rope_heads.find_partial` the heads;
the named guards `cos_table` / `sin_table` (neighbours equal), `tables_layout` (`[S, r]` rows on the heads'
sequence axis), `one_dtype` and the engine's `absorbed_escape` (no node of the form, the chain included, read
elsewhere) are its refusals, which `fuse_sdpa`'s `rope_on_heads` quotes (`engine.refusal`). Each rewrite is a
`fuse_sdpa.rope_pairs` match.
"""

from __future__ import annotations

import numpy as np

from ...ir import Graph, Node, Op, Rewriter
from ..engine import rule_pass
from ..guard import NOT_RECOGNIZED, Ctx, Guard, guard
from ..pattern import P
from ..rule import QUIET, Fail, Rule, reports
from ..trace import Match
from .rope_heads import _halves, _other, const_index, find_partial, move_map, one_dtype

RULE = "fuse_sdpa.rope_pairs"
MAX_INDEX = 1 << 24
"""The most elements of h whose signed index map is evaluated (int32: 64 MiB)."""
_MAP_OPS = (Op.NARROW, Op.GATHER, Op.TRANSPOSE, Op.RESHAPE, Op.CONCAT, Op.NEG, Op.EXPAND)


def _signed_map(g: Graph, h: int, top: int) -> tuple[np.ndarray, set[int]] | None:
    """Node `top` as a signed index map of `h` (h's element k is k + 1; `neg` flips the sign) and the nodes between
    them, when every node from `top` up to h is a movement op or `neg` (and index tables are constants)."""
    hn = g[h]
    if int(np.prod(hn.shape)) > MAX_INDEX:
        return None
    memo: dict[int, np.ndarray] = {h: _ids(hn)}
    seen: set[int] = set()

    def ev(i: int, depth: int) -> np.ndarray | None:
        if i in memo:
            return memo[i]
        n = g[i]
        if depth > 16 or n.op not in _MAP_OPS:
            return None
        a = ev(n.inputs[0], depth + 1)
        if a is None:
            return None
        if n.op in (Op.NEG, Op.CONCAT):
            parts = [a] + [ev(j, depth + 1) for j in n.inputs[1:]]
            if any(p is None for p in parts):
                return None
            try:
                out = -a if n.op == Op.NEG else np.concatenate(parts, axis=n.attrs["axis"] % a.ndim)
            except ValueError:
                return None
            if out.shape != n.shape:
                return None
        elif (out := move_map(n, a, const_index(g, n.inputs[1]) if n.op == Op.GATHER else None)) is None:
            return None
        memo[i] = out
        seen.add(i)
        return out

    got = ev(top, 0)
    return None if got is None else (got, seen)


def _every_two(idx: np.ndarray) -> np.ndarray:
    p = idx.reshape(*idx.shape[:-1], idx.shape[-1] // 2, 2)
    return np.stack([-p[..., 1], p[..., 0]], axis=-1).reshape(idx.shape)


def every_two(g: Graph, add: Node) -> tuple[int, int] | None:
    """`(add, rotated)` when `add` is `h * cos + rotate_every_two(h) * sin`, `rotated` the node computing
    rotate_every_two(h) (any spelling: read by its index map), else None (`rope_forms.interleaved_rope`)."""
    found = _rotation(g, add)
    return None if found is None else (add.id, found[4])


def _rotation(g: Graph, add: Node) -> tuple[int, int, int, list[int], int] | None:
    """`(h, cos, sin, nodes, rotated)` when `add` is `h * cos + rotate_every_two(h) * sin` (module doc), else
    None."""
    if add.op != Op.ADD or len(add.inputs) != 2:
        return None
    for pi, ri in (add.inputs, add.inputs[::-1]):
        plain, rot = g[pi], g[ri]
        if plain.op != Op.MUL or rot.op != Op.MUL or len(plain.inputs) != 2 or len(rot.inputs) != 2:
            continue
        for h in dict.fromkeys(plain.inputs):
            hn = g[h]
            if hn.rank != 4 or hn.shape[-1] % 2 or hn.shape != add.shape:
                continue
            for r in dict.fromkeys(rot.inputs):
                if g[r].shape != hn.shape:
                    continue
                found = _signed_map(g, h, r)
                if found is None or not np.array_equal(found[0], _every_two(_ids(hn))):
                    continue
                cos, sin = _other(plain, h), _other(rot, r)
                if cos is not None and sin is not None:
                    return h, cos, sin, [plain.id, rot.id, *found[1]], r
    return None


def _ids(n: Node) -> np.ndarray:
    return np.arange(1, int(np.prod(n.shape)) + 1, dtype=np.int32).reshape(n.shape)


def _tables_fit(g: Graph, t: int, s: int, r: int, b: int, ax: int) -> bool:
    """Table node t holds `[S, r]` rows for heads whose sequence axis is `ax` (1: `[B, S, nh, r]`, 2: `[B, nh, S,
    r]`): one table for every batch row, or with a batch `b` > 1 one per batch row (RoPE at `position_ids` that
    differ by row: optimum's decoder exports). Checked for the given axis: at S = 1 (a decode step) `[1, 1, 1, r]`
    fits both layouts."""
    rows = (1, b) if b > 1 else (1,)
    if ax == 1:
        return g[t].shape in {(k, s, 1, r) for k in rows}
    return g[t].shape in {(s, r), *((k, s, r) for k in rows), *((k, 1, s, r) for k in rows)}


def _seq_axis(c: Ctx) -> int | None:
    """The heads' sequence axis (1 or 2) both tables are laid out for, or None."""
    hs, r = c["split"].shape, c["h"].shape[-1]
    return next((ax for ax in (1, 2) if all(_tables_fit(c.graph, c.id(t), hs[ax], r, hs[0], ax)
                                            for t in ("cos", "sin"))), None)


def _per_row(c: Ctx) -> bool:
    """Both tables hold one table per batch row (`[B > 1, ...]`)."""
    b = c["split"].shape[0]
    return b > 1 and all(c[t].rank >= 3 and c[t].shape[0] == b for t in ("cos", "sin"))


@reports(reads=("rope_sum",), binds=("h", "cos", "sin", "plain", "rotated", "move*"))
def _find_rotation(c: Ctx) -> Fail | None:
    """Bind the interleaved rotation `h * cos + rotate_every_two(h) * sin` summed by the anchor (`_rotation`), its
    movement chain as `move0`, `move1`, ...; quiet when the add is none (not a candidate)."""
    found = _rotation(c.graph, c["rope_sum"])
    if found is None:
        return QUIET
    h, cos, sin, core, _ = found
    c.bindings["h"], c.bindings["cos"], c.bindings["sin"] = h, cos, sin
    c.bindings["plain"], c.bindings["rotated"] = core[0], core[1]
    for k, i in enumerate(core[2:]):
        c.bindings[f"move{k}"] = i
    return None


def _pairs_guard(name: str) -> Guard:
    """`{name}_table`: the table's neighbours are equal (`_halves(pairs=True)`), so its even columns are the table
    the rope op reads."""
    return guard(f"{name}_table", lambda c: not _halves(c.graph, c.id(name), pairs=True),
                 lambda c: f"its {name} table: {_halves(c.graph, c.id(name), pairs=True)}",
                 "give the rotation tables whose neighbours are equal (repeat_interleave(t, 2)) and whose values the "
                 "graph carries", requires=(name,), kind=NOT_RECOGNIZED,
                 fix="fuse_sdpa.rope_pairs reads tables whose neighbour pairs are known equal")


def _layout_why(c: Ctx) -> str:
    r = c["h"].shape[-1]
    return (f"its tables {c.d('cos')} and {c.d('sin')} are {list(c['cos'].shape)} and {list(c['sin'].shape)}, not "
            f"[S, {r}] rows on the sequence axis of the heads {c.d('split')} {list(c['split'].shape)}: needs "
            f"[1, S, 1, {r}] for [B, S, nh, d] heads, or [S, {r}], [1, S, {r}], [1, 1, S, {r}] for [B, nh, S, d] "
            f"(B in place of the leading 1 for one table per batch row)")


def _rows_alike(c: Ctx) -> bool:
    """Both tables are per batch row, or neither is (the rope op reads its two tables alike)."""
    b = c["split"].shape[0]
    return len({c[t].rank >= 3 and c[t].shape[0] == b > 1 for t in ("cos", "sin")}) == 1


TABLES_LAYOUT = guard("tables_layout", lambda c: _seq_axis(c) is not None and _rows_alike(c), _layout_why,
                      "lay the tables out as [S, r] rows on the heads' sequence axis", requires=("cos", "sin"),
                      reads=("split", "h"), kind=NOT_RECOGNIZED,
                      fix="fuse_sdpa.rope_pairs reads tables laid out for another head layout")


def _moves(c: Ctx) -> list[int]:
    """The bound movement chain `move0`, `move1`, ... (rotate_every_two's nodes), in binding order."""
    return [i for r, i in c.bindings.items() if r.startswith("move") and r[4:].isdigit()]


def _rewrite(c: Ctx, rw: Rewriter) -> int:
    """`rope(interleaved=True)` on the packed heads, back to the heads' layout; the form removed."""
    partial = "tail" in c
    core = [c.id("plain"), c.id("rotated"), *_moves(c)]
    core += [c.id("rope_sum"), c.id("h_part"), c.id("pass")] if partial else []
    result = c.id("tail") if partial else c.id("rope_sum")
    hs, r, seq = c["split"].shape, c["h"].shape[-1], _seq_axis(c)
    b, d = hs[0], hs[3]
    s, nh = (hs[1], hs[2]) if seq == 1 else (hs[2], hs[1])
    with rw.provenance([*core, result]):
        src = c.id("split") if seq == 1 else rw.transpose(c.id("split"), (0, 2, 1, 3))
        x = rw.reshape(src, (b, s, nh * d))
        rows = (b,) if _per_row(c) else ()
        cos, sin = (_pair_table(rw, c.id(t), (*rows, s), r) for t in ("cos", "sin"))
        rot = rw.emit(Op.ROPE, [x, cos, sin], head_dim=d, n_rot=r, interleaved=True)
        out = rw.reshape(rot, (b, s, nh, d))
        if seq == 2:
            out = rw.transpose(out, (0, 2, 1, 3))
    rw.replace(result, out)
    rw.remove(core)
    return rot


def _pair_table(rw: Rewriter, t: int, rows: tuple[int, ...], r: int) -> int:
    """The `[*rows, r/2]` even columns of the full-width table t (its neighbours are equal); rows `(S,)`, or `(B,
    S)` for one table per batch row."""
    pairs = rw.reshape(t, (*rows, r // 2, 2))
    return rw.reshape(rw.narrow(pairs, len(rows) + 1, 0, 1), (*rows, r // 2))


ROPE_PAIRS = Rule(
    RULE, P(Op.ADD, name="rope_sum"),
    steps=(_find_rotation, find_partial, _pairs_guard("cos"), _pairs_guard("sin"), TABLES_LAYOUT,
           one_dtype(("split", "cos", "sin", "plain", "rotated", "rope_sum"), ("move*", "h_part", "pass", "tail"))),
    result=("tail", "rope_sum"), absorb=("plain", "rotated", "move*", "rope_sum", "h_part", "pass", "tail"),
    rewrite=_rewrite, labels={"rope_sum": "rotation", "split": "heads"},
    doc="RoPE written interleaved (h * cos + rotate_every_two(h) * sin) -> rope(interleaved=True)")

ROPE_PAIRS_PASS = rule_pass("fuse_sdpa", [ROPE_PAIRS], "RoPE written interleaved -> rope(interleaved=True)")
"""The rule as a stage of `fuse_sdpa` (`engine.compose`): its matches and its refusals, the rule's near misses."""


def rope_pairs(g: Graph) -> tuple[Graph, list[Match]]:
    """`g` with every interleaved rotation rewritten to `rope(interleaved=True)` (module doc), one `Match` each: the
    `ROPE_PAIRS` rule run by the engine."""
    return ROPE_PAIRS_PASS.rewrite(g)


__all__ = ["RULE", "ROPE_PAIRS", "ROPE_PAIRS_PASS", "every_two", "rope_pairs"]
