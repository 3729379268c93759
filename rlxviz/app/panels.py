"""Main-area views: version stepper, before/after graphs, node inspector, decisions table,
"why didn't layer N fuse?", IR text and diff with downloads. Each reads one `AppState`. (The Timing tab:
`timingview`, its chart and words `timingchart`; the stale banner: `stale`.)
"""

from __future__ import annotations

import html
import io
from collections.abc import Callable, Mapping
from typing import Any

import panel as pn
import param
from panel.viewable import Viewer

from ..ir import Graph, format_graph
from ..passes.why.places import PLACE_UNIT
from ..passes.why.text import compiler_fix_words, left_out_heading, workaround_words
from ..passes.why.verdict import OP_GAP_GROUP
from ..session.overlays import UNITS
from ..viz import box_layer
from .explain import counterpart_line, counterparts, made_once, node_report, report_markdown
from .graphpane import OnnxNames, SvgGraph, ZoomScope, absent_index, absorbed_index, folded_index, ops_legend_html
from .irdiff import diff_table, side_by_side
from .irtext import IRText
from .stale import StaleMark, safe
from .state import AppState
from .text import download_name, html_text, md_escape, select_width
from .views import COLLAPSED, FOCUS
from .whyview import show_layer
from .wording import version_name

PLAYER_RANGE_JS = """
for (const view of Bokeh.index.find(source)) {
  if (view.sliderEl != null) {
    view.sliderEl.min = String(source.start)
    view.sliderEl.max = String(source.end)
    view.sliderEl.value = String(source.value)
  }
}
"""
"""Browser code run when the version player's range changes: its range input takes the new min and max."""


OVERLAY_CHOICES = {"op (no overlay)": "none", "time share": "time", "error vs input": "error"}
"""The overlay selector's labels for `AppState.overlay`'s values."""


def legend_html(rows: list[tuple[str, str]], unit: str, status: str) -> str:
    """The overlay's legend: its unit, one swatch per colour with its range, and the measurement's status; every
    text escaped (they are the app's own words and numbers, never a model's). Two lines that never wrap: the unit
    line is cut with an ellipsis (the whole line in its tooltip), the swatches sit close (at 1280 px the error
    legend's eight swatches wrapped to a third line and pushed the panes down)."""
    if not rows:
        return ""
    sw = "".join(f'<span class="rv-swatch" style="background:{html.escape(c)}"></span>'
                 f'<span class="rv-range">{html.escape(r.replace(" – ", "–"))}</span>' for c, r in rows)
    note = f' <span class="rv-legend-status">{html.escape(status)}</span>' if status else ""
    whole = html.escape(f"Node colour: {unit}" + (f" {status}" if status else ""), quote=True)
    ranges = html.escape(", ".join(r for _, r in rows), quote=True)
    return (f'<div class="rv-legend-body"><div class="rv-legend-unit" title="{whole}"><b>Node colour:</b> '
            f'{html.escape(unit)}{note}</div><div class="rv-legend-swatches" title="{ranges}">{sw}</div></div>'
            "<style>.rv-legend-unit,.rv-legend-swatches{white-space:nowrap;overflow:hidden;text-overflow:ellipsis;"
            "line-height:18px}.rv-legend-unit{font-size:12px}"
            ".rv-swatch{display:inline-block;width:12px;height:10px;border:1px solid #999;"
            "margin:0 2px 0 4px;vertical-align:middle}.rv-range{font-size:11px}"
            ".rv-legend-status{color:#8a6d00}</style>")


SELECT_PX = (270, 310)
"""Least and most width of the version list, px: at most, the version row (◀, list, ▶, player, filter, view,
colour) still fits one line beside a folded sidebar at 1280 px; a second line took 64 px of the graph's height."""


def version_select_width(options: Mapping[str, object]) -> int:
    """Width of the version list that shows its longest label whole (`text.select_width`), within `SELECT_PX`. A
    longer label than the most is cut there; the pane titles name the version whole."""
    return select_width(options, *SELECT_PX)


REJECTED_ON_SELECTED = "color:#c62828;background:#ffffff;border-radius:6px;padding:0 3px"
"""The rejection count's style on the selected (dark blue, #1565c0) chip: the red used elsewhere (#c62828) has a
contrast of about 1:1 against that blue; on a white badge it keeps its red at 5.6:1 (WCAG AA for text: 4.5)."""

