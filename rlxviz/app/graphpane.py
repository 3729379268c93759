"""`SvgGraph`: a Graphviz SVG in the browser with pan, zoom, search, click-to-select and highlighting.

The renderer gives every node a DOT id `n<id>` that survives into the SVG (`<g id="n12" class="node">`),
so a click maps back to the IR node id, and highlighting is a CSS class on those groups; the layer view's
boxes (and the clusters of layers expanded in place) are `layer<i>` (`layer_<stack>_<i>` in an encoder-decoder
model), so a click on one reports the box's layer, and
the next picture is centred on that layer. Pan with the mouse (drag), zoom with the wheel or
the +/- buttons, "fit" to see the whole graph, "full" to lay the drawing over the whole window (its
button, then "✕ close (Esc)", or Esc closes it; the page's header is hidden meanwhile). A folded "op and layer-box
colours" legend (`legend`) sits in the picture's lower left corner. The view (zoom and pan) is kept when the picture
changes
within the same `scope` (stepping versions, clicking nodes) once the user moved it, and panes with the same
`sync` group move together (before/after; a search or reveal centres the same node in both where both have
it, else in the partner the fused node that absorbed it, else the partner's own search hit: each pane's hit stays in
view). The search box finds nodes by `%id` (that node only) or by text
in their own op, name or path, or a name messages give them (`ln1 (role h1)`; never in the operands or users their
tooltip lists; `search_hits` is the same search in Python), and marks them with its own mark
(`viz.styles.SEARCH_MARK`: a thick magenta outline with a glow, the fill kept, so a found box of the layer view still
shows its status colour; the counter shows the mark's swatch, `search_key` its tooltip); after those, the fused nodes
that absorbed a node of that id or op, at any depth (a note over the graph says so: "softmax: absorbed into
FusedAttentionBlock %812 (layer 3)", or through a fused node it absorbed: "softmax: absorbed into
FusedTransformerLayer %86 (layer 0) via FusedAttentionBlock %40"); typing centres the first hit, and Enter steps
through the hits in one order (`search_order`: graph order, each node inside a folded layer a hit of its own), the
first Enter after a new query showing hit 1, each later one the next, opening the layer that holds it and centring
it; a new picture (a layer opened) keeps the place, and marks and counts the hits without moving the view. When the
picture is larger than the pane, a minimap in the corner shows the whole graph with the visible part framed; a click
or a drag on it pans there. It is at least 96 px wide: a graph too tall for that is cropped to a window that scrolls
with the view ("map ↕"). Its box has one size in every pane, and it lies in the corner where it covers least of the
drawing, the same corner in the linked panes (before/after), chosen once the view rests. It lies over the pane's
corner, so it folds away: the × in its labelled head or the bar's "map" button (which brings it back). A model switch
fits the picture: a highlight of the model before never centres the new one (its ids are another graph's), and a
kept view that shows none of a new picture is fitted, and a node-id query in the search box (`%795`, one model's
node) is cleared, while a term (`softmax`) carries over (`kept_query`), marking its hits in the fitted picture (it
zoomed both panes onto its first hit), Enter showing its hit 1. "fit" fits every pane of its `sync` group, each to
its own picture (the partner took the fitted pane's frame, cut at its right edge), with a 4 px margin above and below.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping
from pathlib import Path

import param
from panel.custom import JSComponent

from ..ir import Graph
from ..ir.identity import DigestCache
from ..ir.printer import shown_attrs
from ..passes.made import is_copy, made_in_run, remade_in_run, replaced
from ..passes.placement import placed
from ..passes.trace import Trace, layer_keys, layer_label, layer_of
from ..viz import layer_groups
from ..viz.overlay import all_versions
from ..viz.styles import HIGHLIGHT_MARK, SEARCH_MARK, SELECTED_MARK, box_legend, op_legend, search_key, tint

_HERE = Path(__file__).parent

FULL_CLOSE = "✕ close (Esc)"
"""The full view's button while it is open: a visible way back (only Esc, unsaid, closed it)."""


