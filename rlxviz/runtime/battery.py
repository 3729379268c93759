"""The input battery: the inputs every equivalence check runs a graph version on.

A version that equals the unfused graph on seeded random inputs can still differ on the inputs real
batches contain. `battery(graph, base)` derives, from one set of base feeds, the named input sets
below; each applies only when the graph has what it changes (a mask input, a float input), and the
ones that do not apply are listed in `Battery.skipped` with the reason.

| name | what it changes |
|---|---|
| `random` | the base feeds (seeded random; BERT masks pad at the end) |
| `fully_masked_row` | the last batch row's mask is all zeros (an empty / all-padding sequence) |
| `left_padding` | each row's padding at the start (row r: r+1 positions, at most seq-1) |
| `holes` | mask zeros in the middle of every row (every third position after the first) |
| `single_token` | one visible token per row (position 0) |
| `large_magnitude` | float inputs uniform in [-300, 300] (squares overflow float16) |
| `constant_rows` | float inputs constant along the last axis (LayerNorm variance 0) |

A mask input is an input of rank 2 whose name contains `mask` (any dtype; its values are 0/1). User arrays
(`load_inputs`, `.npz`) are checked against the graph's inputs by name, shape and dtype kind.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..ir import Graph, Node

KINDS = ("random", "fully_masked_row", "left_padding", "holes", "single_token", "large_magnitude",
         "constant_rows")
"""Every battery input set, in the order they run."""

DESCRIPTIONS = {
    "random": "seeded random inputs",
    "fully_masked_row": "the last row's mask all zeros",
    "left_padding": "padding at the start of each row",
    "holes": "mask zeros in the middle of each row",
    "single_token": "one visible token per row",
    "large_magnitude": "float inputs in [-300, 300]",
    "constant_rows": "float inputs constant along the last axis",
}


@dataclass(frozen=True)
class InputSet:
    """One named set of graph inputs.

    Attributes:
        name: a battery kind (`KINDS`) or `user` for the user's arrays.
        what: one line saying what is special about it.
        feeds: input name -> array (the graph's shapes).
    """

    name: str
    what: str
    feeds: dict[str, np.ndarray] = field(repr=False)


@dataclass(frozen=True)
class Battery:
    """The input sets a check runs (`sets`) and the kinds left out, with why (`skipped`)."""

    sets: tuple[InputSet, ...]
    skipped: tuple[tuple[str, str], ...] = ()

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sets]

    def describe(self) -> str:
        """One line: which inputs ran and which did not apply."""
        text = "inputs: " + ", ".join(self.names)
        if self.skipped:
            text += "; not applicable: " + ", ".join(f"{k} ({why})" for k, why in self.skipped)
        return text


def mask_inputs(graph: Graph) -> list[Node]:
    """Inputs that are padding masks `[batch, seq]` (1 = token, 0 = padding): rank 2, a name containing `mask`."""
    return [n for n in graph.inputs if n.rank == 2 and "mask" in n.attrs["name"].lower()]


def float_inputs(graph: Graph) -> list[Node]:
    """Float-typed graph inputs that are not masks."""
    masks = {n.id for n in mask_inputs(graph)}
    return [n for n in graph.inputs if n.dtype.is_float and n.id not in masks]


def _masks(kind: str, shape: tuple[int, ...]) -> np.ndarray:
    b, s = shape
    m = np.ones((b, s), np.int64)
    if kind == "fully_masked_row":
        m[b - 1] = 0
    elif kind == "left_padding":
        for r in range(b):
            m[r, :min(r + 1, s - 1)] = 0
    elif kind == "holes":
        m[:, 1::3] = 0
        m[:, 0] = 1
    elif kind == "single_token":
        m[:, 1:] = 0
    return m


_MASK_KINDS = ("fully_masked_row", "left_padding", "holes", "single_token")
_FLOAT_KINDS: dict[str, Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]] = {
    "large_magnitude": lambda rng, shape: rng.uniform(-300.0, 300.0, size=shape),
    "constant_rows": lambda rng, shape: np.broadcast_to(rng.standard_normal((*shape[:-1], 1)), shape).copy(),
}


def battery(graph: Graph, base: Mapping[str, np.ndarray], seed: int = 0,
            kinds: tuple[str, ...] = KINDS) -> Battery:
    """The battery of input sets for `graph`, derived from the base feeds `base`.

    Args:
        graph: the unfused graph (its inputs decide which kinds apply).
        base: one complete set of feeds (e.g. `Model.random_feeds(seed)`), used as `random` and as
            the unchanged inputs of every other set.
        kinds: which kinds to build (default: all of `KINDS`).

    Raises:
        ValueError: an unknown kind.
    """
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"unknown input kind(s) {', '.join(bad)}; known: {', '.join(KINDS)}")
    rng = np.random.default_rng(seed)
    masks, floats = mask_inputs(graph), float_inputs(graph)
    sets: list[InputSet] = []
    skipped: list[tuple[str, str]] = []
    for kind in kinds:
        feeds = {k: np.asarray(v) for k, v in base.items()}
        if kind in _MASK_KINDS:
            if not masks:
                skipped.append((kind, "no mask input"))
                continue
            for n in masks:
                feeds[n.attrs["name"]] = _masks(kind, n.shape).astype(n.dtype.numpy)
        elif kind in _FLOAT_KINDS:
            if not floats:
                skipped.append((kind, "no float input"))
                continue
            for n in floats:
                feeds[n.attrs["name"]] = _FLOAT_KINDS[kind](rng, n.shape).astype(n.dtype.numpy)
        sets.append(InputSet(kind, DESCRIPTIONS[kind], feeds))
    return Battery(tuple(sets), tuple(skipped))


def load_inputs(path: str | Path | bytes, graph: Graph, name: str | None = None) -> InputSet:
    """The user's arrays from an `.npz` file (a path, or its bytes: an upload), checked against the graph's inputs.

    Returns:
        `InputSet("user", ...)` with one array per graph input, in the input's dtype.

    Raises:
        ValueError: not a readable `.npz`, an input missing, an unknown name, a shape or dtype kind
            that differs (one line, naming the input and both values).
    """
    data = isinstance(path, bytes)
    p = Path(name or "upload.npz") if data else Path(path)
    what = f"inputs {p.name}"
    names = {n.attrs["name"]: n for n in graph.inputs}
    try:
        if data:
            head, source = path[:4], io.BytesIO(path)
        else:
            with p.open("rb") as f:
                head, source = f.read(4), p
        if head != b"PK\x03\x04":  # not a zip: refuse before NumPy reads a whole .npy into memory
            raise ValueError("not a zip archive")
        with np.load(source, allow_pickle=False) as z:
            extra = sorted(set(z.files) - set(names))
            if extra:
                raise KeyError(f"unknown input(s) {', '.join(extra)}; the graph takes {', '.join(names)}")
            for k in z.files:  # shapes from the headers, before any array is read into memory
                with z.zip.open(k + ".npy") as f:
                    version = np.lib.format.read_magic(f)
                    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                            else np.lib.format.read_array_header_2_0)
                    shape, _, _ = read(f)
                if tuple(shape) != names[k].shape:
                    raise KeyError(f"input {k!r} has shape {list(shape)}, the graph needs {list(names[k].shape)}")
            arrays = {k: np.asarray(z[k]) for k in z.files}
    except KeyError as e:
        raise ValueError(f"{what}: {e.args[0]}") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{p}: not a readable .npz file of arrays ({why})") from None
    return check_inputs(arrays, graph, what)


def check_inputs(arrays: Mapping[str, np.ndarray], graph: Graph, what: str = "user inputs") -> InputSet:
    """`arrays` as an `InputSet("user")` after checking names, shapes and dtype kinds (see `load_inputs`)."""
    names = {n.attrs["name"]: n for n in graph.inputs}
    extra = sorted(set(arrays) - set(names))
    if extra:
        raise ValueError(f"{what}: unknown input(s) {', '.join(extra)}; the graph takes {', '.join(names)}")
    feeds: dict[str, np.ndarray] = {}
    for name, n in names.items():
        if name not in arrays:
            raise ValueError(f"{what}: no array for input {name!r} ({n.type})")
        a = arrays[name]
        if tuple(a.shape) != n.shape:
            raise ValueError(f"{what}: input {name!r} has shape {list(a.shape)}, the graph needs {list(n.shape)}")
        if a.dtype.kind not in "biuf" or (a.dtype.kind == "f") != n.dtype.is_float:
            raise ValueError(f"{what}: input {name!r} is {a.dtype}, the graph needs {n.dtype}")
        feeds[name] = a.astype(n.dtype.numpy)
    return InputSet("user", what, feeds)


__all__ = ["DESCRIPTIONS", "KINDS", "Battery", "InputSet", "battery", "check_inputs", "float_inputs",
           "load_inputs", "mask_inputs"]
