"""Teaching variants as the session applies them: one list (`rlxviz.models.VARIANTS`), one shape rule.

A variant either rewrites one layer of a built BERT graph (`Variant.changes_graph`) or, for
`over_threshold`, raises batch*seq above the attention-fusion gate so the size guard rejects it.
"""

from __future__ import annotations

import dataclasses

from ..models import PRESETS, VARIANTS, Variant
from ..passes.pipeline import RLX_FAB_MAX_TOKENS
from .errors import SessionError

OVER_THRESHOLD = "over_threshold"
"""The variant that teaches the size gate: batch*seq above `fab_max_tokens` (RLX's 64 when no gate is set)."""

RLX_THRESHOLD = RLX_FAB_MAX_TOKENS
"""RLX's default batch*seq gate for attention fusion (`fab_max_tokens` of the `rlx` profile)."""


def teaching_cases() -> dict[str, str]:
    """Every teaching variant but `none`, with its one line on what it changes (from `models.VARIANTS`)."""
    return {name: v.doc for name, v in VARIANTS.items() if name != "none"}


def variant_named(name: str | None, layer: int = 0) -> Variant | None:
    """The `Variant` record for `name` applied to `layer` (None for `None` or `none`).

    Raises:
        SessionError: unknown name (the message lists the known ones).
    """
    if name in (None, "none"):
        return None
    if name not in VARIANTS:
        raise SessionError(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}")
    return dataclasses.replace(VARIANTS[name], layer=layer)


def preset_is_bert(name: str) -> bool:
    """True when preset `name` is a BERT encoder (where teaching variants apply); the presets built by
    `rlxviz.models.llama` are decoder blocks."""
    fn = PRESETS[name][0] if name in PRESETS else None
    return fn is not None and not fn.__module__.endswith(".llama")


SOURCE_KINDS = ("preset", "checkpoint", "onnx", "ir")
"""Where a model comes from, as `variant_unavailable` tells them apart."""


def variant_unavailable(name: str | None, source: str, model: str, bert: bool = True) -> str:
    """Why teaching variant `name` does not apply to `model` ('' when it does; always '' for None/`none`).

    Every variant, `over_threshold` included, is a lesson on a BERT encoder built from a preset or a checkpoint:
    the layer variants rewrite a BERT layer, and `over_threshold` raises seq to push the BERT attention block over
    its size gate (a decoder's or an ONNX export's attention never becomes that block, and an export's positions
    or an IR file's shapes are fixed). `source` is one of `SOURCE_KINDS`; `bert` whether the model is a BERT
    encoder (presets: `preset_is_bert`). Raises nothing.
    """
    if name in (None, "none"):
        return ""
    if source == "ir":
        return (f"{model}: teaching variants apply to BERT presets and checkpoints, not IR files (their shapes "
                "are their own)")
    if source == "onnx":
        return (f"{model}: teaching variants apply to BERT presets and checkpoints, not ONNX files (an export's "
                "graph and position table are fixed)")
    if not bert:
        return (f"{model} is not a BERT encoder: teaching variants ({name} too) change or size a BERT layer; "
                "pick a BERT model (minilm, bert-tiny, ...)")
    return ""


def graph_variant(variant: Variant | None) -> Variant | None:
    """What a model builder gets: the variant when it rewrites the graph, else None."""
    return variant if variant is not None and variant.changes_graph else None


def effective_threshold(variant: Variant | None, threshold: int | None) -> int | None:
    """The batch*seq attention gate a pipeline runs with: `threshold`, or RLX's 64 for `over_threshold`
    when no threshold is set (None: no gate)."""
    if threshold is None and variant is not None and variant.over_threshold:
        return RLX_THRESHOLD
    return threshold


def effective_seq(variant: Variant | None, batch: int, seq: int, threshold: int | None,
                  max_seq: int | None = None) -> int:
    """The sequence length a model is built with: `seq`, raised for `over_threshold` to the smallest length
    that puts batch*seq over the effective threshold (capped at `max_seq` when given)."""
    limit = effective_threshold(variant, threshold)
    if variant is None or not variant.over_threshold or limit is None:
        return seq
    need = limit // max(batch, 1) + 1
    if max_seq is not None:
        need = min(need, max_seq)
    return max(seq, need)


MODEL_WIDE = "model-wide: a size gate applies to every layer, so the layer to break does not apply"
"""Why `over_threshold` changes no one layer, as the CLI and the app both say it."""


def gate_note(name: str | None, threshold: int | None) -> str:
    """Where the attention gate a run uses comes from, in words, when teaching variant `name` sets it: "the gate 64
    (pipeline param fab_max_tokens) is set by this variant" for `over_threshold` with no `threshold` asked; ''
    otherwise (the gate is the pipeline's or the one asked for). Raises SessionError for an unknown name."""
    v = variant_named(name)
    limit = effective_threshold(v, threshold)
    if v is None or not v.over_threshold or threshold is not None or limit is None:
        return ""
    return f"the gate {limit} (pipeline param fab_max_tokens, RLX's profile) is set by this variant"


def variant_note(name: str | None, batch: int, seq: int, threshold: int | None, max_seq: int | None = None) -> str:
    """One line on what `over_threshold` does to a run, the same words for the CLI and the app: model-wide, the
    gate it applies and who set it, and the sequence length it builds with (`seq` raised over the gate); '' for
    another variant (each changes the one layer it names). `batch` and `seq` are the shape asked for (tokens).
    Raises SessionError for an unknown name."""
    v = variant_named(name)
    limit = effective_threshold(v, threshold)
    if v is None or not v.over_threshold or limit is None:
        return ""
    built = effective_seq(v, batch, seq, threshold, max_seq)
    raised = f"seq raised from {seq} to {built}, so " if built != seq else ""
    over = "over" if batch * built > limit else "still not over"
    who = gate_note(name, threshold) or f"the gate {limit} is the one asked for (--threshold)"
    return (f"teaching variant {name}: {MODEL_WIDE}; {raised}batch*seq = {batch}*{built} = {batch * built} is "
            f"{over} the attention gate {limit}; {who}")


__all__ = ["MODEL_WIDE", "OVER_THRESHOLD", "RLX_THRESHOLD", "SOURCE_KINDS", "effective_seq", "effective_threshold",
           "gate_note", "graph_variant", "preset_is_bert", "teaching_cases", "variant_named", "variant_note",
           "variant_unavailable"]
