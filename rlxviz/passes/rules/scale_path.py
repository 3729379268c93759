"""A Q- or K-side scale anywhere on the operand's path to the scores, moved next to the head split.

`fuse_sdpa`'s pattern takes a constant pre-scale of Q or K in two places: on the projection before the head split
(`reshape`), or on the heads right after the split (`transpose(., [0, 2, 1, 3])`). Exporters also write it
further down: K scaled after its own transpose (`q @ (k^T * c)`), after the GQA `repeat_kv` expansion, or between
the head reshape and the head transpose. `hoist_scales` rewrites each such path so the scales apply first and the
movement ops after them, which `fuse_sdpa` then folds into the attention's `scale`:

    matmul(q, mul(transpose(k_heads, [0, 1, 3, 2]), c))  ->  matmul(q, transpose(mul(k_heads, c), [0, 1, 3, 2]))

The path of a scores operand is read upward from the rank-4 `Q @ K^T` matmul under an attention softmax, through
`transpose`, `reshape`, `expand` and scalar scales (`x * c`, `c * x`, `x / c` with `c` a constant of shape `[]` or
`[1]`), and stops at the head split (a `[0, 2, 1, 3]` transpose of a reshape) or at the first other op.

Validity (numbers equal, bit for bit, for every input): a scale by one scalar is elementwise, and a transpose,
reshape or expand moves or repeats elements without arithmetic, so `move(x) * c == move(x * c)` element for
element; the scales keep their order, so each element sees the same products in the same order. Taken only when
every node of the path has one reader and is no graph output (otherwise nothing changes and `fuse_sdpa`'s
`scores_form` names the node), and each scale keeps its operand's shape and dtype (no broadcast, no promotion).
Each rewritten path is reported as a `fuse_sdpa.hoist_scale` match.

The rules (`HOIST_SCALES`, `SCALAR_SCALES`, stages of `fuse_sdpa` run by the engine) have no refusal of their own:
a path with nothing to move is no candidate, and a path read elsewhere is left quiet because `fuse_sdpa`'s
`scores_form` already names its node (a second record would blame the same node twice).
"""

from __future__ import annotations

from ...ir import Graph, Node, Op, Rewriter
from ..engine import rule_pass
from ..guard import Ctx
from ..pattern import P
from ..rule import QUIET, Fail, Rule, reports
from ..trace import Match

RULE = "fuse_sdpa.hoist_scale"
_MOVES = frozenset({Op.TRANSPOSE, Op.RESHAPE, Op.EXPAND})


def _scalar_const(g: Graph, i: int) -> bool:
    n = g[i]
    return n.op == Op.CONST and n.shape in ((), (1,))


def _scale_operand(g: Graph, n: Node) -> int | None:
    """The scaled operand of `n` when `n` is `x * c`, `c * x` or `x / c` (c a scalar constant) keeping x's shape and
    dtype, else None."""
    if n.op not in (Op.MUL, Op.DIV) or len(n.inputs) != 2:
        return None
    a, b = n.inputs
    x = a if _scalar_const(g, b) else b if (n.op == Op.MUL and _scalar_const(g, a)) else None
    if x is None or _scalar_const(g, x) or g[x].shape != n.shape or g[x].dtype != n.dtype:
        return None
    return x


def _head_split(g: Graph, n: Node) -> bool:
    return n.op == Op.TRANSPOSE and tuple(n.attrs["perm"]) == (0, 2, 1, 3) and g[n.inputs[0]].op == Op.RESHAPE


def _scores_matmuls(g: Graph) -> list[Node]:
    """The rank-4 matmuls under a rank-4 softmax, through at most three adds / scales (the `Q @ K^T` scores)."""
    out: list[Node] = []
    for sm in g:
        if sm.op != Op.SOFTMAX or sm.rank != 4:
            continue
        todo = [(sm.inputs[0], 0)]
        while todo:
            i, d = todo.pop()
            n = g[i]
            if n.op == Op.MATMUL and n.rank == 4:
                if n not in out:
                    out.append(n)
                break
            if d < 3 and n.op in (Op.ADD, Op.MUL, Op.DIV, Op.WHERE):
                todo += [(j, d + 1) for j in n.inputs]
    return out


def _path(g: Graph, start: int) -> tuple[list[Node], int]:
    """The movement ops and scales from `start` upward (nearest the matmul first) and the node the path starts
    from (the head split, or the first other op)."""
    path: list[Node] = []
    i = start
    while True:
        n = g[i]
        x = _scale_operand(g, n)
        if x is not None:
            path.append(n)
            i = x
        elif n.op in _MOVES and not _head_split(g, n):
            path.append(n)
            i = n.inputs[0]
        else:
            return path, i


def _misplaced(g: Graph, path: list[Node]) -> bool:
    """A scale has a movement op above it (between it and the path's start)."""
    seen_move = False
    for n in reversed(path):  # from the top (the start) down to the matmul
        if _scale_operand(g, n) is not None:
            if seen_move:
                return True
        else:
            seen_move = True
    return False


def _scores_operand(g: Graph, n: Node) -> bool:
    """`n` is an operand of a scores matmul (`_scores_matmuls`)."""
    readers = {u.id for u in g.users(n.id) if u.op == Op.MATMUL and u.rank == 4}
    return bool(readers) and any(mm.id in readers for mm in _scores_matmuls(g))


def _on_scores_path(g: Graph, n: Node) -> bool:
    """`n` lies on the path (`_path`) of a scores matmul's operand: some chain of its readers that are scales of
    it or movement ops (not a head split) reaches an operand of a scores matmul."""
    todo, seen = [n], set()
    while todo:
        m = todo.pop()
        if m.id in seen:
            continue
        seen.add(m.id)
        if _scores_operand(g, m):
            return True
        todo += [u for u in g.users(m.id) if _scale_operand(g, u) == m.id
                 or (u.op in _MOVES and not _head_split(g, u) and u.inputs[0] == m.id)]
    return False


