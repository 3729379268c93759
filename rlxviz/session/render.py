"""Drawing a graph version: a pure function of (trace, view) for every front end, cached by content.

A `View` names what to draw: a version of the run (index into `trace.versions()`), the side (the
version with its pass's fused nodes marked, the graph the pass saw with every match and rejection
marked, or the graph before the pass that first rejected something in a layer, or first refused it at a gap in
rlxviz's ops), `full` or `layers`
(one box per layer), and an optional layer to focus on.

The layers view labels each layer box with the run's one final verdict (`verdicts`: the `passes.why.RunVerdict`
that "why didn't layer N fuse?" renders) at every version; at a version before the layer reached its final form, or
before the pass that refuses it ran, the box adds what has happened to it so far, labelled (`settled_verdicts`). A
box outside the layers says, by the same rule, the run's refusals there whose pass has run (`Overlay.trace_summary`
of the steps so far): from that pass's version on, never only at the final one. The
"why" side draws the graph before the pass of its first rejection (of its first gap refusal, drawn `△`, for a layer
held back only by rlxviz's ops), so the text and the picture never disagree.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..ir import Graph
from ..ir.ops import LEAF
from ..passes import PassStep, Trace, layer_of
from ..passes.made import remade_in_run
from ..passes.placement import placed
from ..passes.readers import live_nodes
from ..passes.trace import Layer
from ..passes.why.excused import OpGap
from ..passes.why.facts import made_nodes
from ..passes.why.places import layer_places
from ..passes.why.text import FUSED_AS_EXPECTED, kind_limit, none_made_words
from ..passes.why.verdict import OP_GAP_GROUP, LayerVerdict, RunVerdict, first_gap, layer_verdict, why_step
from ..viz import Overlay, Verdict, drawing_title, render_dot, render_svg
from ..viz.dot import GAP_MARK
from ..viz.overlay import GapNames, before_caption, change_words, group_words
from .cache import LRUCache
from .loading import layer_indices

RENDERS = LRUCache(maxsize=512)
"""SVG text by (source key, View), shared by every session of the process."""

SIDES = ("after", "before", "why")
VIEWS = ("full", "layers")


@dataclass(frozen=True)
class View:
    """What to draw.

    Attributes:
        version: index into `trace.versions()` (0: the input).
        view: `full` (one box per op) or `layers` (one box per layer).
        side: `after` (the version, its pass's fused nodes marked), `before` (the graph its pass saw, matches
            clustered and rejections marked) or `why` (the graph before the pass that first rejected something
            in `focus`, or first refused it at a gap in rlxviz's ops, with that pass's marks: `_why`).
        focus: a layer to draw alone (full view only), or None.
        expanded: `layers` view only: layers drawn open in place, their nodes inside the overview.
    """

    version: int = 0
    view: str = "full"
    side: str = "after"
    focus: int | None = None
    expanded: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.view not in VIEWS or self.side not in SIDES:
            raise ValueError(f"[View] view must be one of {VIEWS} and side one of {SIDES}, got {self.view!r}, "
                             f"{self.side!r}")


def _why(trace: Trace, layer: int | None, i: int) -> tuple[Graph, Overlay | None]:
    """The "why" side: the graph before the step `why_step` names for the layer, with that step's marks (the overlay
    the Graph tab's before pane draws), its caption counting the layer's places (`layer_caption`): the pass of the
    layer's first counted rejection in the run's verdict (`RunVerdict`), or for a layer held back only by gaps in
    rlxviz's ops (`LayerVerdict.gap_only`) the pass of its first gap refusal, drawn `△`, its title saying so and naming
    the layer's other gaps (`_gap_title`); for a layer whose first rejection is an `unrecognized.*` finding, the step
    it is filed under, marked as its chip counts it (`why.places.step_refusals`). A layer that fused as expected, or no
    layer shows version `i`. One verdict: the text and the picture never name different rejections."""
    k = why_step(trace, layer) if layer is not None and layer in layer_indices(trace.input) else None
    if k is not None and layer is not None:
        s = trace.steps[k]
        ov = layer_caption(Overlay.before(s).worded_by(trace, s), trace, s, layer)
        gap = first_gap(trace, layer, k)
        return s.before, replace(ov, title=_gap_title(trace, layer_verdict(trace, layer), gap, k, ov)) if gap else ov
    step = trace.steps[i - 1] if i > 0 else None
    if step is None:
        return trace.input, None
    ov = Overlay.after(step, trace)
    return step.after, replace(ov, title=layer_changes(step, layer, trace)) if layer is not None else ov


def layer_caption(ov: Overlay, trace: Trace, step: PassStep, layer: int) -> Overlay:
    """`ov` (the before pane's overlay of `step`) drawn for `layer` alone: its caption counting the layer's matches
    and places, saying so (`viz.overlay.before_caption`: `before P, in this layer: ...`); the whole graph's counts
    under one layer's drawing read as the layer's (gpt-neox's layer 1 said `△2` of one place)."""
    return replace(ov, title=before_caption(step, trace, layer)) if ov.title.startswith("before ") else ov


def layer_changes(step: PassStep, layer: int, trace: Trace | None = None) -> str:
    """The after pane's title for `layer` drawn alone: what `step` added and removed in that layer
    (`viz.overlay.change_words` of the nodes whose path names it), saying so (`after P, in this layer: ...`), where the
    whole graph's counts read as the layer's; P named as `trace` names the step (`Trace.step_name`: `NAME#2` for a
    later run)."""
    added = [i for i in step.added if layer_of(step.after[i].path) == layer]
    removed = [i for i in step.removed if layer_of(step.before[i].path) == layer]
    name = trace.step_name(step) if trace is not None else step.pass_name
    return f"after {name}, in this layer: {change_words(step.before, step.after, added, removed)}"


def _gap_title(trace: Trace, v: LayerVerdict, gap: OpGap, k: int, ov: Overlay) -> str:
    """The "why" drawing's title for a layer held back only by gaps in rlxviz's ops: its status, the place of its
    first gap drawn `△` (`gap`'s rule at its first place `ov` marks) and every gap that place ran into
    (`Overlay.gap_names`, else what ran into `gap`), then each other gap of the layer (`LayerVerdict.gaps`) in the
    words of the Why tab's `rlxviz's ops lack:` lines (`OpGap.__str__`), saying where it is: `also △ in P, a later
    pass (not drawn): ...` for a gap refused in a later pass than `trace.steps[k]`'s (deit's mask-less attention block
    behind its bias-after-residual gap), `also △ in this drawing: ...` for one this step refused elsewhere; then the
    caption (`ov.title`), e.g. `fused as far as rlxviz's ops go: △ fuse_attention_block.qkv_attention_out @ %795:
    default_scale (2 gaps in rlxviz's ops: its integer-matmul Q/K/V projections (integer_qkv), default_scale); before
    fuse_attention_block, in this layer: 0 match(es), 0 rejected places, △1 place at a gap in rlxviz's ops` (the
    place: `_gap_words`). The place's caveat on its compiler fix follows its words where no follower's mark says it
    (`Overlay.caveats`: esm's `alone it is not enough: qkv_packed (not recognized) fails next`)."""
    at = next((a for a in gap.at if (gap.rule, a) in ov.standings), gap.at[0] if gap.at else None)
    gaps = (ov.gap_names.get((gap.rule, at), ()) if at is not None else ()) or ((gap.form, gap.by),)
    words = _gap_words(ov, gap.rule, at, gaps)
    where = f" @ %{at}" if at is not None else ""
    named = {(gap.rule, f) for f, _ in gaps} | {(gap.rule, gap.form)}
    also = []
    for g in v.gaps:
        if (g.rule, g.form) in named:
            continue
        at_k = next((j for j in range(k, len(trace.steps)) if _refuses(trace.steps[j], g)), None)
        scope = ("in this drawing" if at_k == k else "elsewhere in the run (not drawn)" if at_k is None else
                 f"in {trace.step_names()[at_k]}, a later pass (not drawn)")
        also.append(f"also {GAP_MARK} {scope}: {g}")
    caveat = ov.caveats.get((gap.rule, at), "") if at is not None else ""  # the text's: esm's qkv_packed next
    return "; ".join([f"{v.status}: {GAP_MARK} {gap.rule}{where}: {words}", *([caveat] if caveat else []), *also,
                      ov.title])


def _gap_words(ov: Overlay, rule: str, at: int | None, gaps: GapNames) -> str:
    """What `_gap_title` says the place (`rule`, `at`) ran into, in the words of its cluster's label (`viz.dot`:
    `GUARD (STANDING)`): the failing guards that meet a gap there (the place's refusals but those `ov.followers` names,
    no gap themselves), then the gap group counting its gaps, each named by its guard or, where a layer trait makes the
    gap whatever the guard, as what the trait is in the model (`passes.declarations.trait_named`)
    (`viz.overlay.trait_worded`, the text's `rlxviz's ops lack:` words): qwen3's `qkv_packed (gap in rlxviz's ops: its
    Q and K normalized before the attention (qk_norm))`, esm.qdyn's `default_scale (2 gaps in rlxviz's ops:
    its integer-matmul Q/K/V projections (integer_qkv), default_scale)`, never a trait bare where a guard's name stands.
    The group and its one name (`gap in rlxviz's ops: its integer-matmul Q/K/V projections (integer_qkv)`) where no
    refusal of the place is drawn."""
    guards = list(dict.fromkeys(r.guard for r in ov.rejections if (r.rule, r.anchor) == (rule, at)
                                and (rule, at, r.guard) not in ov.followers))
    words = group_words(OP_GAP_GROUP, gaps)
    if not guards:
        return words if words != OP_GAP_GROUP else f"{words}: {gaps[0][1]}"  # one gap, one guard: named all the same
    if words == OP_GAP_GROUP and any(n not in guards for _, n in gaps):  # one gap, a trait: the label names none
        words = f"{words}: {gaps[0][1]}"
    return f"{', '.join(guards)} ({words})"


def _refuses(step: PassStep, g: OpGap) -> bool:
    """`step`'s refusals hold a place of gap `g` (its rule at one of its anchors)."""
    return any(r.rule == g.rule and r.anchor in g.at for r in step.rejections)


_VERDICTS = LRUCache(maxsize=16)


def verdicts(trace: Trace) -> dict[int, Verdict]:
    """Layer -> the run's verdict on it drawn on its box (`RunVerdict`: fused as expected, else the first guard that
    rejected it and its message), for every layer of the run's input graph; cached by the trace's key."""
    return _VERDICTS.get_or_compute(trace.key, lambda: _verdicts(trace))


def _verdicts(trace: Trace) -> dict[int, Verdict]:
    run, at = RunVerdict.of(trace), layer_places(trace)

    def summary(v: LayerVerdict) -> tuple:  # what "same as layer K" compares of the verdict besides its words and guard
        ops = Counter(item.split(" %", 1)[0] for item in (*v.done, *v.rewritten))
        return tuple(sorted(ops.items())), at.get(v.layer, ())

    def verdict(v: LayerVerdict) -> Verdict:  # the verdict's own words (`LayerVerdict.status`), as the Why tab says,
        limit = kind_limit(v)  # but `fused as expected` and its kind's limit where that `fused` is no full fusion
        return Verdict(v.fused, v.first.guard if v.first is not None else "", v.reason,
                       status=FUSED_AS_EXPECTED if limit else v.status, none_made=none_made_words(v),
                       held_back=v.fused and bool(v.op_gaps) and not v.has_fused_op, at_gap=v.gap_only,
                       summary=summary(v), limit=limit)

    return {v.layer: verdict(v) for v in run.layers}


def _layer_nodes(g: Graph, where: Mapping[int, Layer | str]) -> dict[int, frozenset[int]]:
    """Layer -> ids of its live compute nodes in `g` (node ids are never reused: equal sets mean the same nodes).
    Leaves and dead nodes (`readers.live_nodes`) do not count: a dead const of esm.dynamo-eager's layer 0 that the
    last dead_code_elimination removed kept the layer unsettled before it, drawing one layer in two colours. A node
    `where` places (`placement.placed`) counts in its place's layer, in none when placed outside the layers."""
    out: dict[int, set[int]] = {}
    live = live_nodes(g)
    for n in g:
        if n.id in live and n.op not in LEAF and (k := where.get(n.id, layer_of(n.path))) is not None \
                and not isinstance(k, str):
            out.setdefault(k, set()).add(n.id)
    return {k: frozenset(v) for k, v in out.items()}


def settled_verdicts(trace: Trace, g: Graph, ran: int | None = None) -> dict[int, Verdict]:
    """`verdicts` (the final verdict) of every layer `g` (a version of `trace`) holds, each `settled` when `g` already
    holds the layer as the final graph does (the same nodes) and the pass the verdict names has run (`why_step`: the
    step of its first counted rejection, or of its first gap refusal): its box says the verdict's word, whichever
    pane or version shows it. An earlier state of the layer, or the layer's final nodes at a version before that pass
    refused it there (bert-tiny's `dead_h1_user` layer 1 after `fuse_residual_ln` read `not fused / rejected:
    h1_user_count`, a refusal `fuse_transformer_layer` makes two steps later, newcomer run 22), gets the verdict with
    `settled=False` (its box says `final: <word>` and what has happened to it so far, `viz.layers`). Either way with
    the nodes of the layer in `g` that the run's matches made (`Verdict.made`, from `why.facts.made_nodes`, the nodes
    the verdict lists): a settled box says the plain ops among them beside its fused ones (`rewritten as attention`,
    the CLI's `rewritten as: attention %312`), as an earlier version's box does.

    Args:
        trace: the run.
        g: a graph of the run (a version, or the graph a step ran on).
        ran: how many of `trace.steps` made `g` (version `i` of `trace.versions()`: `i`; the graph step `k` ran on:
            `k`); None: the last version whose graph is `g`.
    """
    ran = _ran(trace, g) if ran is None else ran
    where = placed(trace)  # drawn where the run placed them (`final norm`, a layer), not by their path
    now, final = _layer_nodes(g, where), _layer_nodes(trace.final, where)
    listed = listed_nodes(trace)

    def settled(k: int) -> bool:
        step = why_step(trace, k)
        return now[k] == final.get(k) and (step is None or step < ran)

    return {k: replace(v, settled=settled(k), made=now[k] & listed.get(k, frozenset()))
            for k, v in verdicts(trace).items() if k in now}


def _ran(trace: Trace, g: Graph) -> int:
    """How many of `trace.steps` made `g`: the last version of `trace` whose graph is `g`, else every step."""
    graphs = [v for _, v in trace.versions()]
    return next((i for i in range(len(graphs) - 1, -1, -1) if graphs[i] is g), len(trace.steps))


def listed_nodes(trace: Trace) -> dict[Layer | int, frozenset[int]]:
    """Layer -> ids of the nodes the run's matches made (`made_nodes`) that a box's `at this version:` counts as
    made: those its verdict lists (`LayerVerdict.done`, `LayerVerdict.rewritten`: `OP %ID (...)`, what `explain`'s
    layer line, `-v`, `--json` and the Why tab say), and each rewrite's product (`_new_kind`: the packed `attention`,
    a `rope`, a merged matmul, a `gelu` a later fusion absorbed, so the final verdict no longer lists it). The box
    answers for its version, the verdict for the final graph; they differ only by what a later pass absorbed. A plain
    op a rewrite re-made of the one op of its kind it took in (gpt-neox's `where` %170, the NaN guard
    `canonicalize_exported.nan_guard_moved` moved, which a region later took in) is the model's op re-placed, not a
    rewrite "as" anything: version 26 said `rewritten as attention, where` while every other view said `rewritten
    as: attention %237`. A node that re-makes an earlier match's product (`remade_in_run`: gpt-neox's ropes %233 and
    %235, which `fuse_attention_block.qkv_columns` made from `fuse_sdpa`'s) is said as that product, as the verdict
    credits it."""
    made, new = made_nodes(trace) | frozenset(remade_in_run(trace)), _new_kind(trace)
    return {v.layer: frozenset(i for item in (*v.done, *v.rewritten)
                               if (i := int(item.split(" %", 1)[1].split(" ", 1)[0].rstrip(")"))) in made) | new
            for v in RunVerdict.of(trace).layers}


def _new_kind(trace: Trace) -> frozenset[int]:
    """Ids of the nodes the run's matches made (`Match.fused`) that are a rewrite's product: of an op the match bound
    none of in the graph it ran on (`Match.bindings` in `PassStep.before`: a `rope`, the packed `attention`), or
    several of (the merged matmul of `fuse_shared_input_matmul`), not the one op of its kind it re-made in place (a
    `where` re-made by `canonicalize_exported.nan_guard_moved` or `where_bias`, a transpose `fuse_sdpa.head_layout`
    re-laid)."""
    out = set()
    for s in trace.steps:
        for m in s.matches:
            if m.fused is not None and m.fused in s.after:
                took = [s.before[i].op for i in m.bindings.values() if i in s.before]
                if took.count(s.after[m.fused].op) != 1:
                    out.add(m.fused)
    return frozenset(out)


def is_final(trace: Trace, version: int) -> bool:
    """Version `version` (index into `trace.versions()`) is the run's final graph: no later pass changed it."""
    return not any(s.changed for s in trace.steps[version:])


Heat = tuple[tuple[int, str, str], ...]
"""Per-node fills with their tooltip lines, `(node id, fill, line)` sorted by id (`overlays.heat`): hashable, so
a drawing's cache key holds it."""


def picture(source: Trace | Graph, v: View, heat: Heat = ()) -> tuple[Graph, Overlay | None, dict[str, Any]]:
    """(graph, overlay, `viz.render_dot` keyword arguments) of `v` in a run (or of a bare graph); `heat` colours
    the nodes it names (a per-node overlay of time share or error)."""
    kw_refusals: Overlay | None = None
    if isinstance(source, Graph):
        g, ov, trace = source, None, None
    else:
        trace = source
        step = trace.steps[v.version - 1] if v.version > 0 else None
        if v.side == "why":
            g, ov = _why(trace, v.focus, v.version)
        elif step is None:
            g, ov = trace.input, None
        elif v.side == "before":
            g, ov = step.before, Overlay.before(step).worded_by(trace, step)
            ov = layer_caption(ov, trace, step, v.focus) if v.focus is not None else ov
        else:
            g, ov = step.after, Overlay.after(step, trace)
            ov = replace(ov, title=layer_changes(step, v.focus, trace)) if v.focus is not None else ov
            if v.view == "layers":  # its boxes say what the pass that made it found, as its before pane does
                kw_refusals = Overlay.before(step).worded_by(trace, step)
    kw: dict[str, Any] = {"view": v.view}
    if kw_refusals is not None:
        kw["refusals"] = kw_refusals
    if v.focus is not None:
        kw["focus"] = v.focus
    if v.view == "layers" and v.expanded:
        kw["expanded"] = v.expanded
    if v.view == "layers" and trace is not None and ov is None:
        ov = Overlay.trace_summary(trace)
    if trace is not None:  # placed by structure: boxed (a stub says it) where `explain` says they sit
        kw["placed"] = placed(trace)
    if v.view == "layers" and trace is not None:
        ran = v.version if v.side == "after" else max(v.version - 1, 0) if v.side == "before" else \
            next((k for k, s in enumerate(trace.steps) if s.before is g), None)
        kw["verdicts"] = settled_verdicts(trace, g, ran)  # the final verdict, as the "why" view says it, on every box
        # the boxes outside the layers say the run's refusals whose pass has run, as a layer's settled box does: the
        # verdict's `outside the layers:` lines on the final version, and none of them before its pass (deit's pooler
        # read `fused` between its refusal and the final version, the pane's pass refusing nothing there)
        kw["outside"] = Overlay.trace_summary(trace, _ran(trace, g) if ran is None else ran)
    if v.view == "layers" and (alone := drawn_alone(g, v.expanded)) is not None:  # too many to open in place
        layer, count = alone
        kw = {"view": "full", "focus": layer, **{k: kw[k] for k in ("placed",) if k in kw}}
        said = f"{ov.title}; " if ov is not None and ov.title else ""
        ov = replace(ov or Overlay(), title=f"{said}{count} ops, too many to open among the layer boxes (over "
                                            f"{OPEN_IN_PLACE_NODES}): drawn alone; “Fold all layers” goes back")
    if heat:
        ov = replace(ov or Overlay(), heat={i: (fill, line) for i, fill, line in heat if i in g})
    return g, ov, kw


OPEN_IN_PLACE_NODES = 300
"""Most ops the layer view draws open among its boxes (`View.expanded`); past it the open layer is drawn alone, as
the focus view draws it (`drawn_alone`). Measured on a busy 2-core EPYC with Graphviz 2.43: convbert.qdq's layer 0,
1289 ops, drawn open among the boxes crashed `dot` (SIGSEGV) after 25-40 s (graphviz-pure: 35 s of CPU), the same
ops drawn alone laid out in 0.7-0.9 s; convbert.qdyn's layer 0, about 310 ops, took 9 s open among the boxes,
falcon's (about 40) 0.2 s."""


def open_nodes(graph: Graph, layers: Collection[Layer | int]) -> int:
    """How many ops of `graph` (`Graph.compute_nodes`: params and constants are drawn in their readers' labels) lie in
    `layers` (by path, `passes.layer_of`): what opening them draws in place."""
    keys = list(layers)
    return sum(1 for n in graph.compute_nodes()
               if (k := layer_of(n.path)) is not None and any(k == x for x in keys)) if keys else 0


def drawn_alone(graph: Graph, expanded: Collection[Layer | int]) -> tuple[Layer | int, int] | None:
    """(the layer, its node count) when the layers `expanded` open in the layer view hold more than
    `OPEN_IN_PLACE_NODES` ops: the largest of them is drawn alone instead (`picture`); None when they fit."""
    if open_nodes(graph, expanded) <= OPEN_IN_PLACE_NODES:
        return None
    counts = [(open_nodes(graph, [k]), k) for k in expanded]
    count, layer = max(counts, key=lambda c: c[0])
    return layer, count


def dot(source: Trace | Graph, v: View, heat: Heat = (), titled: bool = True) -> str:
    """DOT source of `v` (see `picture`); `titled`: with its `caption` as the graph's label (a stand-alone drawing:
    `rlxviz render`, a downloaded SVG), else none (the app shows the caption in HTML above the picture)."""
    g, ov, kw = picture(source, v, heat)
    return render_dot(g, ov, **kw) if titled else render_dot(g, ov, title="", **kw)


def caption(source: Trace | Graph, v: View) -> str:
    """The title of `v`'s drawing (`viz.drawing_title` of `picture`'s overlay): the label a titled drawing carries,
    and the text the app shows above an untitled one, e.g. the Why tab's `fused as far as rlxviz's ops go: △ ...;
    before P, in this layer: ...`. Raises as `picture` does."""
    g, ov, kw = picture(source, v)
    return drawing_title(g, ov, view=kw["view"], focus=kw.get("focus"))


def source_key(source: Trace | Graph) -> tuple[str, str]:
    """The content key of what is drawn from: the trace's `Trace.key`, or a bare graph's `Graph.digest`."""
    return ("graph", source.digest) if isinstance(source, Graph) else ("trace", source.key)


def svg(source: Trace | Graph, v: View, heat: Heat = (), titled: bool = True) -> str:
    """SVG of `v` (with `heat`'s node fills; `titled`: see `dot`), cached by (content key, view, heat, titled)."""
    return RENDERS.get_or_compute(("svg", source_key(source), v, heat, titled),
                                  lambda: render_svg(dot(source, v, heat, titled)).svg)


__all__ = ["Heat", "OPEN_IN_PLACE_NODES", "RENDERS", "SIDES", "VIEWS", "View", "caption", "dot", "drawn_alone",
           "is_final", "layer_caption", "layer_changes", "listed_nodes", "open_nodes", "picture", "settled_verdicts",
           "source_key", "svg", "verdicts"]
