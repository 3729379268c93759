"""What to draw on top of a graph: matches, near-misses, fused nodes and a diff against another version.

An `Overlay` is plain data built from a `PassStep` (or two graphs), so the DOT renderer stays a pure
function of `(graph, overlay, options)`. Match bindings refer to node ids of the graph *before* the
pass, and `Match.fused` to a node *after* it: `Overlay.before(step)` draws clusters on the
before-graph, `Overlay.after(step)` marks the fused nodes on the after-graph.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from ..ir import Graph, Node, Op, operand_roles
from ..ir.identity import DigestCache
from ..ir.ops import FUSED
from ..passes.made import Beside, made_beside, made_in_run, stage_makers, step_makers
from ..passes.trace import Match, PassStep, Rejection, Trace
from ..passes.why.gap_words import GapNames, group_words, trait_worded

if TYPE_CHECKING:
    from ..passes.why.standing import Held

INPUT_ROLES = frozenset(r for op in FUSED for k in range(1, 15) for r in operand_roles(op, {"has_rope": True}, k)
                        if not r.startswith("in"))
"""Role names that bind an *operand* of a fused op (hidden, x, residual, qkv_w, ...): bound but not absorbed."""


NOT_OPS = {Op.PARAM: "param(s)/constant(s)", Op.CONST: "param(s)/constant(s)", Op.INPUT: "graph input(s)"}
"""The nodes that are no op, by the words a count of them takes: the version list's and the chips' counts are ops
(`Graph.compute_nodes`), and params and constants are drawn folded into their users' labels, not as nodes."""


NOT_OPS_SHORT = {"param(s)/constant(s)": "params/consts", "graph input(s)": "inputs"}
"""The chip's short word for each `NOT_OPS` kind (`other_changes`: "-2 params/consts")."""


def node_changes(before: Graph, after: Graph, added: list[int], removed: list[int]) -> dict[str, tuple[int, int]]:
    """What a pass added and removed by kind: "op(s)" (compute nodes) first, then each `NOT_OPS` word met ->
    `(added, removed)`. The one count the after pane's title (`change_words`) and the version chips
    (`other_changes`) read.

    Args:
        before / after: the graphs before and after the pass.
        added: ids in `after` only; removed: ids in `before` only (`PassStep.added`, `PassStep.removed`).
    """
    out: dict[str, list[int]] = {"op(s)": [0, 0]}
    for k, (graph, ids) in enumerate(((after, added), (before, removed))):
        for i in ids:
            out.setdefault(NOT_OPS.get(graph[i].op, "op(s)"), [0, 0])[k] += 1
    return {w: (a, r) for w, (a, r) in out.items()}


def change_words(before: Graph, after: Graph, added: list[int], removed: list[int]) -> str:
    """What a pass added and removed, in the chips' unit: ops (compute nodes) first, then the other nodes by kind.

    "0 op(s) added, 3 removed; 8 param(s)/constant(s) removed": the chip's change (-3) is the ops' added minus
    removed. A count of every node ("11 removed") read as contradicting the chips (-3) and the pictures, in which
    params and constants are no nodes (dead weights removed by `dead_code_elimination` changed neither).

    Args:
        before / after: the graphs before and after the pass.
        added: ids in `after` only; removed: ids in `before` only (`PassStep.added`, `PassStep.removed`).
    """
    counts = node_changes(before, after, added, removed)
    a, r = counts.pop("op(s)")
    text = f"{a} op(s) added, {r} removed"
    for word, (a, r) in counts.items():
        said = [f"{n} {how}" for n, how in ((a, "added"), (r, "removed")) if n]
        text += f"; {word}: {', '.join(said)}"
    return text


