"""A refusal's standing: whether it is a near-miss, and if not, in which group it stands (`standing`), and the op
forms rlxviz lacks at a refusal that is a gap in rlxviz's ops (`place_gaps`).

The verdict's own rule (`verdict.layer_verdict`, `policy.excuse`) read per refusal, so the app's version chips,
`explain` and `--json` never disagree on what is a near-miss. `verdict` re-exports both names.
"""

from __future__ import annotations

import operator

from ..architecture import classify_layer
from ..refusal_kinds import MODEL_TERM, model_term_why
from ..trace import Rejection, Trace
from .caveat import (
    NextBlocker,
    caveat_words,
    fix_blocker,
    fix_unchecked,
    line_caveats,
    next_blocker,
    own_term_behind,
)
from .facts import RunFacts, taken_places
from .fix_words import block_fix_words
from .held import Held, term_refusal
from .kinds import LayerArchitecture as Architecture
from .policy import (
    ILLEGAL_HERE,
    NOT_EXPECTED_HERE,
    TAKEN_LATER_GROUP,
    excuse,
    gap_names,
    not_expected_fix,
    op_gaps,
    with_caveat,
)
from .verdict import ILLEGAL_HERE_GROUP, OP_GAP_GROUP, judged_kind, layer_verdict


def _judged_as(facts: RunFacts, layer: int | None) -> Architecture | None:
    """The kind a refusal at `layer` is judged as (`judged_kind`; the whole graph's kind at a place in no layer: the
    verdict's `RunVerdict.outside_gaps` judge a layered graph's pooler so, `excused.outside_refusals`)."""
    key = ("judged", layer)
    if key not in facts.cache:
        if layer is None:
            facts.cache[key] = classify_layer(facts.trace.input, None)
        else:
            facts.cache[key] = judged_kind(facts.trace, layer)[1] if layer in set(facts.layers) else None
    return facts.cache[key]


def standing(trace: Trace, r: Rejection) -> tuple[str, str] | None:
    """Whether the refusal `r` of `trace` is a near-miss: None when it is (it counts against its layer, the app's
    chips count its place as `✗`), else `(group, why)`, `group` one of `STANDING_GROUPS`: `policy.excuse` of the
    refusal in the kind its layer is judged as (the model's own term, a lookalike, a merge the tool's cost test
    declined, a refusal the layer's kind does not expect), or `ILLEGAL_HERE_GROUP` when the layer's verdict holds it
    illegal for the layer (`LayerVerdict.illegal`). The verdict's own rule (`expected_misses`, `layer_verdict`) read
    per refusal, so the chips, `explain` and `--json` never disagree on what is a near-miss.

    A not-expected refusal at a gap in rlxviz's ops (`policy.op_gaps`, what `LayerVerdict.op_gaps` lists) stands in
    `OP_GAP_GROUP`: a compiler fix, not "nothing to fix".

    A place whose candidate a later pass fused after all (`report.taken_by`: clip-text's out_proj refused for its
    bias after the residual, its matmul then taken by fuse_attention_block) stands in `policy.TAKEN_LATER_GROUP`,
    whatever its refusal's own kind: no near-miss, nor a gap (the verdict neither counts it nor lists its gap).

    A further failing guard of a candidate (`Rejection.headline` False) stands as its candidate's headline does:
    pass the headline (`places` does)."""
    taken = taken_places(trace).get((r.rule, r.anchor))
    if taken:
        return TAKEN_LATER_GROUP, taken
    layer = r.layer
    arch, ex, gaps = _excused(trace, r)
    if ex is not None and ex[0] == NOT_EXPECTED_HERE and arch is not None:
        group = OP_GAP_GROUP if gaps else NOT_EXPECTED_HERE
        return group, with_caveat(ex[1], line_caveats(trace, r.rule, r.anchor, r.guard, arch))
    if ex is not None or layer is None or arch is None:
        return ex
    if any((o.rule, o.nodes[0] if o.nodes else None) == (r.rule, r.anchor)
           for o in layer_verdict(trace, layer).illegal):
        return ILLEGAL_HERE_GROUP, ILLEGAL_HERE
    return None


