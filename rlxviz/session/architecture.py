"""What kind of layer a layer is, and which fusions that kind expects.

`classify(graph, layer)` is the one place the session asks; `layer_status` calls it. The default
classifier below tells post-LN BERT-style layers from the rest by their ops. A finer classifier
(pre-LN, LLaMA, parallel, attention-only) plugs in by assigning `CLASSIFIER` a function with the
same signature returning an `Architecture`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..ir import Graph, Op
from ..passes import layer_of


@dataclass(frozen=True)
class Architecture:
    """One layer's kind.

    Attributes:
        kind: a short name (`post_ln`, `llama`, `pre_norm`, `no_attention`, ...).
        description: one line for people, e.g. `attention -> residual add -> LayerNorm (post-LN BERT style)`.
        post_ln: a post-LN BERT-style layer, so one FusedTransformerLayer is expected.
        pre_norm: the residual sum also feeds the next residual add, so residual-norm fusions are illegal.
    """

    kind: str
    description: str
    post_ln: bool
    pre_norm: bool = False


def default_classifier(graph: Graph, layer: int) -> Architecture:
    """`Architecture` of `layer` in `graph` (use the unfused input graph), from its ops.

    Post-LN BERT style: attention and a residual add feeding a LayerNorm, or a FusedResidualLN /
    FusedTransformerLayer already there. Anything else with attention is treated as pre-norm (a LLaMA
    block when its norm is RmsNorm).
    """
    nodes = [n for n in graph if layer_of(n.path) == layer and n.op not in (Op.INPUT, Op.PARAM, Op.CONST)]
    ops = {n.op for n in nodes}
    attention = bool(ops & {Op.ATTENTION, Op.SOFTMAX, Op.FUSED_ATTENTION_BLOCK, Op.FUSED_TRANSFORMER_LAYER})
    ln_residual = bool(ops & {Op.FUSED_RESIDUAL_LN, Op.FUSED_TRANSFORMER_LAYER}) or any(
        n.op == Op.ADD and any(u.op == Op.LAYER_NORM for u in graph.users(n.id)) for n in nodes)
    if attention and ln_residual:
        return Architecture("post_ln", "attention -> residual add -> LayerNorm (post-LN BERT style)", True)
    norm = ("RmsNorm" if Op.RMS_NORM in ops or Op.FUSED_RESIDUAL_RMS_NORM in ops
            else "LayerNorm" if Op.LAYER_NORM in ops else "no norm")
    if not attention:
        return Architecture("no_attention", f"no attention ({norm})", False)
    llama = norm == "RmsNorm"
    return Architecture("llama" if llama else "pre_norm",
                        f"attention + {norm}, no LayerNorm on the attention residual{': LLaMA style' if llama else ''}",
                        False, pre_norm=True)


CLASSIFIER: Callable[[Graph, int], Architecture] = default_classifier
"""The classifier `classify` uses (replace it to plug in a finer one)."""


def classify(graph: Graph, layer: int) -> Architecture:
    """The `Architecture` of `layer` in `graph`, by the current `CLASSIFIER`."""
    return CLASSIFIER(graph, layer)


POST_LN_ONLY: dict[str, str] = {
    "fuse_transformer_layer": "FusedTransformerLayer is the post-LN BERT layer",
    "fuse_attention_block": "FusedAttentionBlock is the BERT encoder attention (keep mask, biased packed QKV)",
}
"""Passes whose fusions only a post-LN BERT-style layer is expected to get, with the reason."""

PRE_NORM_ILLEGAL: dict[str, frozenset[str]] = {
    "fuse_residual_ln": frozenset({"sum_single_user"}),
    "fuse_residual_rms_norm": frozenset({"sum_single_user"}),
}
"""Residual-norm passes and the guards whose rejection in a pre-norm layer means the fusion is illegal there
(the residual sum also feeds the next residual add), not that something went wrong."""


def not_expected(arch: Architecture, pass_name: str, guard: str) -> str | None:
    """Why a rejection of `pass_name` at `guard` does not count in a layer of kind `arch` (None: it counts)."""
    if arch.post_ln:
        return None
    if pass_name in POST_LN_ONLY:
        return POST_LN_ONLY[pass_name]
    if guard in PRE_NORM_ILLEGAL.get(pass_name, frozenset()):
        return "pre-norm layout: the residual sum also feeds the next residual add, so it cannot be fused"
    return None


__all__ = ["CLASSIFIER", "POST_LN_ONLY", "PRE_NORM_ILLEGAL", "Architecture", "classify", "default_classifier",
           "not_expected"]