def other_changes(step: PassStep) -> str:
    """The nodes other than ops `step` added and removed, as a version chip says them: "-2 params/consts",
    "+1/-1 params/consts, -1 inputs"; "" when it changed ops only. A pass that removed dead weights changed the
    graph though its op count did not move: its chip says so, not read as a no-op (`node_changes`)."""
    counts = node_changes(step.before, step.after, step.added, step.removed)
    counts.pop("op(s)")
    return ", ".join("/".join(x for x in (f"+{a}" if a else "", f"-{r}" if r else "") if x)
                     + f" {NOT_OPS_SHORT[w]}" for w, (a, r) in counts.items())


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def before_caption(step: PassStep, trace: Trace | None = None, layer: int | None = None) -> str:
    """The caption of the graph before `step`: its matches, and its rejections counted by place (a rule's candidate
    at one anchor) in the version chips' unit, never per failing guard; in the whole graph, or in `layer` alone (a
    drawing of one layer: its matches and the places whose refusal names it, `Rejection.layer`), the caption saying
    which (`in the graph` / `in this layer`): gpt-neox's layer 1 drawing said `△2` of the pass's two places, one each
    layer.

    "before fuse_transformer_layer, in the graph: 0 match(es), 1 rejected place (4 failing guards)": the rejected
    places are the hard near-misses the chip counts as `✗` (`passes.why.places.places` of `step`'s rejections in
    `trace`, judged by `standing`), the guards in brackets (when more than one per place) the failing guards of those
    places; places that are no near-miss are added as the chip's faded `○N` ("○2 not near-misses", "○7 not
    near-misses at 4 nodes" when patterns share a node: `places.PLACE_UNIT`), and places at a gap in rlxviz's ops as
    its `△N`, counted as places ("△1 place at a gap in rlxviz's ops": esm's one place per layer runs into two gaps,
    which its `△` label names). Without `trace` (a step drawn on its own), a hard refusal's kind alone decides
    (`Rejection.near_miss`), as `app.derived.refusals` does then.
    """
    k = trace.index_of(step) if trace is not None else None
    refusals = _refusals(trace, step)
    mine = {(r.rule, r.anchor) for r in refusals if layer is None or r.layer == layer}
    anchors = {a for _, a in mine}
    scope = "in the graph" if layer is None else "in this layer"
    matches = sum(1 for m in step.matches if layer is None or m.layer == layer)
    head = f"before {trace.step_name(step) if trace is not None else step.pass_name}, {scope}: {matches} match(es)"
    if trace is not None and k is not None:
        from ..passes.why.places import places  # the verdict reads the pipeline; the overlay is drawn without it
        from ..passes.why.verdict import OP_GAP_GROUP

        p = places(trace, k)
        near = {(r.rule, r.anchor) for r in p.near_misses} & mine
        at = [a for anchors_ in p.faded_at.values() for a in anchors_ if a in anchors]
        excused, nodes = len(at), len(set(at))
        gaps = sum(1 for a in p.excused_at.get(OP_GAP_GROUP, []) if a in anchors)
    else:
        near = {(r.rule, r.anchor) for r in step.rejections if not r.soft and r.near_miss} & mine
        faded = {(r.rule, r.anchor) for r in step.rejections if not r.soft and not r.near_miss} & mine
        excused, nodes, gaps = len(faded), len({a for _, a in faded}), 0
    guards = sum(1 for r in refusals if not r.soft and (r.rule, r.anchor) in near)
    text = f"{head}, {_plural(len(near), 'rejected place', 'rejected places')}"
    if guards > len(near):
        text += f" ({_plural(guards, 'failing guard', 'failing guards')})"
    if excused:  # two patterns refused at one node are two places: at how many nodes, when fewer
        text += f", ○{_plural(excused, 'not near-miss', 'not near-misses')}"
        text += f" at {_plural(nodes, 'node', 'nodes')}" if nodes < excused else ""
    if gaps:  # the chips' △: places at a gap in rlxviz's ops, a compiler fix (`places.Places.gaps`)
        text += ", △" + _plural(gaps, "place at a gap in rlxviz's ops", "places at gaps in rlxviz's ops")
    return text


