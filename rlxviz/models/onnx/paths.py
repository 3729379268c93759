"""Module paths for ONNX nodes that carry none: nodes a graph optimizer made (ONNX Runtime's transformer optimizer
names them `FullyConnect_MatMul_0`, `SkipLayerNorm_AddBias_1`, `FastGelu_AddBias_0`), read from the names of the
values they touch, so a layer keeps its MLP and norms (`onnx.paths.node_path`'s last resort).

Two name forms carry a path: a legacy exporter's value name `/a/b.0/c/Op_output_0` (-> `a.b.0.c`) and a parameter
name `a.b.0.c.weight` / `.bias` (-> `a.b.0.c`). Outputs are read first (what the node makes), then inputs.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Sequence
from typing import Any

from ...ir.rewrite import common_path
from ...passes.trace import layer_of

_VALUE = re.compile(r"^/(.+)/[^/]+_output_\d+$")
_PARAM = re.compile(r"^([A-Za-z_]\w*(?:\.\w+)+)\.(?:weight|bias)$")


def path_of_name(name: str) -> str:
    """The module path a value or parameter name carries, or ''."""
    if m := _VALUE.match(name or ""):
        return module_path(".".join(p for p in m.group(1).split("/") if p))
    if m := _PARAM.match(name or ""):
        return module_path(m.group(1))
    return ""


def path_from_values(node: Any) -> str:
    """The module path of an ONNX node from the names of its outputs, then its parameter inputs, then its other
    inputs; '' when none carries one."""
    for name in list(node.output) + [i for i in node.input if _PARAM.match(i or "")] + list(node.input):
        if p := path_of_name(name):
            return p
    return ""


EXPORTER_ARTIFACT = re.compile(r"_\w*_hook(?:\$\d+)?|\w*nn_module_stack\w*")
"""A scope name an exporter writes where it knows no module, not a module of the model: torch.export's
`_empty_nn_module_stack_from_metadata_hook` (`torch._export.passes._node_metadata_hook`, the module stack of a node a
pass made, e.g. deit's `sym_size` shape op; tools downstream number it `...hook$1`). A path of one reads as none."""


def module_path(path: str) -> str:
    """`path` less the parts that are exporter artifacts (`EXPORTER_ARTIFACT`), and of the parts below one:
    `_empty_nn_module_stack_from_metadata_hook` -> '' (no module path); any other path as it is."""
    parts = path.split(".") if path else []
    k = next((k for k, part in enumerate(parts) if EXPORTER_ARTIFACT.fullmatch(part)), None)
    return path if k is None else ".".join(parts[:k])


_NAME_SCOPES = "pkg.torch.onnx.name_scopes"
MAX_SCOPES_TEXT = 8192
"""The longest name-scope metadata read (a real one is a few hundred bytes); longer is ignored, the node name used."""


@functools.lru_cache(maxsize=1024)
def _scopes(text: str) -> str | None:
    """The innermost module path a name-scope list names (`"['', 'encoder', 'encoder.layer.0', 'MatMul']"` ->
    `encoder.layer.0`; '' when it names none: `['_empty_nn_module_stack_from_metadata_hook', 'sym_size_int_3']`,
    an exporter artifact, `EXPORTER_ARTIFACT`), None when `text` is no list. One parse per distinct text: the
    nodes of a layer repeat a few texts."""
    try:
        scopes = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if not isinstance(scopes, list | tuple):
        return None
    mods = [s for s in scopes[:-1] if isinstance(s, str) and s and not EXPORTER_ARTIFACT.fullmatch(s)]
    return module_path(mods[-1]) if mods else ""


def node_path(node: Any) -> str:
    """The exporter's module path of an ONNX node: torch.onnx's name-scope metadata, else a legacy
    `/a/b.0/c/Op` node name as `a.b.0.c`, else the path its values' names carry (`path_from_values`:
    nodes a graph optimizer made); '' when none is present."""
    for p in node.metadata_props:
        if p.key == _NAME_SCOPES:
            if len(p.value) > MAX_SCOPES_TEXT:  # parsed with a bound: 400 KB of it took 179 MB
                break
            scopes = _scopes(p.value)
            if scopes is None:
                break
            return scopes
    name = node.name or ""
    if name.startswith("/"):
        return module_path(".".join(part for part in name.split("/")[1:-1] if part))
    return path_from_values(node)  # a node an optimizer made: the path its values' names carry


def agreed_paths(nodes: Sequence[Any], paths: Sequence[str], given: Sequence[str] | None = None) -> list[str]:
    """`paths` (one per ONNX node, in graph order) with each run of pathless nodes given the path of the layer its
    neighbours agree on. Nodes a tool inserted carry no path in their names (`onnxruntime.quantization`'s
    `node_MatMul_55_quant` MatMulInteger, its output Cast and scale Muls): without this a dynamically quantized
    model's projections belong to no layer. Pathless nodes joined by a value form one run; the run takes the common
    path of the pathed nodes that feed it or read it when all of those name one layer (else it stays pathless: mask
    preparation read by every layer). Deterministic and linear in the graph's size (union-find over the values).

    `given` (one per node, as `paths`; default `paths`): the paths the exporter wrote. A node pathed in `paths` but
    not in `given` had its path lent by a rule (`handlers.quant.quant_paths`: a DynamicQuantizeLinear takes the path
    of the value it quantizes) and is no neighbour: it neither joins a run nor votes on one. In a post-LN model the
    value a layer's Q/K/V MatMulIntegers quantize is the previous layer's output (or the embeddings'), so its
    quantize step's lent path would outvote the layer that reads the projections (convbert.qdyn: both layers' Q/K/V
    and convolution matmuls in no layer)."""
    out = list(paths)
    lent = [bool(p) and not g for p, g in zip(paths, paths if given is None else given, strict=True)]
    parent = list(range(len(nodes)))

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    producer: dict[str, int] = {}
    for k, n in enumerate(nodes):
        for v in n.output:
            if v:
                producer[v] = k
    edges: list[tuple[int, int]] = []  # (producer, reader) per value read
    for k, n in enumerate(nodes):
        for v in n.input:
            if v and (src := producer.get(v)) is not None:
                edges.append((src, k))
                if not out[src] and not out[k]:
                    a, b = root(src), root(k)
                    if a != b:
                        parent[max(a, b)] = min(a, b)
    around: dict[int, list[str]] = {}  # run -> the paths of the pathed nodes next to it
    for a, b in edges:
        for run, other in ((a, b), (b, a)):
            if not out[run] and out[other] and not lent[other]:
                around.setdefault(root(run), []).append(out[other])
    agreed: dict[int, str] = {}
    for run, near in around.items():
        layers = {layer_of(p) for p in near}
        if len(layers) == 1 and None not in layers:
            agreed[run] = common_path(near)
    for k in range(len(nodes)):
        if not out[k]:
            out[k] = agreed.get(root(k), "")
    return out


__all__ = ["EXPORTER_ARTIFACT", "agreed_paths", "module_path", "path_from_values", "path_of_name"]
