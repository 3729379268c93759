"""The Why tab's views: the table of every match and rejection (`DecisionTable`) and "why didn't layer N fuse?"
(`WhyView`), formatters of the run's one verdict."""

from __future__ import annotations

from typing import Any

import pandas as pd
import panel as pn
import param
from panel.viewable import Viewer

from ..passes.trace import layer_label
from ..passes.why.places import LEFT_OUT_STATUS, REJECTED
from ..passes.why.verdict import STANDING_GROUPS
from ..session import SessionError
from .explain import decision_rows
from .graphpane import OnnxNames, SvgGraph, ZoomScope, absorbed_index
from .layout import next_tick
from .stale import StaleMark, safe
from .state import AppState
from .text import md_escape, select_width
from .wording import SHAPE_VARIANT

TABLE_MIN_PX = 300
"""The matches table's least height; it takes the tab's whole height (it was fixed at 420 px, 12 of 18 rows shown
above 400 blank px at 1080 px)."""
COLUMN_WIDTHS = {"layer": "7%", "position": "6%", "kind": "6%", "pass": "10%", "guard": "9%", "why": "6%",
                 "rule": "11%", "anchor": "6%", "message": "16%", "hint": "10%", "fix": "13%"}
"""Each column's share of the table's width (100% in all): the columns fit the table at any width, the text
wrapping in its cell (the message, hint and fix columns of 420, 260 and 220 px ran past the right edge at 1920 px,
hint and fix cut), and each header (`COLUMN_TITLES`) fits its share whole at `NARROW_TABLE_PX` (`header_fits`: at
1280 px "layer" and "anchor" read "la…" and "anc…")."""
NARROW_TABLE_PX = 866
"""The table's width beside an open sidebar at 1280 px (the strip's measured width there)."""
HEADER_PX_PER_CHAR = 7.0
"""A header title's width per character in `TABLE_CSS`'s 12 px bold, on average, rounded up."""
HEADER_PAD_PX = 22
"""A header's padding and its sort arrow as `TABLE_CSS` sets them (3 + 3 px, 12 px for the arrow), and 4 px to spare."""


def header_fits(title: str, share: str, table_px: int = NARROW_TABLE_PX) -> bool:
    """True when header `title` fits whole in a column of `share` ("7%") of a `table_px` wide table (an estimate
    from `HEADER_PX_PER_CHAR` and `HEADER_PAD_PX`; the browser test measures it)."""
    return len(title) * HEADER_PX_PER_CHAR + HEADER_PAD_PX <= float(share.rstrip("%")) / 100 * table_px


WRAPPED = ("kind", "pass", "guard", "why", "rule", "message", "hint", "fix")
"""Columns whose text wraps in its cell (a long rule name breaks anywhere: `TABLE_CSS`)."""
TABLE_CSS = """
.tabulator-cell { overflow-wrap: anywhere; }
.tabulator .tabulator-header .tabulator-col .tabulator-col-content { padding: 4px 3px !important; }
.tabulator .tabulator-header .tabulator-col .tabulator-col-title { font-size: 12px; }
.tabulator .tabulator-header .tabulator-col.tabulator-sortable .tabulator-col-title { padding-right: 12px !important; }
.tabulator .tabulator-header .tabulator-col .tabulator-col-content .tabulator-col-sorter { right: 2px !important; }
.tabulator-tableholder::-webkit-scrollbar { width: 12px; height: 12px; }
.tabulator-tableholder::-webkit-scrollbar-thumb { background: #9e9e9e; border-radius: 6px; }
.tabulator-tableholder::-webkit-scrollbar-track { background: #eeeeee; }
@supports not selector(::-webkit-scrollbar) { .tabulator-tableholder { scrollbar-color: #9e9e9e #eeeeee; } }
"""
"""The table's scroll bar always drawn (an overlay scroll bar, hidden until scrolled, left "(18 rows)" with 12 in
view and no sign of the rest), and long names broken anywhere in their wrapped cells."""