_ESM = (_HERE / "graphpane.js").read_text(encoding="utf-8")
"""The pane's browser side (an ES module: pan, zoom, fit, minimap, search, the full view), with its placeholders
filled below."""
_ESM = _ESM.replace("__SEARCH_KEY__", json.dumps(search_key())).replace("__CLOSE_LABEL__", json.dumps(FULL_CLOSE))

_CSS = (_HERE / "graphpane.css").read_text(encoding="utf-8")
_CSS = (_CSS.replace("__SEARCH__", SEARCH_MARK).replace("__HIGHLIGHT__", HIGHLIGHT_MARK)
        .replace("__SELECTED__", SELECTED_MARK).replace("__SEARCH_TINT__", tint(SEARCH_MARK, 0.9)))
"""The pane's style. A found node (`rv-found-node`) keeps its fill (a status colour in the layer view) and gets the
search's own mark, `viz.styles.SEARCH_MARK`, drawn before the highlight and selection marks so those stay on top;
the hit counter shows a swatch of the mark (the search's legend, `search_key`, is its tooltip)."""


def ops_legend_html() -> str:
    """The colours' legend as `SvgGraph.legend` takes it: a folded "op and layer-box colours" summary, one swatch per
    op family (`viz.styles.op_legend`), then one per look of a layer box in the layers view (`viz.styles.box_legend`:
    its fill and frame, as `viz.layers` draws them, and the words the boxes print), so a gap box's indigo is not read
    as the attention ops' lavender; the app's own words, escaped."""
    rows = "".join(f'<div class="rv-ops-row"><span class="rv-ops-sw" style="background:{html.escape(c)}"></span>'
                   f'<b>{html.escape(f)}</b> {html.escape(words)}</div>' for f, c, words in op_legend())
    boxes = "".join(f'<div class="rv-ops-row" data-tone="{html.escape(tone)}"><span class="rv-ops-sw rv-box-sw" '
                    f'style="background:{html.escape(fill)};border:2px {html.escape(line)} {html.escape(frame)}">'
                    f'</span>{html.escape(words)}</div>' for tone, fill, frame, line, words in box_legend())
    return ('<summary title="what each node fill and layer box colour means">op and layer-box colours</summary>'
            f'<div class="rv-ops-list">{rows}<div class="rv-ops-row">other ops: a pale colour of their own</div>'
            f'<div class="rv-ops-row"><b>layer boxes</b> (layers view):</div>{boxes}</div>')