NOT_NEAR_MISS_MARK = "○"
"""A version chip's neutral mark (`not_near_miss_mark`): refusals that are no near-miss, not counted in its ✗."""


_SEP = "; "
"""Between a chip tooltip's places that each say why (`%ANCHOR (PATH): RULE (GUARD): why`); plain names take
commas."""


def _at_one_node(items: list[str]) -> str:
    """The items of one node's places: the item, `ITEM (2 patterns)` when they say the same, else each."""
    said = list(dict.fromkeys(items))
    if len(items) == 1:
        return items[0]
    if len(said) == 1:
        return f"{said[0]} ({len(items)} patterns)"
    return f"{len(items)} patterns at one node: " + " | ".join(said)


def _node_by_node(items: list[str], anchors: list[int]) -> str:
    """`items` (places) grouped by their anchor node (`anchors`, one per item), each node's as `_at_one_node` says them;
    `; ` between them where an item says why (`%ANCHOR (PATH): RULE ...`), else `, `."""
    by_node: dict[int, list[str]] = {}
    for a, item in zip(anchors, items, strict=True):
        by_node.setdefault(a, []).append(item)
    said = [_at_one_node(x) for x in by_node.values()]
    sep = _SEP if any(": " in x for x in said) else ", "
    return sep.join(said)


def _counted_at(n: int, anchors: set[int]) -> str:
    """A chip tooltip's head: what it counts and at how many nodes, `7 at 4 nodes (one per pattern and place)`."""
    m = len(anchors)
    return f"{n} at {m} node{'s' if m != 1 else ''} ({PLACE_UNIT})"


def _places_tip(kinds: Mapping[str, list[str]], at: Mapping[str, list[int]] | None, workaround: bool = False
                ) -> tuple[int, str]:
    """(how many places, the tooltip's words) of a chip mark's places (group -> items; `at`: group -> the anchor node
    of each item): what is counted and at how many nodes, then the verdict's heading for each group
    (`passes.why.text.left_out_heading`; `workaround`: `Places.gap_worked` > 0) and its items grouped by node."""
    n = sum(len(p) for p in kinds.values())
    at = at or {}
    groups, nodes = [], set()
    for k, items in kinds.items():
        anchors = list(at.get(k, ())) if len(at.get(k, ())) == len(items) else list(range(-len(items), 0))
        nodes.update(anchors)
        groups.append(f"{left_out_heading(k, len(items), workaround)}: {_node_by_node(items, anchors)}")
    return n, f"{_counted_at(n, nodes)}: " + "; ".join(groups)


def rejected_mark(items: list[str], at: list[int], style: str) -> str:
    """A chip's `✗N` for a pass's near-miss places (`Places.near_miss_items`, in the run's order; `at`: the anchor
    node of each), in `style` (the rejection's red). Its tooltip names them node by node as the faded `○`'s does
    (`not_near_miss_mark`): what is counted and at how many nodes, then each place as `%ANCHOR (PATH): RULE (GUARD)`
    (`places.near_miss_item`: its node id to search for, as every chip item names it), e.g. `2 at 1 node (one per
    pattern and place): rejections of this pass (near-misses): 2 patterns at one node: %12 (encoder.layer.0): ...`.
    Node names are the model's text: escaped, never markup."""
    n = len(items)
    anchors = list(at) if len(at) == n else list(range(-n, 0))
    tip = f"{_counted_at(n, set(anchors))}: rejections of this pass (near-misses): {_node_by_node(items, anchors)}"
    return f" <span class='rv-rejected' title='{html_text(tip)}' style='{style}'>✗{n}</span>"


def not_near_miss_mark(kinds: Mapping[str, list[str]], at: Mapping[str, list[int]] | None = None) -> str:
    """A chip's neutral mark for a pass's places that are no near-miss and nothing to fix (`derived.not_near_misses`:
    group -> items; `at`: group -> the anchor node of each item, `Places.excused_at`): `○N` (N places, `PLACE_UNIT`:
    two patterns refused at one node are two) in the chip's own colour, faded. Its tooltip says what is counted and at
    how many nodes, then the verdict's heading for each group (`passes.why.text.left_out_heading`) and its items
    grouped by node (each `%ANCHOR (PATH)`, its rule, guard and why), e.g. `1 at 1 node (one per pattern and place): 1
    lookalike, not a candidate (nothing to fix, not a near-miss): %7 (embeddings.LayerNorm): RULE (GUARD): why`."""
    n, tip = _places_tip(kinds, at)
    return (f" <span class='rv-lookalike' title='{html_text(tip)}' style='opacity:.7'>"
            f"{NOT_NEAR_MISS_MARK}{n}</span>")


