"""The words a pass's policy declarations may use (`engine.Pass`): layer kinds and traits, the families of an
"unrecognized" finding (and that finding's own declarations), and what a quantized layer does to a pass. They sit
below the engine so that a pass checks its own declarations when it is built (a misspelt word fails at import of the
module that writes it, `check_words`); `passes.why.policy` reads them, `passes.unrecognized` names its families here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from .guard import EPILOGUE_ACTIVATIONS
from .pattern import RuleError
from .spelling import close

KINDS = ("post_ln", "pre_ln", "llama", "parallel", "cross_decoder", "attention_only", "no_attention", "unknown")
"""Every layer kind `passes.architecture.classify_layer` answers."""

TRAITS = (*KINDS, "pre_norm", "kv_cache", "keep_mask", "no_mask", "causal_mask", "attention", "swiglu",
          "grouped_query", "integer_qkv", "qk_norm", "norm_per_sublayer")
"""What a pass's `expected_of` / `excused_by` / `listed_for` and a guard's `excused_in` / `gap_in` may name
(`why.kinds.LayerArchitecture.has`): a kind, or `pre_norm` (the residual sum also feeds the next residual add),
`kv_cache` (K/V read through a KV cache), `keep_mask` (the attention's mask is a keep mask), `no_mask` (its fused
attention has no mask at all), `causal_mask` (its fused attention's mask is the causal kind), `attention` (the layer
has an attention, fused or primitives), `swiglu` (a gated MLP), `grouped_query` (fewer K/V heads than query heads),
`integer_qkv` (the attention's Q/K/V projected by integer matmuls: dynamic quantization), `qk_norm` (the attention's Q
or K normalized between its projection and the attention: OLMo-2, Qwen3), `norm_per_sublayer` (a parallel block whose
attention and MLP each read their own norm of the residual sum: GPT-NeoX)."""

TRAIT_WORDS: dict[str, str] = {
    "post_ln": "a post-LN layer", "pre_ln": "a pre-LN layer", "llama": "a LLaMA-style layer",
    "parallel": "a parallel block", "cross_decoder": "a cross-attention decoder layer",
    "attention_only": "an attention-only graph", "no_attention": "a layer without attention",
    "unknown": "a layer of a kind rlxviz does not recognize",
    "pre_norm": "a pre-norm layer", "kv_cache": "a layer whose attention reads a KV cache",
    "keep_mask": "a layer whose attention has a keep mask", "no_mask": "a layer whose attention has no mask",
    "causal_mask": "a layer whose attention has a causal mask",
    "attention": "a layer with an attention",
    "swiglu": "a layer with a gated MLP", "grouped_query": "a layer with grouped-query attention",
    "integer_qkv": "a layer whose Q/K/V projections are integer matmuls (dynamic quantization)",
    "qk_norm": "a layer whose attention normalizes Q and K (QK-norm)",
    "norm_per_sublayer": "a parallel block with a norm per sublayer",
}
"""trait -> the layer it names, in words: what a pass's `unexpected` says its `expected_of` traits are
(`{expected}`, `why.policy.not_expected`), so the sentence is the declaration itself, never a second copy of it."""

GAP_TRAIT_WORDS: dict[str, str] = {
    "integer_qkv": "its integer-matmul Q/K/V projections",
    "qk_norm": "its Q and K normalized before the attention",
}
"""trait -> what it is in the model, for a trait under which a pass makes no product (`Pass.lacks`): how a gap's
source is named where shown (`trait_named`), never the trait's bare name (a newcomer read `the layer's trait
integer_qkv`)."""


def trait_named(trait: str) -> str:
    """A layer trait as the text, the app and the drawings name what ran into a gap in rlxviz's ops: what it is in
    the model, then its name, `its integer-matmul Q/K/V projections (integer_qkv)` (`GAP_TRAIT_WORDS`; a trait with
    no words there: `its trait T`)."""
    words = GAP_TRAIT_WORDS.get(trait)
    return f"{words} ({trait})" if words else f"its trait {trait}"


FAMILIES: dict[str, tuple[str, str]] = {
    "norm": ("LayerNorm/RMSNorm statistics", "write it as (x - mean) / sqrt(var + eps) or x * rsqrt(mean(x^2) + eps) "
             "(see docs/passes.md, recognized forms), or emit layer_norm / rms_norm"),
    "gelu": ("a GELU", "write 0.5 * x * (1 + erf(x / sqrt(2))) or the tanh form, or emit gelu / gelu_tanh"),
    "glu": ("a gated linear unit", "only the SiLU- and GELU-gated forms (SwiGLU, GeGLU) have a fused op "
            "(FusedSwiGLU with its activation)"),
    "where_mask": ("a where-based attention mask", "use an additive or keep mask (HF's extended mask)"),
    "attention": ("scaled-dot-product attention", "see the fuse_sdpa pattern in docs/passes.md"),
    "activation": ("an activation written as primitives", "keep the model's activation: no fused op takes this form "
                   f"(the epilogue allow-list is {', '.join(EPILOGUE_ACTIVATIONS)}); the compiler fix is an op and "
                   "an epilogue for it"),
}
"""family -> (what its chain looks like, how to make a rule see it): the chains `passes.unrecognized` reports when no
rule made them a candidate, and what a pass's `recognizes_families` names."""

FINDING = "unrecognized"
"""The pass name an unrecognized finding's pattern starts with (`unrecognized.<family>`, `passes.unrecognized`): what
`MissedFusion.pattern` names in place of a pass, and what the verdict's policy reads the finding's declarations by."""

FINDING_QUANTIZATION = ("breaks", "a chain that a quantization step of an intermediate value cut (a GELU whose erf "
                                  "is rounded) looks like a family no rule recognizes, and is none")
"""What a quantized layer does to an unrecognized finding, as a pass declares it (`engine.Pass.quantization`): a
layer with quantized activations does not count it."""

QUANTIZATION: dict[str, str] = {
    "breaks": "a quantization step of an intermediate value breaks the pattern: a layer with quantized activations "
              "does not expect the product",
    "attention": "the product holds the attention (or its Q/K/V projections): a layer with quantized activations "
                 "whose attention stayed primitives (mask `unknown`) does not expect it",
}
"""What a pass's `quantization` may say (mode -> what it means for the layer's verdict, `why.policy.not_expected`)."""


def check_words(owner: str, what: str, words: Iterable[str], known: Collection[str]) -> None:
    """Every one of `words` is in `known`.

    Raises:
        RuleError: `[owner] unknown WHAT 'word' (did you mean ...); known: ...` for the first that is not.
    """
    for w in words:
        if w not in known:
            raise RuleError(f"[{owner}] unknown {what} {w!r}{close(str(w), known)}; known: {', '.join(known)}")


__all__ = ["FAMILIES", "FINDING", "FINDING_QUANTIZATION", "GAP_TRAIT_WORDS", "KINDS", "QUANTIZATION", "TRAITS",
           "TRAIT_WORDS", "check_words", "trait_named"]
