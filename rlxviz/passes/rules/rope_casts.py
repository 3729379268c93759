"""RoPE computed in float32 between casts of half-precision heads (OLMo, and any model whose `apply_rotary_pos_emb`
promotes to the float32 tables) -> the rope op in float32 on the cast projection, its heads split after the casts.

A float16 (bfloat16) model with float32 `cos`/`sin` tables exports its rotation as

    h   = transpose(reshape(x, [B, S, nh, d]), [0, 2, 1, 3])                   x: f16 [B, S, nh*d]
    out = cast(cast(h, f32) * cos + cast(rotate_half(h), f32) * sin, f16)       cos, sin: f32

so the rotation `rope_heads` reads is behind casts on both sides: its rotate_half reads the half-precision heads and
the scores read a cast of the rotated heads, not a head split. Two exact canonicalizations, each a rule run as a
stage of `fuse_sdpa` before `rope_heads` (`CAST_HEADS` also after it):

* `fuse_sdpa.cast_rotation`: `cast(r(h), T)` where `r` is computed from the heads h by movement ops and `neg` only
  (rotate_half: narrows, neg, concat; rotate_every_two in any spelling) -> `r(cast(h, T))`, the chain computed on
  the cast heads (an existing `cast(h, T)` reused: the form's plain product reads one). Exact: a float-to-float
  cast maps each element on its own and rounds to nearest, which is symmetric (`cast(-v) == -cast(v)`), and
  movement ops only move elements. Guards: `float_cast` (a cast between float dtypes: an integer's negation can
  overflow), `rotation_chain` is structural (quiet: no neg and no concat in the chain is no rotation).
* `fuse_sdpa.cast_heads`: `cast(transpose(reshape(x, [B, S, nh, d]), [0, 2, 1, 3]), T)` with x `[B, S, nh*d]` ->
  `transpose(reshape(cast(x, T), [B, S, nh, d]), [0, 2, 1, 3])`: the head split after the cast, which the rope op
  (on the cast projection) and the attention (reading the cast of the rotated projection) take. Exact for every
  cast: it maps each element on its own, and the head split only moves elements. The old view goes once nothing
  else reads it.

With both, `rope_heads` rewrites the float32 rotation to `rope(cast(x, f32), cos, sin)` (bit-exact: the module doc
of `rope_heads`), the cast back to f16 sits on the packed rotated projection, and the attention packs reading it;
`fuse_attention_block` takes the casts around the rope into FusedAttentionBlock as its `rope_dtype` (`rules.block`).
"""

from __future__ import annotations

from ...ir import DType, Graph, Op, Rewriter
from ..engine import rule_pass
from ..guard import NOT_RECOGNIZED, Ctx, guard
from ..pattern import P
from ..rule import QUIET, Fail, Rule, reports
from .head_layout import remove_shared

ROTATION_RULE = "fuse_sdpa.cast_rotation"
HEADS_RULE = "fuse_sdpa.cast_heads"
_CHAIN_OPS = (Op.NARROW, Op.GATHER, Op.TRANSPOSE, Op.RESHAPE, Op.CONCAT, Op.NEG, Op.EXPAND)
_MAX_CHAIN = 24


def _twin(g: Graph, i: int, dtype: DType) -> int | None:
    """A reader of node i that casts it to `dtype` (the form's plain product reads one), or None."""
    return next((u.id for u in g.users(i) if u.op == Op.CAST and u.dtype == dtype), None)


def _chain(g: Graph, top: int, dtype: DType) -> tuple[int, list[int]] | None:
    """`(h, nodes)` when node `top` is computed from one node h by movement ops and `neg` (`_CHAIN_OPS`; a gather's
    index a constant), `nodes` in topological order (h's readers first); None otherwise. The walk stops at a node
    already cast to `dtype` elsewhere (the heads the plain product reads as `cast(h) * cos`): that is h."""
    sources: set[int] = set()
    order: list[int] = []
    seen: set[int] = set()

    def walk(i: int, depth: int) -> bool:
        if i in seen:
            return True
        n = g[i]
        if depth > _MAX_CHAIN:
            return False
        if n.op not in _CHAIN_OPS or (i != top and _twin(g, i, dtype) is not None):
            sources.add(i)
            return True
        seen.add(i)
        data = n.inputs[:1] if n.op == Op.GATHER else n.inputs
        if n.op == Op.GATHER and g[n.inputs[1]].op not in (Op.CONST, Op.PARAM):
            return False
        if not all(walk(j, depth + 1) for j in data):
            return False
        order.append(i)
        return True

    if not walk(top, 0) or len(sources) != 1:
        return None
    return next(iter(sources)), order


