"""What a layer is expected to fuse, by its kind: the one place that decides which refusals count.

The facts come from the trace (`facts`) and the layer's kind (`passes.architecture.classify_layer`); this module
turns them into "expected" and "not expected here", and nothing outside `passes/why/` does. The product of each
pattern pass (`PRODUCTS`) is what its name is in a layer's expectations; which kinds expect it and where a guard's
refusal is excused are read from here (see `not_expected`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .kinds import LayerArchitecture

EXPECT_MODES = ("model", "pipeline")
"""What a layer is judged against: `model` (default): every product that is legal for the layer, i.e. what the
canonical pipeline makes of it, so a pipeline without a pass the layer needs cannot pass the check; `pipeline`: only
what the run's own passes could make (the products its missing passes would make are listed, not counted)."""

PRODUCTS: dict[str, str] = {
    "fuse_sdpa": "packed attention", "fuse_swiglu": "FusedSwiGLU",
    "fuse_shared_input_matmul": "shared-input QKV matmul",
    "fuse_matmul_bias_act": "FusedMatMulBiasAct", "fuse_attention_block": "FusedAttentionBlock",
    "fuse_residual_ln": "FusedResidualLN", "fuse_residual_rms_norm": "FusedResidualRmsNorm",
    "fuse_transformer_layer": "FusedTransformerLayer",
    "canonicalize_norm": "layer_norm / rms_norm", "canonicalize_gelu": "gelu / gelu_tanh",
    "canonicalize_exported": "the exporter's forms as IR ops (silu, rsqrt, where mask)",
}
"""What each pattern pass produces, as named in a layer's expectations."""

LAYER_PASS = "fuse_transformer_layer"
"""The pass that turns a whole post-LN layer into one node (`Op.FUSED_TRANSFORMER_LAYER`)."""

FAMILY_PASSES: dict[str, tuple[str, ...]] = {
    "norm": ("canonicalize_norm",), "gelu": ("canonicalize_gelu",), "glu": ("fuse_swiglu",),
    "attention": ("fuse_sdpa",), "where_mask": ("canonicalize_exported", "fuse_sdpa"),
    "activation": ("canonicalize_exported", "fuse_matmul_bias_act"),
}
"""The passes whose rules recognize each `passes.unrecognized` family."""

RESIDUAL_NORM_PASSES = ("fuse_residual_ln", "fuse_residual_rms_norm")
PRE_NORM_ILLEGAL_GUARDS = frozenset({"sum_single_user", "biased_single_user"})

ILLEGAL_HERE = ("illegal for this layer: no change to the model that keeps its numbers makes it legal (the layer is "
                "fused as far as legal)")


def product(pass_name: str) -> str:
    """The product `pass_name` makes, as named in a layer's expectations (the pass name when it makes none)."""
    return PRODUCTS.get(pass_name, pass_name)


def not_expected(arch: LayerArchitecture, pass_name: str, guard: str = "") -> str | None:
    """Why a rejection of `pass_name` at `guard` does not count in a layer of kind `arch` (None: it counts). (A
    refusal that is `illegal` and `read by the model`, the model's own dataflow, is excused per layer by
    `verdict.layer_verdict`: `ILLEGAL_HERE`.)

    The rules: `FusedTransformerLayer` is expected only of `post_ln`; `FusedAttentionBlock` of `post_ln` and of any
    layer whose attention has a keep mask and no KV cache (the block also takes an additive mask, but a pre-norm
    layer with one is only expected to pack its attention); a residual-norm fusion refused because the residual sum
    has other users is illegal, not missed, in a pre-norm layer. Everything else counts."""
    if pass_name == "fuse_transformer_layer" and not arch.post_ln:
        return f"FusedTransformerLayer is the post-LN BERT layer; this layer is {arch.description}"
    if pass_name == "fuse_attention_block" and arch.kv_cache:
        return ("FusedAttentionBlock projects K and V from the hidden states; this layer's attention reads a KV "
                "cache (a decode step)")
    if pass_name == "fuse_attention_block" and not arch.post_ln and arch.mask == "additive":
        return ("FusedAttentionBlock takes this layer's additive mask when the rest of the block matches, but a "
                "pre-norm layer is only expected to pack its attention (the block is expected with a keep mask)")
    if pass_name == "fuse_attention_block" and not arch.post_ln and arch.mask != "keep":
        return (f"FusedAttentionBlock takes a keep mask or an additive one as its mask operand; this layer's "
                f"attention mask is {arch.mask or 'absent'}")
    if pass_name in RESIDUAL_NORM_PASSES and arch.pre_norm and guard in PRE_NORM_ILLEGAL_GUARDS:
        return "pre-norm layout: the residual sum also feeds the next residual add, so it cannot be fused"
    return None


def expected_products(arch: LayerArchitecture) -> list[str]:
    """The fused ops a layer of kind `arch` should end with (for messages)."""
    if arch.post_ln:
        return ["FusedTransformerLayer"]
    out = []
    if arch.mask is not None:
        out.append("packed attention" + (" (grouped-query)" if "grouped-query" in " ".join(arch.evidence) else ""))
        if arch.mask == "keep" and not arch.kv_cache:
            out.append("FusedAttentionBlock")
    if arch.swiglu:
        out.append("FusedSwiGLU")
    return out


__all__ = ["EXPECT_MODES", "FAMILY_PASSES", "ILLEGAL_HERE", "LAYER_PASS", "PRODUCTS", "expected_products",
           "not_expected", "product"]
