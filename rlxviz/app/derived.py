"""`Derived`: what the app shows, derived from `AppState`'s parameters and its run (a mixin of `AppState`, no
Panel import): the shown versions and their graphs, the IR text views, the drawings (cached by content) and the
session's answers about layers ("why didn't layer N fuse?"). Nothing here changes a parameter.

Each derivation declares the parameters it reads with `param.depends` (`AppState.param.method_dependencies(name)`
lists them; `tests/test_app_derived_deps.py` checks that none reads another).
"""

from __future__ import annotations

import difflib
from typing import Any

import param

from .. import session
from ..ir import Graph, format_graph
from ..passes import PassStep, Trace
from ..passes.placement import sits
from ..passes.trace import Layer, Rejection, layer_label, layer_of, own_key
from ..passes.why.places import Places, own_item, places
from ..passes.why.verdict import OP_GAP_GROUP, RunVerdict
from ..session import LayerStatus, SessionError, View, overlays
from ..session import render as drawing
from ..viz.heat import UNCOLOURED_ROW, legend
from ..viz.overlay import other_changes
from .views import AUTO, COLLAPSED, FOCUS, FULL
from .wording import md_lines

FULL_VIEW_LIMIT = 400
"""`auto` view: graphs with more nodes than this are drawn one box per layer."""
FULL_VIEW_LAYERS = 6
"""`auto` view: models with more layers than this are drawn one box per layer (a layer expands in place)."""



INPUT_FIRST = "input graph, passes running"
"""The pipeline name of the trace with no pass a load shows first (`Runs._show_input_first`): drawn as its bare
input graph, so no layer box says `not fused` before a pass has run."""

RUN = ("trace", "model")
"""The run shown (a graph before its run: the model's)."""
SHOWN = (*RUN, "version", "hide_unchanged")
"""The version shown: the run, the selected version, and which versions are listed."""
DRAWN = (*SHOWN, "view", "selected_layer", "expanded_layers")
"""A drawing of the version shown: its view, the focused layer, the layers drawn open."""
COLOURS = ("node_figures", "overlay")
"""The node colours of the chosen overlay."""


def step_places(step: PassStep, trace: Trace | None = None) -> Places:
    """`passes.why.places.places` of `step` of `trace`: its refusals counted `PLACE_UNIT` (a pattern's candidate at one
    node, never per failing guard), the hard near-misses (the chip's ✗) apart from the places that are no near-miss
    (the chip's faded ○). Without `trace` (or a step of no trace), by the refusal alone (`Rejection.near_miss`): the
    hard refusals of a kind that is no near-miss, each by its node and message (`own_item`), still one per place."""
    if trace is not None and (k := trace.index_of(step)) is not None:
        return places(trace, k)
    heads: dict[tuple[str, int], Rejection] = {}
    for r in step.rejections:
        if not r.soft:
            heads.setdefault((r.rule, r.anchor), r)
    excused: dict[str, list[str]] = {}
    at: dict[str, list[int]] = {}
    for r in heads.values():
        if not r.near_miss:
            excused.setdefault(r.kind, []).append(own_item(r))
            at.setdefault(r.kind, []).append(r.anchor)
    return Places([r for r in heads.values() if r.near_miss], excused, at)


def _counted(p: Places) -> bool:
    """Whether a chip counts any place of `p`: a near-miss (✗) or a place that is nothing to fix (○)."""
    return bool(p.near_misses or p.excused)


def refusals(step: PassStep, trace: Trace | None = None) -> list[Rejection]:
    """The hard near-misses of `step` of `trace`, one per place (`step_places`: a candidate with four failing guards
    is one refusal), judged by the verdict's rule (`passes.why.standing.standing`: not the model's own term, not a
    lookalike, not a merge the tool's cost test declined, not a refusal the layer's kind does not expect or that is
    illegal for its layer): what its version chip counts as rejections (✗N)."""
    return step_places(step, trace).near_misses


def not_near_misses(step: PassStep, trace: Trace | None = None) -> dict[str, list[str]]:
    """Group -> items of `step`'s places that are no near-miss and nothing to fix (`step_places`, `Places.faded`: the
    model's own term, a lookalike, a declined merge, not expected of the layer, illegal for it; hard or soft), in the
    run's order: an item names its place by node and path, `%ANCHOR (PATH)`, as every chip item does: `%ANCHOR (PATH):
    RULE (GUARD): MESSAGE` for a place whose reason is its refusal's own (the model's own term, a lookalike, a declined
    merge: `places.own_item`, as `explain` lists it), else `%ANCHOR (PATH): RULE (GUARD): why` (the chip's faded ○N).
    A place at a gap in rlxviz's ops is not one of them (`Places.gaps`: the chip's △N)."""
    return step_places(step, trace).faded


