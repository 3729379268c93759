"""What kind a layer is (`LayerArchitecture`, read by `passes.architecture.classify_layer`), and what that kind is
expected to fuse: its `not_expected` and `expected` ask `policy`, the one place that decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import policy

POST_NORM, PRE_NORM = "(post-norm)", "(pre-norm)"
"""The marks `architecture._norm_order`'s evidence ends with: a norm that closes its residual sum (it reads a sum
that feeds nothing else), one on the residual stream (the value it reads also feeds a residual add)."""


@dataclass(frozen=True)
class LayerArchitecture:
    """One layer's kind and the facts it was read from.

    Attributes:
        kind: one of `KINDS`.
        description: one line, e.g. `pre-LN (GPT-2, ViT): norm -> sublayer -> residual add; LayerNorm`.
        norm: `LayerNorm`, `RMSNorm` or `none`.
        mask: the attention's mask kind after `fuse_sdpa` (`keep`, `causal`, `additive`, `none`), `unknown`
            when the attention stayed primitives, None without attention.
        rope / swiglu: the layer has rotary embeddings / a gated MLP (SiLU-gated SwiGLU or GELU-gated GeGLU: the
            forms `FusedSwiGLU` takes).
        evidence: node-level facts behind the kind, e.g. `residual sum %12 feeds only layer_norm %13`.
    """

    kind: str
    description: str
    norm: str = "none"
    mask: str | None = None
    rope: bool = False
    swiglu: bool = False
    evidence: tuple[str, ...] = field(default_factory=tuple)
    kv_cache: bool = False
    """The attention reads K/V through a KV cache (a decode step): FusedAttentionBlock cannot take it."""
    quantized: int = 0
    """QDQ steps of computed values in the layer (a QuantizeLinear of an activation dequantized for float ops,
    `architecture._fake_quant`), 0 in a float layer and in a dynamically quantized one (its integer matmuls read the
    values)."""
    integer_qkv: bool = False
    """The attention's Q, K or V is projected by an integer matmul (`architecture.integer_qkv`: ONNX's MatMulInteger,
    dynamic quantization): no FusedAttentionBlock of rlxviz's takes such projections (trait `integer_qkv`)."""
    qk_norm: bool = False
    """The attention's Q or K is normalized between its projection and the attention (`architecture.qk_norm`: OLMo-2,
    Qwen3): no FusedAttentionBlock of rlxviz's has a norm there (trait `qk_norm`)."""
    parallel_norms: int = 0
    """The norms of the residual stream a parallel block's sublayers read: 1 (GPT-J, Falcon: one norm feeds the
    attention and the MLP) or 2 (GPT-NeoX: one each, so the residual sum feeds two norms and the next residual add;
    trait `norm_per_sublayer`); 0 for any other kind."""

    @property
    def post_ln(self) -> bool:
        """A post-LN BERT-style layer: one FusedTransformerLayer is expected."""
        return self.kind == "post_ln"

    @property
    def pre_norm(self) -> bool:
        """The residual sum also feeds the next residual add, so the single-output residual-norm ops rlxviz's rules
        build (the normalized value only; the ops' `with_sum` form, which no rule builds, returns the sum too)
        cannot take it."""
        return self.kind in ("pre_ln", "llama", "parallel") or (
            self.kind in ("attention_only", "cross_decoder") and any("pre-norm" in e for e in self.evidence))

    @property
    def post_norm(self) -> bool:
        """Every residual norm whose order was read closes its residual sum (`norm(x + sublayer(x))`), whatever the
        kind: a post-LN BERT layer, BART's and Marian's decoder layers (`cross_decoder`, read as post-norm), not
        T5's (pre-norm). Where such a layer's residual norm sits (`placement.match_layer`): in the layer whose sum it
        closes, not the next layer, which reads it."""
        return self.post_ln or (not self.pre_norm and any(e.endswith(POST_NORM) for e in self.evidence)
                                and not any(e.endswith(PRE_NORM) for e in self.evidence))

    def has(self, trait: str) -> bool:
        """Whether the layer has `trait` (`passes.declarations.TRAITS`): its kind (`post_ln`, `llama`, ...),
        `pre_norm`, `kv_cache`, `keep_mask` (its attention's mask is a keep mask), `no_mask` (its fused attention has
        none), `causal_mask` (its fused attention's mask is the causal kind), `attention` (it has one, fused or
        primitives: `mask` is not None), `swiglu` or `grouped_query` (an attention with fewer K/V heads than query
        heads, read from the evidence), `integer_qkv` (its Q/K/V projected by integer matmuls), `qk_norm` (its Q or K
        normalized before the attention), `norm_per_sublayer` (a parallel block whose sublayers each read their own
        norm of the residual sum, `parallel_norms`). The traits a pass's `expected_of` / `excused_by` / `listed_for` /
        `lacks` and a guard's `excused_in` / `gap_in` name."""
        if trait == "grouped_query":
            return self.mask is not None and any("grouped-query" in e for e in self.evidence)
        return {"pre_norm": self.pre_norm, "kv_cache": self.kv_cache, "keep_mask": self.mask == "keep",
                "no_mask": self.mask == "none", "causal_mask": self.mask == "causal",
                "post_ln": self.post_ln, "attention": self.mask is not None,
                "swiglu": self.swiglu, "integer_qkv": self.integer_qkv,
                "qk_norm": self.qk_norm, "norm_per_sublayer": self.kind == "parallel" and self.parallel_norms > 1,
                }.get(trait, self.kind == trait)

    def not_expected(self, pass_name: str, guard: str = "") -> str | None:
        """Why a rejection of `pass_name` at `guard` does not count in this layer (None: it counts;
        `policy.not_expected`)."""
        return policy.not_expected(self, pass_name, guard)

    def expected(self) -> list[str]:
        """The fused ops this kind of layer should end with, for messages (`policy.expected_products`)."""
        return policy.expected_products(self)


__all__ = ["POST_NORM", "PRE_NORM", "LayerArchitecture"]
