"""The model-side fix of a non-default attention scale (`fuse_attention_block`'s `default_scale`): fold the ratio
into the Q projection.

Granite scales its scores by its attention multiplier (0.0625) where `FusedAttentionBlock` computes the default
1/sqrt(head_dim) (0.25 for head_dim 16). With `ratio = scale / default`, the model that multiplies its Q projection's
weight (and bias) by `ratio` and scales the scores by the default computes the same function:

    softmax((ratio * q) @ k^T * default + mask) == softmax(q @ k^T * scale + mask)

Validity: `q` must be a linear function of the projection's output `x @ W (+ b)`: every node on the paths from the
projection to the attention's Q operand is a layout move (reshape, transpose, narrow, expand, a float cast), a
negation, a concat of such values, a sum of such values (RoPE's `q * cos + rotate_half(q) * sin`), a product or a
division by a value that does not depend on the projection (a cos/sin table, a Q pre-scale), or the rope op; the
projection's only extra term is its bias (scaled too); no node on those paths has a reader off them or is a graph
output; no scalar scale on them is one `fuse_sdpa` could not fold (ESM scales Q before its RoPE: the block cannot
take that scale either way, and `scale_blame.scale_origin` says what to do there). A scalar factor commutes with
every such node, so the numbers are equal in real arithmetic; when `ratio` is a power of two the change is exact in
the model's dtype too (barring overflow or underflow), otherwise the scaled weight and the new scale constant differ
by rounding only.

The scale node changed is one `fuse_sdpa` folded into the attention's `scale` (the scores' scale, else a Q or K
pre-scale): its constant becomes `old / ratio`, so the folded product is the default and `fuse_sdpa` records none.
Where the scores are not scaled at all (T5 folds 1/sqrt(head_dim) into its weights, so the scale is 1.0 and no node
holds it) the same fold multiplies the weight by `sqrt(head_dim)` and adds the scores' scale as a new mul by the
default after the scores' matmul: the one form gets the one fix, wherever its scale is held.
`scale_fold` plans the change (the pipeline words the guard's fix line from it, `fold_hint`); `folded_graph` applies
it to the user's graph (the what-if `passes.whatif` checks). Graphs only: no weights are read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...ir import DType, Graph, Node, Op, Rewriter
from ..pattern import is_const
from ..refusal_kinds import ROUNDING_ONLY
from ..trace import Rejection
from .attention import FACTORS
from .scale_blame import ROLE_NAMES
from .sdpa_mask import typed_value

_LAYOUT = frozenset({Op.RESHAPE, Op.TRANSPOSE, Op.NARROW, Op.EXPAND, Op.NEG})
"""One-operand ops a scalar factor commutes with exactly."""
_WALK = _LAYOUT | {Op.CAST, Op.CONCAT, Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.ROPE}
"""The ops the search for the Q projection walks up through from the attention's Q operand."""
_ORDER = ("scale", "q_prescale", "k_prescale")
"""The folded factor changed: the scores' scale first, else a Q pre-scale, else a K pre-scale."""


@dataclass(frozen=True)
class ScaleFold:
    """A planned fold of an attention's non-default scale into its Q projection (module docstring).

    Attributes:
        scale / head_dim: the attention's scale and head_dim; `default` is 1/sqrt(head_dim).
        ratio: `scale / default` as the weight's dtype holds it: what the weight (and bias) are multiplied by.
        proj: the Q projection's matmul (a node of the user's graph); `weight` its weight operand; `qk` the scores'
            matmul that reads Q.
        bias: the projection's bias add and its bias operand, or None.
        factor / factor_const: the scale node whose constant changes, and that constant, or None for both when the
            scores are not scaled (scale 1.0): then a new mul of the scores' matmul `qk` by `new_value` is added;
            `role` its `FACTORS` role.
        new_value: the factor node's new constant (as its dtype holds it).
        rope: a rotation lies on the path (the text says RoPE is linear).
        exact: `ratio` is a power of two: the change is exact in the model's dtype (barring overflow or underflow).
        reals: the scaled weight and the new constant keep the scores' factor exactly in real arithmetic (`ratio *
            new factor == old factor`), so the model's numbers in float64 differ by float64 rounding only.
    """

    scale: float
    head_dim: int
    ratio: float
    proj: int
    weight: int
    qk: int
    bias: tuple[int, int] | None
    factor: int | None
    factor_const: int | None
    role: str
    new_value: float
    rope: bool
    exact: bool
    reals: bool

    @property
    def default(self) -> float:
        """The block's scale, 1/sqrt(head_dim)."""
        return 1.0 / math.sqrt(self.head_dim)


