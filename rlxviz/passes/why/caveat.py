"""The caveat a line naming a compiler fix carries when that fix, checked at the refusing rule alone
(`passes.whatif.fix_alone_blocker`), still leaves the fusion refused: one wording (`CAVEAT`) for a not-expected
line's reason (`fix_caveat`, read by `standing.standing`) and `explain -v`'s `fix: none in the model` line
(`session.advice`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..architecture import classify_layer
from ..guard import IN_MODEL
from ..pipeline import PASSES, STAGES
from ..refusal_kinds import MODEL_TERM, NOT_RECOGNIZED
from ..report import user_origin
from ..trace import Trace
from ..whatif import (
    MODEL,
    Blocker,
    fix_alone_blocker,
    fix_alone_fail,
    fix_alone_readers,
    fix_form,
    what_if,
    without_guard,
)
from .facts import RunFacts
from .kinds import LayerArchitecture as Architecture
from .policy import PRODUCTS, WORKAROUND, op_gaps

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


MADE_READERS = ("{guard} ({kind} while the {what} reads there, a reader rlxviz's own {rule} made from your nodes: "
                "the fusion would hide the value it reads, and {product} has no form that takes it in; a compiler "
                "fix, nothing in the model to change)")
"""A blocker's name (`blocker_name`) when every reader its failure highlights was made by one of rlxviz's own
rewrites (`made_readers`): gpt-neox's attention output is read by the exporter's sdpa NaN guard, which
`canonicalize_exported.nan_guard_moved` moved past the head merge, and `attn_single_user (illegal)` alone read as a
fault of the model. The words say who made the reader, what the fusion would cost (it would hide the value), that the
product (`{product}`, `policy.PRODUCTS`: FusedAttentionBlock) cannot take that reader in, and that nothing in the
model is to change: the guard is what a -inf mask fill needs (dropping it, or a finite fill, changes a fully masked
row's numbers), so it is rlxviz's op and rewrite that hold the layer back, not a form of the model its patterns miss
(issue 39: "ops and patterns" read as the latter). The kind is said as holding while that reader reads there:
`illegal: read there by ...` read as "no fused op could ever take it"."""


def made_readers(trace: Trace, readers: tuple[int, ...]) -> tuple[str, str] | None:
    """`(rule, what)` when every node of `readers` was made by one rewrite of the run (`report.user_origin`): `what`
    is that rule's `form` (`sdpa NaN guard moved past the head merge`), `nodes` when it has none; None when a reader
    is the user's own node or a product, the readers come from several rules, or there are none."""
    origins = [user_origin(trace, i) for i in readers]
    rules = {o[0] for o in origins if o is not None}
    if not origins or None in origins or len(rules) != 1:
        return None
    (rule,) = rules
    p = STAGES.get(rule.split(".")[0]) or PASSES.get(rule.split(".")[0])
    form = next((x.form for x in (p.rules if p is not None else ()) if x.name == rule), "")
    return rule, form or "nodes"


CAVEAT_OF = "the {guard} fix alone is not enough: {blocker} fails next"
"""`CAVEAT` on a line whose compiler fix joins several gaps' fixes (`caveat_words` with `guard`): the check behind it
(`passes.whatif.fix_alone_blocker`) applied the refusing guard's own fix alone, never the others. esm.qdyn's gap line
names the int8 block (with a shared-input merge of integer matmuls) and the Q pre-scale fold, then said `alone it is
not enough: qkv_packed (not recognized) fails next`, read as the whole fix failing; only the fold was checked."""


def caveat_words(blocker: str, guard: str = "") -> str:
    """`CAVEAT` for a compiler fix that leaves `blocker` standing (`blocker_name`): `alone it is not enough:
    residual_same_shape (not a candidate) fails next`; with `guard` (a line naming several gaps' fixes), `CAVEAT_OF`:
    `the default_scale fix alone is not enough: qkv_packed (not recognized) fails next`, saying whose fix was
    checked; "" when nothing stands ("")."""
    if not blocker:
        return ""
    return CAVEAT_OF.format(guard=guard, blocker=blocker) if guard else CAVEAT.format(blocker=blocker)


def alone_caveat(guard: str, blocker: Blocker | None) -> str:
    """`CAVEAT` for the compiler fix of a refusal by `guard` whose check at its rule alone
    (`passes.whatif.fix_alone_blocker`) left `blocker` standing: `alone it is not enough: residual_same_shape (not a
    candidate) fails next` (the guard alone when it is `guard` itself); "" when nothing stands (None). The one wording
    of that caveat, wherever a line names the compiler fix."""
    return caveat_words(blocker_name(guard, blocker))


@dataclass(frozen=True)
class NextBlocker:
    """What fails next when the compiler fix of one refusal is checked at its rule alone
    (`passes.whatif.fix_alone_blocker`), as data: the guard the views compare and look up, beside the words they say.

    Attributes:
        guard: the guard that fails next (t5's cross-attention: `self_attention`); "" when the fix is enough or
            nothing is known.
        words: how a caveat names it (`blocker_name`, `MADE_READERS`, `GAP_BLOCKER`): `self_attention (the model's own
            term)`; "" with no guard.
        kind: its refusal kind (`passes.refusal_kinds`, e.g. `not recognized`), "" with none.
        own: it is rlxviz's own doing (`fix_blocker_own`).
        made_by: the rewrite of rlxviz's that made every reader it highlights (`fix_blocker_made_by`), else "".
    """

    guard: str = ""
    words: str = ""
    kind: str = ""
    own: bool = False
    made_by: str = ""


def next_blocker(trace: Trace, rule: str, anchor: int, guard: str) -> NextBlocker:
    """`NextBlocker` of the refusal of `rule` at `anchor` by `guard`: what fails next when the compiler fix its
    not-expected reason names is checked at its rule alone, checked once per refusal and trace (`_fix_blocker`). What
    `fix_blocker`, `fix_blocker_kind`, `fix_blocker_own` and `fix_blocker_made_by` read, and the one source of the
    guard that fails next (never cut out of `words`)."""
    return _fix_blocker(trace, rule, anchor, guard)


def fix_blocker(trace: Trace, rule: str, anchor: int, guard: str) -> str:
    """What fails next (`blocker_name`) when the compiler fix that the not-expected reason of the refusal of `rule` at
    `anchor` by `guard` names is checked at its rule alone (`passes.whatif.fix_alone_blocker`, the check behind
    `explain -v`'s `checked at this rule alone`), e.g. deit's `sum_single_user`: a two-output FusedResidualLN passes
    it, then `residual_same_shape (not a candidate)` fails; "" when the fix is enough or
    nothing is known. Checked once per refusal and trace; the structured fact behind `fix_caveat` (`next_blocker`'s
    `words`)."""
    return _fix_blocker(trace, rule, anchor, guard).words


def fix_blocker_kind(trace: Trace, rule: str, anchor: int, guard: str) -> str:
    """The refusal kind (`passes.refusal_kinds`, e.g. `not recognized`) of what `fix_blocker` names as failing next;
    "" when it names nothing."""
    return _fix_blocker(trace, rule, anchor, guard).kind


def fix_blocker_own(trace: Trace, rule: str, anchor: int, guard: str) -> bool:
    """Whether what `fix_blocker` names as failing next is rlxviz's own doing: a form its patterns do not recognize
    (`not recognized`: esm's default_scale, then `qkv_packed`), or a refusal whose every highlighted reader one of its
    own rewrites made (`fix_blocker_made_by`, `MADE_READERS`: gpt-neox's NaN guard that `nan_guard_moved` moved past
    the head merge). Data beside the words; False when it names nothing, or the model's own term or layout. Only the
    first is a pattern miss (`verdict.LayerVerdict.pattern_blocked`: "ops and patterns")."""
    return _fix_blocker(trace, rule, anchor, guard).own


def fix_blocker_made_by(trace: Trace, rule: str, anchor: int, guard: str) -> str:
    """The rewrite of rlxviz's (`pass.rule`) that made every reader what `fix_blocker` names as failing next
    highlights (`made_readers`: gpt-neox's `canonicalize_exported.nan_guard_moved`); "" when it names nothing or a
    reader is not that rewrite's."""
    return _fix_blocker(trace, rule, anchor, guard).made_by


GAP_BLOCKER = "{guard} (a gap in rlxviz's ops: {forms})"
"""What fails next when it is itself a gap in rlxviz's ops of the layer, as a not-expected line words a gap:
`rope_halves (a gap in rlxviz's ops: FusedAttentionBlock with interleaved RoPE)`."""


def _fix_blocker(trace: Trace, rule: str, anchor: int, guard: str) -> NextBlocker:
    """`next_blocker`, checked once per refusal and trace: the
    same check as `explain -v`'s `checked at this rule alone` (`session.advice`), so every view names what that line
    names. Where the pass makes no product for the layer at all (`policy.lacks_product`, esm.qdyn's integer
    projections) the guard's own compiler fix is still the one checked: the check is the refusal's own, whatever the
    layer's kind."""
    facts = RunFacts.of(trace)
    key = ("fix_blocker", rule, anchor, guard)
    if key not in facts.cache:
        facts.cache[key] = NextBlocker()
        pass_name = rule.split(".")[0]
        hit = next(((k, r) for k, s in enumerate(trace.steps) if s.pass_name == pass_name for r in s.rejections
                    if (r.rule, r.anchor, r.guard) == (rule, anchor, guard) and r.fix), None)
        blocker = fix_alone_blocker(trace, *hit) if hit is not None else None
        name = blocker_name(guard, blocker)
        if blocker is not None and name:
            made = made_readers(trace, fix_alone_readers(trace, *hit)) if blocker[0] != guard else None
            if made is not None:
                name = MADE_READERS.format(guard=blocker[0], kind=blocker[1], rule=made[0], what=made[1],
                                           product=PRODUCTS.get(pass_name, pass_name))
            # a blocker that is itself a gap in rlxviz's ops of the layer (gptj's interleaved RoPE `rope_halves`
            # behind its partial rotary; esm.qdyn's `qkv_packed`, refused for its integer-matmul projections) is
            # named as one, as a not-expected line names a gap, and is no pattern miss (newcomer runs 19, 20); so is
            # one whose own fixes make it a gap (its one fix the compiler's: albert's gelu_tanh `fc1_activation`
            # behind `ln1_no_bias`, `policy.compiler_fix_only`)
            gaps = (op_gaps(classify_layer(trace.input, hit[1].layer), pass_name, blocker[0],
                            fix_alone_fail(trace, *hit))
                    if blocker[0] != guard and made is None else [])
            if gaps:
                name = GAP_BLOCKER.format(guard=blocker[0], forms=" and ".join(gaps))
            own = not gaps and (blocker[1] == NOT_RECOGNIZED or made is not None)
            facts.cache[key] = NextBlocker(blocker[0], name, blocker[1], own, made[0] if made is not None else "")
    return facts.cache[key]


def fix_unchecked(trace: Trace, rule: str, anchor: int, guard: str) -> bool:
    """Whether no what-if checks the compiler fix of the refusal of `rule` at `anchor` by `guard` at its rule alone
    (`passes.whatif.without_guard` knows nothing, or the refusal names no fix): a structure miss such as
    codegen.qdyn's `qkv_packed`, refused because the integer-matmul Q/K/V projections are no packed projection. There
    `fix_blocker` is "" though nothing was checked: the RoPE guards after it (interleaved, partial rotary) never ran,
    so no line may read the fix as enough (`UNCHECKED`). Checked once per refusal and trace."""
    facts = RunFacts.of(trace)
    key = ("fix_unchecked", rule, anchor, guard)
    if key not in facts.cache:
        pass_name = rule.split(".")[0]
        hit = next(((k, r) for k, s in enumerate(trace.steps) if s.pass_name == pass_name for r in s.rejections
                    if (r.rule, r.anchor, r.guard) == (rule, anchor, guard) and r.fix), None)
        facts.cache[key] = hit is None or without_guard(trace, *hit) is None
    return facts.cache[key]


UNCHECKED = "not checked whether it alone is enough: no what-if builds it at {guard}"
"""What a gap line adds to the compiler fix it names when no what-if checks that fix (`fix_unchecked`): codegen.qdyn's
int8 block named alone, with the RoPE guards after `qkv_packed` (its interleaved, partial rotary RoPE: the float
export's gaps) never run, read as the one fix needed."""


def own_term_behind(trace: Trace, rule: str, anchor: int, guard: str) -> bool:
    """Whether the compiler fix of the refusal of `rule` at `anchor` by `guard`, checked at its rule alone
    (`fix_blocker`), would only uncover a refusal for the model's own term (`MODEL_TERM`): t5's cross-attention,
    refused by `default_scale` (a gap: the block has no scale attribute), then by `self_attention` (Q and K/V from
    different inputs). Such a place is held by the model's own structure, not by the gap: it stands with the model's
    own terms (`standing.standing`'s `○`, `held_also`), its gap no compiler fix that would form it (the verdict's gaps,
    `excused.excused_misses`), as marian's and bart's cross-attention, refused by `self_attention` first, stand. The
    one reading of it for every view."""
    return fix_blocker_kind(trace, rule, anchor, guard) == MODEL_TERM


HELD_ALSO = ("it also runs into a gap in rlxviz's ops, {forms} ({guard}), whose compiler fix alone would not form "
             "{product} here")
"""What a place held by the model's own term (`own_term_behind`) says after that term's refusal: the gap it also has,
and that its compiler fix alone would not make the fusion, so the gap is named but never counted as a fix."""


def held_also(forms: list[str], guard: str, pass_name: str) -> str:
    """`HELD_ALSO` for a place held by the model's own term: `forms` the op forms rlxviz lacks there
    (`policy.op_gaps`), `guard` the gap's guard, `pass_name` the refused pass (its product, `policy.PRODUCTS`)."""
    return HELD_ALSO.format(forms=" and ".join(forms), guard=guard, product=PRODUCTS.get(pass_name, pass_name))


def fix_caveat(trace: Trace, rule: str, anchor: int, guard: str) -> str:
    """`CAVEAT` for the refusal of `rule` at `anchor` by `guard` when the compiler fix its not-expected reason names
    does not make the match (`fix_blocker`); "" when it does or nothing is known."""
    return caveat_words(fix_blocker(trace, rule, anchor, guard))


def model_fix_note(trace: Trace, rule: str, anchor: int, guard: str) -> str:
    """The fix line of the headline refusal of `rule` at `anchor` by `guard` when that line is a
    change to the model (`whatif.fix_form`) that a what-if applies (`whatif.what_if`), else "". On a checked run
    (`session.advice.vetted`) a fix that failed its check reads `none in the model: ...` (a statement), so only a
    checked change is named. Made once per refusal and trace."""
    return _model_fix(trace, rule, anchor, guard)[0]


def model_fix_rounded(trace: Trace, rule: str, anchor: int, guard: str) -> bool:
    """Whether `model_fix_note`'s change keeps the numbers only up to rounding (`whatif.WhatIf.rounded`: new constants
    rounded to the model's dtype, e.g. a scale folded by a ratio that is no power of two); False for none."""
    return _model_fix(trace, rule, anchor, guard)[1]


def _model_fix(trace: Trace, rule: str, anchor: int, guard: str) -> tuple[str, bool]:
    """`(model_fix_note, model_fix_rounded)`, made once per refusal and trace."""
    facts = RunFacts.of(trace)
    key = ("model_fix_note", rule, anchor, guard)
    if key not in facts.cache:
        facts.cache[key] = ("", False)
        hit = next(((k, r) for k, s in enumerate(trace.steps) for r in s.rejections
                    if (r.rule, r.anchor, r.guard) == (rule, anchor, guard) and r.headline), None)
        if hit is not None and hit[1].remedy in ("", IN_MODEL) and fix_form(hit[1].hint) == MODEL:
            try:
                w = what_if(trace, *hit)
            except Exception:  # noqa: BLE001 - a what-if that cannot be built names no change
                w = None
            facts.cache[key] = (hit[1].hint, w.rounded) if w is not None else ("", False)
    return facts.cache[key]


def workaround_words(fix: str) -> str:
    """`WORKAROUND` for a checked model-side `fix` (`model_fix_note`); "" for none ("")."""
    return WORKAROUND.format(fix=fix) if fix else ""


def line_caveats(trace: Trace, rule: str, anchor: int, guard: str, arch: Architecture) -> str:
    """What a not-expected line adds to the compiler fix its reason names (`policy.with_caveat`): `fix_caveat`, and at
    a gap in rlxviz's ops (`policy.op_gaps`) the model-side workaround (`model_fix_note`), joined by `; `. The one
    reading of both for the verdict's lines (`verdict.expected_misses`) and a place's standing (`standing.standing`).
    Where the reason names several gaps' fixes, the caveat says whose fix was checked (`CAVEAT_OF`)."""
    gap = op_gaps(arch, rule.split(".")[0], guard)
    blocker = fix_blocker(trace, rule, anchor, guard)
    notes = (caveat_words(blocker, guard if len(gap) > 1 else ""),  # whose fix
             UNCHECKED.format(guard=guard) if gap and not blocker and fix_unchecked(trace, rule, anchor, guard) else "",
             workaround_words(model_fix_note(trace, rule, anchor, guard)) if gap else "")
    return "; ".join(n for n in notes if n)


__all__ = ["CAVEAT", "CAVEAT_OF", "MADE_READERS", "WORKAROUND", "alone_caveat", "blocker_name", "caveat_words",
           "GAP_BLOCKER", "fix_blocker", "fix_blocker_kind", "fix_blocker_made_by", "fix_blocker_own", "fix_caveat",
           "fix_unchecked", "UNCHECKED",
           "line_caveats", "HELD_ALSO", "held_also", "own_term_behind",
           "made_readers", "NextBlocker", "next_blocker",
           "model_fix_note", "model_fix_rounded", "workaround_words"]
