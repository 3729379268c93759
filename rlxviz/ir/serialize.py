"""JSON form of a graph: `to_json` / `from_json` round-trip exactly (tuples come back as tuples)."""

from __future__ import annotations

import json
from typing import Any

from .dtype import DType
from .graph import Graph, GraphError
from .node import Node
from .ops import Op


def graph_to_dict(graph: Graph) -> dict[str, Any]:
    """A JSON-ready dict: `{name, next_id, outputs, nodes: [...]}`; each node has
    `id, op, inputs, shape, dtype, attrs, path, pass, absorbed`."""
    return {
        "name": graph.name,
        "next_id": graph.next_id,
        "outputs": list(graph.outputs),
        "nodes": [{"id": n.id, "op": n.op.value, "inputs": list(n.inputs), "shape": list(n.shape),
                   "dtype": n.dtype.value, "attrs": n.attrs, "path": n.path, "pass": n.pass_name,
                   "absorbed": list(n.absorbed)} for n in graph],
    }


def _tuples(v: Any) -> Any:
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def graph_from_dict(d: dict[str, Any]) -> Graph:
    """Inverse of `graph_to_dict`. Raises GraphError for unknown ops/dtypes or missing fields."""
    nodes = []
    for k, nd in enumerate(d.get("nodes", [])):
        try:
            nodes.append(Node(int(nd["id"]), Op(nd["op"]), tuple(nd["inputs"]), tuple(nd["shape"]),
                              DType(nd["dtype"]), {a: _tuples(v) for a, v in nd.get("attrs", {}).items()},
                              nd.get("path", ""), nd.get("pass", ""), tuple(nd.get("absorbed", ()))))
        except (KeyError, ValueError, TypeError) as e:
            raise GraphError(f"[graph_from_dict] node #{k}: {type(e).__name__}: {e}") from None
    return Graph(nodes, d.get("outputs", []), d.get("name", "graph"), d.get("next_id"))


def to_json(graph: Graph, indent: int | None = None) -> str:
    return json.dumps(graph_to_dict(graph), indent=indent)


def from_json(text: str) -> Graph:
    return graph_from_dict(json.loads(text))