OP_GAP_MARK = "△"
"""A version chip's mark for places at a gap in rlxviz's ops (`op_gap_mark`): no near-miss, nor "nothing to fix" (○)."""


def op_gap_mark(items: list[str], at: list[int] | None = None, lacks: list[str] | None = None,
                worked: int = 0, blockers: list[tuple[str, str]] | None = None, unchecked: int = 0,
                rounded: int = 0) -> str:
    """A chip's mark for a pass's places at a gap in rlxviz's ops (`Places.gaps`: items; `at`: their anchors; `lacks`:
    `Places.lacks`): `△N` in the chip's colour, not faded (rlxviz's to fix), its tooltip first what `explain`'s
    headline says of these places, by place (`fix_words`: `Places.gap_blockers`, `gap_unchecked`; `worked`, `rounded`:
    `Places.gap_worked`, `gap_rounded`): `rlxviz's ops lack X: a compiler fix, ...`; then the places (`_places_tip`)."""
    n, tip = _places_tip({OP_GAP_GROUP: items}, {OP_GAP_GROUP: list(at or [])}, worked > 0)
    workaround = workaround_words(worked, rounded, len(items) == 1)  # the headline's words, counted by place
    asks = compiler_fix_words(list(blockers or []), unchecked, len(lacks or []) > 1, workaround)
    head = f"rlxviz's ops lack {', '.join(lacks)}: {asks}. " if lacks else ""
    return f" <span class='rv-op-gap' title='{html_text(head + tip)}'>{OP_GAP_MARK}{n}</span>"


def counts_html(rows: list[dict[str, Any]], current: int, hidden_before: Callable[[int], str]) -> str:
    """The version chips' row of `rows` (`derived.version_rows`): each version's ops and change, its ✓ matches, ✗
    near-misses, ○ places that are nothing to fix and △ gaps, each mark with its tooltip; the chip of row `current`
    dark, and after each chip's name what `hidden_before(k)` says of the steps hidden before row k. HTML, the model's
    text escaped."""
    if not rows:
        return ""
    cells = []
    for r in rows:
        cur = r["#"] == current
        gap = hidden_before(r["#"])
        gap = f" ({gap}, hidden)" if gap else ""  # the numbers skip hidden steps: which ones
        # the ops' change, then the other nodes' (a pass that removed dead weights only is no no-op)
        said = [f"{r['change']:+d}"] * bool(r["change"]) + [r["others"]] * bool(r.get("others"))
        delta = f" ({', '.join(said)})" if said else ""
        if r.get("matches"):
            delta += f" <span title='matches of this pass'>✓{r['matches']}</span>"
        # red on the selected chip's dark blue was unreadable (issue 39): there, red on a white badge
        red = REJECTED_ON_SELECTED if cur else "color:#c62828"
        if r.get("rejections"):  # the places named node by node, as the faded ○'s tooltip names its own
            delta += rejected_mark(r.get("rejected", []), r.get("rejected_at", []), red)
        if r.get("not_near_misses"):  # a lookalike or the model's own term: said, not marked as a failure
            delta += not_near_miss_mark(r["not_near_misses"], r.get("not_near_miss_at"))
        if r.get("op_gaps"):  # a gap in rlxviz's ops: the compiler's to fix, not faded as "nothing to fix"
            delta += op_gap_mark(r["op_gaps"], r.get("op_gap_at"), r.get("lacks"), r.get("gap_worked", 0),
                                 r.get("gap_blockers"), r.get("gap_unchecked", 0), r.get("gap_rounded", 0))
        if r.get("crashed"):
            delta += f" <b style='{red}'>CRASHED</b>"
        style = "background:#1565c0;color:#fff;" if cur else "background:#f1f3f5;"
        # 20 px a line (1 px padding and margin): wrapped to two lines at 1280 px, they cost the graph 40 px
        cells.append(f"<span class='rv-chip' style='{style}padding:1px 6px;border-radius:10px;margin:1px 2px;"
                     f"display:inline-block;white-space:nowrap;font-size:12px;line-height:16px' "
                     f"title='{html_text(r['version'])}{gap}'>"
                     f"{html_text(r['version'])}: <b>{r['nodes']}</b>{delta}</span>")
    # the chips wrap onto more lines inside the pane (on one line they ran off its right edge); each stays whole
    return ("<div style='display:flex;flex-wrap:wrap;align-items:center;max-width:100%'>"
            "<span style='margin-right:4px'>ops per version:</span>" + "".join(cells) + "</div>")