def version_rows(trace: Trace, visible: list[tuple[int, str]]) -> list[dict]:
    """One row per version of `trace` in `visible` ((index into `trace.versions()`, label), in order): what
    `Derived.version_rows` says of each (its ops, their change, matches, near-misses, places that are nothing to fix,
    gaps, whether its pass crashed, the pass's time in ms)."""
    versions = trace.versions()
    rows = []
    for k, (i, label) in enumerate(visible):
        g = versions[i][1]
        n = len(g.compute_nodes())
        prev = len(versions[i - 1][1].compute_nodes()) if i else n
        step = trace.steps[i - 1] if i else None
        p = step_places(step, trace) if step else Places([], {})
        rows.append({"#": k, "version": label, "nodes": n, "change": n - prev,
                     "others": other_changes(step) if step else "",
                     "matches": len(step.matches) if step else 0,
                     "rejections": len(p.near_misses), "rejected": p.near_miss_items(),
                     "rejected_at": [r.anchor for r in p.near_misses], "not_near_misses": p.faded,
                     "not_near_miss_at": p.faded_at, "op_gaps": p.gaps,
                     "op_gap_at": p.excused_at.get(OP_GAP_GROUP, []), "lacks": p.lacks,
                     "gap_worked": p.gap_worked, "gap_rounded": p.gap_rounded, "gap_blockers": p.gap_blockers,
                     "gap_unchecked": p.gap_unchecked,
                     "crashed": bool(i and trace.steps[i - 1].error),
                     "fused": sum(1 for x in g if x.pass_name), "ms": (trace.steps[i - 1].seconds * 1e3
                                                                      if i else 0.0)})
    return rows