COLUMN_TITLES = {"hint": "fix", "fix": "compiler fix", "position": "pos", "anchor": "node"}
ID_FORMAT = {c: {"type": "plaintext"} for c in ("anchor", "position")}
"""Node ids and positions as written (`1332`): a number column's default format read `1,332` (newcomer run 31)."""
"""Headers of the rows' `hint` and `fix` fields, as the Why tab and the inspector name the same texts ("fix:" in
the model, "compiler fix:"): the table's "hint" held what the Why tab calls the fix, its "fix" the compiler fix.
`position` and `anchor` are shortened to fit at 1280 px; their whole meaning is the header's tooltip
(`HEADER_TIPS`)."""
HEADER_TIPS = {"layer": "the layer of the anchor node, or its place outside the layers (embeddings, pooler, final "
               "norm), as explain's 'outside the layers:' line names it",
               "position": "position: where the anchor node sits in the graph's topological order (the rows' "
               "reading order)",
               "anchor": "anchor: the id of the node the pattern was tried at (click the row to highlight it)",
               "hint": "fix: what to change in the model", "fix": "compiler fix: what to change in the pass"}
"""Each shortened or unclear header's tooltip."""

ORDER_NOTE = ("Rows in reading order: by layer, then by where the anchor node sits in the graph (*position*: its "
              "place in the graph's topological order), then by pass; click a header to sort otherwise.")
"""How the table's rows are ordered (`explain.decision_rows`, `passes.trace.reading_order`), said under its title:
the rows were sorted by kind, then pipeline order, an order a newcomer could not follow (issue 39)."""


LAYER_SORTER = "alphanum"
"""The layer column's sort (Tabulator's): layer numbers in numeric order, then the places outside the layers by
name (`layer_cells`; an object column sorted as strings put layer 10 before layer 2)."""


def _stacked(rows: list[dict[str, Any]]) -> bool:
    """The rows' layers lie in more than one stack (`trace.Layer.stack`: an encoder-decoder model)."""
    return len({getattr(r["layer"], "stack", "") for r in rows if r["layer"] is not None}) > 1


def _layer_cell(layer: Any, stacked: bool) -> int | str:
    """A layer's cell: its number, or `encoder 0` / `decoder 0` where the model has more than one stack (`stacked`:
    bart.encdec's encoder and decoder layer 0 both read `0`)."""
    return f"{layer.stack} {int(layer)}" if stacked and getattr(layer, "stack", "") else int(layer)


LAYER_FILTERS = {"number": {"type": "number", "func": "=", "placeholder": "layer"},
                 "text": {"type": "input", "func": "like", "placeholder": "layer"}}
"""The layer column's header filter: a layer number (`=`), or text (`like`) where the layers are named by stack
(`decoder 1`)."""


def _filter_kind(rows: list[dict[str, Any]]) -> str:
    """`number` (the `=` of a layer number: a place's row never matches) unless the layers' cells name their stack."""
    return "text" if _stacked(rows) else "number"


def layer_cells(rows: list[dict[str, Any]]) -> pd.Series:
    """The table's layer column of `decision_rows` `rows`: each row's layer number, or for a row of no layer its
    place outside the layers (`place`: `embeddings`, `pooler`, `final norm`: `placement.outside_box`, the name
    `explain`'s `outside the layers:` line gives it; deit.ortopt's embeddings row read `-`); NA where neither (a graph
    whose node paths name no layer). Int64 when no row names a place, else object (ints and strings)."""
    stacked = _stacked(rows)
    cells = [_layer_cell(r["layer"], stacked) if r["layer"] is not None else (r.get("place") or None) for r in rows]
    if any(isinstance(c, str) for c in cells):
        return pd.Series(cells, dtype=object)
    return pd.Series(cells, dtype="Int64")


