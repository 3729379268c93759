"""Drawing graphs: DOT built as a pure function, laid out by Graphviz `dot` or the pip `graphviz-pure`."""

from .dot import MAX_NODES, DotOptions, GraphTooLarge, graph_to_dot
from .engine import ENGINES, LayoutError, Rendered, available_engines, layout, resolve_engine
from .layers import LayerGroup, Verdict, box_layer, focus_ids, layer_groups, layers_to_dot
from .overlay import Overlay
from .render import drawing_title, render_dot, render_svg, save
from .styles import FAMILY_COLORS, hashed_color, op_color

__all__ = [
    "ENGINES", "FAMILY_COLORS", "MAX_NODES", "DotOptions", "GraphTooLarge", "LayerGroup", "LayoutError", "Overlay",
    "Rendered", "available_engines", "box_layer", "drawing_title", "focus_ids", "graph_to_dot", "hashed_color",
    "layer_groups", "layers_to_dot", "layout", "op_color", "render_dot", "render_svg", "resolve_engine", "save",
    "Verdict",
]
