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
"""

from __future__ import annotations

from ...ir import Graph, Node, Op, Rewriter
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


def hoist_scales(g: Graph) -> tuple[Graph, list[Match]]:
    """`g` with every misplaced Q/K scale moved next to the head split (see the module doc), and one `Match` per
    rewritten path; `(g, [])` when there is none."""
    plans: list[tuple[Node, list[Node], int]] = []
    for mm in _scores_matmuls(g):
        for k in (0, 1):
            path, top = _path(g, mm.inputs[k])
            if not path or not _misplaced(g, path):
                continue
            if any(len(g.users(n.id)) != 1 or g.is_output(n.id) for n in path):
                continue
            plans.append((mm, path, top))
    if not plans:
        return g, []
    rw = Rewriter(g, "fuse_sdpa")
    matches = []
    for mm, path, top in plans:
        scales = [n for n in reversed(path) if _scale_operand(g, n) is not None]
        moves = [n for n in reversed(path) if _scale_operand(g, n) is None]
        with rw.provenance([n.id for n in path]):
            v = top
            for s in scales:  # upstream first: each element is scaled in the original order
                x = _scale_operand(g, s)
                v = rw.emit(s.op, [v if i == x else i for i in s.inputs])
            for m in moves:
                v = rw.emit(m.op, [v], **dict(m.attrs))
        rw.replace(path[0].id, v)
        rw.remove([n.id for n in path[1:]])
        matches.append(Match("fuse_sdpa", RULE, scales[0].id, {"scale": scales[0].id, "scores": mm.id}, None,
                             scales[0].path))
    return rw.finish(), matches


def scalar_scales(g: Graph) -> tuple[Graph, list[Match]]:
    """`g` with each Q/K scale by a `[1]`-shaped constant on a scores operand's path (torch's sdpa export of Falcon
    writes `q * [c]`) read as the same scale by the scalar constant `c` (what `fuse_sdpa`'s pattern and the
    attention's `scale` take). Exact: the scaled operand has rank >= 1, so the broadcast shape, the dtype and every
    product are the same. One `fuse_sdpa.hoist_scale` match per scale."""
    found: list[tuple[Node, int]] = []
    for mm in _scores_matmuls(g):
        for k in (0, 1):
            path, _ = _path(g, mm.inputs[k])
            for n in path:
                c = next((i for i in n.inputs if _scalar_const(g, i) and g[i].shape == (1,)), None)
                if c is not None and _scale_operand(g, n) is not None and n not in [f for f, _ in found]:
                    found.append((n, c))
    if not found:
        return g, []
    rw = Rewriter(g, "fuse_sdpa")
    matches = []
    for n, c in found:
        with rw.provenance([n.id]):
            one = rw.const(g[c].attrs["value"][0], g[c].dtype)
            new = rw.emit(n.op, [one if i == c else i for i in n.inputs])
        rw.replace(n.id, new)
        matches.append(Match("fuse_sdpa", RULE, n.id, {"scale": n.id}, new, n.path))
    return rw.finish(), matches


__all__ = ["RULE", "hoist_scales", "scalar_scales"]