class DecisionTable(Viewer):
    """Every match and rejection (Tabulator: sortable, filterable by pass, layer, guard); a click highlights it."""

    state = param.ClassSelector(class_=AppState)
    columns = ["layer", "position", "kind", "pass", "guard", "why", "rule", "anchor", "message", "hint", "fix"]
    """The sort key's columns first (layer, then graph position): the reading order is seen, not only said."""

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        # the table listed every pass's rows whatever version was selected, and said nothing of it (issue 39): a
        # line says what it lists, and the box narrows it to the selected version's pass
        self.only = pn.widgets.Checkbox(name="only the selected version's pass", value=False,
                                        css_classes=["rv-decisions-only"])
        frame = self._frame()
        self.table = pn.widgets.Tabulator(
            frame, show_index=False, sizing_mode="stretch_both", min_height=TABLE_MIN_PX, pagination=None,
            disabled=True, selectable=1, layout="fit_columns", css_classes=["rv-decisions"],
            stylesheets=[TABLE_CSS],
            sorters=[],  # the rows' own order (`ORDER_NOTE`): a sort by kind scattered a layer's rows
            header_filters={"kind": {"type": "list", "values": ["fused", REJECTED, LEFT_OUT_STATUS, *STANDING_GROUPS],
                                     "clearable": True},
                            "pass": {"type": "input", "func": "like", "placeholder": "pass"},
                            "layer": LAYER_FILTERS[_filter_kind(self._rows)],
                            "guard": {"type": "input", "func": "like", "placeholder": "guard"}},
            formatters={**{c: {"type": "textarea"} for c in WRAPPED}, **ID_FORMAT}, widths=dict(COLUMN_WIDTHS),
            titles=dict(COLUMN_TITLES), header_tooltips=dict(HEADER_TIPS),
            configuration={"columns": [{"field": "layer", "sorter": LAYER_SORTER}]})
        self.table.on_click(self._clicked)
        self.about = pn.pane.Markdown("", css_classes=["rv-decisions-about"], margin=(0, 10),
                                      styles={"font-size": "13px"})
        self.only.param.watch(lambda *e: self._refresh(), "value")
        self.state.param.watch(lambda *e: self._refresh(), ["trace", "version", "hide_unchanged"])
        self._refresh()

    def _step(self) -> int | None:
        """The index into `trace.steps` of the pass that made the selected version (None: the input graph)."""
        s = self.state
        if s.trace is None:
            return None
        n = s.version_index()
        return n - 1 if 0 < n <= len(s.trace.steps) else None

    def _refresh(self) -> None:
        """The table's rows and the line saying which they are; no row stays selected (a row's highlight stayed on a
        row of another list)."""
        s = self.state
        frame = self._frame()
        filters = {**self.table.header_filters, "layer": LAYER_FILTERS[_filter_kind(self._rows)]}
        self.table.param.update(value=frame, selection=[], header_filters=filters)
        rows = len(self._rows)
        if s.trace is None:
            self.about.object = ""
        elif not self.only.value:
            self.about.object = (f"**The whole run:** every pass's matches and rejections ({rows} rows), whatever "
                                 f"version is selected; a click goes to the version its pass made. {ORDER_NOTE}")
        elif (k := self._step()) is None:
            self.about.object = (f"**The whole run** ({rows} rows): the selected version is the input graph, which no "
                                 f"pass made. {ORDER_NOTE}")
        else:
            label = md_escape(f"after {s.trace.step_names()[k]}")
            self.about.object = f"**{label} only:** its pass's matches and rejections ({rows} rows). {ORDER_NOTE}"

    def _frame(self) -> pd.DataFrame:
        advised, _ = safe(self.state.advised_trace)  # each hint as the Why tab and `explain` print it
        rows = decision_rows(advised or self.state.trace)
        if self.only.value and (k := self._step()) is not None:
            rows = [r for r in rows if r["step"] == k]
        self._rows = rows
        frame = pd.DataFrame([{c: r[c] for c in self.columns} for r in rows], columns=self.columns).astype(
            {"position": "Int64"})
        frame["layer"] = layer_cells(rows)
        return frame

    def _clicked(self, event: Any) -> None:
        self.select_row(event.row)

    def select_row(self, i: int) -> None:
        """Go to the version the row's pass produced and highlight its nodes."""
        if i is None or i >= len(self._rows):
            return
        self.state.show_decision(self._rows[i])

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(pn.Row(self.about, self.only, sizing_mode="stretch_width"), self.table,
                         sizing_mode="stretch_both")  # the table takes the tab's height