def _refusals(trace: Trace | None, step: PassStep) -> tuple[Rejection, ...]:
    """`step`'s refusals as the chips read them (`passes.why.places.step_refusals`: its own, then the leftover scan's
    findings filed under it), a step of `trace`; its own alone without `trace` (or a step of no trace)."""
    k = trace.index_of(step) if trace is not None else None
    if trace is None or k is None:
        return tuple(step.rejections)
    from ..passes.why.places import step_refusals  # the verdict reads the pipeline; the overlay is drawn without it

    return step_refusals(trace, k)


def place_groups(trace: Trace | None, step: PassStep) -> dict[tuple[str, int], str]:
    """Each place (rule, anchor) of `step`'s refusals that is no near-miss -> its standing group
    (`passes.why.places.place_standings`, a `passes.why.verdict.STANDING_GROUPS` word: `not expected here`, `gap in
    rlxviz's ops`, ...): the chips' faded `○`, or their `△` for `OP_GAP_GROUP`, read in `trace`. Without `trace` (or a
    step of no trace), a refusal's kind alone decides (`Rejection.near_miss`), as `before_caption` does: its group is
    its kind (`guard.NOT_NEAR_MISSES`), else `guard.DOES_NOT_PAY`. A near-miss place is not in it."""
    k = trace.index_of(step) if trace is not None else None
    if trace is None or k is None:
        from ..passes.refusal_kinds import DOES_NOT_PAY, NOT_NEAR_MISSES

        return {(r.rule, r.anchor): r.kind if r.kind in NOT_NEAR_MISSES else DOES_NOT_PAY
                for r in step.rejections if not r.near_miss}
    from ..passes.why.places import place_standings  # the verdict reads the pipeline; the overlay is drawn without

    return {pl: st[0] for pl, (_, st) in place_standings(trace, k).items() if st is not None}


def run_groups(trace: Trace) -> dict[tuple[str, int], str]:
    """`place_groups` of every step of `trace`, for a drawing of the whole run's refusals (`Overlay.trace_summary`):
    a place that is a near-miss at any step of the run is none of them (its red `✗` stays)."""
    out: dict[tuple[str, int], str] = {}
    near: set[tuple[str, int]] = set()
    for s in trace.steps:
        groups = place_groups(trace, s)
        out |= groups
        near |= {(r.rule, r.anchor) for r in s.rejections} - set(groups)
    return {pl: group for pl, group in out.items() if pl not in near}


def _gap_places(trace: Trace, step: PassStep, groups: dict[tuple[str, int], str] | None
                ) -> dict[tuple[str, int], list[Rejection]]:
    """`step`'s refusals by place (rule, anchor), the places at a gap in rlxviz's ops only (`place_groups`, or
    `groups` when given: `is_gap`)."""
    groups = place_groups(trace, step) if groups is None else groups
    at: dict[tuple[str, int], list[Rejection]] = {}
    for r in step.rejections:
        if is_gap(groups.get((r.rule, r.anchor), "")):
            at.setdefault((r.rule, r.anchor), []).append(r)
    return at


def gap_names(trace: Trace | None, step: PassStep, groups: dict[tuple[str, int], str] | None = None
              ) -> dict[tuple[str, int], GapNames]:
    """Each place (rule, anchor) of `step`'s refusals at a gap in rlxviz's ops (`place_groups`, or `groups` when
    given: `is_gap`) -> each gap its refusals ran into, its op form and a short name
    (`passes.why.standing.place_gap_names`: the layer trait under which the pass makes no product, else the guard):
    esm's attention place -> two gaps, `integer_qkv` and `default_scale`. {} without `trace` (or a step of no
    trace)."""
    if trace is None or trace.index_of(step) is None:
        return {}
    from ..passes.why.standing import place_gap_names  # the verdict reads the pipeline; the overlay is drawn without

    at = _gap_places(trace, step, groups)
    return {pl: trait_worded(place_gap_names(trace, rs), {r.guard for r in rs}) for pl, rs in at.items()}