@reports(reads=("operand",), binds=("top", "path*"))
def _find_path(c: Ctx) -> Fail | None:
    """Bind the operand's path (`path0` the operand, up to the head split or first other op `top`) when a scale on
    it has a movement op above it and every node of it has one reader and is no graph output; quiet otherwise
    (nothing to move, or the path is read elsewhere: `fuse_sdpa`'s `scores_form` names that node)."""
    g, n = c.graph, c["operand"]
    if not _scores_operand(g, n):
        return QUIET
    path, top = _path(g, n.id)
    if not path or not _misplaced(g, path) or any(len(g.users(m.id)) != 1 or g.is_output(m.id) for m in path):
        return QUIET
    c.bindings["top"] = top
    for k, m in enumerate(path):
        c.bindings[f"path{k}"] = m.id
    return None


def _bound_path(c: Ctx) -> list[Node]:
    return [c.graph[i] for r, i in c.bindings.items() if r.startswith("path") and r[4:].isdigit()]


def _hoist(c: Ctx, rw: Rewriter) -> None:
    """The path's scales applied first (in their order), its movement ops after them. No fused node stands for the
    match (the moved path is plain ops), so its record has none; each op made absorbs the one of the path it re-makes
    (a Q/K scale's ONNX node is named by the moved scale, not by the moved transpose too)."""
    g, path = c.graph, _bound_path(c)
    scales = [n for n in reversed(path) if _scale_operand(g, n) is not None]
    moves = [n for n in reversed(path) if _scale_operand(g, n) is None]
    with rw.provenance([n.id for n in path]):
        v = c.id("top")
        for s in scales:  # upstream first: each element is scaled in the original order
            x = _scale_operand(g, s)
            with rw.absorbing([s.id]):  # each op moved re-makes one of the path's, not the whole path
                v = rw.emit(s.op, [v if i == x else i for i in s.inputs])
        for m in moves:
            with rw.absorbing([m.id]):
                v = rw.emit(m.op, [v], **dict(m.attrs))
    rw.replace(path[0].id, v)
    rw.remove([n.id for n in path[1:]])


OPERAND = P((Op.MUL, Op.DIV, *_MOVES), name="operand")
"""A scale or movement op (the anchor of `HOIST_SCALES`: a scores operand's path starts with one)."""

HOIST_SCALES = Rule(RULE, OPERAND, steps=(_find_path,), result="operand", absorb=("operand",), rewrite=_hoist,
                    doc="a Q/K scale below a movement op -> next to the head split")

HOIST_SCALES_PASS = rule_pass("fuse_sdpa", [HOIST_SCALES], "Q/K scales moved next to the head split")
"""The rule as a stage of `fuse_sdpa` (`engine.compose`)."""


def hoist_scales(g: Graph) -> tuple[Graph, list[Match]]:
    """`g` with every misplaced Q/K scale moved next to the head split (see the module doc), and one `Match` per
    rewritten path; `(g, [])` when there is none. The `HOIST_SCALES` rule run by the engine."""
    return HOIST_SCALES_PASS.rewrite(g)


def _one_scalar(g: Graph, n: Node) -> int | None:
    return next((i for i in n.inputs if _scalar_const(g, i) and g[i].shape == (1,)), None)


SCALE = P((Op.MUL, Op.DIV), name="scale")
"""A product or quotient (the anchor of `SCALAR_SCALES`)."""


@reports(reads=("scale",), binds=("one",))
def _find_one(c: Ctx) -> Fail | None:
    """Bind the `[1]`-shaped constant `one` of a scale on a scores operand's path; quiet otherwise."""
    g, n = c.graph, c["scale"]
    one = _one_scalar(g, n)
    if one is None or _scale_operand(g, n) is None or not _on_scores_path(g, n):
        return QUIET
    c.bindings["one"] = one
    return None


def _scalar(c: Ctx, rw: Rewriter) -> int:
    """The same scale by the scalar constant the `[1]` one holds."""
    g, n, one = c.graph, c["scale"], c.id("one")
    with rw.provenance([n.id]):
        k = rw.const(g[one].attrs["value"][0], g[one].dtype)
        new = rw.emit(n.op, [k if i == one else i for i in n.inputs])
    rw.replace(n.id, new)
    return new


SCALAR_SCALES = Rule(RULE, SCALE, steps=(_find_one,), result="scale", absorb=("scale",), rewrite=_scalar,
                     doc="a [1]-shaped Q/K scale -> the same scale by a scalar")

SCALAR_SCALES_PASS = rule_pass("fuse_sdpa", [SCALAR_SCALES], "[1]-shaped Q/K scales as scalars")
"""The rule as a stage of `fuse_sdpa` (`engine.compose`)."""


def scalar_scales(g: Graph) -> tuple[Graph, list[Match]]:
    """`g` with each Q/K scale by a `[1]`-shaped constant on a scores operand's path (torch's sdpa export of Falcon
    writes `q * [c]`) read as the same scale by the scalar constant `c` (what `fuse_sdpa`'s pattern and the
    attention's `scale` take). Exact: the scaled operand has rank >= 1, so the broadcast shape, the dtype and every
    product are the same. One `fuse_sdpa.hoist_scale` match per scale: the `SCALAR_SCALES` rule run by the
    engine."""
    return SCALAR_SCALES_PASS.rewrite(g)


__all__ = ["HOIST_SCALES", "HOIST_SCALES_PASS", "OPERAND", "RULE", "SCALAR_SCALES", "SCALAR_SCALES_PASS", "SCALE",
           "hoist_scales", "scalar_scales"]