def _fuse_sdpa_match(steps: Sequence[Any], attn: int) -> tuple[dict[str, int], Node] | None:
    """The bindings of the `fuse_sdpa` match that built the attention `attn` and the attention node it made."""
    for step in reversed(steps):
        m = next((m for m in step.matches if m.pass_name == "fuse_sdpa" and m.fused == attn), None)
        if m is not None:
            packed = step.after.get(m.fused)
            return ({k: int(v) for k, v in m.bindings.items()}, packed) if packed is not None else None
    return None


def _dynamic(g: Graph) -> set[int]:
    """The nodes that read a graph input (the others are weights, constants and tables computed from them), in one
    sweep in graph order (no recursion: a deep model's chains are longer than Python's stack)."""
    out: set[int] = set()
    for n in g:
        if n.op == Op.INPUT or any(j in out for j in n.inputs):
            out.add(n.id)
    return out


def _projection(g: Graph, start: int, dynamic: set[int]) -> int | None:
    """The one matmul by a weight (`x @ W`, W reading no graph input, x reading one: `dynamic`) reached from `start`
    up through `_WALK` ops, or None (none, or several)."""
    seen: set[int] = set()
    todo, found = [start], set()
    while todo and len(seen) < 256:
        i = todo.pop()
        if i in seen:
            continue
        seen.add(i)
        n = g[i]
        if n.op == Op.MATMUL and n.inputs[1] not in dynamic and n.inputs[0] in dynamic:
            found.add(i)
        elif n.op in _WALK:
            todo += [j for j in n.inputs if j in dynamic]
    return found.pop() if len(found) == 1 else None


def _between(g: Graph, proj: int, start: int) -> set[int]:
    """The nodes on the paths from `proj` to `start`, both included."""
    up: set[int] = set()
    todo = [start]
    while todo:
        i = todo.pop()
        if i not in up:
            up.add(i)
            todo += g[i].inputs
    down = {proj}
    for n in g:  # topological order: an operand comes before its reader
        if n.id in up and any(j in down for j in n.inputs):
            down.add(n.id)
    return down & up


def _linear(g: Graph, path: set[int], proj: int, start: int, reader: int, folded: set[int], dynamic: set[int]
            ) -> tuple[tuple[int, int] | None, bool] | None:
    """`(the projection's bias add and bias, whether a rotation lies on the path)` when `start` is a linear function of
    `proj`'s output through the nodes `path` (module docstring), else None. `reader` is the node that reads `start`
    (the scores' matmul); `folded` the scale nodes `fuse_sdpa` folded into the attention: a scalar scale on the path
    that is none of them (ESM's Q scaled before its RoPE) is not folded, and `scale_origin` words its own advice."""
    bias: tuple[int, int] | None = None
    rope = False
    for i in path:
        n = g[i]
        if g.is_output(i) or any(u.id not in path and not (i == start and u.id == reader) for u in g.users(i)):
            return None  # another reader would see the scaled value
        if i == proj:
            continue
        on = [j for j in n.inputs if j in path]
        off = [j for j in n.inputs if j not in path]
        if n.op in _LAYOUT or n.op == Op.CONCAT:
            ok = not off
        elif n.op == Op.CAST:
            ok = n.dtype.numpy.kind == "f" and g[n.inputs[0]].dtype.numpy.kind == "f"
        elif n.op in (Op.ADD, Op.SUB):
            if off and on == [proj] and len(off) == 1 and off[0] not in dynamic and bias is None \
                    and g[off[0]].dtype.numpy.kind == "f":
                bias, ok = (i, off[0]), True
            else:
                ok = not off
        elif n.op in (Op.MUL, Op.DIV) and i not in folded and any(is_const(g[j]) for j in off):
            ok = False  # a scale fuse_sdpa could not fold: the block cannot take it between projection and RoPE
        elif n.op == Op.MUL:
            ok = len(on) == 1 and len(off) == 1
        elif n.op == Op.DIV:
            ok = n.inputs[0] in path and n.inputs[1] not in path
        elif n.op == Op.ROPE:
            ok = n.inputs[0] in path and not any(j in path for j in n.inputs[1:])
            rope = True
        else:
            ok = False
        if not ok:
            return None
        rope = rope or (n.op == Op.CONCAT and any(g[j].op == Op.NEG for j in on))  # rotate_half written out
    return bias, rope


