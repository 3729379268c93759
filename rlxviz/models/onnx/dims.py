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
import difflib
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
        input: the first graph input with a dim nothing binds ('' for the other kinds), for a front end's own
            remedy (a file of that input's array beside the model: `session.loading`).
        names: every dim name nothing binds, in the order the inputs meet them (() for the other kinds): all of
            them at once, so that one `--dim` per name binds the graph (`num_channels`, `height`, `width`).
        where: name -> (input, axis) of the first input that declares the name as a dim of its own (not in an
            expression): the axis of that input's array which holds the name's value (`session.inputs`).
        what: the message without its remedy (`input 'x': cannot bind dimensions 2 (height), 3 (width)`), for a
            front end that says its own.
    """

    def __init__(self, message: str, input: str = "", names: Sequence[str] = (),
                 where: Mapping[str, tuple[str, int]] | None = None, what: str = "") -> None:
        super().__init__(message)
        self.input, self.names, self.where, self.what = input, tuple(names), dict(where or {}), what or message


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


def _names_in(expr: str) -> list[str]:
    """The names of a dim expression (`past + sequence_length` -> `['past', 'sequence_length']`), each once, in
    order; [] when it does not parse."""
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    return list(dict.fromkeys(n.id for n in ast.walk(tree) if isinstance(n, ast.Name)))


def dim_roles(inputs: Sequence[Any], initializers: set[str] | None = None) -> dict[str, str]:
    """Every symbolic dim name of the graph's inputs (`onnx.ValueInfoProto`s; initializer names skipped), in the order
    they are met, plain or inside an expression, -> the shape box it fills when nothing names it: `batch` for a name
    the defaults bind to the batch at axis 0, `seq` for one they bind to the sequence length at axis 1 of a rank-2 or
    rank-3 input (`input_ids [batch_size, sequence_length]`), '' for any other (`past_sequence_length`, `height`).
    A `--dim` for a `batch` or `seq` name overrides `--batch` / `--seq` (`session.dims_overrides`)."""
    skip = initializers or set()
    roles: dict[str, str] = {}
    for vi in inputs:
        if vi.name in skip:
            continue
        shape = vi.type.tensor_type.shape.dim
        for i, d in enumerate(shape):
            name = d.dim_param if d.HasField("dim_param") else ""
            if not name or not _NAME.match(name):
                for n in _names_in(name) if name else []:
                    roles.setdefault(n, "")
                continue
            v = default_dim(name, i, -1, -2, len(shape))
            role = "batch" if v == -1 and i == 0 else "seq" if v == -2 and i == 1 and len(shape) <= 3 else ""
            if not roles.get(name):
                roles[name] = role
    return roles


class UnknownDimError(DimError):
    """`--dim` names that name no dimension of the graph's inputs (a typo, or dims kept from another model).

    Attributes:
        names: the unknown names, as given.
        known: the graph's input dim names (`dim_roles`), in order.
        file: the model's file name, as the message says it.
        what: the message without the option that gave the names (`sequence_lenght names no dimension of
            roberta.onnx's inputs (its named dims: batch, seq)`).
    """

    def __init__(self, names: Sequence[str], known: Sequence[str], file: str) -> None:
        verb = "names" if len(names) == 1 else "name"
        close = {n: m[0] for n in names if (m := difflib.get_close_matches(n, known, n=1))}
        hint = ""
        if len(names) == 1 and close:
            hint = f"; did you mean {close[names[0]]}?"
        elif close:
            hint = "; did you mean " + ", ".join(f"{m} for {n}" for n, m in close.items()) + "?"
        what = (f"{', '.join(names)} {verb} no dimension of {file}'s inputs (its named dims: "
                f"{', '.join(known) or 'none'}{hint})")
        super().__init__(f"--dim {what}", what=what)
        self.names, self.known, self.file = tuple(names), tuple(known), file  # after DimError's own `names`


def check_dim_names(dims: Mapping[str, int] | None, roles: Mapping[str, str], file: str) -> None:
    """Refuse `dims` names that no input dim of the graph has (`roles`: `dim_roles`): one line naming them all, the
    graph's own names and the closest of those to each (`difflib.get_close_matches`). Raises UnknownDimError."""
    if unknown := [n for n in dims or {} if n not in roles]:
        raise UnknownDimError(unknown, list(roles), file)


def dims_remedy(names: Sequence[str], arrays: str = "the inputs") -> str:
    """What binds the dim `names` on the command line and in Python, as the unbound-dim message says it:
    `pass --dim past=N (Python: dims={'past': N}) or the inputs with --inputs`; `arrays` names the arrays that
    would bind them instead."""
    flags = " ".join(f"--dim {n}=N" for n in names)
    python = ", ".join(f"{n!r}: N" for n in names)
    return f"pass {flags} (Python: dims={{{python}}}) or {arrays} with --inputs"


def _unbound_message(places: Sequence[tuple[str, int, str, list[str]]]) -> str:
    """The unbound dims' places said per input, without the remedy: `input 'x': cannot bind dimensions 2 (height),
    3 (width); input 'mask': dimension 1 (past + 1) needs 'past'`. `places`: (input, axis, the dim's text, the names
    it needs; [] for a plain name)."""
    by_input: dict[str, list[tuple[int, str, list[str]]]] = {}
    for inp, axis, text, needs in places:  # an expression in parentheses may span lines: said on one
        by_input.setdefault(inp, []).append((axis, " ".join(text.split()), needs))
    parts = []
    for inp, dims in by_input.items():
        plain = [f"{axis} ({text})" for axis, text, needs in dims if not needs]
        said = [f"cannot bind dimension{'s' if len(plain) > 1 else ''} {', '.join(plain)}"] if plain else []
        said += [f"dimension {axis} ({text}) needs {' and '.join(repr(n) for n in needs)}"
                 for axis, text, needs in dims if needs]
        parts.append(f"input {inp!r}: {'; '.join(said)}")
    return "; ".join(parts)


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
        DimError: dims nothing binds, all of them in one message (it names each input, axis and dim, and says to
            pass one `--dim` per name or the arrays; `DimError.names`, `.where`), two given arrays giving one name
            two values, or an expression that is not integer arithmetic on names (`+ - * //`).
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
    places: list[tuple[str, int, str, list[str]]] = []  # where the unbound names are met, each name said once
    unbound: dict[str, None] = {}  # the names nothing binds, in order
    where: dict[str, tuple[str, int]] = {}  # name -> the first (input, axis) that declares it plainly
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
            rank = len(vi.type.tensor_type.shape.dim)
            needs: list[str] = []
            v: int | None = None
            if name and _NAME.match(name):
                v = value_of(name, i, rank)
                if v is None:
                    where.setdefault(name, (vi.name, i))
                    needs = [name]
            elif name:
                needs = [n for n in _names_in(name) if value_of(n) is None]
                if not needs:
                    try:
                        v = _eval(name, value_of)
                    except (KeyError, TypeError, ZeroDivisionError, OverflowError, RecursionError):
                        v = None
            else:
                v = default_dim("", i, batch, seq, rank)
            if needs:  # said with every other unbound name once all inputs are read
                if new := [n for n in needs if n not in unbound]:
                    unbound.update(dict.fromkeys(new))
                    places.append((vi.name, i, name, [] if new == [name] else new))
                continue
            if v is None:
                raise DimError(f"input {vi.name!r}: cannot bind dimension {i} ({name or '?'}); pass the input's "
                               f"array with --inputs (Python: input_shapes=)", vi.name)
            if v <= 0:
                raise DimError(f"input {vi.name!r}: dimension {i} ({name}) is {v}; a graph input's dimensions must be "
                               f"positive")
            shape.append(int(v))
        out[vi.name] = tuple(shape)
    if places:
        what = _unbound_message(places)
        names = list(unbound)
        one_array = len({p[0] for p in places}) == 1 and not any(p[3] for p in places)
        arrays = "the input's array" if one_array else "the inputs"
        raise DimError(f"{what}; {dims_remedy(names, arrays)}", places[0][0], names,
                       {n: where[n] for n in names if n in where}, what)
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


__all__ = ["DimError", "UnknownDimError", "bind_input_shapes", "check_dim_names", "default_dim", "dim_roles",
           "dims_remedy", "onnx_input_shapes", "parse_dim", "parse_onnx", "proto_input_shapes"]
