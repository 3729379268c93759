"""Static shapes for an ONNX graph's inputs from named dims (`--dim height=224`), the shapes of given arrays
(`--inputs IN.npz`) and the batch / sequence defaults, before the import (`bind_input_shapes`).

A symbolic dim is a name (`batch_size`, `past_sequence_length`) or, in optimum's exports, an expression of names
(`past_sequence_length + sequence_length`). Each name gets one value for the whole graph, in this order:

1. `dims` (the user's `--dim NAME=VALUE`);
2. the shape of a given array whose declared dim is that plain name (`--inputs`: `past_key_values.0.key` of shape
   `[2, 2, 16, 16]` binds `past_sequence_length = 16`); two arrays that disagree are refused;
3. the importer's defaults: a name containing `batch` -> `batch`, one containing `seq`/`sequence`/`len`/`token` ->
   `seq`; a plain name at axis 0 -> `batch`, at axis 1 -> `seq`.

An expression is evaluated with its names bound the same way (`+`, `-`, `*`, `//` on integers), so
`past_sequence_length + sequence_length` is always the sum of the two values the other inputs use. A name none of
these binds is refused in one line that says how to bind it.
"""

from __future__ import annotations

import ast
import mmap
import operator
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .context import OnnxImportError, _onnx
from .layout import unreadable_why

_BATCH_RE = re.compile(r"batch", re.I)
_SEQ_RE = re.compile(r"seq|sequence|len|token", re.I)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}
MAX_DIM = 1 << 40
"""The largest value a bound dim may take (the memory limit refuses far smaller graphs; this bounds the arithmetic)."""


class DimError(OnnxImportError):
    """A symbolic dim that cannot be bound, a bad `--dim`, or given arrays that disagree (one line).

    Attributes:
        input: the graph input whose dim nothing binds ('' for the other kinds), for a front end's own remedy (a
            file of that input's array beside the model: `session.loading`).
    """

    def __init__(self, message: str, input: str = "") -> None:
        super().__init__(message)
        self.input = input


def parse_dim(text: str) -> tuple[str, int]:
    """`NAME=VALUE` -> (name, value), value a positive integer. Raises DimError."""
    name, sep, value = text.partition("=")
    name = name.strip()
    try:
        v = int(value.strip()) if sep else 0
    except ValueError:
        v = 0
    if not sep or not name or v <= 0 or v > MAX_DIM:
        raise DimError(f"--dim {text!r}: give NAME=VALUE with a positive integer value (e.g. --dim height=224)")
    return name, v


_NOT_TOKENS_RE = re.compile(r"channel|height|width|image|pixel|feature|mel|head|hidden|embed|vocab", re.I)
"""Dim names that say what they are, and it is neither batch nor tokens (an image's `num_channels`, `height`): never
bound by their axis alone."""


def default_dim(name: str, axis: int | None, batch: int, seq: int, rank: int | None = None) -> int | None:
    """The value of a symbolic dim nothing names: `batch` for a batch-like name, `seq` for a sequence-like one; else,
    by its axis, `batch` on axis 0 and `seq` on axis 1 of a rank-2 or rank-3 input (`[batch, seq]` ids and masks,
    `[batch, seq, hidden]` states), unless its name says it is something else (`_NOT_TOKENS_RE`): axis 1 of an image
    `[batch, num_channels, height, width]` is no sequence (beit.optimum's channels took the sequence length, 16, and
    its Conv failed on 16 channels). None: unbound."""
    if _BATCH_RE.search(name):
        return batch
    if _SEQ_RE.search(name):
        return seq
    if _NOT_TOKENS_RE.search(name):
        return None
    if axis == 0:
        return batch
    if axis == 1 and (rank is None or rank <= 3):
        return seq
    return None


def _eval(expr: str, value_of: Any) -> int | None:
    """The integer value of a dim expression, names resolved by `value_of(name)` (None: unbound); None if `expr` is
    not an expression of that grammar."""
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None

    def ev(n: ast.AST) -> int:
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and type(n.value) is int:
            return n.value
        if isinstance(n, ast.Name):
            v = value_of(n.id)
            if v is None:
                raise KeyError(n.id)
            return int(v)
        if isinstance(n, ast.BinOp) and type(n.op) in _OPS:
            a, b = ev(n.left), ev(n.right)
            if type(n.op) is ast.FloorDiv and b == 0:
                raise ZeroDivisionError(expr)
            out = _OPS[type(n.op)](a, b)
            if abs(out) > MAX_DIM:
                raise OverflowError(expr)
            return out
        raise TypeError(type(n).__name__)

    return ev(tree)


