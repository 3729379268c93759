"""What reading an `.onnx` file costs, known before it is parsed: its size, and its text, from the protobuf wire
format alone (no message is built, the file is mapped, not read).

Reading a model holds the file several times: `onnx.load` keeps the bytes read and the parsed message, and the
check against ONNX Runtime serializes the model again and parses that copy (measured: a 64 MiB `doc_string` raised
`rlxviz explain`'s peak by 252 MB, 3.9x). So a file counts `FILE_COPIES` times its size against the memory limit
(`--max-memory-mb` / `RLXVIZ_MAX_MEMORY_MB`), the same limit its tensors are checked against after parsing; the
first `FREE_BYTES` are free (parsing a small file costs nothing next to the process itself).

Text, every string and bytes field that is not tensor data (doc strings, names, string attributes, metadata,
`string_data`), is the ONNX file's counterpart of IR text, and is capped as IR text files are
(`MAX_TEXT_BYTES`, 64 MiB), whatever the memory limit: a model's text is never that large, while a 256 MB
`doc_string` is a file built to exhaust memory.
"""

from __future__ import annotations

import functools
import mmap
from dataclasses import dataclass
from pathlib import Path

from ...ir.memory import format_bytes

FILE_COPIES = 4
"""Times an `.onnx` file's size counted against the memory limit (the bytes, the parsed model, and the copies of
both that the ONNX Runtime check makes)."""

FREE_BYTES = 1 << 20
"""Files up to this size are read whatever the limit."""

MAX_TEXT_BYTES = 64 << 20
"""Most bytes of text (all string fields together) an `.onnx` file may hold; IR text files have the same cap."""

MAX_DEPTH = 64
"""Messages nested deeper than this (graphs inside attributes inside graphs) are not walked further."""

# The ONNX messages' fields that the walk follows (onnx.proto field numbers): `number: (what, name)`, `what` a
# message name for a sub-message, "text" for a string or bytes field, "data" for tensor data (raw_data and the
# packed number arrays). Other fields (numbers, enums) are skipped with the wire format's own lengths.
_SSE = {1: ("text", "key"), 2: ("text", "value")}  # StringStringEntryProto
_SCHEMA: dict[str, dict[int, tuple[str, str]]] = {
    "model": {2: ("text", "producer_name"), 3: ("text", "producer_version"), 4: ("text", "domain"),
              6: ("text", "doc_string"), 7: ("graph", "graph"), 8: ("opset", "opset_import"),
              14: ("sse", "metadata_props"), 20: ("training", "training_info"), 25: ("function", "functions")},
    "opset": {1: ("text", "domain")},
    "sse": _SSE,
    "training": {1: ("graph", "initialization"), 2: ("graph", "algorithm"), 3: ("sse", "initialization_binding"),
                 4: ("sse", "update_binding")},
    "graph": {1: ("node", "node"), 2: ("text", "name"), 5: ("tensor", "initializer"), 10: ("text", "doc_string"),
              11: ("value_info", "input"), 12: ("value_info", "output"), 13: ("value_info", "value_info"),
              14: ("annotation", "quantization_annotation"), 15: ("sparse", "sparse_initializer"),
              16: ("sse", "metadata_props")},
    "node": {1: ("text", "input"), 2: ("text", "output"), 3: ("text", "name"), 4: ("text", "op_type"),
             5: ("attribute", "attribute"), 6: ("text", "doc_string"), 7: ("text", "domain"), 8: ("text", "overload"),
             9: ("sse", "metadata_props")},
    "attribute": {1: ("text", "name"), 4: ("text", "s"), 5: ("tensor", "t"), 6: ("graph", "g"), 9: ("text", "strings"),
                  10: ("tensor", "tensors"), 11: ("graph", "graphs"), 13: ("text", "doc_string"), 14: ("type", "tp"),
                  15: ("type", "type_protos"), 21: ("text", "ref_attr_name"), 22: ("sparse", "sparse_tensor"),
                  23: ("sparse", "sparse_tensors")},
    "tensor": {4: ("data", "float_data"), 5: ("data", "int32_data"), 6: ("text", "string_data"),
               7: ("data", "int64_data"), 8: ("text", "name"), 9: ("data", "raw_data"), 10: ("data", "double_data"),
               11: ("data", "uint64_data"), 12: ("text", "doc_string"), 13: ("sse", "external_data"),
               16: ("sse", "metadata_props")},
    "sparse": {1: ("tensor", "values"), 2: ("tensor", "indices")},
    "value_info": {1: ("text", "name"), 2: ("type", "type"), 3: ("text", "doc_string"), 4: ("sse", "metadata_props")},
    "type": {1: ("type_tensor", "tensor_type"), 4: ("type_elem", "sequence_type"), 5: ("type_map", "map_type"),
             6: ("text", "denotation"), 8: ("type_tensor", "sparse_tensor_type"), 9: ("type_elem", "optional_type")},
    "type_tensor": {2: ("shape", "shape")},
    "type_elem": {1: ("type", "elem_type")},
    "type_map": {2: ("type", "value_type")},
    "shape": {1: ("dim", "dim")},
    "dim": {2: ("text", "dim_param"), 3: ("text", "denotation")},
    "annotation": {1: ("text", "tensor_name"), 2: ("sse", "quant_parameter_tensor_names")},
    "function": {1: ("text", "name"), 4: ("text", "input"), 5: ("text", "output"), 6: ("text", "attribute"),
                 7: ("node", "node"), 8: ("text", "doc_string"), 9: ("opset", "opset_import"), 10: ("text", "domain"),
                 11: ("attribute", "attribute_proto"), 12: ("value_info", "value_info"), 13: ("text", "overload"),
                 14: ("sse", "metadata_props")},
}