def _power_of_two(x: float) -> bool:
    return x != 0.0 and math.isfinite(x) and math.frexp(abs(x))[0] == 0.5


def scale_fold(g: Graph, steps: Sequence[Any], r: Rejection) -> ScaleFold | None:
    """The fold of `r`'s refused attention scale (`default_scale`) into the Q projection of the user's graph `g`, as
    `steps` (the `PassStep`s before the refusal) built that attention, or None when no such change is known: the
    attention was not made by `fuse_sdpa` of this run, no folded scale node is a node of `g`, the Q operand is not a
    linear function of one projection (module docstring), or a constant would be zero or not finite."""
    if r.guard != "default_scale":
        return None
    found = _fuse_sdpa_match(steps, int(r.bindings.get("attn", r.anchor)))
    if found is None:
        return None
    b, packed = found
    scale, d = packed.attrs.get("scale"), packed.attrs.get("head_dim")
    if scale is None or not d or b.get("qk") not in g or g[b["qk"]].op != Op.MATMUL:
        return None
    consts = dict(FACTORS)
    factors = [(role, b[role], b[consts[role]]) for role in _ORDER if role in b and consts[role] in b
               and b[role] in g and b[consts[role]] in g and g[b[role]].op in (Op.MUL, Op.DIV)
               and b[consts[role]] in g[b[role]].inputs and typed_value(g[b[consts[role]]]) not in (None, 0.0)]
    if not factors and (any(role in b for role, _ in FACTORS) or not math.isclose(scale, 1.0)):
        return None
    role, factor, const = factors[0] if factors else ("scale", None, None)
    qk = g[b["qk"]]
    if factor is None and (g.is_output(qk.id) or not g.users(qk.id)):
        return None  # the new scale mul would have no reader to feed
    start = qk.inputs[0]
    dynamic = _dynamic(g)
    proj = _projection(g, start, dynamic)
    if proj is None:
        return None
    got = _linear(g, _between(g, proj, start), proj, start, qk.id, {b[r_] for r_, _ in FACTORS if r_ in b}, dynamic)
    if got is None:
        return None
    bias, rope = got
    weight = g[proj].inputs[1]
    dt = g[weight].dtype.numpy
    ratio = float(np.asarray(scale * math.sqrt(d)).astype(dt))
    div = factor is not None and g[factor].op == Op.DIV
    cdt = g[const].dtype.numpy if const is not None else qk.dtype.numpy
    old = typed_value(g[const]) if const is not None else 1.0
    assert old is not None
    f_old = 1.0 / old if div else old
    f_new = float(np.asarray(f_old / ratio).astype(cdt))
    new_value = float(np.asarray(1.0 / f_new if div else f_new).astype(cdt))
    if not all(math.isfinite(x) and x != 0.0 for x in (ratio, f_new, new_value)):
        return None
    f_kept = 1.0 / new_value if div else new_value
    return ScaleFold(scale, d, ratio, proj, weight, qk.id, bias, factor, const, role, new_value, rope,
                     _power_of_two(ratio), ratio * f_kept == f_old)


def _named(g: Graph, i: int) -> str:
    """A param by its name and node (`q_proj.weight (node 8)`), also read through layout ops (a transposed weight:
    `q_proj.weight (node 8, read through transpose node 9)`); any other node by its op and node."""
    n, through = g[i], []
    while n.op in (Op.TRANSPOSE, Op.RESHAPE, Op.CAST) and len(n.inputs) == 1:
        through.append(f"{n.op.value} node {n.id}")
        n = g[n.inputs[0]]
    if n.op != Op.PARAM:
        return f"{g[i].op.value} (node {i})"
    return f"{n.attrs['name']} (node {n.id}" + (f", read through {', '.join(through)})" if through else ")")


