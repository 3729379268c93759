"""Binding a graph input's symbolic dimensions to sizes: `batch` and `seq` by the dimension's name or place, or the
full shape a caller gives (`input_shapes`), which may bind only the file's symbolic dimensions, one size per symbol.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...ir import DType
from .context import OnnxImportError, onnx_dtype
from .dims import default_dim


def _bind_input(vi: Any, batch: int, seq: int, shapes: Mapping[str, Sequence[int]]) -> tuple[tuple[int, ...], DType]:
    t = vi.type.tensor_type
    dtype = onnx_dtype(t.elem_type)
    if vi.name in shapes:
        given = tuple(int(d) for d in shapes[vi.name])
        if (bad := next((i for i, d in enumerate(given) if d <= 0), None)) is not None:
            raise OnnxImportError(f"input {vi.name!r}: dimension {bad} is {given[bad]}; a graph input's dimensions "
                                  f"must be positive")
        if why := _binds(vi, given):
            raise OnnxImportError(why)
        return given, dtype
    dims = []
    for i, d in enumerate(t.shape.dim):
        if d.HasField("dim_value") and d.dim_value <= 0:
            raise OnnxImportError(f"input {vi.name!r}: dimension {i} is {d.dim_value}; a graph input's dimensions "
                                  f"must be positive")
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif (v := default_dim(d.dim_param or "", i, batch, seq, len(t.shape.dim))) is not None:
            dims.append(v)  # by its name or place, as `dims.bind_input_shapes` binds a dim nothing names
        else:
            raise OnnxImportError(f"input {vi.name!r}: cannot bind dimension {i} ({d.dim_param or '?'}); "
                                  f"give its shape with input_shapes={{'{vi.name}': [...]}}")
    return tuple(dims), dtype


def _binds(vi: Any, given: tuple[int, ...]) -> str:
    """Why the array shape `given` cannot bind the graph input `vi`, or '': an array binds only the symbolic
    dimensions of the file's input (a `dim_param`, or none given); its rank and every fixed dimension must be the
    file's, else the model would run under another meaning than the file's (ONNX Runtime refuses such inputs).
    An input with no shape in the file binds any. Raises nothing."""
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return ""
    declared = [int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
    shown = "[" + ", ".join(str(d) for d in declared) + "]"
    where = f"input {vi.name!r} has shape {list(given)}"
    if len(given) != len(declared):
        return (f"{where} (rank {len(given)}); the file's input is {shown} (rank {len(declared)}): an array binds only "
                f"the input's symbolic dimensions")
    fixed = [i for i, d in enumerate(declared) if isinstance(d, int) and d != given[i]]
    if fixed:
        return (f"{where}; the file fixes it to {shown} (dimension {fixed[0]} is {declared[fixed[0]]}): an array "
                f"binds only the input's symbolic dimensions")
    return ""


def _same_symbols(vi: Any, shape: tuple[int, ...], bound: dict[str, tuple[int, str]]) -> str:
    """Why the array shape `shape` binds a symbolic dimension of input `vi` to another size than an earlier input
    bound the same symbol to (`bound`: symbol -> (size, input), updated), or '': one symbol has one size.
    Raises nothing."""
    t = vi.type.tensor_type
    for i, d in enumerate(t.shape.dim if t.HasField("shape") else ()):
        if not d.dim_param or i >= len(shape):
            continue
        size, by = bound.setdefault(d.dim_param, (shape[i], vi.name))
        if size != shape[i]:
            return (f"input {vi.name!r} has shape {list(shape)}: its dimension {i} ({d.dim_param!r}) is {shape[i]}, "
                    f"but input {by!r} binds {d.dim_param!r} to {size}")
    return ""


__all__: list[str] = []