class Derived:
    """Derived values of `AppState` (its versions, graphs, texts and drawings); read-only."""

    def _visible(self, trace: Trace) -> list[tuple[int, str]]:
        """(index into trace.versions(), label) of the versions shown (memoized per trace content and setting)."""
        key = (trace.key, self.hide_unchanged)
        memo = getattr(self, "_visible_memo", None)
        if memo is not None and memo[0] == key:
            return memo[1]
        out = self._compute_visible(trace, self.hide_unchanged)
        self._visible_memo = (key, out)
        return out

    @staticmethod
    def _compute_visible(trace: Trace, hide: bool) -> list[tuple[int, str]]:
        out = []
        for k, (label, _g) in enumerate(trace.versions()):
            step = trace.steps[k - 1] if k else None
            # a crash stays shown, and so does a pass whose only events are refusals its chip counts (the one an
            # engineer looks for): near-misses (✗) and places that are nothing to fix (○), so every place a chip
            # counts is on a chip shown (a newcomer found llama-block's three ○ in no chip)
            if step is None or not hide or step.changed or step.error or _counted(step_places(step, trace)):
                out.append((k, label))
        return out

    @property
    def version_labels(self) -> list[str]:
        """Labels of the shown versions: "input", "after fuse_matmul_bias_act", ..."""
        return [lbl for _, lbl in self._visible(self.trace)] if self.trace is not None else []

    @param.depends(*RUN, "hide_unchanged")
    def hidden_note(self) -> str:
        """Why the version numbers skip (they count every step, as `rlxviz time`'s `#` does): "16 steps that changed
        nothing hidden (numbers count every step)", or "" when no step is hidden."""
        if self.trace is None:
            return ""
        shown = {k for k, _ in self._visible(self.trace)}
        hidden = [k for k in range(len(self.trace.versions())) if k not in shown]
        if not hidden:
            return ""
        # a hidden step holds no refusal a chip counts (`_compute_visible` keeps those): nothing of ✗ or ○ is hidden
        return (f"{len(hidden)} step{'s' if len(hidden) != 1 else ''} that changed nothing hidden "
                f"(the numbers count every step, as rlxviz time does)")

    @param.depends(*RUN, "hide_unchanged")
    def hidden_before(self, k: int) -> str:
        """The steps hidden just before shown version `k`: "steps 1-16 changed nothing" (trace numbering), or ""."""
        if self.trace is None:
            return ""
        vis = self._visible(self.trace)
        if not 0 < k < len(vis):
            return ""
        a, b = vis[k - 1][0] + 1, vis[k][0] - 1
        return "" if a > b else f"step {a} changed nothing" if a == b else f"steps {a}-{b} changed nothing"

    @param.depends(*SHOWN)
    def version_index(self, k: int | None = None, trace: Trace | None = None) -> int:
        """Index into `trace.versions()` of shown version `k` (default: the selected one) of `trace` (default:
        the state's trace)."""
        trace = self.trace if trace is None else trace
        vis = self._visible(trace) if trace is not None else [(0, "input")]
        k = self.version if k is None else k
        return vis[min(k, len(vis) - 1)][0]

    @param.depends(*SHOWN)
    def graph_at(self, k: int | None = None) -> Graph | None:
        """The graph of shown version `k` (default: the selected one)."""
        if self.trace is None:
            return self.model.graph if self.model is not None else None
        return self.trace.versions()[self.version_index(k)][1]

    @property
    def current_graph(self) -> Graph | None:
        return self.graph_at()

    @property
    def previous_graph(self) -> Graph | None:
        """The graph before the selected version's pass (the version itself for the input)."""
        if self.trace is None:
            return self.current_graph
        i = self.version_index()
        return self.trace.versions()[max(i - 1, 0)][1]

    @property
    def current_step(self) -> PassStep | None:
        """The `PassStep` that produced the selected version (None for the input)."""
        i = self.version_index() if self.trace is not None else 0
        return self.trace.steps[i - 1] if i > 0 else None

    def step_to(self, label: str) -> None:
        """Select the shown version with `label` (e.g. "after fuse_transformer_layer").

        Raises:
            ValueError: no shown version has that label.
        """
        labels = self.version_labels
        if label not in labels:
            raise ValueError(f"no version {label!r}; shown: {labels}")
        self.version = labels.index(label)

    @param.depends(*SHOWN)
    def version_rows(self) -> list[dict[str, Any]]:
        """One row per shown version: label, compute-node count, fused-node count, change in nodes, the other nodes
        it added and removed (`viz.overlay.other_changes`: "-2 params/consts", "" for none), the pass's
        matches, its rejections (`refusals`: hard near-misses by place, the chip's ✗), `rejected`: each of them named
        (`Places.near_miss_items`: `%ANCHOR (PATH): RULE (GUARD)`) and `rejected_at`: its anchor node, and
        `not_near_misses`: group ->
        its places that are no near-miss (`passes.why.standing.standing`: a lookalike, the model's own term, a declined
        merge, not expected of the layer: `Places.faded`), which the chip shows apart, not as a failure, and
        `not_near_miss_at`: the anchor node of each (`step_places`); `op_gaps`: the items of its places at a gap in
        rlxviz's ops (`Places.gaps`, the chip's own mark: a compiler fix), `op_gap_at` their anchors and `lacks` the
        op forms rlxviz lacks there. Read off the run with its fixes checked (`chip_trace`), so a tooltip's
        workaround says what `rlxviz explain` says of it (a rounding-only change with its measured error)."""
        return [] if self.trace is None else version_rows(self.chip_trace(), self._visible(self.trace))

    def chip_trace(self) -> Trace | None:
        """The run the version chips' marks read: `advised_trace` (each fix as `rlxviz explain` prints it, checked:
        `session.advice.checked_verdict`), or the bare run where the check raised (the chips still show its places).
        Same graphs and steps in the same order as `trace`, only refusals' words differ. None before a run."""
        try:
            return self.advised_trace() or self.trace
        except Exception:  # noqa: BLE001 - a check that broke is the Why tab's to say; the chips show the bare run
            return self.trace

    @param.depends(*SHOWN)
    def ir_current(self) -> str:
        g = self.current_graph
        return format_graph(g) if g is not None else ""

    @param.depends(*SHOWN)
    def ir_diff(self) -> str:
        """Unified diff (difflib) of the selected version's IR against the version before it."""
        cur, prev = self.current_graph, self.previous_graph
        if cur is None or prev is None or cur is prev:
            return ""
        step = self.current_step
        name = self.trace.step_name(step) if step is not None and self.trace is not None else "input"
        return "".join(difflib.unified_diff(format_graph(prev).splitlines(True), format_graph(cur).splitlines(True),
                                            f"before {name}", f"after {name}", n=1))

    @param.depends(*RUN)
    def trace_json(self) -> str:
        return self.trace.to_json(graphs=True, indent=1) if self.trace is not None else "{}"

    @property
    def input_first(self) -> bool:
        """The trace shown is the input graph drawn before the passes ran (`Runs._show_input_first`): the run itself
        is still coming, so what waits for a new run (a jump to a refusing pass, an overlay) waits on."""
        return self.trace is not None and self.trace.pipeline == INPUT_FIRST

    def _drawing(self, k: int | None, view: str, side: str = "after",
                 trace: Trace | None = None) -> tuple[Trace | Graph, View]:
        """What to draw for shown version `k` in the app's `view` (`full`, `collapsed`, `focus`): the source
        (the trace, or the bare model graph before a run) and the session's `View`.

        Raises:
            ValueError: no model loaded yet, or `focus` with no layer selected.
        """
        trace = self.trace if trace is None else trace
        source: Trace | Graph | None = trace if trace is not None else (
            self.model.graph if self.model is not None else None)
        if trace is not None and trace.pipeline == INPUT_FIRST:  # the passes still run: no verdict on any layer yet
            source = trace.input
        if source is None:
            raise ValueError("no model loaded yet")
        i = self.version_index(k, trace) if trace is not None else 0
        focus = self.selected_layer if view == FOCUS or side == "why" else None
        if view == FOCUS and focus is None:
            raise ValueError("pick a layer to focus on")
        expanded = tuple(sorted(set(self.expanded_layers))) if view == COLLAPSED else ()
        return source, View(i, "layers" if view == COLLAPSED else "full", side, focus, expanded)

    @param.depends(*DRAWN)
    def render_key(self, k: int | None = None, view: str | None = None) -> tuple:
        """Cache key of a drawing, derived from the graph it draws: the trace's content key (`Trace.key`), the
        version index, the view (and layer for `focus`)."""
        source, v = self._drawing(k, view or self.resolved_view())
        return ("svg", drawing.source_key(source), v)

    @param.depends(*RUN, "view")
    def resolved_view(self, trace: Trace | None = None) -> str:
        """`auto` is the full graph for small models, one box per layer for big ones: more than
        `FULL_VIEW_LIMIT` nodes or `FULL_VIEW_LAYERS` layers in the run's input graph (decided once per run,
        so stepping through versions never switches the view)."""
        if self.view != AUTO:
            return self.view
        trace = self.trace if trace is None else trace
        g = trace.input if trace is not None else (self.model.graph if self.model is not None else None)
        if g is None:
            return FULL
        big = len(g) > FULL_VIEW_LIMIT or len(session.model_layers(g)) > FULL_VIEW_LAYERS
        return COLLAPSED if big else FULL

    @param.depends(*DRAWN)
    def dot(self, k: int | None = None, view: str | None = None) -> str:
        """DOT source of shown version `k` in `view`, with the pass's overlay."""
        return drawing.dot(*self._drawing(k, view or self.resolved_view()))

    @param.depends(*DRAWN, *COLOURS)
    def svg(self, k: int | None = None, view: str | None = None, titled: bool = False) -> str:
        """SVG of shown version `k` with its pass's fused nodes marked, and the node colours of `overlay` when they
        were measured for it (cached by trace content, version, view and colours); `titled`: with its `caption`
        drawn in it (a downloaded file), else none (the pane shows the caption in HTML: `session.render.dot`)."""
        return drawing.svg(*self._drawing(k, view or self.resolved_view()), self.heat(k), titled)

    @param.depends(*DRAWN)
    def caption(self, k: int | None = None, view: str | None = None, side: str = "after") -> str:
        """The title of shown version `k`'s drawing on `side` (`after`, `before`, `why`: `session.render.caption`),
        which the app shows above the untitled picture."""
        return drawing.caption(*self._drawing(k, FOCUS if side == "why" else view or self.resolved_view(), side=side))

    @param.depends(*SHOWN, *COLOURS)
    def heat(self, k: int | None = None) -> drawing.Heat:
        """The node fills of `node_figures` (`session.overlays.heat`) when they belong to shown version `k` of the
        run shown, else none (op colours)."""
        f = self.node_figures
        if f is None or self.trace is None or self.overlay != f.kind or f.version != self.version_index(k):
            return ()
        return overlays.heat(f)

    @param.depends("overlay")
    def overlay_legend(self) -> list[tuple[str, str]]:
        """(fill, range) per colour of the chosen overlay (`viz.heat.legend`), then the grey of what it does not
        colour (`viz.heat.UNCOLOURED_ROW`: layer boxes, nodes without a figure); [] for none."""
        return [*legend(self.overlay), UNCOLOURED_ROW] if self.overlay != "none" else []

    @param.depends(*DRAWN, *COLOURS)
    def svg_before(self, k: int | None = None, view: str | None = None) -> str:
        """SVG of the graph before version `k`'s pass, with its matches clustered and rejections marked, and the
        overlay's colours on the nodes the pass kept (`heat_before`); untitled (`caption(k, side="before")`)."""
        return drawing.svg(*self._drawing(k, view or self.resolved_view(), side="before"), self.heat_before(k),
                           titled=False)

    @param.depends(*SHOWN, *COLOURS)
    def heat_before(self, k: int | None = None) -> drawing.Heat:
        """The node fills of `node_figures` on the graph before shown version `k`'s pass: the nodes it kept
        (`session.overlays.heat_before`); none when the figures are not version `k`'s."""
        f = self.node_figures
        if f is None or self.trace is None or self.overlay != f.kind or f.version != self.version_index(k):
            return ()
        return overlays.heat_before(f, self.trace)

    @param.depends(*RUN)
    def layers(self) -> list[int]:
        """Layer indices found in the input graph's provenance."""
        g = self.trace.input if self.trace is not None else (self.model.graph if self.model else None)
        return session.model_layers(g) if g is not None else []

    @param.depends(*SHOWN)
    def node_layer(self, node: int | None, before: bool = False) -> Layer | int | None:
        """The layer node `node` sits in, as the model's own key (`passes.trace.own_key`), where the node drawer and
        `explain` say it sits (`placement.sits`; its path's layer before a run): marian.encdec's `node_softmax_3` ->
        `decoder layer 0`. `before`: clicked in the before pane (the version before the step shown); a node that
        version lacks is looked for in every version. None for no node, one no version holds, or one of no layer
        (embeddings, a final norm)."""
        if node is None:
            return None
        g = self.previous_graph if before else self.current_graph
        if (g is None or node not in g) and self.trace is not None:
            g = next((v for _, v in self.trace.versions() if node in v), None)
        if g is None or node not in g:
            return None
        layer = sits(self.trace, g[node])[0] if self.trace is not None else layer_of(g[node].path)
        return own_key(self.layers(), layer) if layer is not None else None

    def layer_options(self) -> dict[str, int | None]:
        """A layer picker's options: `choose` (None), then each layer under its label (`layer 3`; `encoder layer 0`
        and `decoder layer 0` when the model has two stacks). Labelled `layer {index}`, an encoder-decoder's two
        layers 0 shared one key: the picker could hold only the decoder's, so it moved the Why tab's pick (the
        encoder's) there, the Why tab moved it back, and so on until RecursionError (bart-full.onnx)."""
        return {"choose": None, **{layer_label(i): i for i in self.layers()}}

    @param.depends(*RUN)
    def verdict(self) -> RunVerdict:
        """The current run's one verdict (`passes.why.RunVerdict`): what the Why tab, the drawing, the node panel and
        `rlxviz explain` all format, with every fix line checked as a what-if (`session.advice.checked_verdict`, as
        `explain` does); made once per run.

        Raises:
            SessionError: no run yet.
        """
        if self.trace is None:
            raise SessionError("no pipeline run yet: load a model first")
        name = self.model.name if self.model is not None else ""
        if self.trace.pipeline == INPUT_FIRST:  # no pass ran yet: nothing to advise on
            return RunVerdict.of(self.trace, model=name)
        return self._checked()[0]

    def _checked(self) -> tuple[RunVerdict, Trace]:
        """(`verdict`, the run with its failed fixes vetted: `session.advice.vetted`), made once per run."""
        memo = getattr(self, "_verdict_memo", None)
        if memo is not None and memo[0] is self.trace:
            return memo[1], memo[2]
        from ..session.advice import checked_verdict, vetted
        from ..session.fidelity import unread_weights

        assert self.trace is not None
        m = self.model
        name = m.name if m is not None else ""
        feeds = m.random_feeds(seed=0) if m is not None and unread_weights(m) is None else None
        run, fixes = checked_verdict(self.trace, name, feeds, m.weights if m is not None else {}, verbose=True)
        advised = vetted(self.trace, fixes)
        self._verdict_memo = (self.trace, run, advised)  # every fix line checked as `rlxviz explain` checks it
        return run, advised

    @param.depends(*RUN)
    def advised_trace(self) -> Trace | None:
        """The run with each refusal's fix as the Why tab and `rlxviz explain` print it: a fix that failed its
        what-if check (it changes the numbers, or could not be checked within explain's budget) says so
        (`session.advice.vetted`), where the bare trace keeps the rule's own hint. What the node panel and the
        matches table read, so that their Fix is the Why tab's for any model size. None before a run; the run
        itself while the passes still run (`INPUT_FIRST`: nothing to advise on)."""
        if self.trace is None or self.trace.pipeline == INPUT_FIRST:
            return self.trace
        return self._checked()[1]

    @param.depends(*RUN)
    def layer_status(self, layer: int) -> LayerStatus:
        """The run's verdict on `layer` (`verdict().layer`).

        Raises:
            SessionError: no run yet, or no such layer.
        """
        if self.trace is None:
            raise SessionError("no pipeline run yet: load a model first")
        session.check_layer(self.trace, layer, self.model.name if self.model is not None else "")
        return self.verdict().layer(layer)

    @param.depends("model")
    def imported_forms(self) -> list[str]:
        """What the shown model's ONNX file had already fused (ONNX Runtime's optimizer: `SkipLayerNormalization`,
        `BiasGelu`, ...) and its quantization steps, one line each, the lines `rlxviz explain` prints
        (`session.imported_forms`); [] for any other model."""
        return session.imported_forms(self.model) if self.model is not None else []

    @param.depends("model")
    def host_note(self) -> str:
        """The line `rlxviz explain` prints of the shown model's nodes the IR has no op for, run on the host
        (`session.describe_host`: `4 node(s) the IR has no op for ran on the host (ONNX Runtime): %626 Conv
        'node_Conv_364', ...`); "" when it has none, or before a model is loaded."""
        return (session.describe_host(self.model.graph) or "") if self.model is not None else ""

    def _file_note(self) -> str:
        """`host_note` and `imported_forms` as Markdown paragraphs under the Why tab's heading, in the order
        `explain` prints them above its verdict, every line escaped ("" when there are none)."""
        host = f"**The model:** {md_lines(h)}\n\n" if (h := self.host_note()) else ""
        lines = self.imported_forms()
        return host + ("**The file:** " + md_lines("\n".join(lines)) + "\n\n" if lines else "")

    @param.depends(*RUN)
    def why_layer(self, layer: int) -> str:
        """"Why didn't layer N fuse?" as Markdown: the session's text (`LayerStatus.render`, the same the CLI
        prints), every line escaped, under a heading; above it, the nodes that run on the host (`host_note`) and
        what the file had already fused (`imported_forms`), which `rlxviz explain` prints above its verdict. The
        heading is the layer's label as the text names it (`passes.trace.layer_label`: `Decoder layer 0` in an
        encoder-decoder model, `Layer 0` else)."""
        label = layer_label(layer)
        return (f"### {label[:1].upper()}{label[1:]}\n\n" + self._file_note()
                + md_lines(self.layer_status(layer).render(verbose=True)))

    @param.depends(*RUN)
    def why_graph(self) -> str:
        """The Why tab for a graph without layer paths, as Markdown: the whole-graph answer `rlxviz explain` prints
        for it (`session.check_fusion`: the graph kind and its evidence, each missed fusion with its guard), every
        line escaped; above it, the nodes that run on the host and what the file had already fused (`_file_note`).

        Raises:
            SessionError: no run yet.
        """
        text = self.verdict().render(verbose=True)
        return "### The whole graph (no node path names a layer)\n\n" + self._file_note() + md_lines(text)

    @param.depends(*SHOWN, "selected_layer")
    def svg_why(self) -> str:
        """The selected layer, focused, in the graph before the pass that first rejected something in it, or that first
        refused it at a gap in rlxviz's ops (`session.render.View` `side="why"`); untitled: its long title (the gap
        places, the layer's other gaps, the pass's counts) is `caption(side="why")`, shown above it in HTML."""
        return drawing.svg(*self._drawing(None, FOCUS, side="why"), titled=False)

    @param.depends(*SHOWN, "selected_layer")
    def why_graph_drawn(self) -> Graph:
        """The graph `svg_why` draws (the whole of it; the drawing focuses on the selected layer).

        Raises:
            ValueError: no model loaded yet, or no layer selected.
        """
        return drawing.picture(*self._drawing(None, FOCUS, side="why"))[0]
