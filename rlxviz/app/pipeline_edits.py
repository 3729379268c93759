"""Editing the app's pipeline: which passes (and stages of a pass) run, in what order, and the attention gate. A
mixin of `AppState`: its methods read and write the state's `passes`, `disabled`, `variant` and `threshold`."""

from __future__ import annotations

from .. import session
from ..models import VARIANTS
from ..passes import CANONICAL_ORDER, DEFAULT_PARAMS, PASSES
from ..passes.pipeline import STAGES


def move_position(order: list[str], off: list[int], i: int, delta: int) -> tuple[list[str], list[int]] | None:
    """(`order` with position `i` swapped with position `i + delta`, `off` positions renumbered so each pass keeps
    its on/off state), or None when either position is out of range."""
    j = i + delta
    if not (0 <= i < len(order) and 0 <= j < len(order)):
        return None
    moved = list(order)
    moved[i], moved[j] = moved[j], moved[i]
    swap = {i: j, j: i}
    return moved, sorted(swap.get(k, k) for k in off)


class PipelineEdits:
    """The pipeline rows of `AppState` (`passes`, `disabled`, `threshold`): what runs, and the edits the sidebar's
    pipeline controls make."""

    passes: list[str]
    disabled: list[int]
    variant: str
    threshold: int | None

    @property
    def enabled_passes(self) -> list[str]:
        """The passes (and stages of a pass, `fuse_sdpa/rope_heads`) that run, in order."""
        return [p for i, p in enumerate(self.passes) if i not in self.disabled]

    @property
    def pipeline_spec(self) -> list[str]:
        """What `session.build_pipeline` runs: the enabled passes in order, and `-STAGE` for each stage row switched
        off (a stage runs with its pass, before it, wherever its row is; a stage with no row runs)."""
        return ([p for p in self.enabled_passes if p not in STAGES]
                + [f"-{p}" for i, p in enumerate(self.passes) if i in self.disabled and p in STAGES])

    @property
    def effective_threshold(self) -> int | None:
        """The batch*seq attention gate passed to the pipeline (RLX's 64 for the over-threshold variant
        when no threshold is set)."""
        return session.effective_threshold(VARIANTS[self.variant], self.threshold)

    def toggle_pass(self, i: int, enabled: bool) -> None:
        """Switch pass position `i` on or off."""
        off = set(self.disabled)
        off.discard(i) if enabled else off.add(i)
        self.disabled = sorted(off)

    def move_pass(self, i: int, delta: int) -> None:
        """Move pass position `i` up (-1) or down (+1), keeping its on/off state."""
        if (moved := move_position(self.passes, self.disabled, i, delta)) is not None:
            self.param.update(passes=moved[0], disabled=moved[1])

    def remove_pass(self, i: int) -> None:
        """Drop pass position `i` from the pipeline."""
        if 0 <= i < len(self.passes):
            self.param.update(passes=self.passes[:i] + self.passes[i + 1:],
                              disabled=[k - (k > i) for k in self.disabled if k != i])

    def add_pass(self, name: str) -> None:
        """Append pass `name` (enabled). Raises ValueError for an unknown pass."""
        known = self.available_passes()
        if known and name not in known:
            raise ValueError(f"unknown pass {name!r}; known: {', '.join(known)}")
        self.passes = [*self.passes, name]

    def canonical_passes(self) -> list[str]:
        """The pipeline's canonical pass order, each pass's stages (`fuse_sdpa/unfold_heads`, ...) listed before it
        as rows of their own, so each can be switched off like a pass."""
        return [q for p in CANONICAL_ORDER for q in (*(st.name for st in PASSES[p].stages), p)]

    def available_passes(self) -> list[str]:
        """Every pass a user may add."""
        return list(PASSES)

    def default_threshold(self) -> int | None:
        """The canonical pipeline's attention gate on batch*seq (`fab_max_tokens`; None = no gate)."""
        return DEFAULT_PARAMS.get("fab_max_tokens")

    def reset_pipeline(self) -> None:
        """Canonical order, every pass enabled, default threshold."""
        self.param.update(passes=self.canonical_passes(), disabled=[], threshold=None)


__all__ = ["PipelineEdits", "move_position"]
