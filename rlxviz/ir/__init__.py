"""rlxviz IR: dtypes, ops, immutable nodes, graphs with use-def maps, builder, text and JSON forms, verifier."""

from .builder import Builder, NodeEmitter
from .dtype import DType
from .emitter import Emitter
from .graph import Graph, GraphError
from .infer import ShapeError, TensorType, infer
from .lint import lint, problems
from .node import FrozenAttrs, Node
from .ops import FTL_INPUTS, MASK_KINDS, Op, family, operand_roles
from .parser import IRSyntaxError, parse_ir, quote_place, syntax_error_line
from .printer import format_graph, format_node, window
from .rewrite import RewriteError, Rewriter, common_path
from .serialize import from_json, graph_from_dict, graph_to_dict, to_json

__all__ = [
    "Builder", "DType", "Emitter", "FTL_INPUTS", "FrozenAttrs", "Graph", "GraphError", "IRSyntaxError", "MASK_KINDS",
    "Node", "NodeEmitter", "Op", "RewriteError", "Rewriter", "ShapeError", "TensorType", "common_path",
    "family", "format_graph", "format_node", "from_json", "graph_from_dict", "graph_to_dict", "infer",
    "lint", "operand_roles", "parse_ir", "problems", "quote_place", "syntax_error_line", "to_json", "window",
]
