"""The first layers of an ONNX export as an ONNX model of their own: what `rlxviz run/time --layers 0-K` runs when
the whole model does not fit the memory limit.

`slice_layers(path, 0, K)` cuts the file's graph after layer K: its outputs become the values that nodes of layers
0..K produce and later nodes read (the residual stream after layer K: `[batch, seq, hidden]`), everything before
them is kept (embedding, mask and RoPE tables, layers 0..K) with their real weights, and nothing after. The layers
are the exporter's module paths (`onnx.paths.node_path`, numbered as the import numbers them). The slice is written
to a temporary folder (removed when the process exits) next to its weights: a hard link to the model's
external-data file, else a sparse file holding only the byte ranges the slice's initializers use (the offsets
unchanged), so ONNX Runtime, which reads external data only from the model's own folder, runs the same slice. Its
numbers are the original model's numbers for those values: the kept nodes compute exactly what they computed.
"""

from __future__ import annotations

import atexit
import math
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from .layout import unreadable_why

_LAYERS = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


class SliceError(ValueError):
    """A `--layers` range that the file cannot be cut at: one line naming the range and the file's layers."""


def parse_layers(text: str) -> tuple[int, int]:
    """`0-1` -> (0, 1), `3` -> (3, 3). Raises SliceError for anything else or a reversed range."""
    m = _LAYERS.match(text or "")
    if not m:
        raise SliceError(f"--layers {text!r}: expected FIRST-LAST (e.g. 0-1) or one layer index")
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) is not None else first
    if last < first:
        raise SliceError(f"--layers {text}: the last layer {last} is before the first {first}")
    return first, last


_TEMP: list[str] = []


def _temp_dir() -> Path:
    d = tempfile.mkdtemp(prefix="rlxviz-slice-")
    if not _TEMP:
        atexit.register(lambda: [shutil.rmtree(x, ignore_errors=True) for x in _TEMP])
    _TEMP.append(d)
    return Path(d)


def _node_layers(graph: Any) -> list[int | None]:
    from ...passes import layer_of
    from ..module_calls import number_calls
    from .paths import node_path

    paths = number_calls([node_path(n) for n in graph.node])
    return [None if (lay := layer_of(p)) is None else int(lay) for p in paths]


def cut_values(graph: Any, last: int) -> list[str]:
    """Names of the values that nodes of layers <= `last` produce and a later node (or the graph's output) reads.
    Raises SliceError when no node names layer `last`, or when it is the file's last layer."""
    layers = _node_layers(graph)
    present = sorted({x for x in layers if x is not None})
    if last not in present:
        span = f"layers {present[0]}..{present[-1]}" if present else "no node path names a layer"
        raise SliceError(f"--layers: layer {last} is not in this model ({span})")
    end = max(i for i, x in enumerate(layers) if x == last)
    produced: dict[str, int] = {}
    for i, (n, x) in enumerate(zip(graph.node, layers, strict=True)):
        if i <= end and x is not None and x <= last:
            for o in n.output:
                if o:
                    produced[o] = i
    later = {i for n in graph.node[end + 1:] for i in n.input} | {o.name for o in graph.output}
    cut = [v for v in produced if v in later]
    if not cut:
        raise SliceError(f"--layers: nothing that layers 0..{last} compute is read after them")
    return cut


_FLOAT_TYPES = {1, 10, 11, 16}  # TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16


def stream_first(cut: list[str], graph: Any) -> list[str]:
    """The slice's outputs from its cut values (`cut_values`, in the order their nodes run): the floating-point
    values, the last computed first (the residual stream after the last layer, `[batch, seq, hidden]`, leads; then
    tables such as RoPE's cos/sin). The integer ones (shape vectors an exporter computed once in layer 0 for later
    layers' reshapes) are left out: no node of the slice needs them as an output, and `rlxviz run` wrote them beside
    the hidden state as if they were results. All of them, integers last, when none is a float. A value whose type
    shape inference did not find counts as not a float. `graph`: the ONNX graph after shape inference."""
    typed = {v.name: v.type.tensor_type.elem_type for v in graph.value_info}
    typed |= {v.name: v.type.tensor_type.elem_type for v in graph.output}
    order = {name: i for i, name in enumerate(cut)}
    ranked = sorted(cut, key=lambda v: (typed.get(v) not in _FLOAT_TYPES, -order[v]))
    floats = [v for v in ranked if typed.get(v) in _FLOAT_TYPES]
    return floats or ranked


