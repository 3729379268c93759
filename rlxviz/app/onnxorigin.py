"""Which ONNX nodes an IR node came from, for the inspector (no Panel import).

* `onnx_origin`: the ONNX nodes of a node: its own, or every one a fusion absorbed, through the fusions before it.
* `onnx_markdown`: the inspector's line for them, bounded: the compute nodes first (MatMul, Softmax, ...), the rest
  counted by op type.
* `onnx_domain`: the ONNX domain an op type came from, read off the importer's table.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Mapping
from typing import Any

from ..ir import Graph, Node
from .text import md_code, md_escape

ONNX_NAMES_SHOWN = 6
"""Most ONNX node names the inspector lists for a node made of several (the rest counted by op type)."""
OP_TYPES_COUNTED = 6
"""Most op types the count of the ONNX nodes not listed names (the rest summed as `other`)."""

_COMPUTE = ("MatMul", "Gemm", "Conv", "Softmax", "Attention", "Norm", "Einsum", "Gelu", "Rotary")
"""Parts of an ONNX op type that mark what a fusion computes: listed first, before the elementwise ops."""
_LAYOUT = frozenset({"Reshape", "Transpose", "Unsqueeze", "Squeeze", "Slice", "Gather", "Concat", "Cast", "Constant",
                     "Identity", "Expand", "Split", "Flatten", "Shape", "ConstantOfShape", "Range"})
"""ONNX op types that only move or reshape data: listed last (mostly counted)."""


def _rank(op_type: str) -> int:
    """0 for a compute op type (`_COMPUTE`), 2 for a layout one (`_LAYOUT`), 1 for any other."""
    if any(c in op_type for c in _COMPUTE):
        return 0
    return 2 if op_type in _LAYOUT else 1


def onnx_origin(n: Node, onnx_nodes: Mapping[int, tuple[str, str, str]] | None,
                versions: Graph | None = None) -> list[tuple[str, str]]:
    """The ONNX nodes `n` came from, as `(op type, node name)`, each once: its own (an imported node keeps its id),
    else every imported node a pass absorbed into it, through the nodes earlier passes made (`versions`: every node
    of the run, `viz.overlay.all_versions`; without it, one step back): gptj's attention %251 -> its MatMuls,
    Softmax, Mul, Slices ..., not only the two Reshapes it absorbed itself. Compute op types first (`_rank`), each
    group in the file's order.
    [] for a model not read from ONNX.

    Args:
        onnx_nodes: `Model.meta["onnx_nodes"]` (IR node id -> (op type, node name, doc string), from the importer).
    """
    if not onnx_nodes:
        return []
    if n.id in onnx_nodes:
        return [onnx_nodes[n.id][:2]]
    found: set[int] = set()
    seen: set[int] = set()
    todo = list(n.absorbed)
    while todo:
        i = todo.pop()
        if i in seen:
            continue
        seen.add(i)
        if i in onnx_nodes:
            found.add(i)
        elif versions is not None and i in versions:
            todo += versions[i].absorbed
    order = {i: k for k, i in enumerate(onnx_nodes)}
    ids = sorted(found, key=lambda i: (_rank(onnx_nodes[i][0]), order[i]))
    return list(dict.fromkeys((onnx_nodes[i][0], onnx_nodes[i][1]) for i in ids))


def onnx_markdown(rep: Mapping[str, Any]) -> str:
    """The inspector's line for a `node_report`'s `onnx` (`onnx_origin`), "" for none: `**ONNX node** ...` for an
    imported node; for a node a pass made, `**absorbed ONNX nodes** (38): node_linear (MatMul), domain ai.onnx;
    ... and 32 more: 14 Slice, 6 Mul, 4 Reshape, 4 Transpose, 4 other` (`ONNX_NAMES_SHOWN` listed, compute ops first).
    Each name, op type and domain is escaped (text from the model)."""
    onnx = rep.get("onnx") or []
    if not onnx:
        return ""
    known = rep.get("onnx_domains") or {}  # the file's own word; else read off the importer's table
    named = [f"{md_code(name or '(unnamed)')} ({md_escape(op)}), "
             f"domain {md_code(known.get(name) or onnx_domain(op))}" for op, name in onnx[:ONNX_NAMES_SHOWN]]
    rest = Counter(op for op, _ in onnx[ONNX_NAMES_SHOWN:])
    counted = [f"{c} {md_escape(op)}" for op, c in rest.most_common(OP_TYPES_COUNTED)]
    other = sum(rest.values()) - sum(c for _, c in rest.most_common(OP_TYPES_COUNTED))
    more = f" and {sum(rest.values())} more: {', '.join(counted + ([f'{other} other'] if other else []))}" \
        if rest else ""
    if rep.get("onnx_own"):
        what = "**ONNX node**"
    else:  # a node a pass made: the ONNX nodes its fusions took in, counted, so none reads as its whole source
        what = (f"**absorbed ONNX nodes** ({len(onnx)}" + (", of the fusion that made it" if rep.get("made") else "")
                + ", compute first):")
    return f"{what} {'; '.join(named)}{more}"


DEFAULT_DOMAIN = "ai.onnx"
"""How the inspector names ONNX's default domain (written "" or "ai.onnx" in a file)."""


@functools.cache
def onnx_domain(op_type: str) -> str:
    """The ONNX domain an imported node of `op_type` came from, read off the importer's table
    (`models.onnx.HANDLERS`, keyed by (domain, op type)): every node the importer keeps is read by a
    handler of its domain, or kept as a host node, which only a default-domain node becomes. So an op type the
    table reads only in `com.microsoft` came from there, any other from `ai.onnx`; an op type read in both (Gelu,
    SimplifiedLayerNormalization) gives both, joined by " or " (the import keeps the op type, not the domain).
    Raises nothing."""
    from ..models.onnx.context import HANDLERS  # the package import registers every handler

    domains = {d or DEFAULT_DOMAIN for d, op in HANDLERS if op == op_type} or {DEFAULT_DOMAIN}
    domains = sorted(domains, key=lambda d: (d != DEFAULT_DOMAIN, d))  # ai.onnx first
    return " or ".join(domains)
