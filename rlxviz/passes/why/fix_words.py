"""What the compiler fix of a gap in rlxviz's ops asks, in one wording: `explain`'s headline (`text.gap_words`, over
its layers), the app's start strip (one layer), the `△` chip head (over a pass's places, `places.Places`) and the
cost test's words where a gap holds the attention block it protects back (`report.block_in_context`, one place).
Each says the same facts (`OpGap.blocker`, `OpGap.unchecked`, `OpGap.workaround`, `OpGap.rounded`, or the same
checks per place: `standing.place_fix_alone`, `caveat.model_fix_note`) with the functions here, so no view says
"the compiler fix forms it" where another says that fix alone is not enough (newcomer run 38: gptj.ts-eager).
Imports nothing of the verdict: `report` reads it, and the verdict reads `report`.
"""

from __future__ import annotations

from ..refusal_kinds import ROUNDING_ONLY
from .policy import WORKAROUND

GAP_IS_THE_COMPILERS = "a compiler fix, nothing in the model to change"
"""What a gap in rlxviz's ops asks of whom (the headline's count, the app's chip mark for such places)."""
_UNCHECKED = "not checked whether the fix alone is enough{of} (no what-if builds it there)"
UNCHECKED_ALONE = _UNCHECKED.format(of=" in {n} of them")
"""What the headline adds after `GAP_IS_THE_COMPILERS` for the layers whose gaps' compiler fix no what-if checks
(`excused.OpGap.unchecked`): codegen.qdyn's int8 block, refused at `qkv_packed` (a structure miss) before its RoPE
guards ran, read as the one fix needed while its interleaved, partial rotary RoPE would fail next."""

FIX_FORMS_IT = "the compiler fix forms it"
"""What the cost test's words say of a protected attention block a gap in rlxviz's ops holds back where that gap's
compiler fix alone is checked and enough (`block_fix_words`): cohere's interleaved RoPE."""

_WORKAROUND = WORKAROUND.split("{fix}")[0].rstrip(": ")
"""How a gap line names a model-side workaround beside its compiler fix (`policy.WORKAROUND`): `a workaround in the
model`."""


def workaround_words(worked: int, rounded: int, one: bool) -> str:
    """The words of a checked change to the model that works around a gap (`caveat.model_fix_note`) after the compiler
    fix, `; ...`: `; a workaround in the model too (its gap line names it)` for `one` layer or place, else `; a
    workaround in the model in 2 of them (their gap lines name it)`, saying where the change keeps the numbers only
    up to rounding (`it changes the numbers at rounding level only; `, or `in 1 of them it ...` where not every one
    does); "" for `worked` 0. `worked`: how many layers or places have one (`OpGap.workaround`); `rounded`: how many
    of those only up to rounding (`OpGap.rounded`, `caveat.model_fix_rounded`)."""
    if not worked:
        return ""
    exactly = ("" if not rounded else f"it {ROUNDING_ONLY}; " if rounded == worked else
               f"in {rounded} of them it {ROUNDING_ONLY}; ")
    if one:
        return f"; {_WORKAROUND} too ({exactly}its gap line names it)"
    return f"; {_WORKAROUND} in {worked} of them ({exactly}their gap lines name it)"


def compiler_fix_words(blockers: list[tuple[str, str]], unchecked: int, several: bool, workaround: str = "",
                       one: bool = False) -> str:
    """What the compiler fix for a gap in rlxviz's ops asks, after `rlxviz lacks FORMS: `: `GAP_IS_THE_COMPILERS`
    where its fix alone is enough, else `a compiler fix; alone it is not enough in N of them: BLOCKER fails next`.
    The headline (`text.gap_words`, over its layers) and the app's `△` chip head (over a pass's places,
    `places.Places.gap_blockers`) word the same facts with it. `blockers`: `(form, blocker)` of each layer or place
    whose fix alone is not enough (`OpGap.blocker`, `standing.place_fix_alone`); `unchecked`: how many of them have
    a fix no what-if checks alone (`OpGap.unchecked`), said only where no blocker is; `several`: rlxviz lacks
    several forms there, so each form is said with what fails next after its fix alone (albert.ortopt: two gaps,
    each fix alone leaves the other: "the fix for X, Y alone ...: y, x fails next" read as a contradiction);
    `workaround`: the words of a checked change to the model (`workaround_words`), "" without; `one`: the words are
    of one place, so no `in N of them` (`block_fix_words`)."""
    of = "" if one else " in {n} of them"
    unsure = f"; {_UNCHECKED.format(of=of).format(n=unchecked)}" if unchecked and not blockers else ""
    if not blockers and not workaround:
        return f"{GAP_IS_THE_COMPILERS}{unsure}"
    # the compiler fix alone leaves a refusal standing (`caveat.fix_blocker`), or a checked change to the model makes
    # the fusion too (`caveat.model_fix_note`): "nothing in the model to change" is not true there, so the words
    # say what fails next, and in how many the model can be changed instead
    n = of.format(n=len(blockers))
    if several:
        pairs = dict.fromkeys(blockers)
        alone = (f"; a fix alone is not enough{n}: "
                 + "; ".join(f"with the fix for {form} alone, {blocker} fails next" for form, blocker in pairs)
                 if blockers else "")
    else:
        alone = (f"; alone it is not enough{n}: "
                 f"{', '.join(dict.fromkeys(b for _, b in blockers))} fails next" if blockers else "")
    return f"a compiler fix{alone}{unsure}{workaround}"


def block_fix_words(blocker: str, unchecked: bool) -> str:
    """What the cost test's words say of the compiler fix of the gap that holds the attention block it protects back
    (`report.block_in_context`), from that block refusal's own checks (`caveat.fix_blocker`, `caveat.fix_unchecked`):
    `FIX_FORMS_IT` where that fix alone is checked and enough, else the headline's words for one place
    (`compiler_fix_words`): `a compiler fix; alone it is not enough: rope_halves (a gap in rlxviz's ops:
    FusedAttentionBlock with interleaved RoPE) fails next` (gptj's partial rotary RoPE), or `a compiler fix, nothing
    in the model to change; not checked whether the fix alone is enough (no what-if builds it there)`."""
    if not blocker and not unchecked:
        return FIX_FORMS_IT
    return compiler_fix_words([("", blocker)] if blocker else [], int(unchecked), False, one=True)


__all__ = ["FIX_FORMS_IT", "GAP_IS_THE_COMPILERS", "UNCHECKED_ALONE", "block_fix_words", "compiler_fix_words",
           "workaround_words"]
