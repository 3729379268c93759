"""Reading an `.onnx` file into a `Model` (`load_onnx`): the file's size budget before it is parsed, its
initializers' data types and external-data bounds, the weights left in their file, then the import (`driver`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..presets import Model
from .context import OnnxImportError, _onnx, dtype_name
from .dims import parse_onnx
from .driver import import_graph
from .size import over_budget
from .validate import default_opset
from .weights import LAZY_ELEMENTS, ExternalDataError, eager_bytes, split_external


def _size(n: int) -> str:
    return f"{n} bytes" if n < 2**20 else f"{n / 2**20:.1f} MiB"


def _bound_external_data(proto: Any, folder: Path, path: str | Path) -> None:
    """Make each external initializer read exactly the bytes its dims and dtype declare: a missing `length` is set
    to that size (ONNX would read to the end of the file: a 4-byte tensor read a 1 GB file), a `length` that
    differs, or data running past the end of its file, is refused before anything is read.

    Raises:
        OnnxImportError: naming the initializer, its declared size and what the file holds.
    """
    onnx = _onnx()
    for t in proto.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        try:
            need = math.prod(t.dims) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
            offset = int(info.get("offset", 0) or 0)
            length = int(info["length"]) if info.get("length") else None
        except (ValueError, KeyError, TypeError) as e:
            raise OnnxImportError(f"{path}: initializer {t.name!r}: unreadable external data entry ({e})") from None
        where = info.get("location", "")
        f = folder / where
        inside = where and f.resolve().is_relative_to(folder.resolve())  # outside: refused by onnx, unread here
        size = f.stat().st_size if inside and f.is_file() else None
        if length is not None and length != need:
            raise OnnxImportError(f"{path}: initializer {t.name!r} declares {length} bytes of external data; its "
                                  f"dims {list(t.dims)} need {need}")
        if size is not None and (offset < 0 or offset + need > size):
            raise OnnxImportError(f"{path}: initializer {t.name!r} needs bytes {offset}..{offset + need} of {where!r}, "
                                  f"which holds {size}")
        if length is None:
            entry = t.external_data.add()
            entry.key, entry.value = "length", str(need)


def _check_initializer_types(proto: Any, path: str | Path) -> None:
    """Refuse an initializer whose data type code is no ONNX tensor type (999, UNDEFINED): nothing could size or
    read it. Raises OnnxImportError naming the initializer and the code."""
    onnx = _onnx()
    for t in proto.graph.initializer:
        try:
            onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
        except (KeyError, ValueError, TypeError):
            raise OnnxImportError(f"{path}: initializer {t.name!r} has data type {dtype_name(t.data_type)}: no "
                                  f"tensor of that type can be read; refused") from None


def load_onnx(path: str | Path, batch: int = 1, seq: int = 128, input_shapes: Mapping[str, Sequence[int]] | None = None,
              external_data_dir: str | Path | None = None, name: str | None = None,
              max_bytes: int | None = None, lazy_elements: int | None = LAZY_ELEMENTS, proto: Any | None = None,
              ) -> Model:
    """A `Model` from an `.onnx` file.

    Args:
        path: the `.onnx` file.
        batch, seq: values for the symbolic batch / sequence dimensions of the inputs.
        input_shapes: full static shapes for some inputs (by name), overriding the binding.
        external_data_dir: where the external-data files live (default: the model's folder).
        name: the model name (default: the file's stem).
        max_bytes: refuse a model whose initializers held in memory (the file's own and the external ones of at
            most `lazy_elements` elements) would take more bytes, checked from their declared shapes before the
            external data is read, and a file whose size or text counts more (`onnx_size.over_budget`), checked
            before it is parsed.
        lazy_elements: external initializers with more elements stay in their file until their values are
            needed (`onnx_weights`: the model's weights are then a `LazyWeights`); None reads them all at load.
        proto: the file already parsed (`dims.parse_onnx`, by a caller that read its input shapes), so a large
            file is parsed once; it is CHANGED (its small external data read in). None: parsed here.

    Raises:
        OnnxImportError: unreadable or invalid file, too large, missing external data, or anything
            `import_graph` refuses.
    """
    onnx = _onnx()
    p = Path(path)
    if not p.is_file():
        raise OnnxImportError(f"{path}: no such file")
    if max_bytes is not None and (why := over_budget(p, max_bytes)) is not None:  # before parsing (onnx_size)
        raise OnnxImportError(f"{path}: {why}")
    if proto is None:
        proto = parse_onnx(path)
    if not proto.HasField("graph"):
        why = "the file is empty" if p.stat().st_size == 0 else "it holds no graph"
        raise OnnxImportError(f"{path}: not an ONNX model ({why})")
    _check_initializer_types(proto, path)  # before any size is computed from a data type
    folder = Path(external_data_dir or p.parent)
    if max_bytes is not None:
        need = eager_bytes(proto, {t.name for t in proto.graph.initializer  # those left in their file: not held
                                   if t.data_location == onnx.TensorProto.EXTERNAL and lazy_elements is not None
                                   and math.prod(t.dims) > lazy_elements})
        if need > max_bytes:
            raise OnnxImportError(f"{path}: its initializers need {_size(need)}, over the limit of {_size(max_bytes)} "
                                  f"(--max-memory-mb / RLXVIZ_MAX_MEMORY_MB)")
    _bound_external_data(proto, folder, path)
    try:
        external = split_external(proto, folder, lazy_elements)  # reads the small ones; the large stay in the file
    except (ExternalDataError, OSError) as e:  # missing file, path escaping the folder, short read
        raise OnnxImportError(f"{path}: cannot load external data ({type(e).__name__}: {e})") from None
    try:
        graph, weights, provenance = import_graph(proto, batch, seq, input_shapes, name or p.stem, max_bytes,
                                                  external)
    except OnnxImportError as e:
        raise OnnxImportError(f"{path}: {e}") from None
    producer = f"{proto.producer_name} {proto.producer_version}".strip()
    return Model(name or p.stem, graph, weights, None, f"ONNX export {p.name}" + (f" ({producer})" if producer else ""),
                 meta={"onnx_file": str(p), "opset": default_opset(proto), "producer": producer,
                       "onnx_outputs": [o.name for o in proto.graph.output],
                       "onnx_nodes": provenance,  # IR node id -> (op type, node name, doc string)
                       "onnx_domains": {n.name: n.domain or "ai.onnx" for n in proto.graph.node if n.name}})



__all__ = ["load_onnx"]