class VersionStepper(Viewer):
    """Step through versions: ◀ / ▶, a list of versions, a player; hide unchanged passes; node counts."""

    state = param.ClassSelector(class_=AppState)

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        s = self.state
        options = self._options()
        # no `description` (a Bokeh Tooltip model): with it the browser failed now and then on a patch naming a
        # model it did not know ("reference ... isn't known"); the label says how many steps are hidden and each
        # chip's tooltip which
        self.select = pn.widgets.Select(name="Version", options=options, value=s.version,
                                        width=version_select_width(options), css_classes=["rv-version"])
        self.select.param.update(**self._hidden())
        self.select.param.watch(lambda e: setattr(s, "version", e.new), "value")
        self.prev = pn.widgets.Button(label="◀", width=40, align="end", css_classes=["rv-prev"])
        self.next = pn.widgets.Button(label="▶", width=40, align="end", css_classes=["rv-next"])
        self.prev.on_click(lambda e: self._move(-1))
        self.next.on_click(lambda e: self._move(1))
        self.player = pn.widgets.Player(start=0, end=max(len(s.version_labels) - 1, 1), value=s.version,
                                        interval=1500, loop_policy="once", show_value=False, show_loop_controls=False,
                                        width=230, align="end", height=60, css_classes=["rv-player"],
                                        visible_buttons=["first", "previous", "play", "pause", "next", "last"])
        self.player.param.watch(lambda e: setattr(s, "version", e.new), "value")
        # Panel's player view sets its range input's min/max only when `value` changes, so a new model (or the
        # first run of a page) whose version count differs left the slider on the old range (max 8 with 6
        # versions; max 1 with 9): redraw the range whenever `start` or `end` change.
        self.player.jscallback(start=PLAYER_RANGE_JS, end=PLAYER_RANGE_JS)
        # 235 px: box and words on one line; 5 px of it went to the version list (the row fits one line at 1280 px).
        # A fixed width only ("fixed" sizing asks for a height too: Bokeh's W-1005 in the server log)
        self.hide = pn.widgets.Checkbox.from_param(s.param.hide_unchanged, name="hide passes that changed nothing",
                                                   align="end", width=235, css_classes=["rv-hide"])
        self.view = pn.widgets.Select.from_param(s.param.view, name="View", width=110, css_classes=["rv-view"])
        self.layer = pn.widgets.Select(name="Layer", options=self._layers(), value=s.selected_layer,
                                       width=select_width(self._layers()), css_classes=["rv-focus-layer"],
                                       visible=s.view == FOCUS)
        self._syncing = False  # `_focus` setting the picker from the state: not a user's pick to send back
        self.layer.param.watch(lambda e: self._syncing or setattr(s, "selected_layer", e.new), "value")
        s.param.watch(self._focus, ["view", "selected_layer", "trace"])
        self.fold = pn.widgets.Button(label="Fold all layers", width=120, align="end", css_classes=["rv-fold"],
                                      visible=bool(s.expanded_layers) and s.resolved_view() == COLLAPSED,
                                      description="collapse every layer expanded in place back to its box")
        self.fold.on_click(lambda e: setattr(s, "expanded_layers", []))
        s.param.watch(lambda *e: setattr(self.fold, "visible", bool(s.expanded_layers)
                                         and s.resolved_view() == COLLAPSED), ["expanded_layers", "view", "trace"])
        self.counts = pn.pane.HTML(self._counts(), sizing_mode="stretch_width", css_classes=["rv-counts"])
        s.param.watch(self._sync, ["trace", "version", "hide_unchanged"])
        # the overlay's choice in this row, where at 1280 px it fits beside the view (a row of its own over the panes
        # took 52 px of graph height, issue 39); its legend stays over the panes, shown only with an overlay
        self.overlay = pn.widgets.Select(name="Colour nodes by", options=OVERLAY_CHOICES, value=s.overlay, width=130,
                                         css_classes=["rv-overlay"])
        self.overlay.param.watch(lambda e: setattr(s, "overlay", e.new), "value")
        s.param.watch(lambda e: setattr(self.overlay, "value", e.new), "overlay")

    def _layers(self) -> dict[str, int | None]:
        return self.state.layer_options()

    def _focus(self, *events: param.parameterized.Event) -> None:
        """The focus view needs a layer: show the picker, and take the first layer when none is chosen."""
        s = self.state
        layers = s.layers()
        if s.view == FOCUS and s.selected_layer is None and layers:
            s.selected_layer = layers[0]
            return
        self._syncing = True
        try:
            options = self._layers()  # as wide as its longest label (`decoder layer 0` whole)
            show_layer(self.layer, options, s.selected_layer, visible=s.view == FOCUS, width=select_width(options))
        finally:
            self._syncing = False

    def _options(self) -> dict[str, int]:
        rows = self.state.version_rows()
        s = self.state
        return ({f"{version_name(s.version_index(r['#']), r['version'])} ({r['nodes']} ops)": r["#"] for r in rows}
                or {"input": 0})

    def _hidden(self) -> dict[str, str]:
        """The version list's label: the numbers skip the hidden steps (they are `rlxviz time`'s), so the label says
        how many are hidden (on the label's line, it costs the graph no height)."""
        s = self.state
        n = len(s.trace.versions()) - len(s.version_labels) if s.hidden_note() else 0
        return {"name": f"Version · {n} unchanged step{'s' if n != 1 else ''} hidden" if n else "Version"}

    def _move(self, d: int) -> None:
        s = self.state
        s.version = min(max(s.version + d, 0), max(len(s.version_labels) - 1, 0))

    def _counts(self) -> str:
        s = self.state
        return counts_html(s.version_rows(), s.version, s.hidden_before)

    def _sync(self, *events: param.parameterized.Event) -> None:
        s = self.state
        n = len(s.version_labels)
        options = self._options()
        self.select.param.update(options=options, value=s.version, width=version_select_width(options),
                                 **self._hidden())
        self.player.param.update(end=max(n - 1, 1), value=min(s.version, max(n - 1, 0)))
        self.counts.object = self._counts()

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(pn.FlexBox(self.prev, self.select, self.next, self.player, self.hide, self.view,
                                    self.overlay, self.layer, self.fold, flex_wrap="wrap", align_items="flex-end",
                                    sizing_mode="stretch_width"),
                         self.counts, sizing_mode="stretch_width")