Followers = dict[tuple[str, int, str], str]
"""(rule, anchor, guard) of a further failing guard at a gap place that is no gap itself -> the text's caveat (`alone
it is not enough: attn_single_user (illegal: ...) fails next`) when it fails next once the gap's compiler fix alone is
applied, else "" (`gap_followers`)."""


def gap_followers(trace: Trace | None, step: PassStep, groups: dict[tuple[str, int], str] | None = None) -> Followers:
    """The further failing guards of `step`'s places at a gap in rlxviz's ops (`place_groups`, or `groups`: `is_gap`)
    that run into no gap themselves (`passes.why.standing.gap_followers`): gpt-neox's `attn_single_user`, which the
    text names the illegal blocker that fails next once the partial-rotary gap's fix alone is applied, never a second
    gap. {} without `trace` (or a step of no trace)."""
    if trace is None or trace.index_of(step) is None:
        return {}
    from ..passes.why.standing import gap_followers as followers  # the verdict reads the pipeline; the overlay does not

    at = _gap_places(trace, step, groups)
    return {(*pl, guard): words for pl, rs in at.items() for guard, words in followers(trace, rs).items()}


def follower_note(gaps: GapNames, guard: str, kind: str, caveat: str) -> tuple[str, str]:
    """The two parts of the mark of a further failing guard `guard` (refusal kind `kind`) at a place at a gap in
    rlxviz's ops that is no gap itself (`gap_followers`; `gaps`: the place's `gap_names`; `caveat`: its follower
    words): `fix of rope_full_rotary alone is not enough:` / `attn_single_user (illegal) fails next` when it is what
    fails next, else `beside the gap rope_full_rotary:` / `rope_halves (not recognized) also fails, no gap itself`.
    One wording for the drawing's note (`dot`) and the Model Explorer export (`model_explorer`), never the place's
    gap group with its guard as if that guard were a gap."""
    names = ", ".join(dict.fromkeys(n for _, n in gaps)) or "gap"
    said = f"{guard} ({kind})"
    if caveat:
        return f"fix of {names} alone is not enough:", f"{said} fails next"
    return f"beside the gap {names}:", f"{said} also fails, no gap itself"


def marked_nodes(r: Rejection, present: Container[int]) -> tuple[int, ...]:
    """The nodes a drawing marks for refusal `r` (a border and a note: `dot`'s rejection marks), in order: the node its
    guard is about (`r.subject` where `present` holds it, else the anchor), then each node it names offending. The one
    reading for the app's drawing and the Model Explorer export (`model_explorer.graph_json`): gpt-neox's
    `rope_full_rotary` marks both ropes it names, q_rope (the subject) and k_rope, and its follower `attn_single_user`
    the NaN guard's isnan and where that read the attention; the export had marked the anchor and subject alone."""
    mark = r.subject if r.subject is not None and r.subject in present else r.anchor
    return tuple(dict.fromkeys((mark, *r.offending)))


def gap_caveats(trace: Trace | None, step: PassStep, groups: dict[tuple[str, int], str] | None = None
                ) -> dict[tuple[str, int], str]:
    """Each place (rule, anchor) of `step`'s refusals at a gap in rlxviz's ops (`place_groups`, or `groups`: `is_gap`)
    whose compiler fix alone is not enough, where no follower of the place says so (`gap_followers`) -> the text's
    caveat (`passes.why.standing.gap_caveat`): esm's attention -> `alone it is not enough: qkv_packed (not
    recognized) fails next`; and each place held by the model's own term (`held_places`) -> the gap it also runs
    into (`it also runs into a gap in rlxviz's ops: default_scale`), which its `○` mark says after the term. {} without
    `trace` (or a step of no trace)."""
    if trace is None or trace.index_of(step) is None:
        return {}
    from ..passes.why.standing import gap_caveat  # the verdict reads the pipeline; the overlay is drawn without

    at = _gap_places(trace, step, groups)
    held = {pl: f"it also runs into a gap in rlxviz's ops: {h.guard}" for pl, h in held_places(trace, step).items()}
    return {pl: w for pl, rs in at.items() if (w := gap_caveat(trace, rs))} | held


