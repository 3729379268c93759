"""Why a file cannot be an ONNX model, from its top-level protobuf layout alone: one reading for the app's upload
check (`app.sources.check_upload`) and the loader the CLI runs (`dims.parse_onnx`), so both say the same words for a
truncated file (the CLI said only `DecodeError: ... Wire format was corrupt`)."""

from __future__ import annotations

import mmap
from os import PathLike

_MODEL_GRAPH_FIELD = 7
"""`ModelProto.graph`'s field number: a model without it holds no graph."""


def onnx_layout_error(data: bytes | bytearray | memoryview | mmap.mmap) -> str:
    """Why `data` cannot be an ONNX model, read from its top-level protobuf fields alone (tags and lengths, no
    tensor decoded: as cheap for 200 MB as for 2 kB), or "" when it may be one: a field that runs past the end
    (a truncated file: `ends inside field 7 (graph) at byte 5,000 of 530,618 it needs`), a wire type protobuf does
    not have (text or other bytes), or no graph field. What passes is still read by the loader, which says what
    else is wrong; what fails is refused before anything changes (`check_upload`), so the model shown stays
    current and no pane is marked stale."""
    pos, n, graph = 0, len(data), False
    while pos < n:
        tag, pos = _varint(data, pos)
        if tag is None:
            return f"ends inside a field's tag at byte {n:,}"
        field, wire = tag >> 3, tag & 7
        if field == 0 or wire not in (0, 1, 2, 5):
            return f"byte {pos - 1:,} starts no protobuf field (not an ONNX file?)"
        if wire == 0:
            value, pos = _varint(data, pos)
            end = pos if value is not None else n + 1
        elif wire == 2:
            size, pos = _varint(data, pos)
            end = pos + size if size is not None else n + 1
        else:
            end = pos + (8 if wire == 1 else 4)
        if end > n:
            what = " (graph)" if field == _MODEL_GRAPH_FIELD else ""
            return f"ends inside field {field}{what}: the file has {n:,} bytes, the field needs {end:,}; truncated?"
        graph |= field == _MODEL_GRAPH_FIELD and wire == 2
        pos = end
    return "" if graph else "it holds no graph"


def _varint(data: bytes | bytearray | memoryview | mmap.mmap, pos: int) -> tuple[int | None, int]:
    """A protobuf varint of `data` at `pos` and the position after it; `(None, len(data))` when the data ends
    inside it (or it runs past 10 bytes)."""
    value = shift = 0
    for k in range(pos, min(pos + 10, len(data))):
        b = data[k]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, k + 1
        shift += 7
    return None, len(data)


def unreadable_why(path: str | PathLike[str], error: BaseException) -> str:
    """The words for a file at `path` that protobuf could not parse (`error`): `onnx_layout_error` of its bytes
    (`ends inside field 7 (graph): the file has 20,000 bytes, the field needs 530,612; truncated?`) where its layout
    says why, else `error`'s type and text. The file is mapped, not read (its size costs nothing more)."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            why = onnx_layout_error(data)
    except (OSError, ValueError):  # gone, unreadable, or empty (an empty file cannot be mapped)
        why = ""
    return why or f"{type(error).__name__}: {error}"