class GraphCompare(Viewer):
    """The version before the selected pass and after it, side by side, with pan/zoom and click-to-inspect."""

    state = param.ClassSelector(class_=AppState)

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        s = self.state
        # min_height: the panes fill the tab down to the window's bottom (stretch_both); 360 px is the least
        # they keep on a short window, where the page scrolls
        self.before = SvgGraph(sizing_mode="stretch_both", min_height=360, css_classes=["rv-before"], sync="compare")
        self.after = SvgGraph(sizing_mode="stretch_both", min_height=360, css_classes=["rv-after"], sync="compare")
        for g in (self.before, self.after):
            g.param.watch(lambda e: s.param.update(selected_before=e.obj is self.before, selected_node=e.obj.clicked),
                          "clicks")
            g.param.watch(self._layer_clicked, "layer_clicks")  # expand / fold in place
        self.note = pn.pane.Markdown("", css_classes=["rv-graph-note"], margin=(0, 10))
        # the overlay's legend over the panes, only while an overlay is chosen (its choice: `VersionStepper.overlay`)
        self.legend = pn.pane.HTML("", css_classes=["rv-legend"], margin=(0, 10), sizing_mode="stretch_width",
                                   visible=False)
        s.param.watch(self._legend, ["overlay", "node_figures", "overlay_status"])
        self.after.legend = ops_legend_html() if s.overlay == "none" else ""
        self.row = pn.Row(self.after, sizing_mode="stretch_both")
        self.stale = StaleMark(s, "graph", self.before, self.after)
        self._zoom = ZoomScope()
        self._names = OnnxNames()  # the search's ONNX node names, once per model
        s.param.watch(self._draw, ["model", "trace", "version", "view", "selected_layer", "expanded_layers",
                                   "node_figures"])
        s.param.watch(self._mark, ["highlight", "selected_node"])
        self._draw()

    def _scope(self) -> str:
        """Zoom and pan are kept while this stays the same (same model and view), across versions and clicks."""
        s = self.state
        view = s.resolved_view()
        return self._zoom(s.model, view, s.selected_layer if view == "focus" else "")

    def _draw(self, *events: param.parameterized.Event) -> None:
        s = self.state
        if s.trace is None and s.model is None:
            return
        k = s.version
        scope = self._scope()
        svg, err = safe(s.svg, k)
        step = s.current_step
        folded = s.resolved_view() == COLLAPSED
        cap, _ = safe(s.caption, k)
        self.after.param.update(svg=svg or "", title=f"{s.version_labels[k] if s.version_labels else 'input'}",
                                caption=cap or "",
                                scope=scope, folded=self._folded(s.current_graph) if folded else {},
                                absorbed=self._absorbed(s.current_graph), order=self._order(s.current_graph),
                                names=self._onnx_names(), absent=absent_index(s.trace, s.version_index()))
        if step is not None:
            prev, err2 = safe(s.svg_before, k)
            cap, _ = safe(s.caption, k, None, "before")
            self.before.param.update(svg=prev or "", title=f"before {step.pass_name}", scope=scope, caption=cap or "",
                                     folded=self._folded(s.previous_graph) if folded else {},
                                     absorbed=self._absorbed(s.previous_graph),
                                     order=self._order(s.previous_graph), names=self._onnx_names(),
                                     absent=absent_index(s.trace, max(s.version_index() - 1, 0)))
            err = err or err2
        want = [self.before, self.after] if step is not None else [self.after]
        if list(self.row.objects) != want:
            self.row.objects = want
        self.note.object = f"**Not shown:** {md_escape(err)}" if err else ""
        self._mark()

    def _legend(self, *events: param.parameterized.Event) -> None:
        s = self.state
        figs = s.node_figures if s.node_figures is not None and s.node_figures.kind == s.overlay else None
        unit = figs.unit if figs is not None else UNITS.get(s.overlay, "")  # a quantized graph's own judge
        if s.node_figures is not None and s.node_figures.unmatched:
            unit += f"; {len(s.node_figures.unmatched)} node(s) hold values version 0 has not (no colour)"
        self.legend.object = legend_html(s.overlay_legend(), unit, s.overlay_status)
        self.legend.visible = bool(self.legend.object) or s.overlay != "none"
        # the op colours' legend, folded in the after pane's corner while the fills are op colours (no overlay)
        self.after.legend = ops_legend_html() if s.overlay == "none" else ""

    def _layer_clicked(self, event: param.parameterized.Event) -> None:
        """A click on a box (or an open layer's cluster) of the layers view: the layer of the box's id
        (`viz.box_layer`: `layer_decoder_0` is the decoder's layer 0) opens or folds in place."""
        layer = box_layer(event.obj.layer_clicked)
        if layer is not None:
            self.state.toggle_layer(layer)

    def _folded(self, graph: Graph | None) -> dict[str, list[list[int | str]]]:
        return folded_index(graph, list(self.state.expanded_layers), self.state.trace) if graph is not None else {}

    @staticmethod
    def _order(graph: Graph | None) -> list[int]:
        """The graph's node ids in graph order: the order of the search's hits (`SvgGraph.order`)."""
        return [n.id for n in graph] if graph is not None else []

    def _onnx_names(self) -> dict[str, str]:
        """The ONNX node names of the model shown, for the search (`graphpane.onnx_names`); {} for none."""
        m = self.state.model
        return self._names(m.meta.get("onnx_nodes") if m is not None else None)

    def _absorbed(self, graph: Graph | None) -> dict[str, list[list[object]]]:
        """What each fused node of `graph` holds at any depth, for the search (`graphpane.absorbed_index`)."""
        return absorbed_index(graph, self.state.trace) if graph is not None else {}

    def _mark(self, *events: param.parameterized.Event) -> None:
        """Highlights, and the selected node in both panes by identity: where a pane does not hold it, the pane
        marks what it became (after) or what it was made from (before) instead (`explain.counterparts`)."""
        s = self.state
        sel, prev, cur = s.selected_node, s.previous_graph, s.current_graph
        related: tuple[list[int], list[int]] = ([], [])
        if sel is not None and prev is not None and cur is not None and s.current_step is not None:
            related = counterparts(prev, cur, sel, s.trace)  # what each node replaced itself, as the labels say
        covers = (0, DRAWER_PX if sel is not None else 0)  # the drawer lies over the after pane's right edge
        for g, rel, cover in zip((self.before, self.after), related, covers, strict=True):
            g.param.update(cover=cover, highlight=list(s.highlight), selected=sel, related=[i for i in rel if i != sel])

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(self.stale.banner, self.note, self.legend, self.row, sizing_mode="stretch_both")


