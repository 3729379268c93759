"""The IR's pure views and the GLU whose two halves reach its gate product through identical ones.

Read by the `glu` scan (`unrecognized`), which names such a chain, and by `fuse_swiglu.viewed_dual_matmul`
(`rules.swiglu`), which fuses it.
"""

from __future__ import annotations

from ..ir import Graph, Node, Op

VIEWS = frozenset({Op.RESHAPE})
"""The IR's pure views: the same elements in the same row-major order (transpose, expand, narrow move, repeat or drop
elements), so an elementwise op commutes with the same view of each operand, bit for bit."""

GATED = (Op.MATMUL, Op.FUSED_MATMUL_BIAS_ACT, Op.NARROW)
"""What a GLU's gate multiplies: a projection, or a half of a packed one."""


def _view_source(g: Graph, n: Node) -> tuple[list[int], Node]:
    """The reshapes from `n` back (`n` first when it is one) and the node they view (`n` itself when it is none)."""
    chain = []
    while n.op in VIEWS:
        chain.append(n.id)
        n = g[n.inputs[0]]
    return chain, n


def gate_views(g: Graph, act: Node, other: Node) -> tuple[int, ...] | None:
    """The view chains of a GLU whose two halves reach the product through identical reshapes: `act`'s input and
    `other` each views (`VIEWS`) a projection (`GATED`) of one shape as one target shape, e.g. Qwen2-MoE's shared
    expert, `silu(reshape(x @ wg, [8, 32])) * reshape(x @ wu, [8, 32])` with both products `[1, 8, 32]`. Returns
    the chains' node ids and the two projections' (act's side first, `other` itself left out), or None for any
    other form (no reshape, the halves viewed differently, or something else under the views)."""
    a_chain, a_src = _view_source(g, g[act.inputs[0]])
    b_chain, b_src = _view_source(g, other)
    if not a_chain or not b_chain or a_src.op not in GATED or b_src.op not in GATED:
        return None
    if a_src.shape != b_src.shape or g[a_chain[0]].shape != other.shape:
        return None
    return (*a_chain, a_src.id, *b_chain[1:], b_src.id)


__all__ = ["GATED", "VIEWS", "gate_views"]