class SvgGraph(JSComponent):
    """An SVG graph with pan/zoom and search; `clicked` is the id of the last clicked node.

    Parameters:
        svg: the Graphviz SVG text.
        title: a short name of the picture, in the bar above it (one line).
        caption: the drawing's title (`session.render.caption`: a pass's counts, the Why tab's gap places), shown as
            wrapping text over the top of the picture area, the fitted picture below it (the picture is drawn without
            it), set as text (never markup); "" hides it.
        highlight: node ids drawn with a thick orange border (the first is centred when `follow`).
        selected: node id drawn with a dashed blue border.
        related: node ids drawn with a dotted blue border: the selected node of the other pane, as this pane shows
            it (what it became, or what it was made from; `explain.counterparts`).
        clicked: set by the browser when a node is clicked (`clicks` counts clicks, so the same node twice fires).
        layer_clicked: the DOT id of the box of the layer view last clicked, `layer3` or `layer_decoder_0`
            (`viz.box_layer` reads the layer back; the index alone was NaN for `layer_decoder_0` and the box never
            opened); `layer_clicks` counts those clicks.
        scope: what the picture belongs to (the model shown and the view: `ZoomScope`); a new SVG in the same
            scope keeps the user's zoom and pan, a new scope (or none, "") fits the picture.
        sync: panes with the same non-empty group share zoom and pan.
        folded: for the layer view, the nodes inside each folded layer box, `{"layer<i>": [[id, text], ...]}`
            (`folded_index`): the search finds them through their box, and Enter on that hit opens the layer.
        absorbed: what each drawn fused node holds at any depth, `{"n<id>": [[op, [ids], note], ...]}`
            (`absorbed_index`): the search finds the fused node for a held op or `%id`, with the note.
        names: the ONNX node name of each node of the run imported from ONNX, `{"n<id>": name}` (`onnx_names`):
            the search finds a node by the name the inspector shows, and a fused node that absorbed it (the note).
    """

    svg = param.String("")
    title = param.String("")
    caption = param.String("")
    highlight = param.List(default=[], item_type=int)
    selected = param.Integer(None, allow_None=True)
    related = param.List(default=[], item_type=int)
    clicked = param.Integer(None, allow_None=True)
    clicks = param.Integer(0)
    layer_clicked = param.String(None, allow_None=True)
    layer_clicks = param.Integer(0)
    follow = param.Boolean(True)
    scope = param.String("")
    sync = param.String("")
    folded = param.Dict(default={})
    absorbed = param.Dict(default={})
    names = param.Dict(default={})
    order = param.List(default=[], item_type=int, doc="The graph's node ids in graph order: the order of the search's "
                       "hits, the same whichever layers are open (`search_order`); [] keeps the drawing's order.")
    absent = param.Dict(default={}, doc='Where each node of the run this version lacks is: `n<id>` -> `it exists from '
                        '"after fuse_sdpa" on` (`absent_index`); a `%id` query of another version says so.')
    legend = param.String("", doc="HTML of a folded legend in the picture's corner (`ops_legend_html`), or ''.")
    cover = param.Integer(0, bounds=(0, None), doc="Width (px) of the pane's right edge under the node drawer "
                          "(`panels.DRAWER_PX` while it is open), 0 for none: a search hit is centred in the rest.")

    _esm = _ESM
    _stylesheets = [_CSS]


class ZoomScope:
    """A pane's `SvgGraph.scope`: a new number for each model shown, so a switch to another model (a preset, IR text,
    a variant, an upload: a new `Model`) fits its picture, while a new picture of the same model (a version step, a
    new run) keeps the user's zoom and pan.

    Example:
        >>> z = ZoomScope(); a, b = object(), object()
        >>> z(a, "full"), z(a, "full"), z(b, "full"), z(b, "focus", 3)
        ('1:full', '1:full', '2:full', '2:focus:3')
    """

    def __init__(self) -> None:
        self._model: object = None
        self._seq = 0

    def __call__(self, model: object, *within: object) -> str:
        """The scope of a picture of `model` (identity: an id() could be a freed model's) in view `within`."""
        if model is not self._model:
            self._model, self._seq = model, self._seq + 1
        return ":".join(str(x) for x in (self._seq, *within))


OWN_LINES = ("path", "attrs", "roles")
"""The tooltip lines (after the first) that are a drawn node's own text for the search (the browser's `own`)."""


def own_text(tooltip: str) -> str:
    """What the search matches in a drawn node whose tooltip (`viz.dot`) is `tooltip`: the first line without its
    `%id` (op -> shape) and the `path:`, `attrs:` and `roles:` lines (the names messages give the node, as drawn:
    `ln1 (role h1)`), lower-cased; never the operands or users, which name other nodes. The browser's `own` does the
    same (`_ESM`)."""
    lines = tooltip.split("\n")
    keep = [re.sub(r"^%\d+\s*", "", lines[0])] + [ln for ln in lines[1:] if ln.startswith(tuple(f"{k}: " for k in
                                                                                               OWN_LINES))]
    return "\n".join(keep).lower()


def search_hits(tooltips: dict[int, str], query: str) -> list[int]:
    """The node ids the search box finds for `query` among drawn nodes with these tooltips: `%id` that node only,
    else every node whose `own_text` holds the lower-cased query."""
    q = query.strip().lower()
    if m := re.fullmatch(r"%(\d+)", q):
        return [i for i in tooltips if i == int(m[1])]
    return [i for i, t in tooltips.items() if q and q in own_text(t)]


NODE_QUERY = re.compile(r"\s*%")
"""A search query that names a node by its id (`%795`, `%12`, or a `%` being typed): one model's node, so it is
cleared when the pane shows another model (`kept_query`)."""