def unexpected_fix(trace: Trace, r: Rejection) -> str:
    """The fix line of the refusal `r` of `trace` when its layer's kind does not expect it (`standing`'s
    `NOT_EXPECTED_HERE`, not a gap in rlxviz's ops): `policy.not_expected_fix` with the kind's reason, e.g. `nothing to
    change in the model or in rlxviz: this layer's kind does not expect the fusion (not expected here):
    FusedTransformerLayer is the post-LN BERT layer; this layer is a decoder layer ...`; "" for any other refusal.
    Reads the excuse alone, never the layer's verdict (`report.in_context` asks this while the verdict is made)."""
    arch, ex, gaps = _excused(trace, r)
    if arch is None or ex is None or ex[0] != NOT_EXPECTED_HERE or gaps:
        return ""
    return not_expected_fix(ex[1])


def place_gaps(trace: Trace, r: Rejection) -> list[str]:
    """The op forms rlxviz lacks that the refusal `r` of `trace` ran into (`policy.op_gaps` in the kind its layer is
    judged as, as `standing` reads it, `_excused`): what a place of `OP_GAP_GROUP` lacks, e.g. `FusedAttentionBlock
    with QK-norm`; [] for any other refusal, one of the model's own term too whatever compiler fix it names (n3-09's
    cross-attention `self_attention`: what the Why tab's "said no here" line reads, `report._what_ran`)."""
    return _excused(trace, r)[2]


def place_fix_words(trace: Trace, r: Rejection) -> str:
    """What the headline says of the compiler fix of the gap refusal `r` of `trace`, from `r`'s own checks
    (`caveat.fix_blocker`, `caveat.fix_unchecked`; `fix_words.block_fix_words`): `the compiler fix forms it`, or gptj's
    `a compiler fix; alone it is not enough: rope_halves (...) fails next`. The cost test's words ask it
    (`report.block_in_context`, lazily, by the one accepted edge to this module)."""
    blocker = fix_blocker(trace, r.rule, r.anchor, r.guard)
    return block_fix_words(blocker, not blocker and fix_unchecked(trace, r.rule, r.anchor, r.guard))


def _excused(trace: Trace, r: Rejection) -> tuple[Architecture | None, tuple[str, str] | None, list[str]]:
    """`(kind, excuse, gaps)` of the refusal `r` of `trace`: the kind its layer is judged as (`_judged_as`), its
    `policy.excuse` there, and the op forms rlxviz lacks at it (`policy.op_gaps`) only where that excuse is
    `NOT_EXPECTED_HERE`: a refusal of a kind that is no near-miss (the model's own term, a lookalike, a merge that
    does not pay) stands in its kind's group whatever compiler fix it names (a cross-attention's `self_attention`:
    `a cross-attention block`), so no view may call it a gap. A place held by the model's own term (`_held`) stands
    with the model's own terms (`Held.why`), at no gap. The one reading of a refusal's standing and its gaps
    for `standing`, `unexpected_fix`, `place_gaps` and `place_gap_names` (the Why tab's "said no here" line read
    `op_gaps` alone and called the cross-attention refusal a gap the chips, `-v` and `--json` do not)."""
    arch, ex, gaps = _judged(trace, r)
    held = _held(trace, r, gaps)
    return (arch, (MODEL_TERM, held.why), []) if held is not None else (arch, ex, gaps)


def _judged(trace: Trace, r: Rejection) -> tuple[Architecture | None, tuple[str, str] | None, list[str]]:
    """`_excused` before a place held by the model's own term is told apart: its gap's excuse and gaps."""
    facts = RunFacts.of(trace)
    arch = _judged_as(facts, r.layer)
    mine = _own_fixes(facts, r)
    ex = excuse(arch, r.pass_name, r.guard, r.kind, r.remedy, mine)
    if ex is not None and ex[0] == MODEL_TERM == r.kind:  # its own words: a score term's, or its refusal's message
        ex = (MODEL_TERM, model_term_why(r.guard, r.message, r.soft))
    gaps = (op_gaps(arch, r.pass_name, r.guard, mine)
            if ex is not None and ex[0] == NOT_EXPECTED_HERE and arch is not None else [])
    return arch, ex, gaps


