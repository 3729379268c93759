"""The refusals a layer's kind does not count ("not expected here"), gathered by rule, guard and why, and the places
each names: what `verdict.LayerVerdict.not_expected` lists, one line per group (`policy.not_expected_line`), and the
gaps in rlxviz's ops a layer's refusals ran into (`OpGap`), each with what fails next when its compiler fix alone is
applied (`caveat.fix_blocker`), as data: the headline, the layer's lines and `--json` read these fields, never the
words.

Split from `verdict.py` (one job per module): the verdict decides what a layer is expected to fuse; this module
gathers the refusals it does not count.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..declarations import trait_named
from ..explain import Outcome
from ..guard import DOES_NOT_PAY, MODEL_TERM, NOT_A_CANDIDATE
from ..pipeline import PASSES
from ..report import MissedFusion, left_out_line, left_out_rejections
from ..trace import Rejection, Trace, reading_order
from .caveat import (
    UNCHECKED,
    caveat_words,
    fix_blocker,
    fix_blocker_kind,
    fix_blocker_made_by,
    fix_blocker_own,
    fix_unchecked,
    model_fix_note,
    model_fix_rounded,
    own_term_behind,
    workaround_words,
)
from .facts import RunFacts
from .held import Held, term_refusal
from .kinds import LayerArchitecture as Architecture
from .policy import (
    COMPILER_FIX_WORDS,
    NOT_EXPECTED_HERE,
    excuse,
    gap_line,
    gap_sources,
    layer_pass,
    not_expected_line,
    op_gaps,
    places_words,
    with_caveat,
)


@dataclass(frozen=True)
class Excused:
    """One group of refusals a layer's kind does not count: one pattern, failing guard and why, at every place
    (anchor node) it refused; one "not expected here" line (`line`), or one gap line (`policy.gap_line`) when the
    refusal is a gap in rlxviz's ops (`gaps`).

    Attributes:
        pattern: the refused rule, e.g. `fuse_residual_rms_norm.residual_no_beta`.
        guard: its failing guard.
        reason: the guard's own reason at the first place.
        why: why the refusal does not count (`policy.excuse`), without the caveat on the compiler fix it names.
        places: anchor node -> node path of each place, in the run's order.
        gaps: the op forms rlxviz lacks when the refusal is a gap in rlxviz's ops (`policy.op_gaps`), else ().
        blocker: what fails next when the compiler fix `why` names is applied alone (`caveat.fix_blocker` at the
            first place, `GUARD (KIND)`); "" when it is enough, nothing is known, or `why` names no compiler fix.
        workaround: at a gap in rlxviz's ops, the checked change to the model that makes the fusion anyway
            (`caveat.model_fix_note` at the first place: Granite's scale folded into its Q projection), else "".
        rounded: the workaround keeps the numbers only up to rounding (`caveat.model_fix_rounded`).
        reasons: anchor node -> the guard's own reason at that place, for the places after the first whose reason
            differs from `reason` (deit's ORT-optimized layer: the bias added after the residual at o_proj's matmul
            and at fc2's, each named); {} when every place has the first one's.
        blocker_kind: the refusal kind of `blocker` (`caveat.fix_blocker_kind`, e.g. `not recognized`), "" without.
        blocker_own: `blocker` is rlxviz's own doing (`caveat.fix_blocker_own`: a pattern it does not recognize, or
            a refusal whose readers its own rewrite made), False without.
        blocker_made_by: the rewrite of rlxviz's that made the readers `blocker` names (`caveat.fix_blocker_made_by`:
            `canonicalize_exported.nan_guard_moved`), "" without.
        held: where the places are held by the model's own term (`caveat.own_term_behind`: their gap's compiler fix
            alone would only uncover it, t5's cross-attention), the op forms of the gap they also run into, else ():
            no gap (`gaps` empty) and no line of the layer; the run's list of the model's own terms names them
            (`held_lines`), as the chips' `○` counts them.
        unchecked: at a layer trait's gap (`policy.gap_sources`: its integer-matmul Q/K/V projections), no what-if
            checks the compiler fix `why` names at its rule alone (`caveat.fix_unchecked`: codegen.qdyn's structure miss
            `qkv_packed`), so `blocker` "" does not mean the fix is enough; the line says so (`caveat.UNCHECKED`).
            False with a blocker.
    """

    pattern: str
    guard: str
    reason: str
    why: str
    places: dict[int, str]
    gaps: tuple[str, ...] = ()
    blocker: str = ""
    workaround: str = ""
    rounded: bool = False
    reasons: dict[int, str] = field(default_factory=dict)
    blocker_kind: str = ""
    blocker_own: bool = False
    blocker_made_by: str = ""
    held: tuple[str, ...] = ()
    unchecked: bool = False

    @property
    def line(self) -> str:
        """The "not expected here" line (`policy.not_expected_line`; `policy.gap_line` at a gap): the places
        (`places_words`), the first place's reason (`at %N: REASON` when there are several) and each further place's
        own where it differs (`reasons`: `at %N: REASON; at %M: REASON`, so every place's nodes are named, not the
        first's alone), then `why` with the blocker's caveat on its compiler fix and the model-side workaround
        (`caveat.line_caveats`' words); where `why` names several gaps' fixes (`gaps`), the caveat says the guard's
        own fix was the one checked (`caveat.CAVEAT_OF`)."""
        first = next(iter(self.places))
        reason = self.reason if len(self.places) == 1 else "; ".join(
            f"at %{n}: {self.reason if n == first else own_part(self.reasons[n], self.reason, first)}"
            for n in self.places if n == first or n in self.reasons)
        checked = caveat_words(self.blocker, self.guard if len(self.gaps) > 1 else "")  # several gaps' fixes: whose
        unchecked = UNCHECKED.format(guard=self.guard) if self.unchecked and not self.blocker else ""
        notes = "; ".join(n for n in (checked, unchecked, workaround_words(self.workaround)) if n)
        line = gap_line if self.gaps else not_expected_line  # a gap: a compiler fix, no "why not expected" (issue 39)
        return line(self.pattern, self.guard, reason, with_caveat(self.why, notes), places_words(self.places))


SAME_TAIL_WORDS = 6
"""A further place's reason that ends in at least this many words as the first place's does says only its own part
(`own_part`)."""


def own_part(reason: str, first_reason: str, first: int) -> str:
    """`reason` of a further place, said by what is its own: the words before the tail it shares with the first place's
    `first_reason` (at least `SAME_TAIL_WORDS` words, cut after a word that ends a parenthesis), then `... (the rest as
    at %FIRST)`; the whole `reason` when they share no such tail. deit's fc2: `the bias add (node 63, ...) ..., the
    bias of the matmul (node 60, model.layers.0.mlp.fc2), after the residual add (node 61, model.layers.0) ... (the
    rest as at %50)`."""
    mine, theirs = reason.split(" "), first_reason.split(" ")
    k = 0
    while k < min(len(mine), len(theirs)) and mine[-1 - k] == theirs[-1 - k]:
        k += 1
    cut = len(mine) - k  # the first word of the shared tail
    while cut < len(mine) and cut > 0 and not mine[cut - 1].endswith(")"):
        cut += 1
    if len(mine) - cut < SAME_TAIL_WORDS or cut == 0:
        return reason
    return f"{' '.join(mine[:cut])} ... (the rest as at %{first})"


@dataclass(frozen=True)
class OpGap:
    """A gap in rlxviz's ops that a layer's refusal ran into (`verdict.LayerVerdict.gaps`).

    Attributes:
        form: the op form rlxviz lacks, e.g. `FusedAttentionBlock with a non-default scale`.
        rule: the refused rule.
        by: what ran into it (`policy.gap_sources`): the guard, or what the layer's trait is in the model,
            `its integer-matmul Q/K/V projections (integer_qkv)` (`declarations.trait_named`).
        at: the anchor nodes of its places.
        blocker: what fails next when its compiler fix alone is applied (`Excused.blocker`; the first place's that
            has one), "" when the fix alone is enough or nothing is known.
        workaround: the checked change to the model that makes the fusion anyway (`Excused.workaround`), else "".
        rounded: that change keeps the numbers only up to rounding (`Excused.rounded`).
        blocker_kind: the refusal kind of `blocker` (`Excused.blocker_kind`): `not recognized` when what fails next is
            a form rlxviz's patterns do not take.
        blocker_own: `blocker` is rlxviz's own doing (`Excused.blocker_own`: `not recognized`, or a refusal whose
            readers rlxviz's own rewrite made, gpt-neox's moved NaN guard).
        blocker_made_by: the rewrite of rlxviz's that made the readers `blocker` names (`Excused.blocker_made_by`:
            gpt-neox's `canonicalize_exported.nan_guard_moved`), "" without. A blocker of rlxviz's own that no rewrite
            made is a form its patterns do not recognize (`pattern_miss`).
        unchecked: no what-if checks the compiler fix of the refusal that ran into it (`Excused.unchecked`:
            codegen.qdyn's `qkv_packed`), so `blocker` "" says nothing of whether the fix alone is enough.
    """

    form: str
    rule: str
    by: str
    at: tuple[int, ...] = ()
    blocker: str = ""
    workaround: str = ""
    rounded: bool = False
    blocker_kind: str = ""
    blocker_own: bool = False
    blocker_made_by: str = ""
    unchecked: bool = False
    unreached: bool = False
    """A trait's gap in a pass that found no anchor in the layer (`unreached_gaps`): no place of its own."""

    @property
    def pattern_miss(self) -> bool:
        """Its compiler fix alone leaves a form rlxviz's patterns do not recognize (`blocker_own`, no reader a rewrite
        made: esm's `qkv_packed`), so the layer is held back by rlxviz's patterns too, not by its ops alone
        (`verdict.LayerVerdict.pattern_blocked`). A reader rlxviz's own rewrite made (gpt-neox's NaN guard that
        `nan_guard_moved` moved past the head merge) is none: no form of the model goes unrecognized there, the
        product cannot take that reader in (`caveat.MADE_READERS`), so the layer is fused as far as rlxviz's ops go."""
        return self.blocker_own and not self.blocker_made_by

    def __str__(self) -> str:
        """`FORM (RULE: BY)`, as `explain`'s `rlxviz's ops lack:` line names it."""
        return f"{self.form} ({self.rule}: {self.by})"


def layer_gaps(arch: Architecture, refused: Iterable[Outcome], excused: Iterable[Excused], own: bool = True
               ) -> list[OpGap]:
    """The gaps in rlxviz's ops that the `refused` outcomes of a layer of kind `arch` ran into (`policy.gap_sources`),
    each (form, rule, by) once, in order; their places and blocker from the layer's `excused` groups of the same rule
    and guard (the outcome's own anchor where none is one); then the gaps of `excused` groups no outcome names (a
    soft refusal: a fusion made without its activation, GPT-2's tanh-GELU epilogue), by their guard. `own` False: the
    refusals' own fixes are not read (`excused_misses`)."""
    excused = list(excused)
    groups = [x for x in excused if x.gaps]
    held = {(x.pattern, n) for x in excused if x.held for n in x.places}  # the model's own term holds it: no gap
    out: dict[str, OpGap] = {}
    for o in refused:
        if o.nodes and (o.rule, o.nodes[0]) in held:
            continue
        mine = [x for x in groups if (x.pattern, x.guard) == (o.rule, o.guard)]
        at = tuple(dict.fromkeys(n for x in mine for n in x.places)) or o.nodes
        blocker, kind, mine_own, made_by = next(((x.blocker, x.blocker_kind, x.blocker_own, x.blocker_made_by)
                                                 for x in mine if x.blocker), ("", "", False, ""))
        workaround, rounded = next(((x.workaround, x.rounded) for x in mine if x.workaround), ("", False))
        for form, by in gap_sources(arch, o.pass_name, o.guard, o if own else None):
            # the check behind `blocker` is the guard's own compiler fix: a trait's gap (`any refusal, the layer's
            # trait integer_qkv`) names another fix, which was not checked
            checked = by == o.guard
            g = OpGap(form, o.rule, by, at, blocker if checked else "", workaround, rounded, kind if checked else "",
                      mine_own and checked, made_by if checked else "", not blocker and any(x.unchecked for x in mine))
            out.setdefault(str(g), g)
    ran = {(g.rule, g.form) for g in out.values()}
    for x in groups:  # a gap no hard refusal names: a fusion made without part of it (tanh-GELU's epilogue)
        for form in x.gaps:
            if (x.pattern, form) not in ran:
                g = OpGap(form, x.pattern, x.guard, tuple(x.places), x.blocker, x.workaround, x.rounded, x.blocker_kind,
                          x.blocker_own, x.blocker_made_by, x.unchecked)
                out.setdefault(str(g), g)
    return list(out.values())


def unreached_gaps(arch: Architecture, outcomes: Iterable[Outcome], known: Iterable[OpGap]) -> list[OpGap]:
    """The gaps of the layer's traits (`Pass.lacks`) in passes that ran but found no anchor in the layer (every
    outcome `not applicable`), not already among `known`: an earlier gap kept their anchor from forming. convbert.qdyn:
    `fuse_sdpa` refuses its attention (its head merge joins the convolution heads, a gap), so `fuse_attention_block`
    never reaches the integer-matmul Q/K/V projections it could not take either; the headline named the first gap
    alone, as the float export's, with no word that its fix is not the only one. Each is `unchecked` (no what-if
    builds it), and names no places (`OpGap.unreached`: the app's chips add it to the layer's places at other gaps,
    `places.places`). The whole-layer pass is left out: its gap is the layer's (`layer_op_gaps`)."""
    lp = layer_pass()
    ran: dict[str, set[str]] = {}
    for o in outcomes:
        ran.setdefault(o.pass_name, set()).add(o.status)
    forms = {g.form for g in known}
    out: list[OpGap] = []
    for name, statuses in ran.items():
        p = PASSES.get(name)
        if p is None or statuses != {"not applicable"} or (lp is not None and name == lp.name) or not p.rules:
            continue
        for trait, form, _ in p.lacks:
            if arch.has(trait) and form not in forms:
                forms.add(form)
                out.append(OpGap(form, p.rules[0].name, trait_named(trait), unchecked=True, unreached=True))
    return out


HELD = " (held by the model's own term)"
"""Keeps a group of places held by the model's own term (`Excused.held`) apart from the gap places of the same rule,
guard and why in `excused_misses`; no line says it."""


def excused_misses(trace: Trace, arch: Architecture, layer: int | None, own: bool = True, outside: bool = False
                   ) -> tuple[list[MissedFusion], dict[tuple[str, str], Excused]]:
    """`expected_misses` as data: the misses that count, and `(pattern, guard) -> Excused` for those that do not.
    `outside`: only the refusals anchored in no layer (`layer` None: a pooler's, an embeddings').
    `own` False: a refusal's own fixes are not read for a gap in rlxviz's ops (`policy.compiler_fix_only`): a layer
    judged as its siblings' kind (`verdict.judged_kind`: a teaching variant's pre-LN layer among post-LN ones) is
    refused for its deviation, which is the model's, not for a form rlxviz lacks."""
    kept: list[MissedFusion] = []
    groups: dict[tuple[str, str, str, str, str], tuple[MissedFusion, dict[int, str], tuple[str, ...]]] = {}
    reasons: dict[tuple[str, str, str, str, str], dict[int, str]] = {}
    held: dict[tuple[str, int], tuple[str, ...]] = {}
    for m in RunFacts.of(trace).misses():
        if (layer is not None and m.layer != layer) or (outside and m.layer is not None):
            continue
        pass_name = m.pattern.split(".")[0]
        ex = excuse(arch, pass_name, m.guard, m.kind, m.remedy, m if own else None)
        if ex is None:
            kept.append(m)
            continue
        blocker = fix_blocker(trace, m.pattern, m.node, m.guard) if COMPILER_FIX_WORDS in ex[1] else ""
        gaps = tuple(op_gaps(arch, pass_name, m.guard, m if own else None)) if ex[0] == NOT_EXPECTED_HERE else ()
        if gaps and own_term_behind(trace, m.pattern, m.node, m.guard):  # no gap: the model's own term holds it
            held[m.pattern, m.node] = gaps
            gaps, blocker = (), ""
        workaround = model_fix_note(trace, m.pattern, m.node, m.guard) if gaps else ""
        key = (m.pattern, m.guard, ex[1] + (HELD if (m.pattern, m.node) in held else ""), blocker, workaround)
        groups.setdefault(key, (m, {}, gaps))[1][m.node] = m.path
        if m.reason != groups[key][0].reason:  # another place's own nodes (fc2's matmul after o_proj's)
            reasons.setdefault(key, {})[m.node] = m.reason
    out: dict[tuple[str, str], Excused] = {}
    for key, (m, at, gaps) in groups.items():
        pattern, guard, why, blocker, workaround = key
        n = sum(k[0] == pattern and k[1].split("#")[0] == guard for k in out)  # another why: `GUARD#2`
        rounded = bool(workaround) and model_fix_rounded(trace, m.pattern, m.node, m.guard)
        kind = fix_blocker_kind(trace, m.pattern, m.node, m.guard) if blocker else ""
        # a blocker that is a gap in rlxviz's ops of the layer itself is no pattern miss (`caveat.GAP_BLOCKER`)
        mine = bool(blocker) and fix_blocker_own(trace, m.pattern, m.node, m.guard)
        made_by = fix_blocker_made_by(trace, m.pattern, m.node, m.guard) if blocker else ""
        out[pattern, f"{guard}#{n + 1}" if n else guard] = Excused(
            pattern, guard, m.reason, why.removesuffix(HELD), at, gaps, blocker, workaround, rounded,
            reasons.get(key, {}), kind, mine, made_by, held.get((m.pattern, m.node), ()),
            bool(gaps) and not blocker and any(by != m.guard for _, by in gap_sources(arch, pattern.split(".")[0],
                                                                                      m.guard, m if own else None))
            and fix_unchecked(trace, m.pattern, m.node, m.guard))  # a trait's gap, its refusal's fix unchecked
    return kept, out


LEFT_OUT = "left out"
LEFT_OUT_GROUPS = (LEFT_OUT, MODEL_TERM, NOT_A_CANDIDATE, DOES_NOT_PAY)
"""The kinds of `RunVerdict.left_out_groups`, in the order the text lists them: what a fusion left out (a soft
rejection), a place that keeps the model's own term (`guard.MODEL_TERM`), nodes that only look like a fusion's input
(`guard.NOT_A_CANDIDATE`), and the tool's own cost test's refusals (`guard.DOES_NOT_PAY`: nothing to fix)."""


def left_out_group(r: Rejection) -> str:
    """Which of `LEFT_OUT_GROUPS` a rejection of `report.left_out_rejections` is in: its kind when that kind is no
    near-miss (`guard.NOT_NEAR_MISSES`), `guard.DOES_NOT_PAY` when the tool's cost test declined it (`policy.excuse`),
    else `LEFT_OUT`."""
    ex = excuse(None, r.pass_name, r.guard, r.kind, r.remedy)
    return ex[0] if ex is not None else LEFT_OUT


def left_out_groups(trace: Trace, layers: Iterable[int] | None = None,
                    held: Iterable[tuple[int | None, int, str]] = ()) -> dict[str, list[str]]:
    """`report.left_out_rejections` of `trace` (in `layers`, when given) one line each (`report.left_out_line`), by
    `left_out_group`, and each place held by the model's own term (`held`: `(layer, anchor, line)`, `held_lines` of
    the layers' groups; t5's cross-attention, its gap's compiler fix alone would only uncover `self_attention`) under
    `MODEL_TERM`, as the chips' `○` counts it: only the non-empty groups, in `LEFT_OUT_GROUPS` order, each in the
    run's order (`trace.reading_order`)."""
    wanted = None if layers is None else set(layers)
    rows = [(r.layer, r.anchor, left_out_group(r), left_out_line(trace, r)) for r in left_out_rejections(trace, wanted)]
    rows += [(layer, anchor, MODEL_TERM, line) for layer, anchor, line in held]
    key = reading_order(trace)
    out: dict[str, list[str]] = {g: [] for g in LEFT_OUT_GROUPS}
    for _, _, group, line in sorted(rows, key=lambda x: key(x[0], x[1])):
        out[group].append(line)
    return {g: lines for g, lines in out.items() if lines}


def held_lines(trace: Trace, excused: Iterable[Excused]) -> list[tuple[int, str]]:
    """`(anchor, line)` of each place of `excused` held by the model's own term (`Excused.held`), as the model's own
    terms are listed (`report.left_out_line` of the term's refusal the run recorded at the place, `held.term_refusal`:
    `RULE @ %ANCHOR (PATH): self_attention [the model's own term]: ...`), then the gap it also runs into (the place's
    `held.Held`, its `also`, as the standing and the drawing word it)."""
    out = []
    for x in excused:
        for n in x.places if x.held else ():
            term = term_refusal(trace, x.pattern, n, x.guard)
            if term is not None:
                out.append((n, f"{left_out_line(trace, term)}; {Held(term, '', x.held, x.guard, term.pass_name).also}"))
    return out


def outside_refusals(trace: Trace, arch: Architecture) -> tuple[list[str], list[str]]:
    """`(missed, gaps)`: the lines of the refusals anchored in no layer of a graph whose node paths name layers,
    judged as the whole graph's kind `arch`: those that count (`str(MissedFusion)`) and those at a gap in rlxviz's
    ops (`policy.gap_line`); a refusal not expected there is not said, as in a layer's short text. deit's ORT-optimized
    pooler, `tanh(reshape(x @ w + b))`, left its tanh outside its FusedMatMulBiasAct and no line said so."""
    misses, excused = excused_misses(trace, arch, None, outside=True)
    return [str(m) for m in misses], [x.line for x in excused.values() if x.gaps]


def expected_misses(trace: Trace, arch: Architecture, layer: int | None
                    ) -> tuple[list[MissedFusion], dict[tuple[str, str], str]]:
    """The misses of `layer` (None: the whole graph) that count for `arch`, and `(pattern, guard) -> "pattern (guard)
    @ %NODE (PATH): the guard's reason; why it is not expected here: why"` (`policy.not_expected_line`) for those that
    do not: one line per pattern, failing guard and why (keys `(pattern, guard)`, then `(pattern, "guard#2")` for a
    second why: deit's layer norms, where one place's compiler fix is not enough alone), naming every place (anchor
    node) it refused, as the app's chips
    count them `○` (granite's layer 1: the residual norm refused at %186 and %187, `at 2 places, %186 (...) and %187
    (...): at %186: REASON`), the reason and why of the first place, each place with its own guard (BART's decoder
    layer: FusedTransformerLayer refused at the cross-attention by `attn_is_fused_block` and at the self-attention by
    `fc1_is_fused_linear`, two lines). Misses are the run's missed fusions plus its "no rule recognizes this" findings
    (`passes.unrecognized`: a family-shaped chain no rule made a candidate)."""
    kept, excused = excused_misses(trace, arch, layer)
    return kept, {k: x.line for k, x in excused.items()}


__all__ = ["HELD", "LEFT_OUT", "LEFT_OUT_GROUPS", "Excused", "OpGap", "SAME_TAIL_WORDS", "excused_misses",
           "expected_misses", "held_lines", "layer_gaps", "left_out_group", "left_out_groups", "own_part",
           "places_words", "unreached_gaps"]