@dataclass(frozen=True)
class OnnxBytes:
    """What the wire walk of an `.onnx` file counted.

    Attributes:
        file: the file's size in bytes.
        text: bytes of all text fields (strings and bytes that are not tensor data).
        data: bytes of tensor data in the file (raw_data, packed numbers).
        largest: the largest text field by its path of field names (`model.doc_string`,
            `model.graph.node.attribute.s`), "" when none.
        largest_bytes: its size in bytes.
        complete: the walk reached the file's end (False: malformed wire data; the parser will say what).
    """

    file: int
    text: int
    data: int
    largest: str
    largest_bytes: int
    complete: bool


def _varint(buf: memoryview, i: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while i < end and shift < 70:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
    raise ValueError("bad varint")


def count_bytes(path: str | Path) -> OnnxBytes:
    """Walk the ONNX `ModelProto` in the file at `path` by its wire format (the file is mapped; nothing is parsed
    into messages) and count its text and tensor data.

    Raises:
        OSError: the file cannot be opened or mapped.
    """
    p = Path(path)
    st = p.stat()
    return _counted(str(p.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)


@functools.lru_cache(maxsize=16)
def _counted(path: str, size: int, mtime_ns: int, inode: int) -> OnnxBytes:
    """`count_bytes` of one version of a file (its size, mtime and inode name it, as the loaders' caches do): a load
    checks the file before reading its input shapes and again as the importer starts, and the walk is Python over
    every field (~15 ms for a 4,000-node export)."""
    if size == 0:
        return OnnxBytes(0, 0, 0, "", 0, True)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        buf = memoryview(mm)
        try:
            return _walk(buf, size)
        finally:
            buf.release()


def _walk(buf: memoryview, size: int) -> OnnxBytes:
    text = data = largest_bytes = 0
    largest = ""
    stack = [("model", "model.", 0, size, 0)]
    complete = True
    while stack:
        kind, at, i, end, depth = stack.pop()
        fields = _SCHEMA[kind]
        try:
            while i < end:
                key, i = _varint(buf, i, end)
                wire, number = key & 7, key >> 3
                if wire == 0:
                    _, i = _varint(buf, i, end)
                elif wire == 1:
                    i += 8
                elif wire == 5:
                    i += 4
                elif wire == 2:
                    n, i = _varint(buf, i, end)
                    if i + n > end:
                        raise ValueError("field past its message")
                    what, name = fields.get(number, ("", ""))
                    if what == "text":
                        text += n
                        if n > largest_bytes:
                            largest_bytes, largest = n, at + name
                    elif what == "data":
                        data += n
                    elif what and depth < MAX_DEPTH:
                        stack.append((what, f"{at}{name}.", i, i + n, depth + 1))
                    i += n
                else:
                    raise ValueError(f"wire type {wire}")
        except ValueError:
            complete = False
    return OnnxBytes(size, text, data, largest, largest_bytes, complete)


def over_budget(path: str | Path, max_bytes: int) -> str | None:
    """Why the `.onnx` file at `path` is not read under a memory limit of `max_bytes` (one line, without the
    path), or None when it may be parsed: its size counted `FILE_COPIES` times past `FREE_BYTES`, its text
    against `MAX_TEXT_BYTES`.

    Raises:
        OSError: the file cannot be read.
    """
    counted = count_bytes(path)
    big = (f"; its largest text field is {counted.largest} ({format_bytes(counted.largest_bytes)})"
           if counted.largest_bytes >= max(counted.file // 4, 1 << 10) else "")
    need = FILE_COPIES * counted.file
    if counted.file > FREE_BYTES and need > max_bytes:
        return (f"reading this {format_bytes(counted.file)} file needs about {format_bytes(need)} ({FILE_COPIES}x its "
                f"size: the bytes, the parsed model and ONNX Runtime's copies), over the limit of "
                f"{format_bytes(max_bytes)} (--max-memory-mb / RLXVIZ_MAX_MEMORY_MB){big}")
    if counted.text > MAX_TEXT_BYTES:
        return (f"{format_bytes(counted.text)} of text (doc strings, names, string attributes), over the limit of "
                f"{format_bytes(MAX_TEXT_BYTES)} on an ONNX file's text{big}")
    return None


__all__ = ["FILE_COPIES", "FREE_BYTES", "MAX_TEXT_BYTES", "OnnxBytes", "count_bytes", "over_budget"]
