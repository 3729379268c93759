"""Which layer a match is credited to: its path's layer (`Match.layer`), except for a residual norm at a layer's
edge, which is placed by one rule (`RESIDUAL_NORM_RULE`).

A residual norm (`FusedResidualLN`, `FusedResidualRmsNorm`) joins a residual sum to the norm that reads it, and the
two often sit in two layers: the sum closes layer N, the norm opens layer N+1 (pre-LN) or is the model's final norm.
Its path, the common path of what it absorbed, then names no layer (`h.1` and `ln_f`: none), or a wrong one where a
graph optimizer named the nodes (ONNX Runtime's `SkipLayerNormalization` before DeiT's final norm reads
`layers.1.mlp.fc2`). The rule places it by the layer kind, on the model's structure, not on names:

* post-LN (the norm closes its layer: BERT's `h1 = LN(attn(x) + x)`): the layer of the residual sum it normalizes;
  a sum in no layer (the embeddings' norm) is outside the layers;
* any other kind (pre-LN, parallel: the norm opens the sublayer that reads it): the layer of the norm's readers;
  none in a layer (the model's final norm, read by a pooler or the graph's output) is outside the layers.

`explain` keys every match by `match_layer`, so a layer's fused ops (`LayerVerdict.done`), the sibling a rejection
is compared with (`LayerExplanation.sibling`) and the ops said outside the layers (`RunVerdict.outside`) read one
placement.
"""

from __future__ import annotations

from ..ir import Graph, Op
from .architecture import classify_layer
from .trace import Layer, Match, layer_of

RESIDUAL_NORMS = frozenset({Op.FUSED_RESIDUAL_LN, Op.FUSED_RESIDUAL_RMS_NORM})
"""The fused ops `match_layer` places by `RESIDUAL_NORM_RULE`: a residual sum and the norm that reads it."""

RESIDUAL_NORM_RULE = ("a residual norm at a layer's edge is said by the layer whose norm it is: post-LN, the layer "
                      "whose residual sum it closes; otherwise the layer whose sublayer reads it; none (the model's "
                      "final norm, the embeddings' norm) is said outside the layers")
"""`match_layer`'s rule in words."""


def match_layer(source: Graph, before: Graph, after: Graph, m: Match) -> Layer | None:
    """The layer `m` is credited to (None: outside the layers).

    Args:
        source: the run's input graph (what `architecture.classify_layer` reads a layer's kind from).
        before / after: the graphs the match's pass read and made (its `bindings` name nodes of `before`, its
            `fused` a node of `after`).
        m: the match.

    Returns:
        `m.layer` (its path's layer), except for a residual norm (`RESIDUAL_NORMS`) with a bound residual sum, placed
        by `RESIDUAL_NORM_RULE`.
    """
    if m.fused is None or m.fused not in after or after[m.fused].op not in RESIDUAL_NORMS:
        return m.layer
    s = m.bindings.get("sum")
    if s is None or s not in before:
        return m.layer
    closes = layer_of(before[s].path)  # the layer whose residual sum it normalizes
    opens = sorted({k for u in after.users(m.fused) if (k := layer_of(u.path)) is not None})  # whose sublayer reads
    kind_of = closes if closes is not None else (opens[0] if opens else None)
    if kind_of is None:
        return None
    if classify_layer(source, kind_of).post_ln:
        return closes
    return opens[0] if opens else None


__all__ = ["RESIDUAL_NORMS", "RESIDUAL_NORM_RULE", "match_layer"]