def scope_model(scope: str | None) -> str:
    """The model part of a pane's `SvgGraph.scope` (`ZoomScope`: `2:full` -> `2`); "" for none (not known)."""
    return (scope or "").split(":")[0]


def kept_query(query: str, was: str | None, now: str | None) -> str:
    """What the search box holds when the pane's scope goes from `was` to `now` (the browser's `rebase` does the same,
    `_ESM`): a node-id query (`NODE_QUERY`: `%795`) is cleared when the two scopes name different models (a node id is
    one model's: `%795 — no match` stayed on the new model, issue 39); a term (`softmax`) carries over on purpose, and
    so does every query while either model is not known (`scope_model` ""), or within one model (a version step, a new
    run, another view: the same node ids)."""
    a, b = scope_model(was), scope_model(now)
    return "" if a and b and a != b and NODE_QUERY.match(query) else query


def onnx_names(onnx_nodes: Mapping[int, tuple[str, str, str]] | None) -> dict[str, str]:
    """The search's index of ONNX node names (`SvgGraph.names`): `n<id>` -> the name of the ONNX node that IR node
    `id` was imported from (`Model.meta["onnx_nodes"]`, as the inspector reads it), for each named one; {} for a model
    not read from ONNX. A node found by its name alone ranks after the exact hits, noted `ONNX node <name>`. Node ids
    are never reused, so one index serves every version of the run: a later version's node kept its id, and a fused
    node lists the imported ids it absorbed (`absorbed_index`). Made once per model (`OnnxNames`)."""
    return {f"n{i}": name for i, (_, name, *_) in (onnx_nodes or {}).items() if name}


class OnnxNames:
    """`onnx_names` of the model last asked for, made once per model (the search index goes to the browser with each
    picture; a model of 4000 imported nodes is not re-read at each version step)."""

    def __init__(self) -> None:
        self._of: object = None
        self._names: dict[str, str] = {}

    def __call__(self, onnx_nodes: Mapping[int, tuple[str, str, str]] | None) -> dict[str, str]:
        """`onnx_names(onnx_nodes)`, the same dict while `onnx_nodes` is the same object."""
        if onnx_nodes is not self._of:
            self._of, self._names = onnx_nodes, onnx_names(onnx_nodes)
        return self._names


def search_order(order: list[int], drawn: dict[int, str], folded: dict[str, list[list[int | str]]],
                 absorbed: dict[str, list[list[object]]], query: str,
                 names: Mapping[str, str] | None = None) -> list[int]:
    """The node ids the search box steps through for `query`, in the order Enter visits them (the browser's
    `collect`, `_ESM`): exact hits, then fused nodes that absorbed a match (found only through their `absorbed ops`),
    each part in graph order `order` (`SvgGraph.order`). A node inside a folded box (`folded`, `folded_index`) is a
    hit of its own, exactly as it is once its layer is drawn open, so the list is the same whichever layers are open.

    Args:
        order: the graph's node ids in graph order.
        drawn: tooltip (`viz.dot.node_tooltips`) of each node drawn node by node.
        folded: the folded boxes' nodes, `{"layer<i>": [[id, text], ...]}`.
        absorbed: `absorbed_index` of the drawn fused nodes.
        query: the box's text; "" finds nothing.
        names: `onnx_names` of the run's model: a node imported from an ONNX node of a matching name, and a fused
            node that absorbed one, are hits after the exact ones (the browser's `nameNote`, `absorbedNote`: a QDQ
            model's `..._Softmax_output_QuantizeLinear` nodes come after its softmax ops for `softmax`).
    """
    q = query.strip().lower()
    if not q:
        return []
    m = re.fullmatch(r"%(\d+)", q)
    names = names or {}
    exact: list[int] = []
    deep: list[int] = []

    def named(i: object) -> bool:  # the ONNX node `i` came from has a matching name (never for a `%id` query)
        return not m and q in names.get(f"n{i}", "").lower()

    def holds(i: int) -> bool:  # the browser's `absorbedNote`
        return any((int(m[1]) in ids) if m else (bool(op) and q in str(op).lower())  # type: ignore[operator]
                   or any(named(j) for j in ids)  # type: ignore[attr-defined]
                   for op, ids, _ in absorbed.get(f"n{i}", []))

    for rows in folded.values():
        for i, text in rows:
            assert isinstance(i, int) and isinstance(text, str)
            if (i == int(m[1])) if m else q in text.split("\nabsorbed ops: ")[0]:
                exact.append(i)
            elif holds(i) or named(i) or (not m and q in text):
                deep.append(i)
    for i, tip in drawn.items():
        if search_hits({i: tip}, q):
            exact.append(i)
        elif holds(i) or named(i):
            deep.append(i)
    rank = {i: k for k, i in enumerate(order)}
    out: list[int] = []
    for i in sorted(exact, key=lambda i: rank.get(i, len(rank))) + sorted(deep, key=lambda i: rank.get(i, len(rank))):
        if i not in out:
            out.append(i)
    return out


