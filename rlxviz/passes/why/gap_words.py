"""How a place at gaps in rlxviz's ops names them: one wording for the drawing's `△` label (`viz.overlay`), the Model
Explorer export (`viz.model_explorer`) and `explain -v`'s per-rule tag (`why.places.outcome_standing`), so esm.qdyn's
one refusal at its attention reads `2 gaps in rlxviz's ops: its integer-matmul Q/K/V projections (integer_qkv),
default_scale` wherever it is marked, never the gap its failing guard names alone. Imports nothing of the verdict: the
overlay is drawn without it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from ..declarations import trait_named

GapNames = tuple[tuple[str, str], ...]
"""`(op form, short name)` of each gap in rlxviz's ops a place ran into (`passes.why.standing.place_gap_names`)."""


def trait_worded(gaps: Iterable[tuple[str, str]], guards: Collection[str]) -> GapNames:
    """`gaps` (`(op form, short name)`, `passes.why.standing.place_gap_names`) with each name that is none of the
    place's failing `guards` (a layer trait under which the pass makes no product) said as what it is in the model,
    `its Q and K normalized before the attention (qk_norm)` (`passes.declarations.trait_named`, as the text's
    `rlxviz's ops lack:` line says it): qwen3's title said `gap in rlxviz's ops: qk_norm` beside its cluster label
    `qkv_packed (gap in rlxviz's ops)`, a trait read as a second guard."""
    return tuple((f, n if n in guards or " " in n else trait_named(n)) for f, n in gaps)


def group_words(group: str, gaps: GapNames) -> str:
    """A gap group (`viz.overlay.is_gap`, e.g. `gap in rlxviz's ops`) with the gaps its place ran into
    (`viz.overlay.gap_names`): the group alone for one gap met by one guard (or none), else each gap's name, counted
    by op form: `2 gaps in rlxviz's ops: its integer-matmul Q/K/V projections (integer_qkv), default_scale` (esm: two
    forms), `gap in rlxviz's ops: ln1_residual_scaled, ln2_residual_scaled` (DeepNorm: one form, two guards)."""
    forms, names = dict.fromkeys(f for f, _ in gaps), list(dict.fromkeys(n for _, n in gaps))
    if len(names) < 2:
        return group
    head = group.replace("gap ", f"{len(forms)} gaps ", 1) if len(forms) > 1 else group  # `△ 2 gaps in ...`
    return f"{head}: {', '.join(names)}"


__all__ = ["GapNames", "group_words", "trait_worded"]
