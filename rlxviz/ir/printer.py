"""The IR text form: one line per node, readable and diffable; `parser.parse_ir` reads it back exactly.

    graph tiny {
      %0 = input {name="x"} : f32[2, 8, 16]
      %1 = param {name="fc.weight"} : f32[16, 32]
      %2 = matmul(%0, %1) : f32[2, 8, 32] @fc
      %5 = FusedMatMulBiasAct(%0, %1, %3) {activation="gelu"} : f32[2, 8, 32] @fc [fuse_matmul_bias_act <- %2, %4]
      return %5
    }

Ids are the graph's stable node ids (RLX prints `%N` too, docs/rlx.md §1.7); floats print with
Python's shortest round-trip repr (`1e-12`, not RLX's `0.000000000001`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from .node import Node

_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]*")
_NUMBER_WORD = re.compile(r"(?:inf|nan)\b")


def format_name(s: str) -> str:
    """A graph name, model path or pass name: bare when it lexes as one identifier, else a JSON string."""
    return s if _BARE.fullmatch(s) and not _NUMBER_WORD.match(s) else json.dumps(s)


def format_value(v: Any) -> str:
    """An attribute value in IR syntax: `1`, `0.125`, `1e-12`, `"gelu"`, `true`, `none`, `[0, 2, 1, 3]`."""
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        r = repr(v)
        return r if any(c in r for c in ".en") else r + ".0"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, tuple | list):
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    raise TypeError(f"[format_value] unsupported attribute value {v!r}")


BLOB_ATTRS: dict[str, frozenset[str]] = {"onnx_op": frozenset({"node"})}
"""Op name -> its attributes that hold serialized bytes as base64 text (`onnx_op`'s `node`: the whole ONNX
NodeProto, `ir.onnx_op.encode`). The IR text prints them whole (it must parse back); the views say their size."""


def shown_value(op: str, key: str, v: Any) -> str:
    """Attribute `key` of an `op` node (`Op.value`) as the views show it (the inspector, a drawing's tooltip, the
    layer view's search text): `format_value`'s text, except a blob attribute (`BLOB_ATTRS`), which is named by its
    size (`<ONNX node, 412 bytes>`): whisper's `onnx_op` Conv showed ~400 characters of base64 there, which says
    nothing a reader can use (its `op_type` and `name` say what it is)."""
    if key in BLOB_ATTRS.get(op, ()) and isinstance(v, str):
        pad = len(v) - len(v.rstrip("="))
        return f"<ONNX node, {len(v) * 3 // 4 - pad:,} bytes>"
    return format_value(v)


def shown_attrs(node: Node) -> str:
    """Every attribute of `node` as `key=value` joined by `, `, each value as `shown_value` shows it."""
    return ", ".join(f"{k}={shown_value(node.op.value, k, v)}" for k, v in node.attrs.items())


def shown_line(line: str, op: str, attrs: dict[str, Any]) -> str:
    """An IR line (`format_node`) of an `op` node with `attrs` as the inspector shows it: each blob attribute's text
    as `shown_value` says it (the line no longer parses back; `rlxviz ir` prints the whole line)."""
    for k in BLOB_ATTRS.get(op, ()):
        v = attrs.get(k)
        if isinstance(v, str):
            line = line.replace(f"{k}={format_value(v)}", f"{k}={shown_value(op, k, v)}")
    return line


def format_type(node: Node) -> str:
    return f"{node.dtype}[{', '.join(map(str, node.shape))}]"


def format_node(node: Node) -> str:
    """One node as an IR line (without indentation); made once per node and kept on it (nodes are immutable)."""
    line = node._line
    if line is None:
        line = _format_node(node)
        object.__setattr__(node, "_line", line)
    return line


def _format_node(node: Node) -> str:
    s = f"%{node.id} = {node.op.value}"
    if node.inputs:
        s += "(" + ", ".join(f"%{i}" for i in node.inputs) + ")"
    if node.attrs:
        s += " {" + ", ".join(f"{k}={format_value(v)}" for k, v in node.attrs.items()) + "}"
    s += " : " + format_type(node)
    if node.path:
        s += " @" + format_name(node.path)
    if node.pass_name:
        s += f" [{format_name(node.pass_name)}"
        if node.absorbed:
            s += " <- " + ", ".join(f"%{i}" for i in node.absorbed)
        s += "]"
    return s


class Printable(Protocol):
    """What the printer reads of a graph (`graph.Graph` is one): the printer stands below the graph, which hashes
    this text for its digest, so it names no graph class."""

    name: str
    next_id: int
    outputs: tuple[int, ...]

    @property
    def nodes(self) -> Sequence[Node]: ...

    def __iter__(self) -> Iterator[Node]: ...


def format_graph(graph: Printable) -> str:
    """The whole graph as IR text (ends with a newline)."""
    header = f"graph {format_name(graph.name)}"
    if graph.next_id != max((n.id for n in graph), default=-1) + 1:
        header += f" next_id={graph.next_id}"
    lines = [header + " {"]
    lines += ["  " + format_node(n) for n in graph]
    if graph.outputs:
        lines.append("  return " + ", ".join(f"%{o}" for o in graph.outputs))
    lines.append("}")
    return "\n".join(lines) + "\n"


def window(graph: Printable, node_id: int, radius: int = 3) -> str:
    """IR lines around `node_id`, the node itself marked with `>>`, for error messages."""
    nodes = graph.nodes
    idx = next((k for k, n in enumerate(nodes) if n.id == node_id), None)
    if idx is None:
        return ""
    lo, hi = max(0, idx - radius), min(len(nodes), idx + radius + 1)
    return "\n".join(("  >> " if k == idx else "     ") + format_node(nodes[k]) for k in range(lo, hi))
