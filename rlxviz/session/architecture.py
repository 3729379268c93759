"""What kind of layer a layer is, and which rejections that kind does not count.

The session asks one function, `classify(graph, layer)`, which `layer_status` calls. It is
`rlxviz.passes.architecture.classify_layer` (post-LN, pre-LN, LLaMA, parallel, attention-only, no
attention); the kind answers `post_ln` (one FusedTransformerLayer expected) and `not_expected(pass, guard)`
(why a rejection does not count for this kind, or None).
"""

from __future__ import annotations

from ..ir import Graph
from ..passes.architecture import LayerArchitecture as Architecture
from ..passes.architecture import classify_layer


def classify(graph: Graph, layer: int | None) -> Architecture:
    """The `Architecture` of `layer` in `graph` (the unfused input graph); `layer=None`: the whole graph (for a
    graph whose node paths name no layer)."""
    return classify_layer(graph, layer)


__all__ = ["Architecture", "classify"]