def held_places(trace: Trace | None, step: PassStep) -> Mapping[tuple[str, int], Held]:
    """Each place (rule, anchor) of `step`'s refusals held by the model's own term whose refusal the run recorded
    (`passes.why.standing.held_place`: t5's cross-attention, refused by the gap `default_scale`, whose compiler fix
    alone uncovers `self_attention`) -> its `Held`: that term's refusal (`term`), the gap's words as `explain` says
    them after it (`also`: `it also runs into a gap in rlxviz's ops, ... (default_scale), whose compiler fix alone would
    not form FusedAttentionBlock here`) and the gap's guard (`guard`). Its marks are the term's, on the anchor
    (`worded`), never the gap's, nor the term's on the Q-side norm its guard is about. {} without `trace` (or a step
    of no trace)."""
    k = trace.index_of(step) if trace is not None else None
    if trace is None or k is None:
        return {}
    from ..passes.refusal_kinds import MODEL_TERM  # the verdict reads the pipeline; the overlay is drawn without it
    from ..passes.why.facts import RunFacts
    from ..passes.why.places import place_standings
    from ..passes.why.standing import held_place

    cache, key = RunFacts.of(trace).cache, ("held_places", k)  # once per step: the inspector asks per node
    if key not in cache:
        cache[key] = MappingProxyType({
            pl: held for pl, (head, st) in place_standings(trace, k).items()
            if st is not None and st[0] == MODEL_TERM and (held := held_place(trace, head)) is not None
            and held.term is not None})
    return cache[key]


def is_gap(group: str) -> bool:
    """Whether a standing group (`place_groups`) is a gap in rlxviz's ops (`passes.why.verdict.OP_GAP_GROUP`, the
    chips' `△`): a compiler fix, drawn apart from the faded `○`."""
    from ..passes.why.verdict import OP_GAP_GROUP  # the verdict reads the pipeline; the overlay is drawn without it

    return group == OP_GAP_GROUP


def worded(trace: Trace, step: PassStep) -> tuple[Rejection, ...]:
    """`step`'s rejections (a step of `trace`) with their messages and hints as `explain`, the Why tab and the Matches
    & rejections table word them (`passes.report.in_context`: a "run P first" whose P ran before names what P
    decided there; the hint is `passes.report.fix_line`, the fix, never a copy of the message), so a tooltip says
    what the text says; then the leftover scan's findings filed under it (`passes.why.places.step_refusals`), as the
    chips count them. `step`'s own when it is no step of `trace`. A place held by the model's own term
    (`held_places`: t5's cross-attention) is its term's refusal alone, at the anchor, its message naming the gap it
    also runs into as `explain` does: one `○` mark, never the gap's guard as the term, nor the term on the Q norm."""
    from ..passes.report import fix_line, in_context  # the report reads the pipeline; the overlay needs none

    k = trace.index_of(step)
    if k is None:
        return tuple(step.rejections)
    out, held = [], held_places(trace, step)
    for r in _refusals(trace, step):  # a finding filed under the step too, as the chips count it
        if (h := held.get((r.rule, r.anchor))) is not None and h.term is not None and (
                r.headline or r.guard == h.term.guard):
            if r.headline:  # one mark at a held place: its term's, on the anchor, naming the gap it also has
                message = f"{in_context(trace, k, h.term)[0]}; {h.also}"
                out.append(replace(h.term, message=message, hint=fix_line(trace, k, h.term), subject=None,
                                   headline=True))
            continue
        message, hint = in_context(trace, k, r)[0], fix_line(trace, k, r)
        out.append(r if (message, hint) == (r.message, r.hint) else replace(r, message=message, hint=hint))
    return tuple(out)

