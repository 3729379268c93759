"""The caveat a line naming a compiler fix carries when that fix, checked at the refusing rule alone
(`passes.whatif.fix_alone_blocker`), still leaves the fusion refused: one wording (`CAVEAT`) for a not-expected
line's reason (`fix_caveat`, read by `verdict.standing`) and `explain -v`'s `fix: none in the model` line
(`session.advice`).
"""

from __future__ import annotations

from ..trace import Trace
from ..whatif import Blocker, fix_alone_blocker
from .facts import RunFacts
from .kinds import LayerArchitecture as Architecture
from .policy import lacks_product

CAVEAT = "alone it is not enough: {blocker} fails next"
"""What a line that names a compiler fix adds to it when that fix, checked at the refusing rule alone
(`alone_caveat`), still leaves the fusion refused: a not-expected line's reason (`fix_caveat`) and `explain -v`'s
`fix: none in the model: ... (compiler fix: ...)` line (`session.advice`)."""


def blocker_name(guard: str, blocker: Blocker | None) -> str:
    """What still stands after the compiler fix of a refusal by `guard` (`passes.whatif.fix_alone_blocker`'s
    `blocker`), as the caveat names it: `residual_same_shape (not a candidate)`, the guard alone when it is `guard`
    itself; "" when nothing stands (None)."""
    if blocker is None:
        return ""
    return blocker[0] if blocker[0] == guard else f"{blocker[0]} ({blocker[1]})"


def caveat_words(blocker: str) -> str:
    """`CAVEAT` for a compiler fix that leaves `blocker` standing (`blocker_name`): `alone it is not enough:
    residual_same_shape (not a candidate) fails next`; "" when nothing stands ("")."""
    return CAVEAT.format(blocker=blocker) if blocker else ""


def alone_caveat(guard: str, blocker: Blocker | None) -> str:
    """`CAVEAT` for the compiler fix of a refusal by `guard` whose check at its rule alone
    (`passes.whatif.fix_alone_blocker`) left `blocker` standing: `alone it is not enough: residual_same_shape (not a
    candidate) fails next` (the guard alone when it is `guard` itself); "" when nothing stands (None). The one wording
    of that caveat, wherever a line names the compiler fix."""
    return caveat_words(blocker_name(guard, blocker))


def fix_blocker(trace: Trace, rule: str, anchor: int, guard: str, arch: Architecture) -> str:
    """What fails next (`blocker_name`) when the compiler fix that the not-expected reason of the refusal of `rule` at
    `anchor` by `guard` names is checked at its rule alone (`passes.whatif.fix_alone_blocker`, the check behind
    `explain -v`'s `checked at this rule alone`), e.g. deit's `sum_single_user`: a two-output FusedResidualLN passes
    it, then `residual_same_shape (not a candidate)` fails; "" when the fix is enough, nothing is known, or the reason
    names the pass's whole missing form (`policy.lacks_product`), not the guard's fix. Checked once per refusal and
    trace; the structured fact behind `fix_caveat`."""
    facts = RunFacts.of(trace)
    key = ("fix_blocker", rule, anchor, guard)
    if key not in facts.cache:
        facts.cache[key] = ""
        pass_name = rule.split(".")[0]
        if not lacks_product(arch, pass_name):
            hit = next(((k, r) for k, s in enumerate(trace.steps) if s.pass_name == pass_name for r in s.rejections
                        if (r.rule, r.anchor, r.guard) == (rule, anchor, guard) and r.fix), None)
            facts.cache[key] = blocker_name(guard, fix_alone_blocker(trace, *hit) if hit is not None else None)
    return facts.cache[key]


def fix_caveat(trace: Trace, rule: str, anchor: int, guard: str, arch: Architecture) -> str:
    """`CAVEAT` for the refusal of `rule` at `anchor` by `guard` when the compiler fix its not-expected reason names
    does not make the match (`fix_blocker`); "" when it does or nothing is known."""
    return caveat_words(fix_blocker(trace, rule, anchor, guard, arch))


__all__ = ["CAVEAT", "alone_caveat", "blocker_name", "caveat_words", "fix_blocker", "fix_caveat"]
