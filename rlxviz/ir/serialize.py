"""JSON form of a graph: `to_json` / `from_json` round-trip exactly (tuples come back as tuples)."""

from __future__ import annotations

import json
from typing import Any

from . import safejson
from .dtype import DType
from .graph import Graph, GraphError
from .node import Node
from .ops import Op
from .parser import MAX_DIM, MAX_NESTING, MAX_STRING_CHARS


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


def _tuples(v: Any, depth: int = 0) -> Any:
    if isinstance(v, list):
        if depth >= MAX_NESTING:
            raise ValueError(f"attribute value nested deeper than {MAX_NESTING} levels")
        return tuple(_tuples(x, depth + 1) for x in v)
    if v is not None and not isinstance(v, bool | int | float | str):
        raise TypeError(f"attribute value of type {type(v).__name__}")
    if isinstance(v, str) and len(v) > MAX_STRING_CHARS:
        raise ValueError(f"string with {len(v)} characters (at most {MAX_STRING_CHARS})")
    return v


def _ints(v: Any, what: str, hi: int = MAX_DIM) -> tuple[int, ...]:
    if not isinstance(v, list) or not all(type(x) is int and 0 <= x <= hi for x in v):
        raise ValueError(f"{what} must be a list of integers in 0..{hi}")
    return tuple(v)


def _str(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise TypeError(f"{what} must be a string")
    if len(v) > MAX_STRING_CHARS:
        raise ValueError(f"{what} with {len(v)} characters (at most {MAX_STRING_CHARS})")
    return v


class NotGraphJSON(GraphError):
    """Valid JSON that is not rlxviz's graph form at all (no `nodes` list and `outputs` list of `to_json`):
    e.g. a model's metadata or config JSON."""


def graph_from_dict(d: dict[str, Any]) -> Graph:
    """Inverse of `graph_to_dict`. Every field is type-checked (ids and dims non-negative integers,
    attrs nested at most `parser.MAX_NESTING` deep).

    Raises:
        NotGraphJSON: not an object with the `nodes` and `outputs` keys of `to_json`'s form (the message names
            the keys it has).
        GraphError: unknown ops/dtypes, missing or mistyped fields.
    """
    if not isinstance(d, dict) or "nodes" not in d or "outputs" not in d:
        if isinstance(d, dict) and d:
            has = f"its keys are {', '.join(map(repr, list(d)[:8]))}{', ...' if len(d) > 8 else ''}"
        else:
            has = "it is " + ("an empty object" if isinstance(d, dict) else f"a JSON {type(d).__name__}")
        raise NotGraphJSON("not an rlxviz graph JSON (to_json form: an object with 'nodes' and 'outputs'); "
                           + has)
    if not isinstance(d["nodes"], list):
        raise GraphError("[graph_from_dict] expected an object with a 'nodes' list")
    nodes = []
    for k, nd in enumerate(d.get("nodes", [])):
        try:
            if not isinstance(nd, dict) or not isinstance(nd.get("attrs", {}), dict):
                raise TypeError("a node must be an object with an 'attrs' object")
            (nid,) = _ints([nd["id"]], "id")
            attrs = {_str(a, "attribute name"): _tuples(v) for a, v in nd.get("attrs", {}).items()}
            nodes.append(Node(nid, Op(_str(nd["op"], "op")), _ints(nd["inputs"], "inputs"), _ints(nd["shape"], "shape"),
                              DType(_str(nd["dtype"], "dtype")), attrs,
                              _str(nd.get("path", ""), "path"), _str(nd.get("pass", ""), "pass"),
                              _ints(nd.get("absorbed", []), "absorbed")))
        except (KeyError, ValueError, TypeError) as e:
            raise GraphError(f"[graph_from_dict] node #{k}: {type(e).__name__}: {e}") from None
    try:
        outputs = _ints(d.get("outputs", []), "outputs")
        name = _str(d.get("name", "graph"), "name")
        next_id = d.get("next_id")
        if next_id is not None:
            (next_id,) = _ints([next_id], "next_id")
    except (ValueError, TypeError) as e:
        raise GraphError(f"[graph_from_dict] {e}") from None
    return Graph(nodes, outputs, name, next_id)


def to_json(graph: Graph, indent: int | None = None) -> str:
    return json.dumps(graph_to_dict(graph), indent=indent)


def from_json(text: str) -> Graph:
    """Inverse of `to_json`.

    Raises:
        JSONTextError: invalid or out-of-bounds JSON text (line and column; see `safejson.loads`).
        NotGraphJSON: valid JSON that is not rlxviz's graph form at all (see `graph_from_dict`).
        GraphError: valid graph JSON with a bad field (see `graph_from_dict`).
    """
    return graph_from_dict(safejson.loads(text))