def _held(trace: Trace, r: Rejection, gaps: list[str]) -> Held | None:
    """`Held` of the refusal `r` at gaps `gaps` (`_judged`'s) whose compiler fix alone would only uncover the model's
    own term (`caveat.own_term_behind`); None for any other refusal."""
    if not gaps or not own_term_behind(trace, r.rule, r.anchor, r.guard):
        return None
    term = term_refusal(trace, r.rule, r.anchor, r.guard)
    blocker = fix_blocker(trace, r.rule, r.anchor, r.guard) if term is None else ""
    return Held(term, blocker, tuple(gaps), r.guard, r.pass_name)


def held_place(trace: Trace, r: Rejection) -> Held | None:
    """`Held` of the place of the refusal `r` of `trace` when the model's own term holds it (`held_by`'s, with the
    gap it also runs into: what the drawing, the inspector and the text word from it), else None."""
    return None if r.kind == MODEL_TERM else _held(trace, r, _judged(trace, r)[2])


def held_by(trace: Trace, r: Rejection) -> Rejection | None:
    """The refusal of the model's own term that holds the place of the refusal `r` (`caveat.own_term_behind`: r is at
    a gap in rlxviz's ops whose compiler fix alone would only uncover it; t5's cross-attention, `default_scale` then
    `self_attention`); None for any other refusal, or when the run recorded no such further refusal (`held_place`'s
    `Held.term`). Such a place stands with the model's own terms (`standing`: `MODEL_TERM`), as marian's
    cross-attention does."""
    held = held_place(trace, r)
    return held.term if held is not None else None


def place_gap_names(trace: Trace, refusals: list[Rejection]) -> list[tuple[str, str]]:
    """`(op form, short name)` of each gap in rlxviz's ops that the `refusals` of one place ran into, as the verdict
    counts them (`LayerVerdict.gaps`, built from each place's headline refusal): the gaps of the place's headline
    refusal (`policy.gap_names`, as `place_gaps` reads it: the name is the layer trait under which the pass makes no
    product, else the guard), then each further failing guard's that names one of those forms (DeepNorm's
    `ln2_residual_scaled`, the same residual-scale form as its headline `ln1_residual_scaled`), each pair once, in
    order: what the drawing's `△` label, the Why title and the Model Explorer export name, `integer_qkv,
    default_scale` at esm's attention (two gaps, one failing guard). A further guard whose own form the headline's gap
    does not name is no gap of the place (`gap_followers`): gptj's `rope_halves` (interleaved RoPE) behind its
    `rope_full_rotary` gap, which `explain` names `also fails`, never a second gap. [] for a place at no gap."""
    head = _head(refusals)
    if head is None:
        return []
    mine = _gap_names(trace, head)
    forms = {f for f, _ in mine}
    out = dict.fromkeys(mine)
    for r in refusals:
        if r is not head:
            out |= dict.fromkeys(x for x in _gap_names(trace, r) if x[0] in forms)
    return list(out) if mine else []


def place_fix_alone(trace: Trace, r: Rejection) -> tuple[str, str, bool]:
    """`(form, blocker, unchecked)` of a place at a gap in rlxviz's ops whose headline refusal is `r`, read as
    `excused.layer_gaps` reads the verdict's `OpGap`s, so the app's chips and the headline (`text.gap_words`) say one
    thing: `blocker` what fails next once the compiler fix of `r`'s own guard alone is applied (`caveat.fix_blocker`,
    worded: `rope_halves (a gap in rlxviz's ops: ...)`), `form` the first form that is the guard's own gap, both ""
    where the fix alone is enough or no gap is the guard's own (a layer trait's, `integer_qkv`: that fix was not
    checked); `unchecked` where there is no blocker, a trait's gap, and no what-if checks the refusal's fix
    (`caveat.fix_unchecked`: mobilebert.qdyn's integer-matmul projections). `("", "", False)` for a place at no
    gap."""
    names = _gap_names(trace, r)
    own = [form for form, name in names if name == r.guard]
    blocker = fix_blocker(trace, r.rule, r.anchor, r.guard) if names else ""
    if blocker:
        return (own[0], blocker, False) if own else ("", "", False)
    return "", "", any(name != r.guard for _, name in names) and fix_unchecked(trace, r.rule, r.anchor, r.guard)