_LAYOUT_OPS = {"Unsqueeze", "Squeeze", "Reshape", "Flatten", "Cast", "CastLike", "Expand", "Transpose", "Identity",
               "Slice", "Gather", "Mul", "Div"}  # what an exporter puts between a RoPE table and its readers
_SHAPE_ONLY = {"Shape", "Size"}  # read their operand's shape, not its values


def _rope_table(graph: Any, value: str) -> str | None:
    """`cos` / `sin` when `value` is a RoPE table: a Cos or Sin node (or an initializer named `*cos*` / `*sin*`, a
    cached table an export gathers from) behind layout ops only (`_LAYOUT_OPS`; a Mul or Div by a constant, a
    Gather's table operand); else None."""
    made = {o: n for n in graph.node for o in n.output}
    consts = {t.name for t in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    for _ in range(32):
        if value in consts:
            low = value.lower()
            return "cos" if "cos" in low else "sin" if "sin" in low else None
        node = made.get(value)
        if node is None:
            return None
        if node.op_type in ("Cos", "Sin"):
            return node.op_type.lower()
        if node.op_type not in _LAYOUT_OPS:
            return None
        ins = [x for x in node.input if x]
        if node.op_type in ("Mul", "Div"):
            ins = [x for x in ins if x not in consts]
            if len(ins) != 1:
                return None
        if not ins:
            return None
        value = ins[0]
    return None


def _data_inputs(graph: Any, value: str) -> set[str]:
    """The graph inputs whose values `value` is computed from: its operands' producers back to the inputs, except
    through a node that reads only its operand's shape (`_SHAPE_ONLY`). Empty: computed from shapes and constants."""
    made = {o: n for n in graph.node for o in n.output}
    inputs = {i.name for i in graph.input} - {t.name for t in graph.initializer}
    found: set[str] = set()
    seen: set[str] = set()
    todo = [value]
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in inputs:
            found.add(v)
        elif (node := made.get(v)) is not None and node.op_type not in _SHAPE_ONLY:
            todo.extend(x for x in node.input if x)
    return found


def _span(layers: set[int]) -> str:
    lo, hi = min(layers), max(layers)
    return f"layer {lo}" if lo == hi else f"layers {lo}-{hi}"


def output_roles(graph: Any, outs: list[str], last: int) -> dict[str, str]:
    """What each output of the slice cut after layer `last` is, in words, from the whole file's `graph`: the first
    of `outs` (`stream_first`) is the residual stream; each other one is said by what it is (an output of the whole
    model; a RoPE cos/sin table, `_rope_table`; a value built from mask inputs only, an attention mask), what it is
    computed from (`_data_inputs`) and which layers read it. The lines `rlxviz run --layers` prints beside the keys
    it writes, and each output's doc_string in the slice file."""
    layers = _node_layers(graph)
    kept = _span({0, last})
    readers: dict[str, set[int | None]] = {}
    for n, x in zip(graph.node, layers, strict=True):
        for i in n.input:
            readers.setdefault(i, set()).add(x)
    model_outs = {o.name for o in graph.output}
    roles = {}
    for k, v in enumerate(outs):
        by = readers.get(v, set())
        numbered = {x for x in by if x is not None}
        read = " and ".join(([_span(numbered)] if numbered else []) + (["the nodes after the layers"] if None in by
                                                                           else []))
        one = len(numbered) == 1 and None not in by
        read = f"{read} read{'s' if one else ''} it" if read else "no node reads it"
        if k == 0:
            nxt = sorted(x for x in numbered if x > last)
            who = f"layer {nxt[0]}" if nxt else "the nodes after the layers"
            roles[v] = f"the residual stream after layer {last} (the hidden state {who} reads)"
            continue
        src = sorted(_data_inputs(graph, v))
        origin = f"from the input{'s' if len(src) > 1 else ''} {', '.join(src)}" if src else \
            "from shapes and constants only (the same for every input of these shapes)"
        if v in model_outs:
            roles[v] = f"an output of the whole model, computed in {kept}"
        elif (table := _rope_table(graph, v)) is not None:
            roles[v] = f"the RoPE {table} table, computed {origin}; {read}"
        elif src and all("mask" in s.lower() for s in src):
            roles[v] = f"an attention mask, computed {origin}; {read}"
        else:
            roles[v] = f"a value {kept} compute{'s' if last == 0 else ''} {origin}; {read}"
    return roles


def slice_outputs(path: str | Path) -> list[tuple[str, str]]:
    """(name, what it is) for each output of a slice file `slice_layers` wrote, in order: the residual stream first
    (`output_roles`, kept as each output's doc_string). Reads the graph only."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return [(o.name, o.doc_string) for o in graph.output]


def slice_layers(path: str | Path, first: int, last: int) -> Path:
    """Write layers `first`..`last` (`first` must be the model's first layer: the slice starts at the inputs) of the
    ONNX file `path` as their own model (`<stem>.layers<first>-<last>.onnx` in a temporary folder) and return its path.
    Its outputs are the cut values that are floats, the residual stream first (`stream_first`), each one's
    doc_string saying what it is (`output_roles`; `slice_outputs` reads them back).
    Reads no weight (the slice's data file is a hard link, or a sparse copy of the ranges it uses).

    Raises:
        SliceError: a range that does not start at the first layer, a layer the model lacks, a file that cannot be cut.
        OSError: the temporary folder cannot be written.
    """
    import onnx
    from onnx import shape_inference, utils

    p = Path(path)
    try:
        proto = onnx.load(str(p), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf DecodeError and friends
        raise SliceError(f"{path}: not a readable ONNX model ({unreadable_why(p, e)})") from None
    layers = sorted({x for x in _node_layers(proto.graph) if x is not None})
    if not layers:
        raise SliceError(f"{path}: --layers: no node path names a layer, so the file cannot be cut by layer")
    if first != layers[0]:
        raise SliceError(f"--layers {first}-{last}: a slice starts at the first layer ({layers[0]}): give "
                         f"{layers[0]}-{last}")
    inferred = shape_inference.infer_shapes(proto)  # types of the cut values (no data read)
    outs = stream_first(cut_values(proto.graph, last), inferred.graph)
    inits = {t.name for t in proto.graph.initializer}
    inputs = [i.name for i in proto.graph.input if i.name not in inits]
    try:
        part = utils.Extractor(inferred).extract_model(inputs, outs)
    except Exception as e:  # noqa: BLE001 - a value without a type, a cut onnx refuses
        raise SliceError(f"{path}: --layers {first}-{last}: cannot cut the graph ({type(e).__name__}: {e})") from None
    part.graph.name = f"{proto.graph.name or p.stem} layers {first}-{last}"
    roles = output_roles(proto.graph, outs, last)
    for o in part.graph.output:
        o.doc_string = roles[o.name]
    out_dir = _temp_dir()
    _place_external_data(part, p.parent, out_dir)
    out = out_dir / f"{p.stem}.layers{first}-{last}.onnx"
    onnx.save(part, str(out))
    return out


def _place_external_data(proto: Any, src: Path, dst: Path) -> None:
    """Make each external-data file the slice's initializers name readable from `dst`: a hard link, else a sparse
    file of the same size holding the byte ranges those initializers use (copied in 16 MiB pieces)."""
    from onnx import TensorProto, helper

    ranges: dict[str, list[tuple[int, int]]] = {}
    for t in proto.graph.initializer:
        if t.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        where = info.get("location", "")
        size = math.prod(t.dims) * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
        ranges.setdefault(where, []).append((int(info.get("offset", 0) or 0), int(info.get("length") or size)))
    for where, spans in ranges.items():
        f, g = (src / where), (dst / where)
        if not f.resolve().is_relative_to(src.resolve()) or Path(where).is_absolute() or ".." in Path(where).parts:
            raise SliceError(f"external data location {where!r} is outside the model's folder")
        g.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(f.resolve(), g)
            continue
        except OSError:
            pass
        with open(f, "rb") as r, open(g, "wb") as w:
            w.truncate(f.stat().st_size)
            for off, length in spans:
                r.seek(off)
                w.seek(off)
                left = length
                while left:
                    chunk = r.read(min(left, 16 << 20))
                    if not chunk:
                        break
                    w.write(chunk)
                    left -= len(chunk)


__all__ = ["SliceError", "cut_values", "output_roles", "parse_layers", "slice_layers", "slice_outputs"]
