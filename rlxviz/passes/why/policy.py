"""What a layer is expected to fuse, by its kind: the one place that decides which refusals count.

The facts come from the trace (`facts`) and the layer's kind (`passes.architecture.classify_layer`); this module
turns them into "expected" and "not expected here", and nothing outside `passes/why/` does. Policy lives on what it
is about and is only read here: a pass declares its product and the layer traits that expect it (`Pass.product`,
`expected_of`, `excused_by`, `unexpected`), a guard where its refusal is excused (`Guard.excused_in`, `excuse`), so a
renamed pass or guard carries its policy with it.
"""

from __future__ import annotations

from typing import Protocol

from ..guard import Guard
from ..pattern import RuleError
from ..pipeline import PASSES
from ..rule import Soft
from ..spelling import close

KINDS = ("post_ln", "pre_ln", "llama", "parallel", "cross_decoder", "attention_only", "no_attention")
"""Every layer kind `passes.architecture.classify_layer` answers."""

TRAITS = (*KINDS, "pre_norm", "kv_cache", "keep_mask")
"""What a pass's `expected_of` / `excused_by` and a guard's `excused_in` may name (`LayerArchitecture.has`)."""

EXPECT_MODES = ("model", "pipeline")
"""What a layer is judged against: `model` (default): every product that is legal for the layer, i.e. what the
canonical pipeline makes of it, so a pipeline without a pass the layer needs cannot pass the check; `pipeline`: only
what the run's own passes could make (the products its missing passes would make are listed, not counted)."""

PRODUCTS: dict[str, str] = {p.name: p.product for p in PASSES.values() if p.product}
"""What each pattern pass produces, as named in a layer's expectations (`Pass.product`, declared on the pass)."""

LAYER_PASS = "fuse_transformer_layer"
"""The pass that turns a whole post-LN layer into one node (`Op.FUSED_TRANSFORMER_LAYER`)."""

FAMILY_PASSES: dict[str, tuple[str, ...]] = {
    "norm": ("canonicalize_norm",), "gelu": ("canonicalize_gelu",), "glu": ("fuse_swiglu",),
    "attention": ("fuse_sdpa",), "where_mask": ("canonicalize_exported", "fuse_sdpa"),
    "activation": ("canonicalize_exported", "fuse_matmul_bias_act"),
}
"""The passes whose rules recognize each `passes.unrecognized` family."""

ILLEGAL_HERE = ("illegal for this layer: no change to the model that keeps its numbers makes it legal (the layer is "
                "fused as far as legal)")


ATTENTION_PASSES = ("fuse_sdpa", "fuse_attention_block", "fuse_transformer_layer", "fuse_shared_input_matmul")
"""Passes whose product holds the attention (or its Q/K/V projections): refused by a quantized attention."""
QUANTIZED_BLOCKS = ("canonicalize_gelu", "unrecognized", "fuse_residual_ln", "fuse_residual_rms_norm")
"""Passes whose pattern a quantization step of an intermediate value breaks (a GELU whose `x / sqrt(2)` or `erf`
is rounded to 8 bits is no GELU; a residual sum quantized before its norm): a layer with quantized activations
(`LayerArchitecture.quantized`) does not expect them, and neither a packed attention whose scores stayed
primitives."""


class LayerKind(Protocol):
    """What the policy reads of a layer's kind (`kinds.LayerArchitecture` is one). `kinds` asks this module, so
    this module names no class of it."""

    @property
    def description(self) -> str: ...
    @property
    def mask(self) -> str | None: ...
    @property
    def evidence(self) -> tuple[str, ...]: ...
    @property
    def kv_cache(self) -> bool: ...
    @property
    def quantized(self) -> int: ...
    @property
    def swiglu(self) -> bool: ...
    @property
    def post_ln(self) -> bool: ...

    def has(self, trait: str) -> bool: ...


def product(pass_name: str) -> str:
    """The product `pass_name` makes, as named in a layer's expectations (the pass name when it makes none)."""
    return PRODUCTS.get(pass_name, pass_name)