def _head(refusals: list[Rejection]) -> Rejection | None:
    """The headline refusal of one place's `refusals` (the first when none is), None for none."""
    return next((r for r in refusals if r.headline), refusals[0] if refusals else None)


def _gap_names(trace: Trace, r: Rejection) -> list[tuple[str, str]]:
    """`policy.gap_names` of the refusal `r` alone, in the kind its layer is judged as."""
    facts = RunFacts.of(trace)
    arch, _, gaps = _excused(trace, r)
    return gap_names(arch, r.pass_name, r.guard, _own_fixes(facts, r)) if arch is not None and gaps else []


def gap_followers(trace: Trace, refusals: list[Rejection]) -> dict[str, str]:
    """Each further failing guard of one place at a gap in rlxviz's ops that is no gap of the place itself (no name of
    `place_gap_names`, the verdict's gaps) -> the words the text gives it: the not-expected line's caveat
    (`caveat.caveat_words` of the words of `caveat.next_blocker` of the place's headline refusal: `alone it is not
    enough: attn_single_user (illegal while the sdpa NaN guard ... reads there: ...) fails next`) when it is what fails
    next once the gap's compiler fix alone is applied (that record's `guard`), else "" (one more guard the candidate
    fails, `explain -v`'s `also fails`). gpt-neox's attention place is a gap (`rope_full_rotary`, partial rotary) whose
    `attn_single_user` is the illegal next blocker, not a gap: a drawing that marked it with the place's gap group alone
    read as a second gap; gptj's `rope_halves` names a form of its own (interleaved RoPE) the verdict does not count
    there, so it follows too. The one reading of "which guards at a place are gaps" for the drawing
    (`viz.overlay.gap_followers`), the Why title (`session.render._gap_title`) and the Model Explorer export
    (`viz.model_explorer`). {} for a place at no gap."""
    facts = RunFacts.of(trace)
    head = _head(refusals)
    names = place_gap_names(trace, refusals)
    if head is None or not names:
        return {}
    arch = _judged_as(facts, head.layer)
    blocker = next_blocker(trace, head.rule, head.anchor, head.guard) if arch is not None else NextBlocker()
    gaps = {n for _, n in names}
    out: dict[str, str] = {}
    for r in refusals:
        if r is not head and r.guard != head.guard and r.guard not in gaps:
            out.setdefault(r.guard, caveat_words(blocker.words) if blocker.guard == r.guard else "")
    return out


def gap_caveat(trace: Trace, refusals: list[Rejection]) -> str:
    """The text's caveat on the compiler fix of one place at a gap in rlxviz's ops (`refusals`, all of that place):
    `caveat.caveat_words` of `caveat.fix_blocker` of its headline refusal, `alone it is not enough: qkv_packed (not
    recognized) fails next` (esm's attention: its `default_scale` gap's fix alone leaves the packed QKV unrecognized),
    when no further failing guard of the place says it (`gap_followers`: gpt-neox's `attn_single_user` carries it);
    "" for a place at no gap, a fix that is enough, or a caveat a follower carries."""
    facts = RunFacts.of(trace)
    head = _head(refusals)
    if head is None or not place_gap_names(trace, refusals):
        return ""
    arch = _judged_as(facts, head.layer)
    words = caveat_words(fix_blocker(trace, head.rule, head.anchor, head.guard)) if arch is not None else ""
    return "" if words in gap_followers(trace, refusals).values() else words


def _own_fixes(facts: RunFacts, r: Rejection) -> Rejection | None:
    """`r`, whose fixes `policy` reads for a gap in rlxviz's ops; None in a layer judged as another kind than its own
    (`judged_kind`: its refusals are its deviation, as `excused_misses` reads them)."""
    if r.layer in set(facts.layers) and ("deviates", r.layer) not in facts.cache:
        facts.cache["deviates", r.layer] = operator.ne(*judged_kind(facts.trace, r.layer))
    return None if facts.cache.get(("deviates", r.layer)) else r


__all__ = ["Held", "gap_caveat", "gap_followers", "held_by", "held_place", "place_fix_alone", "place_gap_names",
           "place_gaps", "standing", "unexpected_fix"]