def bind_input_shapes(inputs: Sequence[Any], batch: int, seq: int, dims: Mapping[str, int] | None = None,
                      given: Mapping[str, Sequence[int]] | None = None, initializers: set[str] | None = None,
                      ) -> dict[str, tuple[int, ...]]:
    """The static shape of every graph input (`onnx.ValueInfoProto`s; initializer names skipped).

    Args:
        inputs: the graph's inputs.
        batch, seq: the defaults for batch-like and sequence-like names.
        dims: values for symbolic dim names (they win over everything else).
        given: full shapes of some inputs (the arrays of `--inputs`): kept as they are, and their plain dim names
            bind those names for the other inputs.
        initializers: names to skip (old exporters list initializers as inputs too).

    Raises:
        DimError: a dim nothing binds (the message names the input, axis and dim, and says to pass `--dim` or the
            input's array), two given arrays giving one name two values, or an expression that is not integer
            arithmetic on names (`+ - * //`).
    """
    dims = dict(dims or {})
    given = {k: tuple(int(d) for d in v) for k, v in (given or {}).items()}
    skip = initializers or set()
    learned: dict[str, tuple[int, str]] = {}
    for vi in inputs:
        if vi.name in given and vi.name not in skip:
            for i, d in enumerate(vi.type.tensor_type.shape.dim):
                name = d.dim_param if d.HasField("dim_param") else ""
                if not name or not _NAME.match(name) or name in dims or i >= len(given[vi.name]):
                    continue
                v = given[vi.name][i]
                if name in learned and learned[name][0] != v:
                    other, was = learned[name][1], learned[name][0]
                    raise DimError(f"the inputs disagree on {name!r}: {other!r} gives {was}, {vi.name!r} gives {v}")
                learned.setdefault(name, (v, vi.name))

    def value_of(name: str, axis: int | None = None, rank: int | None = None) -> int | None:
        if name in dims:
            return dims[name]
        if name in learned:
            return learned[name][0]
        return default_dim(name, axis, batch, seq, rank)

    out: dict[str, tuple[int, ...]] = {}
    for vi in inputs:
        if vi.name in skip:
            continue
        if vi.name in given:
            out[vi.name] = given[vi.name]
            continue
        shape = []
        for i, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.HasField("dim_value"):
                shape.append(int(d.dim_value))
                continue
            name = d.dim_param or ""
            how = (f"pass --dim {name}=N (Python: dims={{{name!r}: N}}) or the input's array with --inputs"
                   if name and _NAME.match(name) else "pass the input's array with --inputs (Python: input_shapes=)")
            rank = len(vi.type.tensor_type.shape.dim)
            if name and _NAME.match(name):
                v = value_of(name, i, rank)
            elif name:
                try:
                    v = _eval(name, value_of)
                except KeyError as e:
                    raise DimError(f"input {vi.name!r}: dimension {i} ({name}) needs {e.args[0]!r}: pass --dim "
                                   f"{e.args[0]}=N (Python: dims=) or the inputs with --inputs", vi.name) from None
                except (TypeError, ZeroDivisionError, OverflowError, RecursionError):
                    v = None
            else:
                v = default_dim("", i, batch, seq, rank)
            if v is None:
                raise DimError(f"input {vi.name!r}: cannot bind dimension {i} ({name or '?'}); {how}", vi.name)
            if v <= 0:
                raise DimError(f"input {vi.name!r}: dimension {i} ({name}) is {v}; a graph input's dimensions must be "
                               f"positive")
            shape.append(int(v))
        out[vi.name] = tuple(shape)
    return out


def parse_onnx(path: Any) -> Any:
    """The `onnx.ModelProto` of the file at `path`, its external data not loaded (parsed once: `load_onnx` takes it
    as `proto=`). Raises OnnxImportError for an unreadable file."""
    onnx = _onnx()
    try:
        proto = onnx.ModelProto()
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return proto  # as `onnx.load` reads an empty file: a model with no graph (the importer says so)
            # parsed from the page cache, not from a copy `f.read()` makes first (`onnx.load`): 0.75 s instead of
            # 1.3 s for a 434 MB file on a loaded 2-core machine. The message holds its own bytes: nothing refers
            # to the map once it is closed (the map cannot close while a buffer of it is exported)
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
                read = proto.ParseFromString(view)
        if read is not None and read != size:
            raise ValueError(f"parsed {read} of its {size} bytes")  # as `onnx.load` checks
        return proto
    except Exception as e:  # noqa: BLE001 - protobuf DecodeError and friends
        # the app's upload check's words (`layout.unreadable_why`): a truncated file says so, not `DecodeError`
        raise OnnxImportError(f"{path}: not a readable ONNX model ({unreadable_why(path, e)})") from None


def proto_input_shapes(proto: Any, batch: int, seq: int, dims: Mapping[str, int] | None = None,
                       given: Mapping[str, Sequence[int]] | None = None) -> dict[str, tuple[int, ...]]:
    """`bind_input_shapes` for a parsed model (`parse_onnx`). Raises DimError."""
    g = proto.graph
    return bind_input_shapes(g.input, batch, seq, dims, given, {t.name for t in g.initializer})


def onnx_input_shapes(path: Any, batch: int, seq: int, dims: Mapping[str, int] | None = None,
                      given: Mapping[str, Sequence[int]] | None = None) -> dict[str, tuple[int, ...]]:
    """`bind_input_shapes` for the `.onnx` file at `path` (read without its external data). Raises DimError, or
    OnnxImportError for an unreadable file."""
    return proto_input_shapes(parse_onnx(path), batch, seq, dims, given)


__all__ = ["DimError", "bind_input_shapes", "default_dim", "onnx_input_shapes", "parse_dim", "parse_onnx",
           "proto_input_shapes"]
