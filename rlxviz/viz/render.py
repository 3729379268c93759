"""Public entry points: any graph version (+ overlay) to DOT, SVG or a file.

`render_dot` is pure (no layout engine); `render_svg` and `save` run one through `engine.layout`
and report which engine ran.

Example:
    >>> from rlxviz.models import load_model
    >>> g = load_model("bert-tiny", 1, 8).graph
    >>> out = render_svg(g, view="layers")               # doctest: +SKIP
    >>> out.engine, out.svg[:4]                          # doctest: +SKIP
    ('system', '<?xm')
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path

from ..ir import Graph
from ..passes.trace import Layer, layer_label
from .dot import MAX_NODES, DotOptions, graph_to_dot
from .engine import Rendered, layout
from .layers import Verdict, focus_ids, layers_to_dot
from .overlay import Overlay

VIEWS = ("full", "layers")


def render_dot(graph: Graph, overlay: Overlay | None = None, *, view: str = "full", focus: int | None = None,
               radius: int = 0, show_params: bool = False, edge_labels: bool = False,
               max_nodes: int = MAX_NODES, title: str | None = None,
               verdicts: Mapping[int, Verdict] | None = None, expanded: Collection[int] = (),
               placed: Mapping[int, Layer | str] | None = None, refusals: Overlay | None = None,
               outside: Overlay | None = None) -> str:
    """DOT source for one graph version.

    Args:
        graph: the version to draw (e.g. `step.before`, `step.after`, `trace.final`).
        overlay: what to mark on it (`Overlay.before(step)`, `Overlay.after(step)`, `Overlay.diff(a, b)`).
        view: `full` (one box per op) or `layers` (one box per transformer layer with its fusion status).
        focus: draw only this layer (± `radius` layers) of the full view; neighbours become stubs.
        show_params: draw params/consts as nodes instead of folding them into their consumer's label.
        edge_labels: label edges with the tensor type they carry.
        max_nodes: limit on drawn nodes; larger drawings raise `GraphTooLarge`, suggesting a smaller view.
        title: caption (default: `drawing_title`); "" draws none (the app shows it in HTML above the picture).
        verdicts: layer -> the session's `Verdict` (layers view): the boxes say `fused` / `not fused` as the
            session does.
        expanded: layers view: layers drawn open in place (their nodes inside a cluster), the rest one box each.
        placed: node id -> the layer or place outside the layers it sits in, for nodes placed by structure, not
            path (`passes.placement.placed`): the layers view's boxes (`layers.layer_groups`), the full view's
            stubs (what they say of where their node sits).
        refusals: layers view: the pass's refusals its boxes say when `overlay` does not hold them (the after pane:
            `Overlay.before(step)`; `layers.layer_groups`).
        outside: layers view: the run's refusals the boxes outside the layers say (`Overlay.trace_summary` of the
            steps run by the version drawn; on the final version the verdict's `outside the layers` lines), else
            `refusals` or `overlay`'s.

    Raises:
        ValueError: unknown view, or `focus` names a layer the graph lacks.
        GraphTooLarge: the drawing would exceed `max_nodes`.
    """
    if view not in VIEWS:
        raise ValueError(f"[render_dot] view must be one of {VIEWS}, got {view!r}")
    title = drawing_title(graph, overlay, view=view, focus=focus, radius=radius) if title is None else title
    if view == "layers":
        return layers_to_dot(graph, overlay, title, max_nodes, verdicts, expanded, placed, refusals, outside)
    include = focus_ids(graph, focus, radius) if focus is not None else None
    if include is not None and overlay is not None:
        # a rejection in the focused layer is drawn whole: its offending nodes may lie outside the layer's scope
        include |= {i for r in overlay.rejections if r.layer == focus for i in (r.anchor, *r.offending)
                    if i in graph}
    opts = DotOptions(show_params=show_params, edge_labels=edge_labels, max_nodes=max_nodes)
    return graph_to_dot(graph, overlay, options=opts, include=include, title=title, placed=placed)


def drawing_title(graph: Graph, overlay: Overlay | None = None, *, view: str = "full", focus: int | None = None,
                  radius: int = 0) -> str:
    """The caption `render_dot` draws above the graph when given no `title`: the overlay's title (a pass's counts,
    the Why tab's `_gap_title`), else the graph's name and op count; for a focused layer, the layer's label after it
    (`decoder layer 0` in an encoder-decoder model, as `explain` and the Why tab name it). One wording for the
    stand-alone drawing (`rlxviz render`, a downloaded SVG), which carries it as its DOT label, and the app, which
    draws the picture without one and shows this text above it in HTML (readable at any zoom: a long title at the
    fit zoom of a tall drawing was 4-5 px high)."""
    if view == "layers":
        return overlay.title if overlay and overlay.title else \
            f"{graph.name}: layer view, {len(graph.compute_nodes())} ops"
    if focus is not None:
        if overlay and overlay.title:
            return f"{overlay.title} — {layer_label(focus)}"
        return f"{graph.name}: focus on {layer_label(focus)}" + (f" ±{radius}" if radius else "")
    return overlay.title if overlay and overlay.title else f"{graph.name}: {len(graph.compute_nodes())} ops"


def render_svg(graph: Graph | str, overlay: Overlay | None = None, *, engine: str = "auto",
               timeout: float = 60.0, **kw: object) -> Rendered:
    """Lay out and render to SVG. `graph` may also be DOT source text.

    Keyword arguments other than `engine`/`timeout` go to `render_dot`. The result records the engine
    (`out.engine`), its wall time (`out.seconds`) and the SVG text (`out.svg`); node elements keep the
    DOT ids (`id="n41"`), so a click maps back to node 41.

    Raises:
        LayoutError: no engine, a layout failure or a timeout; GraphTooLarge as in `render_dot`.
    """
    dot = graph if isinstance(graph, str) else render_dot(graph, overlay, **kw)  # type: ignore[arg-type]
    return layout(dot, engine=engine, fmt="svg", timeout=timeout)


def save(path: str | Path, graph: Graph | str, overlay: Overlay | None = None, *, engine: str = "auto",
         **kw: object) -> Path:
    """Write a drawing; the format comes from the suffix: `.dot`/`.gv` (no engine), `.svg`, `.png`, `.pdf`.

    Returns:
        The path written.
    """
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    dot = graph if isinstance(graph, str) else render_dot(graph, overlay, **kw)  # type: ignore[arg-type]
    if fmt in ("dot", "gv"):
        path.write_text(dot, encoding="utf-8")
        return path
    if fmt not in ("svg", "png", "pdf"):
        raise ValueError(f"[save] unsupported suffix {path.suffix!r}; use .dot, .gv, .svg, .png or .pdf")
    path.write_bytes(layout(dot, engine=engine, fmt=fmt).data)
    return path