def fold_hint(g: Graph, f: ScaleFold) -> str:
    """The fix line of a planned fold, naming the user's nodes, e.g. `fold the scale into q_proj (matmul, node 26):
    multiply its weight q_proj.weight (node 25) by 0.25 = 0.0625 / 0.25 and scale the scores by the default
    1/sqrt(16): the scores' scale mul (node 62) by 0.25 instead of 0.0625 (exact here: 0.25 is a power of two and RoPE
    is linear)`; "exact" only for a power-of-two ratio, else `ROUNDING_ONLY` (the one wording of a change that keeps
    the numbers in real arithmetic only). Unscaled scores (`ScaleFold.factor` None) get `a new mul of the scores (after
    matmul node 30) by 0.353553` in place of the changed constant."""
    p = g[f.proj]
    own = p.path and p.path != g[f.qk].path  # the projection's own module (q_proj), not the attention's
    short = p.path.rsplit(".", 1)[-1] if own else "the Q projection"
    what = f"its weight {_named(g, f.weight)}" + (f" and its bias {_named(g, f.bias[1])}" if f.bias else "")
    linear = " and RoPE is linear" if f.rope else ""
    why = (f"exact here: {f.ratio:.6g} is a power of two{linear}" if f.exact else
           f"{ROUNDING_ONLY}: {f.ratio:.6g} is not a power of two")
    # a value its dtype rounds where 6 digits show it (granite.fp16's 1/sqrt(8) became 0.353516 beside 0.353553,
    # said nowhere): the value held, then the value meant and the rounding
    cdt = g[f.factor_const].dtype if f.factor_const is not None else g[f.qk].dtype
    div = f.factor is not None and g[f.factor].op == Op.DIV
    meant = f"{'' if div else '1/'}sqrt({f.head_dim})"
    held = _held(f.new_value, 1.0 / f.default if div else f.default, cdt, meant)
    if f.factor is None:
        scaled = f"a new mul of the scores (after {g[f.qk].op.value} node {f.qk}) by {held}, as they are not scaled now"
    else:
        old = typed_value(g[f.factor_const]) if f.factor_const is not None else None
        scaled = f"the {ROLE_NAMES[f.role]} {g[f.factor].op.value} (node {f.factor}) by {held} instead of {old:.6g}"
    quotient = f"{f.scale:.6g} / {f.default:.6g}"
    ratio = _held(f.ratio, f.scale / f.default, g[f.weight].dtype, quotient, said=f"{f.ratio:.6g} = {quotient}")
    return (f"fold the scale into {short} ({p.op.value}, node {f.proj}): multiply {what} by {ratio} and scale the "
            f"scores by the default 1/sqrt({f.head_dim}): {scaled} ({why})")


def _held(value: float, meant: float, dtype: DType, formula: str, said: str = "") -> str:
    """`value` (what `dtype` holds of `meant`, the value of `formula`) as a fix line says it: `said` (default
    `value`) where 6 digits show no rounding; else `0.353516 (1/sqrt(8) = 0.353553, rounded to float16)`."""
    if f"{value:.6g}" == f"{meant:.6g}":
        return said or f"{value:.6g}"
    return f"{value:.6g} ({formula} = {meant:.6g}, rounded to {np.dtype(dtype.numpy).name})"


def folded_graph(g: Graph, f: ScaleFold) -> Graph:
    """The user's graph `g` with the fold `f` applied: the projection reads `weight * ratio` (and its bias add
    `bias * ratio`), and the factor node reads its new constant (new nodes: the constants may be shared)."""
    rw = Rewriter(g, "what-if")
    p = g[f.proj]
    with rw.provenance((f.proj,), p.path):
        r = rw.const(f.ratio, g[f.weight].dtype)
        w = rw.emit(Op.MUL, [f.weight, r])
    rw.fuse(p.op, [p.inputs[0], w], dict(p.attrs), absorbed=(f.proj,))
    if f.bias is not None:
        add, b = g[f.bias[0]], f.bias[1]
        with rw.provenance((add.id,), add.path):
            scaled = rw.emit(Op.MUL, [b, rw.const(f.ratio, g[b].dtype)])
        rw.fuse(add.op, [scaled if j == b else j for j in add.inputs], dict(add.attrs), absorbed=(add.id,))
    if f.factor is None:  # unscaled scores: a new scale mul between the scores' matmul and its readers
        qk = g[f.qk]
        with rw.provenance((f.qk,), qk.path):
            scaled = rw.emit(Op.MUL, [f.qk, rw.const(f.new_value, qk.dtype)])
        for u in g.users(f.qk):
            rw.fuse(u.op, [scaled if j == f.qk else j for j in u.inputs], dict(u.attrs), absorbed=(u.id,))
        return rw.finish()
    node = g[f.factor]
    assert f.factor_const is not None
    with rw.provenance((f.factor,), node.path):
        c = rw.const(f.new_value, g[f.factor_const].dtype)
    rw.fuse(node.op, [c if j == f.factor_const else j for j in node.inputs], dict(node.attrs), absorbed=(f.factor,))
    return rw.finish()


__all__ = ["ScaleFold", "fold_hint", "folded_graph", "scale_fold"]