class NodeInspector(Viewer):
    """The clicked node: op, attributes, shapes, provenance, operands, users, every guard evaluated on it.

    A drawer over the right edge of the graph tab (`rv-inspector-drawer`, absolutely placed in `GraphTab`): it
    takes no width from the panes, shows when a node is selected and hides on its ✕ (which clears the selection).
    """

    state = param.ClassSelector(class_=AppState)

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        s = self.state
        self.pane = pn.pane.Markdown(self._text(), sizing_mode="stretch_width", css_classes=["rv-inspector"])
        self.close = pn.widgets.Button(label="✕", width=36, color="light", css_classes=["rv-inspector-close"],
                                       description="close the node panel", align="end")
        self.close.on_click(lambda e: s.param.update(selected_node=None))
        self.drawer = pn.Column(pn.Row(pn.pane.Markdown("### Node", margin=(0, 10)), pn.HSpacer(), self.close,
                                       sizing_mode="stretch_width"), self.pane,
                                width=DRAWER_PX, scroll=True, visible=s.selected_node is not None,
                                css_classes=["rv-inspector-drawer"], styles=DRAWER_STYLE)
        s.param.watch(self._update, ["selected_node", "selected_before", "version", "trace"])

    def _update(self, *events: param.parameterized.Event) -> None:
        self.pane.object = self._text()
        self.drawer.visible = self.state.selected_node is not None

    def _text(self) -> str:
        s = self.state
        if s.selected_node is None:
            return "*Click a node in the graph to inspect it.*"
        # the pane it was clicked in first: a node both versions hold reads differently in each (its operands)
        order = (s.previous_graph, s.current_graph) if s.selected_before else (s.current_graph, s.previous_graph)
        for g in order:
            if g is not None and s.selected_node in g:
                weights = s.model.weights if s.model is not None else None
                onnx = s.model.meta.get("onnx_nodes") if s.model is not None else None
                domains = s.model.meta.get("onnx_domains") if s.model is not None else None
                # the run whose fixes were checked, and its verdict: the Fix the Why tab and `explain` print
                # (a verdict that cannot be made, e.g. no layer judged: the bare run, as before)
                run, _ = safe(s.verdict) if s.trace is not None else (None, None)
                advised = (safe(s.advised_trace)[0] if run is not None else None) or s.trace
                rep = node_report(g, s.selected_node, advised, weights, onnx, domains, verdict=run)
                text = report_markdown(rep)
                step = s.current_step
                if step is not None and s.previous_graph is not None and s.current_graph is not None:
                    # under the node's heading: which version it is read in, and its counterpart in the other
                    where = "before" if g is s.previous_graph else "after"
                    name = s.trace.step_name(step) if s.trace is not None else step.pass_name  # `NAME#2`
                    line = counterpart_line(s.previous_graph, s.current_graph, s.selected_node, name, s.trace)
                    head, _, rest = text.partition("\n\n")
                    line, rest = made_once(line, rest, rep, step.pass_name)  # which pass made it, said once
                    under = [f"*As the {where} {name} version has it.*", *([line] if line else [])]
                    text = "\n\n".join([head, *under, rest])
                return text
        return f"*Node %{s.selected_node} is not in this version.*"

    def __panel__(self) -> pn.viewable.Viewable:
        return self.drawer


