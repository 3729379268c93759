"""A place held by the model's own term (`caveat.own_term_behind`: t5's cross-attention, refused by the gap
`default_scale`, whose compiler fix alone would only uncover `self_attention`), as data: `Held`, and the term's
refusal the run recorded there (`term_refusal`), found by the guard `caveat.next_blocker` hands out.

Below `standing` (which judges a refusal's standing and makes `Held` of a place, `standing.held_place`) and `excused`
(whose run's list of the model's own terms names those places, `excused.held_lines`), so both word the place from
this one record and neither reads the guard back out of words.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..refusal_kinds import MODEL_TERM
from ..trace import Rejection, Trace
from .caveat import held_also, next_blocker


@dataclass(frozen=True)
class Held:
    """A place held by the model's own term (`caveat.own_term_behind`: t5's cross-attention, refused by the gap
    `default_scale`, whose compiler fix alone would only uncover `self_attention`), as data every view words itself.

    Attributes:
        term: the term's refusal the run recorded at the place (a further failing guard, `term_refusal`), or None.
        blocker: what the gap's compiler fix alone uncovers (`caveat.fix_blocker`: `self_attention (the model's own
            term)`), said where the run recorded no term's refusal.
        gaps: the op forms rlxviz lacks there (`policy.op_gaps`), e.g. `FusedAttentionBlock with a scale attribute`.
        guard: the gap's guard (the place's headline refusal's, `default_scale`).
        pass_name: the refused pass, whose product the gap's fix alone would not form (`policy.PRODUCTS`).
    """

    term: Rejection | None
    blocker: str
    gaps: tuple[str, ...]
    guard: str
    pass_name: str

    @property
    def also(self) -> str:
        """The gap it also runs into, after the term (`caveat.held_also`): `it also runs into a gap in rlxviz's ops,
        ... (default_scale), whose compiler fix alone would not form FusedAttentionBlock here`."""
        return held_also(list(self.gaps), self.guard, self.pass_name)

    @property
    def why(self) -> str:
        """The place's standing reason (`standing`'s, with `MODEL_TERM`): the term's refusal (`GUARD (the model's own
        term): MESSAGE`, else `blocker`), then `also`."""
        said = f"{self.term.guard} ({MODEL_TERM}): {self.term.message}" if self.term is not None else self.blocker
        return f"{said}; {self.also}"


def term_refusal(trace: Trace, rule: str, anchor: int, guard: str) -> Rejection | None:
    """The refusal of `rule` at `anchor` by the guard that the compiler fix of its refusal by `guard` alone uncovers
    (`caveat.next_blocker`'s `guard`: t5's cross-attention `self_attention`), as the run recorded it (a further
    failing guard); None when the run recorded none, or nothing fails next."""
    term = next_blocker(trace, rule, anchor, guard).guard
    return next((x for s in trace.steps for x in s.rejections
                 if (x.rule, x.anchor, x.guard) == (rule, anchor, term)), None) if term else None


__all__ = ["Held", "term_refusal"]