def folded_index(graph: Graph, open_layers: list[int], trace: Trace | None = None) -> dict[str, list[list[int | str]]]:
    """The nodes of each box of the layer view, for the search (`SvgGraph.folded`): the box's id (`layer<i>`,
    `g_embeddings`, as `viz.layer_groups` groups them for the drawing) -> `[id, text]` per node in it, `text` the
    lower-cased words the search matches in a drawn node (op, dtype and shape, path, attributes as the IR prints
    them; never its operands or users), and, for a fused node of `trace`, the ops it absorbed at any depth
    (`absorbed_index`: a box holding a fused node that absorbed a softmax is a hit for `softmax`). Layers in
    `open_layers` are drawn node by node, so they are left out. The nodes `trace` places by structure
    (`passes.placement.placed`: the final norm) are in the box they are drawn in (`final norm`)."""
    held = absorbed_index(graph, trace)
    out: dict[str, list[list[int | str]]] = {}
    for key, group in layer_groups(graph, placed=placed(trace) if trace is not None else None).items():  # as drawn
        if group.layer is not None and group.layer in open_layers:
            continue
        out[key] = [[n.id, (f"{n.op.value} -> {n.dtype}{list(n.shape)}\npath: {n.path}\nattrs: "
                            + shown_attrs(n)
                            + ("\nabsorbed ops: " + " ".join(str(e[0]) for e in held[f"n{n.id}"])
                               if f"n{n.id}" in held else "")).lower()]
                    for n in group.nodes]
    return out