def _guards(pass_name: str) -> dict[str, Guard]:
    """The `Guard`s of `pass_name`'s rules by name (a guard shared by several rules once)."""
    p = PASSES.get(pass_name)
    steps = (st.step if isinstance(st, Soft) else st for r in (p.rules if p is not None else ()) for st in r.steps)
    return {g.name: g for g in steps if isinstance(g, Guard)}


def not_expected(arch: LayerKind, pass_name: str, guard: str = "") -> str | None:
    """Why a rejection of `pass_name` at `guard` does not count in a layer of kind `arch` (None: it counts). (A
    refusal that is `illegal` and `read by the model`, the model's own dataflow, is excused per layer by
    `verdict.layer_verdict`: `ILLEGAL_HERE`.)

    Read from what the pass and the guard declare: a trait of the layer in the pass's `excused_by`, or none of its
    `expected_of` (then its `unexpected` says why), or a trait in the guard's `excused_in` (its `excuse`). E.g.
    `FusedTransformerLayer` is expected only of `post_ln`; `FusedAttentionBlock` of `post_ln` and of a layer whose
    attention has a keep mask, never with a KV cache; a residual-norm fusion refused because the residual sum has
    other users is illegal, not missed, in a pre-norm layer. Everything else counts."""
    p = PASSES.get(pass_name)
    if p is not None:
        for trait, why in p.excused_by:
            if arch.has(trait):
                return why
        if p.expected_of and not any(arch.has(t) for t in p.expected_of):
            u = p.unexpected
            return u(arch) if callable(u) else u.format(description=arch.description, mask=arch.mask)
    g = _guards(pass_name).get(guard) if guard else None
    if g is not None and any(arch.has(t) for t in g.excused_in):
        return g.excuse
    if arch.quantized and (pass_name in QUANTIZED_BLOCKS or pass_name in ATTENTION_PASSES and arch.mask == "unknown"):
        return (f"the layer's activations are quantized ({arch.quantized} quantization step(s) of computed values: "
                f"round(x / scale) + zero point, then dequantized): a fused op of the float pattern would skip those "
                f"roundings and change the numbers")
    return None


def check_declarations() -> None:
    """Every layer trait a pass or a guard names is one `LayerArchitecture.has` knows (`kinds.TRAITS`), so a
    misspelt trait fails at import instead of silently expecting nothing.

    Raises:
        RuleError: a pass's `expected_of` / `excused_by`, or a guard's `excused_in`, names an unknown trait, or a guard
            is excused somewhere without saying why.
    """
    for p in PASSES.values():
        for t in (*p.expected_of, *(t for t, _ in p.excused_by)):
            if t not in TRAITS:
                raise RuleError(f"[Pass {p.name}] unknown layer trait {t!r}{close(t, TRAITS)}; known: "
                                f"{', '.join(TRAITS)}")
        if p.expected_of and not p.unexpected:
            raise RuleError(f"[Pass {p.name}] expected_of without `unexpected`: say why the others do not expect it")
        for g in _guards(p.name).values():
            for t in g.excused_in:
                if t not in TRAITS:
                    raise RuleError(f"[Guard {g.name}] unknown layer trait {t!r}{close(t, TRAITS)}; known: "
                                    f"{', '.join(TRAITS)}")
            if g.excused_in and not g.excuse:
                raise RuleError(f"[Guard {g.name}] excused_in without an excuse")


def expected_products(arch: LayerKind) -> list[str]:
    """The fused ops a layer of kind `arch` should end with (for messages)."""
    if arch.post_ln:
        return ["FusedTransformerLayer"]
    out = []
    if arch.mask is not None and not (arch.quantized and arch.mask == "unknown"):
        out.append("packed attention" + (" (grouped-query)" if "grouped-query" in " ".join(arch.evidence) else ""))
        if arch.mask == "keep" and not arch.kv_cache:
            out.append("FusedAttentionBlock")
    if arch.swiglu:
        out.append("FusedSwiGLU")
    return out


__all__ = ["EXPECT_MODES", "FAMILY_PASSES", "ILLEGAL_HERE", "KINDS", "LAYER_PASS", "LayerKind", "PRODUCTS", "TRAITS",
           "check_declarations", "expected_products", "not_expected", "product"]


check_declarations()
