"""A pass's refusals counted by place (`PLACE_UNIT`): what the app's version chips count as ✗ (near-misses), ○ (refusals
that are no near-miss and nothing to fix, by `standing.standing` group) and △ (refusals at a gap in rlxviz's ops,
`verdict.OP_GAP_GROUP`: a compiler fix), and the status word the matches table shows for each place. One reading of a
place's standing (`place_standings`) that the chips, the table and the drawings share, so they never disagree with
`explain` on what counts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from ...ir.identity import IdentityMap
from ..explain import Outcome, explain
from ..refusal_kinds import DOES_NOT_PAY, MODEL_TERM, NOT_A_CANDIDATE
from ..report import block_cost_in_context, in_context
from ..trace import Rejection, Trace, layer_of, place_label
from .caveat import model_fix_note, model_fix_rounded
from .facts import RunFacts
from .gap_words import GapNames, group_words, trait_worded
from .policy import NOT_EXPECTED_HERE, TAKEN_LATER_GROUP, gap_line, not_expected_line
from .standing import place_fix_alone, place_gap_names, place_gaps, standing, unexpected_fix
from .verdict import ILLEGAL_HERE_GROUP, OP_GAP_GROUP, LayerVerdict, RunVerdict, layer_verdict

PLACE_UNIT = "one per pattern and place"
"""What the chips' ✗, ○ and △ count (`Places`): a pattern's candidate at one node, never a guard (two patterns: two)."""


@dataclass(frozen=True)
class Places:
    """One pass's refusals counted by place (`PLACE_UNIT`: a pattern's candidate, its rule and anchor), never by
    guard.

    Attributes:
        near_misses: the headline refusal of each hard place that is a near-miss (`standing` None), in the run's
            order: what a version chip counts as `✗`.
        excused: `standing` group -> one item per place that is no near-miss (hard or soft), in the run's order,
            each naming its place as `%ANCHOR (PATH)` (`trace.place_label` with its node, as every chip item does):
            for the model's own term, a lookalike or a declined merge, `%ANCHOR (PATH): RULE (GUARD): MESSAGE` as
            `explain` lists it (`own_item`; a place the model's own term holds, `%ANCHOR (PATH): RULE: why`); for a
            group whose reason differs by place (`NOT_EXPECTED_HERE`, `OP_GAP_GROUP`, `ILLEGAL_HERE_GROUP`,
            `TAKEN_LATER_GROUP`) `%ANCHOR (PATH): RULE (GUARD): why`, the
            place named once as `near_miss_item` names it, a not-expected one's why as `explain` words it
            (`policy.not_expected_line` without its places: the guard's reason, then why; `policy.gap_line` for
            `OP_GAP_GROUP`: the reason, then the form rlxviz lacks and its compiler fix). The chip's faded `○`, but
            for `OP_GAP_GROUP` (`gaps`).
        excused_at: the anchor node id of each item of `excused`, in the same order (a chip's tooltip groups the
            places by node).
        lacks: the op forms rlxviz lacks at the `OP_GAP_GROUP` places (`standing.place_gaps`), each once, in order.
        gap_worked: how many `OP_GAP_GROUP` places a checked change to the model works around
            (`caveat.model_fix_note`, the same check that names it in the place's gap line: `gap_workaround`).
        gap_rounded: how many of those keep the numbers only up to rounding (`caveat.model_fix_rounded`, the
            headline's `OpGap.rounded`). The chip's head words both as the headline does
            (`fix_words.workaround_words`: `in 2 of them (it changes the numbers at rounding level only; ...)`).
        gap_blockers: `(form, blocker)` of each `OP_GAP_GROUP` place whose compiler fix alone is not enough, in
            order (`standing.place_fix_alone`: what fails next, as the headline's `OpGap.blocker` says it).
        gap_unchecked: how many `OP_GAP_GROUP` places have a compiler fix no what-if checks alone
            (`standing.place_fix_alone`, the headline's `OpGap.unchecked`). The chip's head words both as the
            headline does (`text.compiler_fix_words`).
    """

    near_misses: list[Rejection]
    excused: dict[str, list[str]]
    excused_at: dict[str, list[int]] = field(default_factory=dict)
    lacks: list[str] = field(default_factory=list)
    gap_worked: int = 0
    gap_rounded: int = 0
    gap_blockers: list[tuple[str, str]] = field(default_factory=list)
    gap_unchecked: int = 0

    @property
    def faded(self) -> dict[str, list[str]]:
        """`excused` but the gaps in rlxviz's ops: the places that are nothing to fix (the chip's faded `○`)."""
        return {g: items for g, items in self.excused.items() if g != OP_GAP_GROUP}

    @property
    def faded_at(self) -> dict[str, list[int]]:
        """`excused_at` of `faded`."""
        return {g: at for g, at in self.excused_at.items() if g != OP_GAP_GROUP}

    @property
    def gaps(self) -> list[str]:
        """The items of the places at a gap in rlxviz's ops (`OP_GAP_GROUP`): a compiler fix, nothing in the model to
        change, so no faded `○` (the chip's `△`)."""
        return self.excused.get(OP_GAP_GROUP, [])

    def near_miss_items(self) -> list[str]:
        """Each near-miss place (`near_misses`), in the run's order, as a chip's `✗` tooltip names it
        (`near_miss_item`); the anchor of each: `Rejection.anchor`."""
        return [near_miss_item(r) for r in self.near_misses]

    def nodes(self) -> int:
        """How many nodes the places that are no near-miss sit at (two patterns refused at one: one node)."""
        return len({a for anchors in self.excused_at.values() for a in anchors})


def near_miss_item(r: Rejection) -> str:
    """A near-miss place named by its headline refusal `r`: `%ANCHOR (PATH): RULE (GUARD)` (`trace.place_label` with
    its node, `-` for no path), as every item of `Places.excused` names its place and `explain -v` lists it, so every
    chip item gives a node id to search for (the ✗ items named the path alone beside ○ items that said `%39 (PATH)`)."""
    return f"{place_label(r.anchor, r.path, with_node=True)}: {r.rule} ({r.guard})"


def own_item(r: Rejection, trace: Trace | None = None) -> str:
    """A place that is no near-miss for a reason of its refusal's own (`r`: the model's own term kept, a lookalike, a
    merge the cost test declined, whose message names each matmul it left out and what merging it would cost), named
    as `explain` lists it (`report.left_out_line`):
    its node and path, `%ANCHOR (PATH)`, its rule and guard, then the refusal's message as the text says it
    (`report.block_cost_in_context` in `trace`; without one, the message as recorded), e.g. `%39
    (model.encoder.block.0.layer.0.SelfAttention): fuse_sdpa.hf_attention (mask_model_term): additive score term kept
    as the attention's operand: ...`. t5's ○4 after fuse_sdpa listed its four layer scopes alone: no node, no why;
    falcon's declined merges dropped the message's last clause (`fewer than 2 matmuls would be left to merge`)."""
    message = block_cost_in_context(trace, r) if trace is not None else r.message
    return f"{place_label(r.anchor, r.path, with_node=True)}: {r.rule} ({r.guard}): {message}"


def step_refusals(trace: Trace, step: int) -> tuple[Rejection, ...]:
    """The refusals of `trace.steps[step]` a place-reading view reads (the app's version chips and matches table):
    the step's own, then the run's unrecognized findings filed under it (`facts.RunFacts.findings`: convbert.qdq's
    erf GELU, `unrecognized.gelu`, under `canonicalize_gelu`), so a finding `explain` and the Why tab list has its
    chip and its row. A finding the layer's kind does not expect (`standing.unexpected_fix`: a quantized layer's GELU)
    loses its hint, so the table's fix is the one line that says nothing needs changing (`report.in_context`), as for
    any such refusal, never a rewrite `explain` does not print.

    Raises:
        IndexError: `step` is not a step index of `trace`.
    """
    found = RunFacts.of(trace).findings().get(step, ())
    return (*trace.steps[step].rejections, *(replace(r, hint="") if unexpected_fix(trace, r) else r for r in found))


def place_standings(trace: Trace, step: int) -> Mapping[tuple[str, int], tuple[Rejection, tuple[str, str] | None]]:
    """Each place (rule, anchor) of the refusals of `trace.steps[step]`, in the run's order -> `(headline, standing)`:
    its headline refusal (its first refusal when none is the headline) and `standing` of it. The one reading of a
    place's standing the chips (`places`) and the app's matches table (`place_status`) share. Computed once per step
    of the run (`RunFacts.cache`), read-only: the node inspector asks it for every step of every node it tells
    (`app.explain.node_decisions`), and worked it out again each time (~2 ms of `standing` per step and node).

    Raises:
        IndexError: `step` is not a step index of `trace`.
    """
    cache, key = RunFacts.of(trace).cache, ("place_standings", step)
    if key not in cache:
        heads: dict[tuple[str, int], Rejection] = {}
        for r in step_refusals(trace, step):
            k = (r.rule, r.anchor)
            if k not in heads or (r.headline and not heads[k].headline):
                heads[k] = r
        cache[key] = MappingProxyType({k: (r, standing(trace, r)) for k, r in heads.items()})
    return cache[key]


REJECTED = "rejected"
"""`place_status` of a hard place that is a near-miss (the chips' `✗`)."""
LEFT_OUT_STATUS = "left out"
"""`place_status` of a soft place that is a near-miss: a fusion made without it (no chip counts it)."""


def gap_workaround(trace: Trace, head: Rejection, st: tuple[str, str] | None) -> bool:
    """Whether a checked change to the model works around the place of headline refusal `head` with `standing` `st`
    (`place_standings`): a place at a gap in rlxviz's ops (`OP_GAP_GROUP`) whose `caveat.model_fix_note` names one.
    The one reading of it for the chips (`Places.gap_worked`) and the node drawer."""
    return (st is not None and st[0] == OP_GAP_GROUP
            and bool(model_fix_note(trace, head.rule, head.anchor, head.guard)))


def place_status(head: Rejection, st: tuple[str, str] | None) -> str:
    """The status word of a place from its headline refusal `head` and `standing` `st` (`place_standings`):
    `REJECTED` (a near-miss, the chips' `✗`), `LEFT_OUT_STATUS` (a soft near-miss), or the `STANDING_GROUPS` group
    of a place that is no near-miss (the chips' `○`: `not expected here`, `illegal here`, `not a candidate`, ...; `△`:
    `gap in rlxviz's ops`),
    so the app's table and chips and `explain` never disagree on what counts."""
    if st is not None:
        return st[0]
    return LEFT_OUT_STATUS if head.soft else REJECTED


def _unreached(trace: Trace, r: Rejection) -> list[str]:
    """The forms of the gaps of `r`'s layer that no place shows (`OpGap.unreached`: a trait's gap in a pass an earlier
    gap kept from its anchor), as its verdict names them; [] outside the layers."""
    k = layer_of(r.path)
    return [] if k is None else [g.form for g in layer_verdict(trace, k).gaps if g.unreached]


def places(trace: Trace, step: int) -> Places:
    """`Places` of the refusals of `trace.steps[step]` (one pass's step, by its index): each (rule, anchor) once,
    judged by `standing` of its headline refusal (its first refusal when none is the headline). A not-expected place
    is worded with its reason in the context of that step (`report.in_context`).

    Raises:
        IndexError: `step` is not a step index of `trace`.
    """
    near: list[Rejection] = []
    excused: dict[str, list[str]] = {}
    excused_at: dict[str, list[int]] = {}
    lacks: dict[str, None] = {}
    worked = rounded = 0
    blockers: list[tuple[str, str]] = []
    unchecked = 0
    for r, st in place_standings(trace, step).values():
        if st is None:
            if not r.soft:
                near.append(r)
            continue
        group, why = st
        place = place_label(r.anchor, r.path, with_node=True)  # `%ANCHOR (PATH)`: every chip item alike
        if group == OP_GAP_GROUP:
            lacks |= dict.fromkeys(place_gaps(trace, r))
            if gap_workaround(trace, r, st):  # the headline's `OpGap.workaround`, `OpGap.rounded`, per place
                worked += 1
                rounded += model_fix_rounded(trace, r.rule, r.anchor, r.guard)
            form, blocker, unsure = place_fix_alone(trace, r)  # the headline's facts (`OpGap`), per place
            hidden = _unreached(trace, r)  # a later pass's gap behind this one (convbert.qdyn's integer Q/K/V)
            lacks |= dict.fromkeys(hidden)
            blockers += [(form, blocker)] * bool(blocker)
            unchecked += unsure or (bool(hidden) and not blocker)
        if group in (NOT_EXPECTED_HERE, OP_GAP_GROUP):  # worded as `explain` words it: the guard's reason, then why
            reason = in_context(trace, step, r)[0]  # a gap: its compiler fix, no "why not expected" (issue 39)
            line = gap_line if group == OP_GAP_GROUP else not_expected_line
            item = f"{place}: {line(r.rule, r.guard, reason, why)}"  # its place named once: `place`
        elif group == MODEL_TERM and r.kind != MODEL_TERM:  # held by the model's own term: say it, and its gap
            # (`standing.held_by`: t5's cross-attention, `default_scale` first)
            item = f"{place}: {r.rule}: {why}"
        elif group in (ILLEGAL_HERE_GROUP, TAKEN_LATER_GROUP):
            item = f"{place}: {r.rule} ({r.guard}): {why}"
        else:  # the model's own term, a lookalike, a declined merge: its node and why, as `explain` lists it
            item = own_item(r, trace)
        excused.setdefault(group, []).append(item)
        excused_at.setdefault(group, []).append(r.anchor)
    return Places(near, excused, excused_at, list(lacks), worked, rounded, blockers, unchecked)


PlaceCount = tuple[str, str, str, str, int]
"""`(rule, headline guard, status word, why, how many places)`: a layer's places of one kind (`layer_places`)."""


def layer_places(trace: Trace) -> dict[int, tuple[PlaceCount, ...]]:
    """Layer -> its refused places over the whole run, counted by rule, headline guard, status word (`place_status`:
    `rejected`, `not expected here`, `gap in rlxviz's ops`, ...) and why (`standing`'s reason: the same for every
    place of a kind, a node named nowhere), sorted: what the app's layer drawing compares beyond the verdict's words
    when it calls a layer "same as" another (granite's layer 1 has the residual-norm refusal at 2 places, layer 0 at
    1: not the same verdict). Node ids and paths are left out, so identical layers of a stack count alike."""
    counts: dict[int, dict[tuple[str, str, str, str], int]] = {}
    for k in range(len(trace.steps)):
        for head, st in place_standings(trace, k).values():
            if head.layer is None:
                continue
            key = (head.rule, head.guard, place_status(head, st), st[1] if st is not None else "")
            per = counts.setdefault(head.layer, {})
            per[key] = per.get(key, 0) + 1
    return {layer: tuple(sorted((*key, n) for key, n in per.items())) for layer, per in counts.items()}


_NOTHING_TO_FIX = {NOT_EXPECTED_HERE: "not expected here", NOT_A_CANDIDATE: "lookalike",
                   MODEL_TERM: "the model's own term", ILLEGAL_HERE_GROUP: "illegal here", DOES_NOT_PAY: "does not pay"}
"""The `○` groups of `standing` as `standing_mark` names them."""


def standing_mark(st: tuple[str, str] | None, gaps: GapNames = ()) -> str:
    """A refusal's `standing` as the mark and words `explain -v`'s per-rule line (and the app's Why tab) tags it
    with, the chips' marks: `✗ near-miss` (None), `△ gap in rlxviz's ops` (`OP_GAP_GROUP`: a compiler fix; naming
    each of `gaps`, the place's, where it ran into several, as the drawing's label does, `gap_words.group_words`:
    `△ 2 gaps in rlxviz's ops: its integer-matmul Q/K/V projections (integer_qkv), default_scale`), else
    `○ nothing to fix, GROUP` (`not expected here`, `lookalike`, `the model's own term`, `illegal here`, `does not
    pay`; `taken later` with what took it: `○ nothing to fix, taken later: its matmul was fused later by
    fuse_attention_block into %148`, as the text's `taken later` line says it)."""
    if st is None:
        return "✗ near-miss"
    if st[0] == TAKEN_LATER_GROUP:
        return f"○ nothing to fix, {TAKEN_LATER_GROUP}: {st[1]}"
    if st[0] == OP_GAP_GROUP:
        return f"△ {group_words(OP_GAP_GROUP, gaps)}"
    return f"○ nothing to fix, {_NOTHING_TO_FIX.get(st[0], st[0])}"


def _heads(trace: Trace) -> dict[tuple[str, int], Rejection]:
    """(rule, anchor) -> the headline refusal of that place over the whole run (its first refusal when none is the
    headline), as `place_standings` picks it per step."""
    facts = RunFacts.of(trace)
    if "place heads" not in facts.cache:
        heads: dict[tuple[str, int], Rejection] = {}
        for s in trace.steps:
            for r in s.rejections:
                k = (r.rule, r.anchor)
                if k not in heads or (r.headline and not heads[k].headline):
                    heads[k] = r
        facts.cache["place heads"] = heads
    return facts.cache["place heads"]


def outcome_standing(trace: Trace, o: Outcome | None) -> str:
    """`standing_mark` of a rejected outcome's place (its rule at its anchor, `standing` of the place's headline
    refusal; at a gap, with the gaps the place ran into, `standing.place_gap_names`: esm.qdyn's `default_scale` line
    named one gap of the two the headline names); "" for no outcome, one of another status, or one at no refusal of
    the run (a missed fusion no rule refused, a crashed pass)."""
    if o is None or o.status != "rejected" or not o.nodes:
        return ""
    head = _heads(trace).get((o.rule, o.nodes[0]))
    if head is None:
        return ""
    st = standing(trace, head)
    if st is None or st[0] != OP_GAP_GROUP:
        return standing_mark(st)
    mine = [r for s in trace.steps for r in s.rejections if (r.rule, r.anchor) == (head.rule, head.anchor)]
    return standing_mark(st, trait_worded(place_gap_names(trace, mine), {r.guard for r in mine}))


def _marked(trace: Trace, o: Outcome | None) -> Outcome | None:
    return o if o is None or o.status != "rejected" else replace(o, standing=outcome_standing(trace, o))


def _once(trace: Trace, o: Outcome | None, done: IdentityMap[Outcome | None, Outcome | None]) -> Outcome | None:
    """`_marked` of `o`, one copy per outcome object (`done`: outcome -> copy, by identity): the text reads `first`
    by identity among the layer's `rejections` (`text.render_layer`'s `also rejected` lines)."""
    if o not in done:
        done[o] = _marked(trace, o)
    return done[o]


def with_standings(trace: Trace, run: RunVerdict) -> RunVerdict:
    """`run` (the verdict of `trace`) with every rejected outcome's `standing` filled (`outcome_standing`) and each
    layer's `explanation` (`explain -v`'s per-rule list, the Why tab's) re-rendered with it, so its line reads
    `[rejected] RULE: GUARD (STAGE, KIND; ✗ near-miss)` as the chips mark the place, and `--json`'s outcomes carry
    the same `standing`. Made after the verdict: `standing` reads the layer's verdict (its `illegal`)."""
    facts = RunFacts.of(trace)
    layers: list[LayerVerdict] = []
    for v in run.layers:
        ex = facts.cache.get(("explained", v.layer)) or explain(trace, v.layer)
        ex = replace(ex, outcomes=[_marked(trace, o) for o in ex.outcomes])
        done: IdentityMap[Outcome | None, Outcome | None] = IdentityMap()  # one marked copy per outcome: `first`
        # stays one of `rejections`
        layers.append(replace(v, first=_once(trace, v.first, done),
                              rejections=[_once(trace, o, done) for o in v.rejections],
                              illegal=[_once(trace, o, done) for o in v.illegal], explanation=ex.render(False)))
    return replace(run, layers=layers)


__all__ = ["LEFT_OUT_STATUS", "PLACE_UNIT", "REJECTED", "PlaceCount", "Places", "gap_workaround", "layer_places",
           "near_miss_item", "outcome_standing", "own_item", "place_standings", "place_status", "places",
           "standing_mark", "step_refusals", "with_standings"]
