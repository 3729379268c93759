"""A Q/K norm written on the heads after their transpose (QK-norm), moved in front of the head transpose.

QK-norm models (Qwen3, Gemma 3, OLMo 2, Cohere, OpenELM, Chameleon) normalize Q and K per head over `head_dim`
before RoPE. Most export it on `[B, S, H, d]`, between the head reshape and the head transpose, which `fuse_sdpa`
takes as part of the projection. Some write it after the transpose, on `[B, H, S, d]`; then the scores' operand
is `norm(transpose(reshape(q), [0, 2, 1, 3]))` and the pattern, which takes Q straight from the head split, misses.
Written before the transpose (Qwen3's form), the head split the pattern needs, `transpose(reshape(.))`, has the
norm between its two ops. `hoist_head_norms` rewrites both forms to the norm in front of a plain head split:

    rms_norm(transpose(reshape(x), [0, 2, 1, 3]), gamma)       (after)
    transpose(rms_norm(reshape(x), gamma), [0, 2, 1, 3])       (before)
      ->  transpose(reshape(reshape(rms_norm(reshape(x), gamma), [B, S, H*d]), [B, S, H, d]), [0, 2, 1, 3])

(`layer_norm` alike), after which the scores are plain `QK^T * scale + mask` of normalized heads and pack (the
attention reads the flattened `[B, S, H*d]` normalized projection). A norm on the full projection before the
split (OLMo 2) needs nothing: it is already part of the projection.

Validity (numbers equal, bit for bit, for every input): the norm reduces over the last axis only (`axis` -1 with
gamma / beta of shape `[d]`), and the transpose keeps the last axis in place (`perm[-1]` is the last axis), so every
row of `d` elements is the same row, in the same order, in both forms, normalized by the same reduction and gamma;
the transpose only moves rows, and the added reshape pair `[B, S, H, d] -> [B, S, H*d] -> [B, S, H, d]` reads the
same row-major order back. Taken only when the inner node (the transpose after, the norm before) has one reader
and is no graph output, and the norm's gamma and beta are `[d]`. Each rewrite is reported as a
`fuse_sdpa.hoist_head_norm` match.

The rules (`HOIST_BEFORE`, `HOIST_AFTER`, one stage of `fuse_sdpa` run by the engine): the anchors `BEFORE` and
`AFTER` are the two forms (a last-axis norm of rank 4, a `[0, 2, 1, 3]` head transpose, a head reshape of a rank
>= 3 value: anything else is no candidate); the named guard `norm_params_per_head_dim` (gamma and beta `[d]`) and
the engine's `absorbed_escape` (the inner node read only inside the form) are their refusals.
"""

from __future__ import annotations

from ...ir import Graph, Node, Op, Rewriter
from ..engine import rule_pass
from ..guard import NOT_RECOGNIZED, Ctx, Guard, guard
from ..pattern import P
from ..rule import Rule
from ..trace import Match

RULE = "fuse_sdpa.hoist_head_norm"
_PERM = {"perm": lambda p: tuple(p) == (0, 2, 1, 3)}


def _norm(x: P) -> P:
    """A last-axis `rms_norm(x, gamma)` or `layer_norm(x, gamma, beta)` of rank 4 (the QK-norm on the heads)."""
    def last(n: Node) -> bool:
        """rank 4, over the last axis"""
        return n.rank == 4 and n.attrs.get("axis", -1) in (-1, 3)

    return (P(Op.RMS_NORM, x, P.var("gamma"), name="norm", where=last)
            | P(Op.LAYER_NORM, x, P.var("gamma"), P.var("beta"), name="norm", where=last))


def _head_reshape() -> P:
    return P(Op.RESHAPE, P.var("x", where=lambda n: n.rank >= 3), name="head_reshape")


BEFORE = P(Op.TRANSPOSE, _norm(_head_reshape()), name="heads", attrs=_PERM)
"""`transpose(norm(reshape(x)), [0, 2, 1, 3])` (Qwen3's form: the norm between the head split's two ops)."""
AFTER = _norm(P(Op.TRANSPOSE, _head_reshape(), name="heads_t", attrs=_PERM))
"""`norm(transpose(reshape(x), [0, 2, 1, 3]))` (the norm after the head transpose)."""


def _params_ok(c: Ctx) -> bool:
    d = c["norm"].shape[-1]
    return all(c.graph[i].shape == (d,) for i in c["norm"].inputs[1:])


def _per_head_dim() -> Guard:
    return guard("norm_params_per_head_dim", _params_ok,
                 lambda c: f"the norm {c.d('norm')} over head_dim {c['norm'].shape[-1]} has gamma/beta "
                           f"{', '.join(str(list(c.graph[i].shape)) for i in c['norm'].inputs[1:])}; moved in front "
                           f"of the head transpose each row must be normalized by the same [d] parameters",
                 "give the QK-norm [head_dim] parameters, shared by every head", requires=("norm",),
                 kind=NOT_RECOGNIZED, fix="fuse_sdpa.hoist_head_norm moves a norm with per-head parameters")


def _hoist(c: Ctx, rw: Rewriter, old: int) -> None:
    """The norm on the `[B, S, H, d]` head reshape, then a plain head split (module doc), for the form's last node
    `old`; the old form removed."""
    norm, head_reshape = c["norm"], c.id("head_reshape")
    b, s, h, d = c["head_reshape"].shape
    with rw.provenance([old, norm.id]):
        normed = rw.emit(norm.op, [head_reshape, *norm.inputs[1:]], **dict(norm.attrs))
        flat = rw.emit(Op.RESHAPE, [normed], shape=(b, s, h * d))
        split = rw.emit(Op.RESHAPE, [flat], shape=(b, s, h, d))
        heads = rw.emit(Op.TRANSPOSE, [split], perm=(0, 2, 1, 3))
    rw.replace(old, heads)
    rw.remove([norm.id] if old != norm.id else [norm.inputs[0]])  # the norm (before) or the transpose (after)
    return None


def _rewrite_before(c: Ctx, rw: Rewriter) -> None:
    return _hoist(c, rw, c.id("heads"))


def _rewrite_after(c: Ctx, rw: Rewriter) -> None:
    return _hoist(c, rw, c.id("norm"))


HOIST_BEFORE = Rule(RULE, BEFORE, steps=(_per_head_dim(),), result="heads", absorb=("norm", "heads"),
                    rewrite=_rewrite_before,
                    doc="a QK-norm between the head reshape and transpose -> in front of the split")
HOIST_AFTER = Rule(RULE, AFTER, steps=(_per_head_dim(),), result="norm", absorb=("heads_t", "norm"),
                   rewrite=_rewrite_after, doc="a QK-norm after the head transpose -> in front of the split")

HOIST_HEAD_NORMS_PASS = rule_pass("fuse_sdpa", [HOIST_BEFORE, HOIST_AFTER], "QK-norm on the heads hoisted")
"""The two rules as a stage of `fuse_sdpa` (`engine.compose`)."""


def hoist_head_norms(g: Graph) -> tuple[Graph, list[Match]]:
    """`g` with every QK-norm on the heads made part of the projection in front of a plain head split (module doc),
    and one `Match` per rewrite; `(g, [])` when there is none. The two rules run by the engine."""
    return HOIST_HEAD_NORMS_PASS.rewrite(g)


__all__ = ["HOIST_AFTER", "HOIST_BEFORE", "HOIST_HEAD_NORMS_PASS", "RULE", "hoist_head_norms"]
