"""Views for large graphs: one box per transformer layer with its fusion status, and focus on one layer.

The layer-collapsed view groups nodes by `layer_of(node.path)` (non-layer nodes by the first part of
their path: `embeddings`, `mask`), folds params into their group, and draws one edge per pair of
groups. Each layer box says whether the layer is fused (one FusedTransformerLayer), partly fused
(some fused ops), rejected (a near-miss; the guard is named, its message is the tooltip) or unfused.
Given the session's verdicts (`Verdict`, from the run's `passes.why.RunVerdict`, the answer the "why didn't layer N
fuse?" view gives), a layer box says that verdict instead: `fused` or `not fused` (with the first guard). The verdict is
the final one, what the whole pipeline did to the layer, whichever version is drawn: on a version where the layer is
not yet as the final graph holds it, or is but the pass that refuses it has not run (`Verdict.settled` False), the box
says `final: fused` / `final: not fused` and, labelled `at this version:`, what the passes so far did to it (`unfused`,
`partly fused`, ...), which also colours it, counting what their matches made in the layer: fused ops and plain ops a
match made (`rewritten as attention`).
A layer whose structure, status and final verdict (its words, the ops it made, its refused places by pattern, guard
and count) are those of an earlier layer (`layer_signature`) says so on its box: "same as layer 0", so that a 32-layer
model reads as one layer and its exceptions.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import graphviz

from ..ir import Graph, Node, Op
from ..ir.ops import FUSED, LEAF, MOVEMENT, REWRITTEN_AS, SPECS, made_as
from ..passes.placement import after_places, path_box
from ..passes.readers import live_nodes
from ..passes.rules.cleanup import region_of_one
from ..passes.trace import Layer, Rejection, layer_label, layer_of, layer_prefix
from .box_words import SAME_AS as SAME_AS  # re-exported: what "same as layer K" compares
from .box_words import box_label, box_tooltip, status_text
from .dot import DotOptions, GraphTooLarge, _Drawer, _e, _html, _small, _tip
from .heat import UNCOLOURED
from .overlay import GapNames, Overlay
from .styles import (
    BOX_FRAMES,
    KIND_LIMITED,
    NOT_NEAR_MISS,
    OP_GAP,
    PLAIN_BOX,
    REJECT,
    STATUS_COLORS,
    fmt_shape,
    tint,
)


@dataclass(frozen=True)
class Verdict:
    """The session's verdict on one layer of a run (`passes.why.RunVerdict`), drawn on its box.

    Attributes:
        fused: the layer fused as its architecture expects.
        guard: the first guard that rejected its fusion (`` when fused or when nothing was rejected).
        message: one line on why it did not fuse (`` when fused).
        settled: the version drawn holds the layer as the final graph does (its box says the verdict's word); False:
            an earlier version, so its box says `final: <word>` and, apart, what has happened to it so far.
        status: the verdict's own words (`passes.why.LayerVerdict.status`, what the Why tab and `explain --json`
            say: `fused`, `fused as far as legal`, `not fused`, ...); "" when the verdict has none (then `word` is
            `fused` or `not fused`, read from `fused`).
        none_made: what the box of a fused layer says when no op of it fused (`passes.why.text.none_made_words`:
            `no fused op` for a layer held back by rlxviz's ops, else `nothing to fuse`).
        held_back: the layer is held back by rlxviz's ops with no fused op (`LayerVerdict.op_gaps` and not
            `has_fused_op`: status `held back by rlxviz's ops`): not fused, not the model's fault; its box is drawn
            as a gap (`styles.OP_GAP`), never in the fused green.
        at_gap: the layer is held back, in part or whole, by gaps in rlxviz's ops (`LayerVerdict.gap_only`: status
            `fused as far as rlxviz's ops go`, `... ops and patterns go`, or `held back by ...`; `held_back` implies
            it): its box and words are drawn as the gap (`styles.OP_GAP`, the chips' `△`), never in the fused green,
            which says "fused as expected" (gpt-neox's `final: fused as far as rlxviz's ops and patterns go` was
            written in green, issue 39).
        made: on an unsettled verdict, ids of the layer's nodes in the version drawn that the run's matches made
            (`passes.why.facts.made_nodes`: the nodes the verdict lists as fused or rewritten), so the box's `at
            this version:` counts the plain ops a match made (the packed `attention`) beside the fused ones.
        limit: what the layer's kind rules out of a verdict `fused` (`passes.why.text.kind_limit`: `quantized
            activations: no float fusion across QDQ steps expected`), "" when none: its `status` is then `fused as
            expected` (the CLI's words for the layer), the limit beside it (`word`), and its box's look
            `styles.KIND_LIMITED`, never the fused green of a full fusion (ernie.qdq's elementwise regions alone).
        summary: the rest of the final verdict that "same as layer K" compares (`layer_signature`), with no node id
            in it: the ops it lists as made (op -> count) and its refused places by pattern, guard, status and why
            (`passes.why.places.layer_places`), e.g. granite's layer 1 with the residual-norm refusal at 2 places
            against layer 0's 1; () when not given.
    """

    fused: bool
    guard: str = ""
    message: str = ""
    settled: bool = True
    status: str = ""
    none_made: str = "nothing to fuse"
    held_back: bool = False
    at_gap: bool = False
    made: frozenset[int] = frozenset()
    summary: tuple = ()
    limit: str = ""

    @property
    def head(self) -> str:
        """The status words of the layer's box, without its `limit`: the verdict's own (`status`), else `fused` or
        `not fused`. The box said `fused` of a layer the Why tab called `fused as far as legal` (a newcomer run, case
        n4-15)."""
        return self.status or ("fused" if self.fused else "not fused")

    @property
    def word(self) -> str:
        """`head`, then the `limit` in brackets when there is one: `fused as expected (quantized activations: no
        float fusion across QDQ steps expected)`, what the tooltip and an opened layer's frame say."""
        return f"{self.head} ({self.limit})" if self.limit else self.head


@dataclass
class LayerGroup:
    """The nodes of one box in the layer view.

    Attributes:
        key: DOT id of the box (`layer3`, `g_embeddings`).
        title: `encoder.layer.3`.
        layer: layer index or None.
        nodes: compute nodes in the group.
        weights: number of parameter values the group reads: each weight once, in the box of its first reader in
            graph order, but a weight only values the layers share read (`placement.placed`: T5's relative position
            bias, which block 0 adds and every block reads) in their box, at every version.
        shared_weights: how many of `weights` are such values the layers share (the box's label and tooltip say it).
        status: `fused`, `partly fused`, `rejected`, `rewritten` (no fused op, but plain ops a match made:
            `Verdict.made`), `unfused` (or `` for non-layer groups): what the passes so far did to the layer; with
            a settled `Verdict` (`Verdict.settled`), its word (`fused`, `not fused`).
        rejections: near-misses anchored in this layer.
        verdict: the session's verdict, when given.
        same_as: the first layer with the same structure and status (`layer_signature`), or None (this layer is
            the first of its kind, or not a layer).
        gaps: for a box drawn as a gap (`OP_GAP`), each gap in rlxviz's ops its places ran into, its op form and
            a short name (`Overlay.gap_names`), each once: the box names them all (`_standing_words`).
        state: for a layer, what the graph drawn holds there (`fused`, `partly fused`, `rewritten`, `unfused`), with
            no refusal counted: `status` less what the pane's pass found (`box_words._so_far`).
        found_by: the pass whose refusals in the box `found_as` says: the pane's pass, on the before pane (it runs on
            the graph drawn) and on the after pane (it made it); "" when it refused nothing there. A box outside the
            layers: the pass of the pane's refusals anchored in it, whatever its status (`outside_status`).
        found_as: what `found_by` found there: `rejected`, `OP_GAP` or `NOT_NEAR_MISS` (`_find`): a layer's `status`
            when no settled verdict says it; a settled layer box and a box outside the layers say it apart, beside
            their own words (`box_words._found`), so every box a pass refused in names the pass (t5's decoder block
            0, settled at `fuse_attention_block`, had no `fuse_attention_block:` line while block 1 had; minilm's
            `embeddings` said nothing of `fuse_residual_ln`'s `○`, newcomer run 22). "" with no `found_by`.
    """

    key: str
    title: str
    layer: int | None
    nodes: list[Node] = field(default_factory=list)
    weights: int = 0
    shared_weights: int = 0
    status: str = ""
    rejections: list[Rejection] = field(default_factory=list)
    verdict: Verdict | None = None
    same_as: Layer | None = None
    gaps: GapNames = ()
    state: str = ""
    found_by: str = ""
    found_as: str = ""

    @property
    def fused(self) -> list[Node]:
        return [n for n in self.nodes if n.op in FUSED]

    @property
    def rewritten(self) -> list[Node]:
        """The plain ops of the group that the run's matches made (`Verdict.made`, named `rewritten as` by
        `ir.ops.made_as`, as the verdict's `LayerVerdict.rewritten`: the `attention` `fuse_sdpa` packed)."""
        made = self.verdict.made if self.verdict is not None else frozenset()
        return [n for n in self.nodes if n.id in made and made_as(n.op) == REWRITTEN_AS]

    @property
    def tone(self) -> str:
        """The key of the box's colours (`STATUS_COLORS`): `fused` or `not fused` for a settled verdict (`fused as
        far as legal` is drawn as fused), but `OP_GAP` for a layer held back by rlxviz's ops, with or without fused
        ops (`Verdict.at_gap`, `Verdict.held_back`: `fused as far as rlxviz's ops go` is no green), and
        `KIND_LIMITED` for one fused only as far as its kind expects any fusion (`Verdict.limit`), else `status`."""
        if self.verdict is not None and self.verdict.settled:
            if self.verdict.held_back or self.verdict.at_gap:
                return OP_GAP
            if self.verdict.limit:  # fused only as far as its kind expects any fusion: no full fusion's green
                return KIND_LIMITED
            return "fused" if self.verdict.fused else "not fused"
        return self.status


def _layer_key(layer: Layer, stacked: bool) -> str:
    """The DOT id of `layer`'s box (`layer3`; `layer_decoder_0` when `stacked`); `box_layer` reads it back."""
    return f"layer_{layer.stack}_{layer}" if stacked and layer.stack else f"layer{layer}"


_BOX = re.compile(r"layer(\d+)|layer_(.+)_(\d+)")
"""A layer box's DOT id (`_layer_key`): `layer3`, or `layer_<stack>_<index>` (the stack may hold `_` and `.`)."""


def box_layer(key: str | None) -> Layer | int | None:
    """The layer whose box (or cluster, drawn open) has DOT id `key`, as the layers view's click sends it: `layer3`
    -> 3 (a plain int, every stack's layer 3, as before: the caller's `passes.trace.own_key` finds the model's key),
    `layer_decoder_0` -> `Layer(0, "decoder")`; None for any other id (`g_embeddings`, `n12`, None). The index alone
    (what a click sent) was 0 for encoder and decoder layer 0 alike, and NaN for `layer_decoder_0`."""
    m = _BOX.fullmatch(key or "")
    if m is None:
        return None
    return int(m.group(1)) if m.group(1) is not None else Layer(int(m.group(3)), m.group(2))


def _group_key(n: Node, stacked: bool = False) -> tuple[str, str, int | None]:
    """(group key, title, layer) of `n`; `stacked`: the graph has several stacks (an encoder-decoder model), whose
    layers of one index are apart (`layer0` / `layer_decoder_0`)."""
    layer = layer_of(n.path)
    if layer is not None:  # titled by the path up to its layer (ALBERT's `albert_layers.0@1`: no part reads `1`)
        return _layer_key(layer, stacked), layer_prefix(n.path) or layer_label(layer), layer
    return place_key(path_box(n.path)), path_box(n.path), None


def place_key(place: str) -> str:
    """The DOT id of the box of a place in no layer (`placement.outside_box`): `g_embeddings`, `g_final_norm`."""
    return "g_" + place.replace(" ", "_")


def weight_only(graph: Graph) -> set[int]:
    """Ids of compute nodes that read only params and constants, directly or through other such nodes
    (e.g. the concat of Q/K/V weights after `fuse_shared_input_matmul`): weight preparation, not activations."""
    static: set[int] = set()
    for n in graph:
        if n.op in (Op.INPUT, Op.PARAM, Op.CONST):
            continue
        if all(graph[i].op in (Op.PARAM, Op.CONST) or i in static for i in n.inputs):
            static.add(n.id)
    return static


NOT_FUSABLE = MOVEMENT | LEAF | frozenset(op for op, spec in SPECS.items() if spec.kind == "host")
"""Ops no fused op of rlxviz takes in: data movement and indexing (reshape, transpose, narrow, concat, expand, gather,
pad), graph leaves and host ops. A box whose ops are fused but for these reads `fused`, not `partly fused`."""


def not_fusable(graph: Graph, n: Node) -> bool:
    """`n` is no op a fusion of rlxviz could take in (`NOT_FUSABLE`), a cast that changes the dtype (no
    ElementwiseRegion takes one: `passes.rules.cleanup`), or a boolean op with no neighbour a region could join it
    with (`cleanup.region_of_one`: gpt-neox's lone mask `where`; mask logic is taken by no fused op but a region, while
    a lone float op may still be an epilogue a FusedMatMulBiasAct refused): left beside a box's fused ops, it leaves
    nothing to fuse."""
    if n.op in NOT_FUSABLE:
        return True
    if n.op == Op.CAST and bool(n.inputs) and graph[n.inputs[0]].dtype.value != n.attrs.get("dtype"):
        return True
    return n.dtype.value == "bool" and region_of_one(graph, n)


def all_fused(graph: Graph, g: LayerGroup, static: Collection[int]) -> bool:
    """The box holds a fused op and every other op of it is weight preparation (`weight_only`: merged Q/K/V weights)
    or not fusable (`not_fusable`): `fused`, where it read `partly fused` (esm.qdyn's `encoder` box, its one op a
    FusedResidualLN; an embeddings box whose unfused ops are a gather and a reshape)."""
    return bool(g.fused) and all(n.op in FUSED or n.id in static or not_fusable(graph, n) for n in g.nodes)


def outside_status(g: LayerGroup, overlay: Overlay | None, of: Mapping[int, str]) -> str:
    """The status of box `g` of a place outside the layers, by the rule of `explain`'s `outside the layers:` lines
    (`why.text.outside_line`, `--json` `outside_boxes` and `outside_gaps`): `fused` when it holds a fused op,
    `partly fused` only where a near-miss refusal (neither the chips' `○` nor `△`: `Overlay.excused`) of `overlay`
    is anchored in it (`of`: node id, or an id a node of the version absorbed -> box key), `OP_GAP` where a place at a
    gap in rlxviz's ops is anchored and no near-miss (deit's pooler: its tanh read through a reshape; its gaps in
    `g.gaps`), `` with no fused op. minilm's and roberta's `embeddings` read `partly fused` beside an op only a `○`
    refuses (nothing to fix), while esm.qdyn's, an ElementwiseRegion too, read `fused`. Raises nothing."""
    if not g.fused:
        return ""
    if overlay is None:
        return "fused"
    at = {(r.rule, r.anchor) for r in overlay.rejections if r.layer is None and of.get(r.anchor) == g.key}
    if at - overlay.excused:
        return "partly fused"
    if at & overlay.gaps:  # the text's `gap in rlxviz's ops:` line under `outside the layers:` (deit's pooler tanh)
        g.gaps = _gaps_at(overlay, at)
        return OP_GAP
    return "fused"


def _find(g: LayerGroup, overlay: Overlay | None, pristine: bool = False) -> bool:
    """Set what the pane's pass found in box `g` (`LayerGroup.found_by`, `found_as`; `gaps` where `g` holds none)
    from its refusals (`g.rejections`, of `overlay`); none on the input graph (`pristine`) of a layer with a verdict.
    A box whose every refusal is no near-miss (the chips' ○) is not found rejected; one of them at a gap in rlxviz's
    ops (the chips' △, `Overlay.gaps`) is found that gap, with the gaps its places ran into. Returns whether it found
    anything."""
    if not g.rejections or (g.verdict is not None and pristine):
        return False
    g.found_by = ", ".join(dict.fromkeys(r.pass_name for r in g.rejections))
    excused = overlay.excused if overlay else frozenset()
    at = {(r.rule, r.anchor) for r in g.rejections}
    gaps = at & overlay.gaps if overlay is not None else set()
    g.found_as = "rejected" if not at <= excused else OP_GAP if gaps else NOT_NEAR_MISS
    if overlay is not None and g.found_as == OP_GAP and not g.gaps:
        g.gaps = _gaps_at(overlay, at)
    return True


def _gaps_at(overlay: Overlay, places: Collection[tuple[str, int]]) -> GapNames:
    """Each gap in rlxviz's ops the places (rule, anchor) among `places` at a gap ran into (`Overlay.gaps`,
    `Overlay.gap_names`), once, in their order."""
    return tuple(dict.fromkeys(x for pl in places if pl in overlay.gaps for x in overlay.gap_names.get(pl, ())))


def _found_outside(g: LayerGroup, overlay: Overlay | None, of: Mapping[int, str],
                   layers: Mapping[Layer, LayerGroup]) -> None:
    """What the pane's pass (`overlay`) found in box `g` outside the layers, as a layer's box says it (`_find`):
    its refusals anchored in `g` (`of`: node id, or an id a node of the graph absorbed -> box key) and credited to no
    layer drawn (`layers`), set as `g.rejections`. minilm's `fuse_residual_ln` refuses the embeddings' norm (`○ not
    near-miss: residual_same_shape`, the caption's and chip's `○1`) and no box said so (newcomer run 22)."""
    if overlay is None:
        return
    g.rejections = [r for r in overlay.rejections if r.layer not in layers and of.get(r.anchor) == g.key]
    _find(g, overlay)


def layer_groups(graph: Graph, overlay: Overlay | None = None,
                 verdicts: Mapping[int, Verdict] | None = None,
                 placed: Mapping[int, Layer | str] | None = None,
                 refusals: Overlay | None = None, outside: Overlay | None = None) -> dict[str, LayerGroup]:
    """Compute nodes grouped by layer (in graph order), each with its fusion status.

    Args:
        graph: the graph version to summarize.
        overlay: its rejections (e.g. `Overlay.trace_summary(trace)`) mark layers as rejected.
        refusals: the overlay whose rejections the boxes say instead of `overlay`'s (the after pane of a pass: the
            pass's own, `Overlay.before(step)`, which the after overlay does not mark on the graph it made), so a
            pass's before and after panes say alike what it found (`LayerGroup.found_by`).
        outside: the overlay whose rejections the boxes outside the layers say (`outside_status`) instead: the run's
            whose pass has run by the version drawn (`Overlay.trace_summary(trace, ran)`), as a layer's box says its
            verdict once the pass that refuses it has run; on the final version `explain`'s `outside the layers:`
            lines. Default: `refusals`, else `overlay`.
        verdicts: layer -> the session's final verdict (what "why didn't layer N fuse?" says); a layer whose verdict
            is `settled` takes its word as status, an unsettled one keeps its status at this version beside it.
        placed: node id -> where it sits, for the nodes `passes.placement.placed` places by the model's structure,
            not their path (a residual norm at a layer's edge, and the norm it absorbed at earlier versions): a layer
            (its box), or a place outside the layers (the box of that name, `final norm`), whatever its path says, so
            the final norm is boxed alike across exports (esm.dynamo-eager's sat with the embeddings in `model`,
            esm.qdyn's in `encoder`, granite's in `other`) and across versions, and each node that runs after the
            layers in its place (`placement.after_places`: deit.qdq's `model.layernorm`, apart from its embeddings'
            `model`); None: those of `graph` alone. Every other node in no layer is boxed by its path
            (`placement.path_box`): the boxes are the places `explain`'s lines say.
    """
    groups: dict[str, LayerGroup] = {}
    of: dict[int, str] = {}
    stacked = len({k.stack for n in graph if (k := layer_of(n.path)) is not None}) > 1
    where = placed if placed is not None else after_places(graph)  # a bare graph: what runs after the layers
    for n in graph:
        if n.op in (Op.INPUT, Op.PARAM, Op.CONST):
            continue
        place = where.get(n.id)
        key, title, layer = _group_key(n, stacked) if place is None else \
            (place_key(place), place, None) if isinstance(place, str) else (_layer_key(place, stacked), "", place)
        grp = groups.get(key) or groups.setdefault(key, LayerGroup(key, title, layer))
        grp.title = grp.title or title  # a layer's box is titled by the path of its own nodes
        grp.nodes.append(n)
        of[n.id] = key
    for g in groups.values():
        g.title = g.title or layer_label(g.layer)
    for n in graph.params:
        reader = next((u for u in graph.users(n) if u.id in of), None)
        if reader is None:
            continue
        size = 1
        for s in n.shape:
            size *= s
        place = where.get(n.id)  # a weight the layers share (`placement.placed`): in their place, at every version
        if isinstance(place, str) and place_key(place) in groups:
            groups[place_key(place)].weights += size
            groups[place_key(place)].shared_weights += size
        else:
            groups[of[reader.id]].weights += size
    by_layer = {g.layer: g for g in groups.values() if g.layer is not None}
    # weight preparation and dead ops (what dead_code_elimination removes) leave nothing to fuse: a box's word at a
    # version depends on the live ops it holds only
    live = live_nodes(graph)
    static = weight_only(graph) | {n.id for n in graph if n.id not in live}
    overlay = refusals or overlay
    outside = outside or overlay
    held = {**{a: of[n.id] for n in graph if n.id in of for a in n.absorbed}, **of}  # a refusal's anchor a match took
    for r in (overlay.rejections if overlay else ()):
        if r.layer in by_layer:
            by_layer[r.layer].rejections.append(r)
    # the input graph (no pass made any node): the run's rejections it may be marked with (`Overlay.trace_summary`)
    # are not what has happened to a layer at this version; the final verdict says them
    pristine = not any(n.pass_name for n in graph)
    for g in groups.values():
        if g.layer is not None and verdicts and g.layer in verdicts:
            g.verdict = verdicts[g.layer]
        if g.layer is not None:  # what the graph holds there, no refusal counted
            one = g.fused and len([n for n in g.nodes if n.id not in static]) == 1  # weight preparation: no op
            # fused but for ops no fusion takes (`all_fused`: a reshape, a gather) is no partial fusion
            g.state = "fused" if one or (g.fused and all_fused(graph, g, static)) else "partly fused" if g.fused \
                else "rewritten" if g.rewritten else "unfused"
        if g.verdict is not None and g.verdict.settled:
            g.status = g.verdict.word
            _find(g, overlay, pristine)  # said apart from the verdict (`box_words._found`)
        elif g.layer is None:
            g.status = outside_status(g, outside, held)
            _found_outside(g, None if pristine else overlay, held, by_layer)  # the input: the run's, not its own
        elif g.state == "fused" and len([n for n in g.nodes if n.id not in static]) == 1:
            g.status = "fused"  # one fused op; weight preparation (e.g. merged Q/K/V weights) does not count
        elif _find(g, overlay, pristine):
            g.status = g.found_as
        else:
            g.status = g.state
    first: dict[tuple, int] = {}
    for g in groups.values():
        if g.layer is not None:
            k = first.setdefault(layer_signature(graph, g), g.layer)
            g.same_as = k if k != g.layer else None
    return groups


def layer_signature(graph: Graph, g: LayerGroup) -> tuple:
    """What two layers share when they are the same: for each node of `g` in graph order its op, dtype, shape,
    attributes (the layer's own path in a text written as `<layer>`) and the pass that made it; each operand as its
    place among the layer's nodes or, from outside the layer, its dtype and shape and whether it is a weight; then
    the number of weights its box counts (a weight read first by layer 0 counts there only: esm.qdyn's layers read
    1.22K and 704), the layer's status, rejected guards and final verdict: everything its box and tooltip say is the
    same (`SAME_AS`), whichever version is drawn: the verdict's words, first guard, held-back mark and `Verdict.summary`
    (the ops it made, its refused places by pattern, guard, status and how many: granite's layer 1, with one more
    residual-norm place than layer 0, read "same as layer 0" at every version before the last). Node ids, names and
    weight values are left out: layer 3 of a stack is the same as layer 0 when only those differ."""
    local = {n.id: k for k, n in enumerate(g.nodes)}

    def attr(v: object) -> object:
        return v.replace(g.title, "<layer>") if isinstance(v, str) else repr(v)

    def operand(i: int) -> tuple:
        if i in local:
            return ("in", local[i])
        m = graph[i]  # what made it differs at the stack's ends (layer 0 reads the embeddings): not compared
        return ("param" if m.op in (Op.PARAM, Op.CONST) else "out", str(m.dtype), tuple(m.shape))

    nodes = tuple((n.op.value, str(n.dtype), tuple(n.shape), tuple(sorted((k, attr(v)) for k, v in n.attrs.items())),
                   n.pass_name or "", tuple(operand(i) for i in n.inputs)) for n in g.nodes)
    v = g.verdict
    verdict = (v.fused, v.guard, v.settled, v.word, v.held_back, v.at_gap, v.summary) if v is not None else None
    return nodes, g.weights, g.status, verdict, tuple(sorted({(r.rule, r.guard) for r in g.rejections}))


def layers_to_dot(graph: Graph, overlay: Overlay | None = None, title: str | None = None,
                  max_nodes: int = 1500, verdicts: Mapping[int, Verdict] | None = None,
                  expanded: Collection[int] = (), placed: Mapping[int, Layer | str] | None = None,
                  refusals: Overlay | None = None, outside: Overlay | None = None) -> str:
    """DOT source of the layer-collapsed view of `graph` (boxes `id="layer<i>"`, edges `L<src>_<dst>`).

    Args:
        verdicts: layer -> `Verdict`: the boxes say the session's status words (see `layer_groups`).
        placed: node id -> where it sits, for nodes placed by structure, not path (see `layer_groups`).
        refusals: the pass's refusals the boxes say, when not `overlay`'s (see `layer_groups`); never marked on nodes.
        outside: the refusals the boxes outside the layers say (see `layer_groups`).
        expanded: layers drawn open in place: a cluster `id="layer<i>"` holding the layer's nodes as the full
            view draws them (`n<id>`, overlay marks included, edges `e<src>_<dst>` between drawn nodes); the
            other layers stay one box each. Layers the graph lacks are ignored.

    Raises:
        GraphTooLarge: more than `max_nodes` boxes and drawn nodes (a graph whose paths carry no layer
            structure, or too many layers expanded).
    """
    groups = layer_groups(graph, overlay, verdicts, placed, refusals, outside)
    opened = [g for g in groups.values() if g.layer is not None and g.layer in set(expanded)]
    inside = {n.id for g in opened for n in g.nodes}
    if len(groups) + len(inside) > max_nodes:
        raise GraphTooLarge(f"[layers_to_dot] {len(groups)} groups and {len(inside)} expanded nodes exceed "
                            f"max_nodes={max_nodes}; expand fewer layers")
    of = {n.id: (f"n{n.id}" if n.id in inside else g.key) for g in groups.values() for n in g.nodes}
    d = graphviz.Digraph(graph.name + "_layers", graph_attr={
        "rankdir": "TB", "newrank": "true", "nodesep": "0.3", "ranksep": "0.3", "fontname": "Helvetica",
        "fontsize": "12", "labelloc": "t", "id": "graph_" + graph.name + "_layers"},
        node_attr={"shape": "box", "style": "rounded,filled", "fontname": "Helvetica", "fontsize": "10",
                   "width": "2.6"},
        edge_attr={"color": "#555555", "arrowsize": "0.6", "fontname": "Helvetica", "fontsize": "8"})
    if title is None:
        title = overlay.title if overlay and overlay.title else \
            f"{graph.name}: layer view, {len(graph.compute_nodes())} ops"
    if title:  # "": the app shows it above the picture (`render.drawing_title`)
        d.attr(label=graphviz.nohtml(title))
    with d.subgraph() as s:
        s.attr(rank="source")
        for n in graph.inputs:
            s.node(f"n{n.id}", _html([f"<B>{_e(n.attrs['name'])}</B>", _small(fmt_shape(n), "#333333", 9)]),
                   id=f"n{n.id}", shape="ellipse", style="filled", fillcolor="#eeeeee", width="0")
            of[n.id] = f"n{n.id}"
    drawer = _Drawer(graph, overlay or Overlay(), DotOptions(max_nodes=max_nodes), inside) if inside else None
    for g in groups.values():
        # while an overlay colours nodes (`Overlay.heat`), a box's status fill would read as its legend (a "partly
        # fused" yellow as 1e-07–1e-06): grey, its status in its words and outline only
        fill = UNCOLOURED if overlay is not None and overlay.heat else STATUS_COLORS.get(g.tone, PLAIN_BOX)
        attrs = {"id": g.key, "fillcolor": fill, "tooltip": _tip(box_tooltip(g))}
        # the frame (`styles.BOX_FRAMES`, what the legend shows): the rejection's red dashed, the chips' faded ○
        # grey dotted (nothing to fix), the unfaded △ solid in the gap's ink (a compiler fix), the fused green
        if g.tone in BOX_FRAMES:
            colour, line, width = BOX_FRAMES[g.tone]
            attrs.update(color=colour, penwidth=width)
            if line != "solid":
                attrs["style"] = f"rounded,filled,{line}"
        if drawer is not None and g in opened:
            _open_layer(d, g, attrs, drawer)
        else:
            d.node(g.key, box_label(g), **attrs)
    edges: dict[tuple[str, str], list[int]] = {}  # (box, box) -> the values it carries, in graph order
    reach: dict[int, set[str]] = {}  # a value -> the boxes that read it
    for n in graph:
        dst = of.get(n.id)
        for j in n.inputs:
            src = of.get(j)
            if src is None or dst is None or src == dst:
                continue
            if drawer is not None and j in inside and n.id in inside:  # inside open layers: every edge, as drawn
                d.edge(src, dst, **_inner_edge(drawer, j, n.id))
            else:
                carried = edges.setdefault((src, dst), [])
                if j not in carried:
                    carried.append(j)
                reach.setdefault(j, set()).add(dst)
    fanout = Counter(src for src, _ in edges)
    labelled: set[int] = set()  # the broadcast values whose first edge says how many boxes read them
    for (src, dst), carried in edges.items():
        # a box that feeds many boxes broadcasts a value (the mask): keep it out of the main chain, unless the edge
        # carries a value only its box reads (bart-full's encoder.layers.0 makes the cross-attention's mask and the
        # hidden state: its edge to encoder.layers.1 holds the chain)
        j = next((j for j in carried if fanout[src] <= 2 or len(reach[j]) == 1), None)
        attrs = {"id": f"L{src}_{dst}"}
        if j is None:
            j = carried[0]
            attrs.update(style="dashed", color="#aaaaaa", constraint="false", arrowsize="0.4")
        if "constraint" not in attrs or j not in labelled:
            attrs["label"] = graphviz.nohtml(fmt_shape(graph[j]) + (f" (to {len(reach[j])} groups)"
                                                                    if "constraint" in attrs else ""))
            labelled.add(j)
        d.edge(src, dst, **attrs)
    with d.subgraph() as s:
        s.attr(rank="sink")
        for k, o in enumerate(graph.outputs):
            s.node(f"out{k}", graphviz.nohtml(f"output {k}\n{fmt_shape(graph[o])}"), id=f"out{k}",
                   shape="ellipse", style="filled", fillcolor="#ffffff", fontsize="9", width="0")
    for k, o in enumerate(graph.outputs):
        if o in of:
            d.edge(of[o], f"out{k}", id=f"eout{k}")
    return d.source


def _open_layer(d: graphviz.Digraph, g: LayerGroup, box: dict[str, object], drawer: _Drawer) -> None:
    """Layer `g` expanded in place: a cluster with the box's id, colours and tooltip, holding its nodes."""
    word = f": {status_text(g)}" if g.status else ""
    if g.same_as is not None:
        word += f" (same as {layer_label(g.same_as)})"
    with d.subgraph(name=f"cluster_{g.key}") as c:
        c.attr(id=g.key, label=graphviz.nohtml(f"{g.title}{word}  [click here to fold]"), labeljust="l",
               style="rounded,filled", fillcolor=tint(str(box.get("color", "#90a4ae")), 0.93),
               color=str(box.get("color", "#90a4ae")), penwidth=str(box.get("penwidth", "1.5")),
               tooltip=box["tooltip"], fontname="Helvetica", fontsize="11")
        c.attr("node", width="0", height="0.3", margin="0.08,0.03", fontsize="10")
        for n in g.nodes:
            drawer._emit_node(c, n)


def _inner_edge(drawer: _Drawer, j: int, i: int) -> dict[str, str]:
    """Attributes of edge %j -> %i between nodes of expanded layers (an offending edge is marked)."""
    attrs = {"id": f"e{j}_{i}"}
    if (j, i) in drawer.hot_edges:
        attrs.update({"color": REJECT, "penwidth": "3", "fontcolor": REJECT, "class": "offending",
                      "label": graphviz.nohtml(drawer.hot_edges[(j, i)])})
    return attrs


def focus_ids(graph: Graph, layer: int, radius: int = 0) -> set[int]:
    """Ids of nodes in layers `layer - radius .. layer + radius` (params included).

    Raises:
        ValueError: no node of `graph` belongs to `layer`.
    """
    stack = getattr(layer, "stack", None)  # a stack-qualified layer: neighbours in its own stack only
    ids = {n.id for n in graph if (k := layer_of(n.path)) is not None and abs(k - layer) <= radius
           and (stack is None or k.stack == stack)}
    if not ids:
        layers = sorted({k for n in graph if (k := layer_of(n.path)) is not None})
        raise ValueError(f"[focus] no node of {graph.name!r} is in layer {layer}; layers: {layers}")
    return ids