@reports(reads=("cast",), binds=("h", "chain*"))
def _find_rotation(c: Ctx) -> Fail | None:
    """Bind the heads h and the chain `r(h)` under the cast: quiet unless the chain has a neg and a concat (the
    shape of rotate_half / rotate_every_two)."""
    g = c.graph
    found = _chain(g, c["cast"].inputs[0], c["cast"].dtype)
    if found is None:
        return QUIET
    h, nodes = found
    ops = {g[i].op for i in nodes}
    if Op.NEG not in ops or Op.CONCAT not in ops:
        return QUIET
    c.bindings["h"] = h
    for k, i in enumerate(nodes):
        c.bindings[f"chain{k}"] = i
    return None


def _chain_ids(c: Ctx) -> list[int]:
    return [i for r, i in c.bindings.items() if r.startswith("chain") and r[5:].isdigit()]


FLOAT_CAST = guard("float_cast", lambda c: c["h"].dtype.is_float and c["cast"].dtype.is_float,
                   lambda c: f"{c.d('cast')} casts {c['h'].dtype} to {c['cast'].dtype}; the cast moves across the "
                             f"rotation's neg exactly only between float dtypes (an integer's negation can overflow)",
                   "compute the rotation in the heads' float dtype", requires=("h", "cast"), kind=NOT_RECOGNIZED,
                   fix="none: only a float cast is symmetric")


def _rotation_rewrite(c: Ctx, rw: Rewriter) -> int:
    """The chain emitted again on `cast(h)` (an existing reader `cast(h, T)` reused); the old chain goes once nothing
    else reads it."""
    g = c.graph
    h, dtype = c.id("h"), c["cast"].dtype
    twin = _twin(g, h, dtype)
    chain = _chain_ids(c)
    with rw.provenance([c.id("cast")]):
        new = {h: twin if twin is not None else rw.cast(h, dtype)}
        for i in chain:
            n = g[i]
            ins = [new.get(j, j) for j in n.inputs]
            new[i] = rw.emit(n.op, ins, **n.attrs)
    out = new[chain[-1]]
    rw.replace(c.id("cast"), out)
    remove_shared(rw, chain[::-1])
    return out


CAST_ROTATION = Rule(
    ROTATION_RULE, P(Op.CAST, name="cast"),
    steps=(_find_rotation, FLOAT_CAST),
    result="cast", absorb=("cast",), rewrite=_rotation_rewrite, labels={"cast": "cast", "h": "heads"},
    doc="cast(rotate_half(h)) -> rotate_half(cast(h)) (a float cast moved across the rotation's movement and neg)")

_SPLIT = P(Op.TRANSPOSE, P(Op.RESHAPE, P.var("x"), name="split_reshape"), name="split",
           attrs={"perm": lambda p: tuple(p) == (0, 2, 1, 3)})


@reports(reads=("x", "split_reshape"))
def _is_head_split(c: Ctx) -> Fail | None:
    """Quiet unless the view is a head split `[B, S, nh*d] -> [B, S, nh, d] -> [B, nh, S, d]`."""
    x, r = c["x"], c["split_reshape"]
    return None if x.rank == 3 and r.rank == 4 and r.shape[:2] == x.shape[:2] and r.shape[2] * r.shape[3] == \
        x.shape[2] else QUIET


def _heads_rewrite(c: Ctx, rw: Rewriter) -> int:
    r = c["split_reshape"]
    with rw.provenance([c.id("cast")]):
        out = rw.transpose(rw.reshape(rw.cast(c.id("x"), c["cast"].dtype), tuple(r.shape)), (0, 2, 1, 3))
    rw.replace(c.id("cast"), out)
    remove_shared(rw, [c.id("split"), c.id("split_reshape")])
    return out


CAST_HEADS = Rule(
    HEADS_RULE, P(Op.CAST, _SPLIT, name="cast"),
    steps=(_is_head_split,),
    result="cast", absorb=("cast",), rewrite=_heads_rewrite, labels={"cast": "cast", "split": "heads"},
    doc="cast(transpose(reshape(x))) -> transpose(reshape(cast(x))) (a cast of the heads moved before the head split)")

CAST_ROTATION_PASS = rule_pass("fuse_sdpa", [CAST_ROTATION], "a cast moved across the rotation on the heads")
CAST_HEADS_PASS = rule_pass("fuse_sdpa", [CAST_HEADS], "a cast of the heads moved before the head split")

__all__ = ["CAST_HEADS", "CAST_HEADS_PASS", "CAST_ROTATION", "CAST_ROTATION_PASS", "HEADS_RULE", "ROTATION_RULE"]