DRAWER_PX = 360
"""Width of the node drawer, px: it covers the after pane's right edge while open, never the panes' width (below
the pane's bar, 30 px, whose search box and buttons stay reachable)."""
DRAWER_STYLE = {"position": "absolute", "right": "0", "top": "30px", "height": "calc(100% - 30px)", "z-index": "20",
                "background": "#fff", "border-left": "1px solid #cfd8dc", "box-shadow": "-2px 0 10px rgba(0,0,0,.18)",
                "overflow-y": "auto"}


def graph_tab(state: AppState) -> pn.viewable.Viewable:
    """The Graph tab: the before/after panes at full width and the node drawer over their right edge."""
    return pn.Column(GraphCompare(state=state), NodeInspector(state=state), sizing_mode="stretch_both",
                     styles={"position": "relative"}, css_classes=["rv-graph-tab"])


class IRView(Viewer):
    """The selected version's IR text, a side-by-side diff of any two versions (by default the one before the
    selected pass and the selected one; `irdiff`), and downloads."""

    state = param.ClassSelector(class_=AppState)

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        s = self.state
        self.ir = IRText(sizing_mode="stretch_width", css_classes=["rv-ir"], selected=s.selected_node)
        self.ir.param.watch(lambda e: s.param.update(selected_before=False, selected_node=e.obj.clicked,
                                                     highlight=[e.obj.clicked]),
                            "clicks")
        s.param.watch(lambda e: setattr(self.ir, "selected", e.new), "selected_node")
        self.left = pn.widgets.Select(label="Left", options={}, width=300, css_classes=["rv-diff-left"])
        self.right = pn.widgets.Select(label="Right", options={}, width=300, css_classes=["rv-diff-right"])
        for w in (self.left, self.right):
            w.param.watch(self._draw_diff, "value")
        self.diff = pn.pane.HTML("", sizing_mode="stretch_width", css_classes=["rv-diff"],
                                 styles={"max-height": "560px", "overflow": "auto"})
        dl = dict(color="light", embed=False, width=150)
        self.downloads = [
            pn.widgets.FileDownload(callback=lambda: self._bytes(s.ir_current()), label="IR text", **dl),
            pn.widgets.FileDownload(callback=lambda: self._bytes(s.dot()), label="DOT", **dl),
            pn.widgets.FileDownload(callback=lambda: self._bytes(s.svg(titled=True)), label="SVG", **dl),
            pn.widgets.FileDownload(callback=lambda: self._bytes(s.trace_json()), label="trace JSON", **dl),
        ]
        self._kinds = [("ir.txt", True), ("dot", True), ("svg", True), ("trace.json", False)]
        self.stale = StaleMark(s, "ir", self.ir, self.diff)
        s.param.watch(self._update, ["trace", "version", "hide_unchanged"])
        self._update()

    def _name_downloads(self) -> None:
        """Each download named after the model and the selected version (`minilm.after-fuse_sdpa.svg`), the trace
        after the model (`minilm.trace.json`)."""
        s = self.state
        model = s.model.name if s.model is not None else "model"
        labels = s.version_labels
        label = labels[s.version] if s.version < len(labels) else "input"
        for button, (ext, per_version) in zip(self.downloads, self._kinds, strict=True):
            button.filename = download_name(model, label if per_version else None, ext)

    @staticmethod
    def _bytes(text: str) -> io.BytesIO:
        return io.BytesIO(text.encode("utf-8"))

    def _update(self, *events: param.parameterized.Event) -> None:
        """A new run or version: its IR, and the diff reset to the version before the selected one vs it."""
        s = self.state
        self.ir.text = s.ir_current()
        labels = s.version_labels or ["input"]
        options = {version_name(s.version_index(k), lbl): k for k, lbl in enumerate(labels)}  # as the list numbers them
        k = min(s.version, len(labels) - 1)
        self._drawing = True  # one diff for both selects' change
        self.left.param.update(options=options, value=max(k - 1, 0))
        self.right.param.update(options=options, value=k)
        self._drawing = False
        self._draw_diff()
        self._name_downloads()

    def _draw_diff(self, *events: param.parameterized.Event) -> None:
        if getattr(self, "_drawing", False):
            return
        s = self.state
        a, b = self.left.value, self.right.value
        ga, gb = (s.graph_at(a), s.graph_at(b)) if a is not None and b is not None else (None, None)
        if ga is None or gb is None:
            self.diff.object = "<i>no run yet</i>"
            return
        labels = s.version_labels or ["input"]
        if a == b:  # version 0 has no version before it (it read "input and input hold the same IR")
            self.diff.object = (f"<i>Both sides show {html_text(labels[a])}: choose another version on either side "
                                "to see what changed.</i>")
            return
        self.diff.object = diff_table(side_by_side(format_graph(ga), format_graph(gb)), labels[a], labels[b])

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(pn.Row("**Download:**", *self.downloads), self.stale.banner,
                         pn.Row(pn.pane.Markdown("#### Side by side", margin=(18, 10, 0, 10)), self.left, self.right),
                         self.diff, pn.pane.Markdown("#### IR of the selected version"), self.ir,
                         sizing_mode="stretch_width")
