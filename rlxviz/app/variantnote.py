"""The teaching variant's notice after a run (`variant_notice`): which guard the variant trips, in the Why tab's words
where its layer is drawn, and what the variant is meant to show and whether the run agrees (`variant_meant`). It reads
the run's refusals as the version chips count them (`passes.why.standing.standing`: near-misses only) and selects the
layer and the nodes it names. `runs.Runs` says it in the message after each load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import session
from ..models import VARIANTS
from ..passes.why.standing import standing
from .derived import refusals
from .wording import SHAPE_VARIANT, VARIANT_LABELS

if TYPE_CHECKING:  # for annotations only: the state imports `runs`, which imports this module
    from .state import AppState


def variant_notice(s: AppState) -> str:
    """The notice of `s`'s teaching variant (not `none`) on its run: `Teaching variant 'LABEL' (MEANT): ...`, the
    layer's first rejection as the Why tab words it, else the gap in rlxviz's ops that holds the layer back (its
    `rlxviz's ops lack:` line: tanh-GELU), else (a layer fused only as far as legal) the refusal illegal for it, else
    the run's first near-miss, else that no pass rejected anything. Selects the variant's layer and highlights the
    refusal's nodes (the Why tab opens there).

    Raises:
        KeyError: `s.variant` is not a teaching variant.
    """
    layer = None if s.variant == SHAPE_VARIANT else s.variant_layer
    rej = [r for r in s.trace.rejections  # near-misses by the verdict's rule, as the chips count them
           if (layer is None or r.layer == layer) and standing(s.trace, r) is None]
    label = VARIANT_LABELS[s.variant]
    shape = ""
    if s.variant == SHAPE_VARIANT and s.effective_threshold is not None:
        b, sq, limit = s.batch, s.effective_seq, s.effective_threshold
        raised = (f"The sequence length was raised from {s._seq_raised[0]} to {sq} (see Sequence length) so "
                  if s._seq_raised else "")
        over = "is over" if b * sq > limit else "is still not over"
        shape = f" {raised}batch*seq = {b}*{sq} = {b * sq} {over} the attention threshold {limit}."
        # the gate it sets (shown in the sidebar's Attention gate box) and that it is model-wide, first: the
        # banner opens folded to one line; the same words as `rlxviz explain --variant` (`variant_note`)
        who = session.gate_note(s.variant, s.threshold)
        gate = f" {who[0].upper()}{who[1:]} (see Attention gate)." if who else ""
        shape = f" {session.MODEL_WIDE[0].upper()}{session.MODEL_WIDE[1:]}.{shape}{gate}"
    status = s.layer_status(layer) if layer is not None and layer in s.layers() else None
    if status is not None and status.first is not None:  # the Why tab's answer, word for word
        first = status.first
        shown = next((r for r in rej if (r.rule, r.guard) == (first.rule, first.guard)), None)
        s.param.update(selected_layer=layer, highlight=list(
            (shown.offending or (shown.anchor,)) if shown is not None else first.nodes))
        verdict = "fused" if status.fused else "NOT fused"
        text = (f"Teaching variant '{label}':{shape} layer {layer} {verdict}; first rejection {first.rule} at "
                f"guard {first.guard}: {first.message}")
    elif status is not None and status.gaps:  # held back by rlxviz's ops: the Why tab's `rlxviz's ops lack:` line
        gap = status.gaps[0]
        s.param.update(selected_layer=layer, highlight=list(gap.at))
        text = f"Teaching variant '{label}':{shape} layer {layer} {status.status}; rlxviz's ops lack {gap}"
    elif status is not None and status.illegal:  # fused as far as legal: the refusal illegal for the layer, named
        first = status.illegal[0]
        s.param.update(selected_layer=layer, highlight=list(first.nodes))
        text = (f"Teaching variant '{label}':{shape} layer {layer} {status.status}; {first.rule} is illegal here "
                f"(guard {first.guard}): {first.message}")
    elif rej:
        first = rej[0]
        s.param.update(selected_layer=layer if layer is not None else first.layer,
                       highlight=list(first.offending or (first.anchor,)))
        text = (f"Teaching variant '{label}':{shape} {first.pass_name} rejected at guard {first.guard}: "
                f"{first.message}")
    else:
        where = "" if layer is None else f" in layer {layer}"
        text = f"Teaching variant '{label}':{shape} no pass rejected anything{where}."
        if status is not None:  # a variant meant to keep the fusion: the Why tab opens on its layer too
            s.param.update(selected_layer=layer, highlight=[])
    return text.replace(f"Teaching variant '{label}':", f"Teaching variant '{label}' ({variant_meant(s)}):", 1)


def variant_meant(s: AppState) -> str:
    """What `s`'s teaching variant is meant to show (`Variant.breaks`), and whether the run agrees: its layer's
    status where that layer is drawn, else whether any chip counts a near-miss."""
    v = VARIANTS[s.variant]
    layer = None if s.variant == SHAPE_VARIANT else s.variant_layer
    st = s.layer_status(layer) if layer is not None and layer in s.layers() else None
    # as the headline counts: a layer held back by rlxviz's ops is not "fused", and a product left unmade because it
    # is illegal for the layer (`legal_only`) is a fusion the variant broke
    fused = (st.fused and not st.gap_only and not st.legal_only if st is not None
             else not any(refusals(step, s.trace) for step in s.trace.steps))  # as the chips count
    if v.breaks:
        return "meant to break the fusion" + ("; yet it fused" if fused else "")
    return "meant to keep the fusion: the rules should still fuse it" + ("" if fused else "; yet it did not fuse")


__all__ = ["variant_meant", "variant_notice"]