@dataclass(frozen=True)
class Overlay:
    """Decorations for one graph version.

    Attributes:
        title: caption drawn above the graph.
        matches: matches whose bindings are ids of the drawn graph; each becomes a coloured cluster.
        extents: anchor id -> every node id a match covers (defaults to its bound ids); from a step,
            the fused node's `absorbed` list, so the cluster holds the whole matched subgraph.
        match_ops: anchor id -> op name of the node that replaced the match (for cluster labels).
        rejections: near-misses whose anchors and bindings are ids of the drawn graph.
        fused: matches whose `fused` node is in the drawn graph (marked, listing what they absorbed).
        added: ids new in this version (green border).
        removed: nodes of an older version that this one dropped (drawn ghosted, with their edges).
        origin: the graph that `Node.absorbed` ids refer to, to name absorbed ops in labels.
        heat: node id -> (fill, tooltip line): a per-node figure drawn as the node's fill (`viz.heat`), its value
            in the tooltip; replaces the op colour of those nodes.
        standings: each place (rule, anchor) of `rejections` that is no near-miss -> its standing group
            (`place_groups`: the chips' `○`, `△` for a gap in rlxviz's ops): the drawing marks it so, never with a
            near-miss's red `✗`; a layer holding only these is drawn as a not-near-miss, never as rejected.
        gap_names: each place of `standings` at a gap in rlxviz's ops -> each gap it ran into, its op form and a
            short name (`gap_names`): a `△` label names them all, `2 gaps in rlxviz's ops: integer_qkv,
            default_scale` (`standing_words`).
        made: node id -> what a node a match made beside its product is (`passes.made.made_beside`): its label
            and tooltip say so instead of listing the match's absorbed nodes, which only the product holds.
        followers: each further failing guard of a gap place that is no gap itself (`gap_followers`) -> the text's
            caveat when it fails next once the gap's fix alone is applied (`alone it is not enough: attn_single_user
            (illegal: ...) fails next`), else "": its marks say so, never the place's gap group with its guard as if
            that guard were a gap.
        caveats: each place of `standings` at a gap whose compiler fix alone is not enough, where no follower says
            so (`gap_caveats`) -> the text's caveat (`alone it is not enough: qkv_packed (not recognized) fails
            next`): its `△` marks and the Why title say it.
        makers: node id -> the stage of its pass that made it (`passes.made.stage_makers`: glm's attention made by
            `fuse_attention_block/qkv_columns`), which its label and tooltip name (`made.maker`), not the pass alone.
        names: node id -> (rule, role) per binding of a match or rejection that this overlay does not draw: the
            names messages give the node (`ln1 (role h1)`), put in its tooltip's `roles:` line so the search finds
            it by them in the after pane too (only the before pane tags candidates).
    """

    title: str = ""
    matches: tuple[Match, ...] = ()
    extents: dict[int, tuple[int, ...]] = field(default_factory=dict)
    match_ops: dict[int, str] = field(default_factory=dict)
    rejections: tuple[Rejection, ...] = ()
    fused: tuple[Match, ...] = ()
    added: frozenset[int] = frozenset()
    removed: tuple[Node, ...] = ()
    origin: Graph | None = None
    heat: dict[int, tuple[str, str]] = field(default_factory=dict)
    standings: dict[tuple[str, int], str] = field(default_factory=dict)
    names: dict[int, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    made: dict[int, Beside] = field(default_factory=dict)
    gap_names: dict[tuple[str, int], GapNames] = field(default_factory=dict)
    followers: Followers = field(default_factory=dict)
    caveats: dict[tuple[str, int], str] = field(default_factory=dict)
    makers: dict[int, str] = field(default_factory=dict)

    @classmethod
    def before(cls, step: PassStep, rejections: bool = True, trace: Trace | None = None) -> Overlay:
        """Clusters for every match and marks for every rejection of `step`, on `step.before`.

        A match's cluster holds what its fused node absorbed (else its non-operand bindings). With
        `trace`, ids absorbed by earlier passes are named in labels.
        """
        extents: dict[int, tuple[int, ...]] = {}
        ops: dict[int, str] = {}
        for m in step.matches:
            ids = {i for r, i in m.bindings.items() if r not in INPUT_ROLES} | {m.anchor}
            fused = step.after.get(m.fused) if m.fused is not None else None
            if fused is not None:
                ids = set(fused.absorbed) | {m.anchor}
                ops[m.anchor] = fused.op.value
            extents[m.anchor] = tuple(sorted(i for i in ids if i in step.before))
        return cls(title=before_caption(step, trace), matches=tuple(step.matches), extents=extents, match_ops=ops,
                   rejections=(worded(trace, step) if trace is not None else tuple(step.rejections))
                   if rejections else (),
                   origin=all_versions(trace) if trace is not None else None,
                   made=made_in_run(trace) if trace is not None else {},
                   makers=stage_makers(trace) if trace is not None else step_makers([step]),
                   standings=(groups := place_groups(trace, step) if rejections else {}),
                   gap_names=gap_names(trace, step, groups) if rejections else {},
                   followers=gap_followers(trace, step, groups) if rejections else {},
                   caveats=gap_caveats(trace, step, groups) if rejections else {})

    def worded_by(self, trace: Trace, step: PassStep) -> Overlay:
        """This overlay with `step`'s rejections (of `trace`) worded as `explain` and the table word them
        (`worded`), for an overlay made without the trace, its caption counting places as the chips do with the
        trace (`before_caption`), its labels read against the whole run as the after pane's are (`made`, `origin`:
        `passes.made.where_now`, the absorbed ops' names). An overlay that marks `step`'s refusals (all of them: none
        for a step that refused nothing) marks the leftover scan's findings filed under it too (`worded`), as its chip
        counts them; one made without marks (`before(step, rejections=False)`) stays so."""
        marks = bool(self.rejections) or not step.rejections  # a finding under a step that refused nothing: drawn
        groups = place_groups(trace, step) if marks else {}
        out = replace(self, rejections=worded(trace, step), standings=groups, gap_names=gap_names(trace, step, groups),
                      followers=gap_followers(trace, step, groups), caveats=gap_caveats(trace, step, groups)
                      ) if marks else self
        # every node of the run, as `before(step, trace=...)` and the after pane read it: a product a later pass
        # absorbed is "now in FusedTransformerLayer %398" in both panes of one version, never "now gone" in one
        out = replace(out, made=made_in_run(trace), origin=all_versions(trace), makers=stage_makers(trace))
        return replace(out, title=before_caption(step, trace)) if out.title.startswith("before ") else out

    @classmethod
    def after(cls, step: PassStep, trace: Trace | None = None) -> Overlay:
        """The fused nodes of `step` (and any other added node) marked on `step.after`."""
        fused = tuple(m for m in step.matches if m.fused is not None and m.fused in step.after)
        changes = change_words(step.before, step.after, step.added, step.removed)
        title = f"after {trace.step_name(step) if trace is not None else step.pass_name}, in the graph: {changes}"
        return cls(title=title, fused=fused, added=frozenset(step.added),
                   origin=all_versions(trace) if trace is not None else step.before, names=bound_names(step),
                   made=made_in_run(trace) if trace is not None else made_beside(step),
                   makers=stage_makers(trace) if trace is not None else step_makers([step]))

    @classmethod
    def diff(cls, old: Graph, new: Graph, title: str = "") -> Overlay:
        """Draw `new` with nodes added since `old` in green and nodes removed from `old` ghosted."""
        added = frozenset(n.id for n in new if n.id not in old)
        removed = tuple(n for n in old if n.id not in new)
        return cls(title=title or f"diff: +{len(added)} added, -{len(removed)} removed, "
                                  f"{len(new) - len(added)} unchanged",
                   added=added, removed=removed, origin=old)

    @classmethod
    def trace_summary(cls, trace: Trace, ran: int | None = None) -> Overlay:
        """Every rejection of a run and every fused node still in its final graph (for the layer view); `ran`: the
        rejections of the first `ran` steps only (`trace.steps[:ran]`: those whose pass has run by version `ran`), each
        still judged as the whole run judges it (`standings`), so a place's status never changes back as steps go."""
        final = trace.final
        fused = tuple(m for m in trace.matches if m.fused is not None and m.fused in final)
        return cls(title=trace.pipeline, fused=fused,
                   rejections=tuple(r for s in trace.steps[:ran] for r in worded(trace, s)), origin=all_versions(trace),
                   made=made_in_run(trace), makers=stage_makers(trace), standings=(groups := run_groups(trace)),
                   gap_names={pl: names for s in trace.steps for pl, names in gap_names(trace, s, groups).items()},
                   followers={k: w for s in trace.steps for k, w in gap_followers(trace, s, groups).items()},
                   caveats={pl: w for s in trace.steps for pl, w in gap_caveats(trace, s, groups).items()})

    @property
    def excused(self) -> frozenset[tuple[str, int]]:
        """The places (rule, anchor) of `rejections` that are no near-miss (`standings`: the chips' `○` and `△`)."""
        return frozenset(self.standings)

    @property
    def gaps(self) -> frozenset[tuple[str, int]]:
        """Those of `excused` at a gap in rlxviz's ops (`is_gap`: the chips' `△`): a layer holding only excused
        places, some of them gaps, is drawn as a gap (`styles.OP_GAP`)."""
        return frozenset(pl for pl, group in self.standings.items() if is_gap(group))

    def standing_words(self, place: tuple[str, int]) -> str:
        """The standing group of `place` (rule, anchor) as a label says it (`standings`; "" for a near-miss): a place
        at several gaps in rlxviz's ops, or met by several guards, names each (`group_words` of `gap_names`), `2 gaps
        in rlxviz's ops: its integer-matmul Q/K/V projections (integer_qkv), default_scale`, never the one its failing
        guard names alone."""
        group = self.standings.get(place, "")
        return group_words(group, self.gap_names.get(place, ())) if is_gap(group) else group

    def extent(self, m: Match) -> tuple[int, ...]:
        """Node ids covered by match `m` (its absorbed nodes; by default its non-operand bindings)."""
        return self.extents.get(m.anchor) or tuple(sorted({i for r, i in m.bindings.items() if r not in INPUT_ROLES}
                                                          | {m.anchor}))


def bound_names(step: PassStep) -> dict[int, tuple[tuple[str, str], ...]]:
    """(rule, role) per binding of `step`'s matches and rejections, by node id, for the nodes `step.after` still
    holds: what `Overlay.names` takes (a rejected candidate's `h1` is `ln1 (role h1)` in the banner, and the after
    pane draws the node)."""
    out: dict[int, dict[tuple[str, str], None]] = {}
    for b in (*step.matches, *step.rejections):
        for role, i in b.bindings.items():
            if i in step.after:
                out.setdefault(i, {})[(b.rule, role)] = None
    return {i: tuple(v) for i, v in out.items()}


_ALL_VERSIONS: DigestCache[Graph] = DigestCache(limit=8)


def all_versions(trace: Trace) -> Graph:
    """Every node of every version of a run in one (non-dataflow) graph, to resolve any id of the run; once per run
    (the graph pane's search index and each inspector report read it)."""
    def every() -> Graph:
        nodes: dict[int, Node] = {}
        for _, g in trace.versions():
            for n in g:
                nodes.setdefault(n.id, n)
        return Graph(nodes.values(), trace.final.outputs, trace.input.name + "_all_versions")

    return _ALL_VERSIONS.get_or_compute(trace, every)