def working_line(layers: int) -> str:
    """The Why tab's line while its answer and drawing are worked out (on the tab's first showing): `*Working out
    why for 40 layers…*`, `*… for the whole graph…*` for a graph whose paths name no layer (`layers` 0)."""
    what = f"{layers} layer{'s' if layers != 1 else ''}" if layers else "the whole graph"
    return f"*Working out why for {what}…*"


def show_layer(picker: pn.widgets.Select, options: dict[str, Any], layer: Any, **more: object) -> None:
    """Set a layer picker to `options` (`Derived.layer_options`) and `layer`, and send the browser the option of
    `layer` whatever the widget held: the new model's key equals the last model's of its index (`Layer.__eq__` leaves
    `qualified` out; bert-tiny's layer 0 equals t5's encoder layer 0), so Panel saw no value change and the browser
    kept the old option's value, none of the new options (a blank box over the Why tab's `Layer 0`). `more`: other
    parameters of `picker` (width, visible). The caller guards its own value watcher (`_syncing`)."""
    picker.param.update(options=options, value=layer, **more)
    picker.param.trigger("value")


class WhyView(Viewer):
    """"Why didn't layer N fuse?": each pattern's outcome in plain words, the first failing guard,
    the difference from a sibling layer that fused, and the picture focused on the layer."""

    state = param.ClassSelector(class_=AppState)

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        s = self.state
        self.layer = pn.widgets.Select(name="Layer", options=self._layers(), value=s.selected_layer,
                                       width=select_width(self._layers(), 120), css_classes=["rv-why-layer"])
        self._auto = True  # the layer shown was picked here, not by the user: each new run picks again
        self._picked: object = None  # the layer this tab picked itself last (`_default_layer`)
        self._syncing = False
        self.layer.param.watch(self._chosen, "value")
        self.text = pn.pane.Markdown(working_line(len(s.layers())) if s.trace is not None else "",
                                     sizing_mode="stretch_width", css_classes=["rv-why"])
        self.graph = SvgGraph(sizing_mode="stretch_both", min_height=520, css_classes=["rv-why-graph"])
        self._zoom = ZoomScope()  # another model fits its picture; a version step keeps the zoom
        self._names = OnnxNames()  # the search's ONNX node names, once per model
        self.graph.param.watch(lambda e: s.param.update(selected_before=False, selected_node=e.obj.clicked), "clicks")
        self.stale = StaleMark(s, "why", self.text, self.graph)
        s.param.watch(lambda e: setattr(self, "_auto", True), "model")
        s.param.watch(self._update, ["trace", "selected_layer", "version"])
        s.param.watch(lambda e: setattr(self.graph, "highlight", list(e.new)), "highlight")
        # the verdict and its drawing on the page's next tick: the tab is sent first with `working_line` in its
        # pane (granite.qdq's drawing takes ~10 s, the pane stayed blank under the header's spinner till then)
        next_tick(self._update)

    def _layers(self) -> dict[str, int | None]:
        return self.state.layer_options()

    def _chosen(self, event: param.parameterized.Event) -> None:
        if not self._syncing:  # the user's choice: kept across runs of this model
            self._auto = False
            self.state.selected_layer = event.new

    def _default_layer(self) -> int | None:
        """The layer the tab opens on: the selected node's (`AppState.node_layer`: the node clicked before the tab
        was first shown, or still selected on a new run of its model; marian.encdec's decoder cross-attention
        softmax opened it on encoder layer 0), else a teaching variant's layer (`AppState.variant_layer`; one meant
        to keep the fusion opened on layer 0, not the layer it changed), else the first that did not fuse as
        expected, else the first (an uploaded model opened on "Pick a layer" with nothing picked, while `rlxviz
        explain` answers at once)."""
        s = self.state
        if (mine := s.node_layer(s.selected_node, s.selected_before)) is not None and mine in s.layers():
            return mine
        if s.variant not in ("none", SHAPE_VARIANT) and s.variant_layer in s.layers():
            return s.variant_layer
        for i in s.layers():
            try:
                if not s.layer_status(i).fused:
                    return i
            except SessionError:
                continue
        return next(iter(s.layers()), None)

    def _update(self, *events: param.parameterized.Event) -> None:
        s = self.state
        if s.selected_layer is not None and s.selected_layer != self._picked and (
                not events or any(e.name == "selected_layer" for e in events)):
            # a layer picked outside the tab (a layer box or the focus picker in the Graph tab, a clicked node, a
            # table row), before the tab was first shown or since: the user's, kept as one picked here is (the
            # tab opened on its own default instead: newcomer runs 35-39)
            self._auto = False
        new_run = not events or any(e.name == "trace" for e in events)
        if self._auto and s.trace is not None and s.layers() and (s.selected_layer is None or new_run):
            pick = self._picked = self._default_layer()
            if pick != s.selected_layer:
                s.selected_layer = pick  # its watcher draws the tab
                return
        self._syncing = True
        try:
            options = self._layers()  # as wide as its longest label: `decoder layer 0` whole
            show_layer(self.layer, options, s.selected_layer, width=select_width(options, 120))
        finally:
            self._syncing = False
        self.layer.visible = bool(s.layers()) or s.trace is None
        if s.trace is not None and not s.layers():  # no layer paths: the whole graph's answer, as `rlxviz explain`
            text, err = safe(s.why_graph)
            self.text.object = text if text else f"**Not shown:** {md_escape(err or '')}"
            self.graph.param.update(visible=True, **self._whole_graph())
            return
        self.graph.visible = True
        if s.selected_layer is None:
            self.text.object = "*Pick a layer to see each pattern's outcome and the first guard that failed.*"
            self.graph.param.update(svg="", caption="", absorbed={})
            return
        text, err = safe(s.why_layer, s.selected_layer)
        self.text.object = text if text else f"**Not shown:** {md_escape(err or '')}"
        svg, err = safe(s.svg_why)
        cap, _ = safe(s.caption, None, None, "why")
        self.graph.param.update(svg=svg or "", title=layer_label(s.selected_layer) + (f" — {err}" if err else ""),
                                caption=cap or "",
                                highlight=list(s.highlight), scope=self._zoom(s.model, "layer", s.selected_layer),
                                absorbed=self._absorbed(), names=self._onnx_names())

    def _onnx_names(self) -> dict[str, str]:
        """The ONNX node names of the model shown, for the search (`graphpane.onnx_names`); {} for none."""
        m = self.state.model
        return self._names(m.meta.get("onnx_nodes") if m is not None else None)

    def _absorbed(self) -> dict[str, list[list[object]]]:
        """What each fused node of the drawn graph holds at any depth, for the search (`graphpane.absorbed_index`)."""
        s = self.state
        graph, _ = safe(s.why_graph_drawn)
        return absorbed_index(graph, s.trace) if graph is not None else {}

    def _whole_graph(self) -> dict[str, object]:
        """The drawing for a graph whose nodes carry no layer path (IR text, most often): there is no layer to focus
        on, so the final version, whole, with what the run fused in it (the pane stayed blank, only its search box and
        zoom buttons, when hidden: a hidden pane in a tab not yet drawn was shown all the same)."""
        s = self.state
        last = len(s.version_labels) - 1
        svg, err = safe(s.svg, last) if last >= 0 else (None, "no version yet")
        scope = self._zoom(s.model, "whole")
        if not svg:
            return {"svg": "", "caption": "", "scope": scope, "absorbed": {},
                    "title": "No layers to draw: this graph's nodes carry no layer path; see the Graph tab"
                             + (f" ({err})" if err else "") + "."}
        return {"svg": svg, "caption": safe(s.caption, last)[0] or "", "highlight": list(s.highlight), "scope": scope,
                "absorbed": absorbed_index(s.graph_at(last), s.trace), "names": self._onnx_names(),
                "title": f"no layer to draw (no node path names one): the final graph, {s.version_labels[last]}"}

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(self.stale.banner, pn.Row(pn.Column(self.layer, self.text, width=480, scroll=True), self.graph,
                                                   sizing_mode="stretch_both"), sizing_mode="stretch_both")


__all__ = ["show_layer", "working_line", "DecisionTable", "WhyView"]