def absorbed_index(graph: Graph, trace: Trace | None) -> dict[str, list[list[object]]]:
    """What each fused node of `graph` (a version of `trace`) holds, at any depth, for the search (`SvgGraph.absorbed`).

    A rewrite's node lists the ids it replaced (`Node.absorbed`); one of those may itself be a fused node with its own
    list (softmax -> FusedAttentionBlock -> FusedTransformerLayer), so the lists are followed to the end, each id
    resolved in any version of the run (ids are never reused).

    Returns:
        `n<id>` (the DOT id of a drawn node that absorbed something) -> `[op, ids, note]` per op and route it holds: the
        ids of that op's nodes inside it, and the note the search shows for them, e.g. `absorbed into
        FusedTransformerLayer %86 (layer 0) via FusedAttentionBlock %40` (no `via` for a node it absorbed itself; one
        row per route, so each id's note is its own chain; `encoder layer 0` / `decoder layer 0` in a model with two
        stacks, as the Why tab's layer picker names them). The earlier product a node re-makes
        (`passes.made.remade_in_run`) is a row of its own, `re-made as matmul %227 (layer 0) by
        fuse_attention_block.qkv_columns` (gptj's merged Q/K/V projection %214), so its own id is never named as the
        path to itself. Ids no version of `trace` holds are listed under op `""` (found by `%id` only). `{}` without a
        trace.
    """
    if trace is None:
        return {}
    every = all_versions(trace)  # once per run
    # the layer keys as the Why picker lists them: `encoder layer 0` / `decoder layer 0` when there are two stacks
    listed = layer_keys(i for n in graph if (i := layer_of(n.path)) is not None)
    keys = {k: k for k in listed}
    out: dict[str, list[list[object]]] = {}
    made, remade = made_in_run(trace), remade_in_run(trace)
    for n in graph:  # what each node replaced itself (`passes.made.replaced`, as its label counts it)
        own = replaced(n, graph, made, every)
        if not own:
            continue
        layer = layer_of(n.path)
        at = f" ({layer_label(keys.get(layer, layer))})" if layer is not None else ""
        r = remade.get(n.id)  # the product it re-makes has a row of its own: it is no path to itself
        again = f"re-made as {n.op.value} %{n.id}{at} by {r.rule}" if r is not None else ""
        # (op, own note, route) -> ids: one row per route, so a node's note names its own chain of fused nodes, not
        # every chain a node of its op took (newcomer run 39: bert.ortopt's output dense matmul read "directly and
        # via FusedMatMulBiasAct %89", the QKV projection's route)
        found: dict[tuple[str, str, str], list[int]] = {}
        todo: list[tuple[int, str]] = [(i, "") for i in own]
        seen: set[int] = set()
        for i, via in todo:  # breadth first: `todo` grows while it is read
            if i in seen:
                continue
            seen.add(i)
            m = every.get(i)
            note = again if r is not None and i == r.old else ""
            found.setdefault((m.op.value if m is not None else "", note, "" if note else via), []).append(i)
            if m is not None and m.absorbed and not is_copy(i, made, every):  # a copy's list is its product's
                here = f"{via} → {m.op.value} %{m.id}" if via else f"{m.op.value} %{m.id}"
                todo += [(j, here) for j in m.absorbed]
        into = f"absorbed into {n.op.value} %{n.id}{at}"
        out[f"n{n.id}"] = [[op, ids, note or into + (f" via {via}" if via else "")]
                           for (op, note, via), ids in found.items()]
    return out


_SPANS: DigestCache[dict[int, tuple[int, int]]] = DigestCache(limit=8)


def node_spans(trace: Trace) -> dict[int, tuple[int, int]]:
    """Node id -> (first, last) index into `trace.versions()` of the versions holding it; once per run (node ids are
    never reused, so a version step reads the run's spans, never the graphs again)."""
    def spans() -> dict[int, tuple[int, int]]:
        out: dict[int, tuple[int, int]] = {}
        for k, (_, g) in enumerate(trace.versions()):
            for n in g:
                out[n.id] = (out[n.id][0], k) if n.id in out else (k, k)
        return out

    return _SPANS.get_or_compute(trace, spans)


def absent_index(trace: Trace | None, index: int) -> dict[str, str]:
    """Where each node of the run that version `index` of `trace` lacks is (`SvgGraph.absent`): `n<id>` ->
    `it exists from "after fuse_sdpa" on` (made by a later pass) or `it was last in "after fold_qdq"` (removed
    before it), the versions named as the CLI and the version list name them. A `%id` query with no hit says so
    (`absent_note`) instead of a bare `no match`: the CLI and the Why tab name ids of any version. {} without a trace.

    Raises:
        IndexError: `index` is not a version of `trace`.
    """
    if trace is None:
        return {}
    versions = trace.versions()
    here = {n.id for n in versions[index][1]}
    labels = [label for label, _ in versions]
    return {f"n{i}": (f'it exists from "{labels[a]}" on' if a > index else f'it was last in "{labels[b]}"')
            for i, (a, b) in node_spans(trace).items() if i not in here}


def absent_note(query: str, absent: Mapping[str, str]) -> str:
    """What the search says of `query` when it finds nothing (the browser's `find`, `_ESM`): for a `%id` of another
    version of the run (`absent`, `absent_index`), `%324 is not in this version (it exists from "after fuse_sdpa"
    on)`, else "" (the counter's `no match` says it all)."""
    q = query.strip().lower()
    m = re.fullmatch(r"%(\d+)", q)
    where = absent.get(f"n{m[1]}") if m else None
    return f"{q} is not in this version ({where})" if where else ""
