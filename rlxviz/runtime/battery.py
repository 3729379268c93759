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

A mask input is an input of rank 2 or more whose name contains `mask` (`[batch, seq]`, `[batch, 1, 1, seq]`,
`[batch, heads, q, k]`, `[q, k]`). Its form (`mask_form`) decides its values: `bool` (True = keep), `keep` (an
integer or float 0/1 keep mask) or `additive` (a float mask the graph adds to the scores: 0 = keep, the dtype's
lowest finite value = masked). A mask set writes its pattern along the first axis (the row: batch, or the query
of a `[q, k]` mask) and the last axis (the key), the same at every other index. A set that cannot apply to an
input (`constant_rows` on a 0-d input) leaves that input at its base value; a set that applies to no input is
skipped with the reason. User arrays (`load_inputs`, `.npz`) are checked against the graph's inputs by name,
shape and dtype kind.
"""

from __future__ import annotations

import io
import math
import zipfile
from collections.abc import Callable, Collection, Container, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..ir import DType, Graph, Node, Op

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
    expected: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    """Outputs the user already has for these inputs (npz members `out:NAME`, e.g. an exporter's own outputs),
    by output name; compared with what the model computes (`session.fidelity`)."""


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
    """Inputs that are attention masks: rank 2 or more, a name containing `mask` (`Node.is_mask_input`; see
    `mask_form`)."""
    return [n for n in graph.inputs if n.is_mask_input]


_MASK_PASSTHROUGH = (Op.RESHAPE, Op.EXPAND, Op.TRANSPOSE, Op.NARROW, Op.CONCAT)
"""Data movement: the mask's values reach the next op unchanged."""


def mask_form(graph: Graph, node: Node) -> str:
    """`bool`, `keep` or `additive`: how the mask input `node` holds "masked".

    bool dtype: `bool` (True = keep); integer: `keep` (1 = keep, 0 = masked); float: `additive` when its values
    reach an `add` through data movement and float casts alone (the graph adds it to the scores: 0 = keep, a
    large negative value = masked), else `keep` (a 0/1 mask the graph turns into a bias itself, HF's
    `(1 - m) * min`)."""
    if node.dtype == DType.bool:
        return "bool"
    if not node.dtype.is_float:
        return "keep"
    seen, todo = {node.id}, [node.id]
    while todo:
        for u in graph.users(todo.pop()):
            if u.op == Op.ADD:
                return "additive"
            if (u.op in _MASK_PASSTHROUGH or (u.op == Op.CAST and u.dtype.is_float)) and u.id not in seen:
                seen.add(u.id)
                todo.append(u.id)
    return "keep"


def float_inputs(graph: Graph) -> list[Node]:
    """Float-typed graph inputs that are not masks."""
    masks = {n.id for n in mask_inputs(graph)}
    return [n for n in graph.inputs if n.dtype.is_float and n.id not in masks]


def _masks(kind: str, shape: tuple[int, ...]) -> np.ndarray:
    """The keep pattern (True = keep) of a mask set on `shape`: rows along axis 0, keys along the last axis."""
    b, s = shape[0], shape[-1]
    m = np.ones((b, s), bool)
    if kind == "fully_masked_row":
        m[b - 1] = False
    elif kind == "left_padding":
        for r in range(b):
            m[r, :min(r + 1, s - 1)] = False
    elif kind == "holes":
        m[:, 1::3] = False
        m[:, 0] = True
    elif kind == "single_token":
        m[:, 1:] = False
    return np.broadcast_to(m.reshape((b,) + (1,) * (len(shape) - 2) + (s,)), shape)


def mask_values(keep: np.ndarray, form: str, dtype: np.dtype) -> np.ndarray:
    """A keep pattern (True = keep) as a mask input of `form` (`mask_form`) in `dtype`: bool as is, `keep` 1/0,
    `additive` 0 / the dtype's lowest finite value (HF's `finfo.min`)."""
    if form == "additive":
        return np.where(keep, 0.0, np.finfo(dtype).min).astype(dtype)
    return np.ascontiguousarray(keep).astype(dtype)


def _constant_rows(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return np.broadcast_to(rng.standard_normal((*shape[:-1], 1)), shape).copy()


_MASK_KINDS = ("fully_masked_row", "left_padding", "holes", "single_token")
_FLOAT_KINDS: dict[str, Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]] = {
    "large_magnitude": lambda rng, shape: rng.uniform(-300.0, 300.0, size=shape),
    "constant_rows": _constant_rows,
}
_FLOAT_MIN_RANK = {"large_magnitude": 0, "constant_rows": 1}
"""The least rank an input needs for a float kind to apply to it (constant along the last axis needs one)."""


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
                feeds[n.attrs["name"]] = mask_values(_masks(kind, n.shape), mask_form(graph, n), n.dtype.numpy)
        elif kind in _FLOAT_KINDS:
            fit = [n for n in floats if n.rank >= _FLOAT_MIN_RANK[kind]]
            if not fit:
                skipped.append((kind, "no float input" if not floats else
                                f"no float input of rank {_FLOAT_MIN_RANK[kind]} or more"))
                continue
            for n in fit:
                feeds[n.attrs["name"]] = _FLOAT_KINDS[kind](rng, n.shape).astype(n.dtype.numpy)
        sets.append(InputSet(kind, DESCRIPTIONS[kind], feeds))
    return Battery(tuple(sets), tuple(skipped))


NpzSource = str | Path | bytes
"""An `.npz` file: a path, or its bytes (an upload)."""


def _npz_name(path: NpzSource, name: str | None) -> Path:
    return Path(name or "upload.npz") if isinstance(path, bytes) else Path(path)


def _open_npz(path: NpzSource, name: str | None = None) -> tuple[Path, np.lib.npyio.NpzFile]:
    """`(shown path, open NpzFile)` after checking that `path` is a zip archive (not a lone `.npy`, not text).

    Raises:
        ValueError: `{path}: not a readable .npz file of arrays (why)`, one line.
    """
    p = _npz_name(path, name)
    try:
        if isinstance(path, bytes):
            head, source = path[:4], io.BytesIO(path)
        else:
            if not p.exists():
                raise ValueError("no such file")
            if not p.is_file():
                raise ValueError("not a file")
            with p.open("rb") as f:
                head, source = f.read(4), p
        if head == b"\x93NUM":
            raise ValueError("a single .npy array; save named arrays with numpy.savez")
        if head != b"PK\x03\x04":  # not a zip: refuse before NumPy reads a whole .npy into memory
            raise ValueError("not a zip archive; save named arrays with numpy.savez")
        if not isinstance(source, io.BytesIO):  # a truncated archive: refused here, where the file is closed
            with zipfile.ZipFile(source):      # (np.load would leave its handle open: a ResourceWarning line)
                pass
        return p, np.load(source, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        why = (e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0] if str(e)
               else type(e).__name__)
        raise ValueError(f"{p}: not a readable .npz file of arrays ({why})") from None


def _member(z: np.lib.npyio.NpzFile, key: str, names: Container[str] | None = None) -> str:
    """The zip member holding array `key` (`key.npy`, or `key` itself); `names`: the archive's member names
    as a set, made once by a caller that looks up many keys (a list scan per key was quadratic: 52 s for
    50,000 members)."""
    names = set(z.zip.namelist()) if names is None else names
    return key + ".npy" if key + ".npy" in names else key


def npz_headers(path: NpzSource, name: str | None = None) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Every array's `(shape, dtype)` in an `.npz`, read from the `.npy` headers alone: no array data is
    decompressed, so a deflate bomb or a header claiming a huge shape costs nothing. Object (pickled)
    arrays are refused here.

    Raises:
        ValueError: not a readable `.npz` of arrays (one line naming the file and why).
    """
    p, z = _open_npz(path, name)
    out: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    try:
        with z:
            names = set(z.zip.namelist())
            for k in z.files:
                try:
                    with z.zip.open(_member(z, k, names)) as f:
                        version = np.lib.format.read_magic(f)
                        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                                else np.lib.format.read_array_header_2_0)
                        shape, _, dtype = read(f)
                except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:
                    why = str(e).splitlines()[0] if str(e) else type(e).__name__
                    raise ValueError(f"array {k[:100]!r}: {why}") from None
                if dtype.hasobject:
                    raise ValueError(f"array {k!r} holds Python objects (pickled); save numeric arrays")
                out[k] = (tuple(int(d) for d in shape), dtype)
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{p}: not a readable .npz file of arrays ({why})") from None
    return out


EXPECTED_PREFIX = "out:"
"""Arrays of an inputs `.npz` named `out:NAME` are expected outputs (the exporters' `*_io.npz` files keep the
reference output beside the inputs, e.g. `out:last_hidden_state`): `load_inputs` sets them aside in
`InputSet.expected`, for `session.fidelity` to compare with the model's output NAME."""


def _check_expected_sizes(found: Mapping[str, tuple[tuple[int, ...], np.dtype]], graph: Graph, what: str) -> None:
    """Expected outputs are read to be compared, so each is bounded first, from its header: no larger than the
    graph's largest output. Raises ValueError (one line) naming the array."""
    largest = max((math.prod(graph[o].shape) * np.dtype(graph[o].dtype.numpy).itemsize for o in graph.outputs),
                  default=0)
    for k, (shape, dtype) in found.items():
        if math.prod(shape) * dtype.itemsize > largest:
            raise ValueError(f"{what}: {k} has shape {list(shape)}, larger than every output of the graph")


def load_expected(path: NpzSource, graph: Graph, name: str | None = None) -> dict[str, np.ndarray]:
    """The expected outputs in an `.npz` (`rlxviz run/time --expect`): each array by output name (an `out:` prefix
    dropped), bounded from its header (`_check_expected_sizes`) before any is read.

    Raises:
        ValueError: not a readable `.npz` of arrays, or an array larger than every output (one line).
    """
    p = _npz_name(path, name)
    _check_expected_sizes(npz_headers(path, name), graph, f"expected outputs {p.name}")
    _, z = _open_npz(path, name)
    try:
        with z:
            return {k.removeprefix(EXPECTED_PREFIX): np.asarray(z[k]) for k in z.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{p}: not a readable .npz file of arrays ({why})") from None


def load_inputs(path: NpzSource, graph: Graph, name: str | None = None, aside: Collection[str] = ()) -> InputSet:
    """The user's arrays from an `.npz` file (a path, or its bytes: an upload), checked against the graph's
    inputs: names, shapes and dtype kinds from the headers (`npz_headers`) before any array is read, then
    the values (`check_inputs`). Arrays named `out:NAME` (expected outputs, `EXPECTED_PREFIX`) are set aside in
    `InputSet.expected`, each no larger than the graph's largest output (checked from its header). The one loader
    of user inputs: `rlxviz run`, `rlxviz time --inputs` and the app's uploads call it. `aside`: output names whose
    `out:NAME` arrays are left unread and unchecked (`--layers`: the whole model's outputs, which the slice lacks).

    Returns:
        `InputSet("user", ...)` with one array per graph input, in the input's dtype.

    Raises:
        ValueError: not a readable `.npz`, an input missing, an unknown name, a shape or dtype kind
            that differs, or values out of range (`check_inputs`); one line, naming the input and both values.
    """
    p = _npz_name(path, name)
    what = f"inputs {p.name}"
    skipped = {EXPECTED_PREFIX + k for k in aside}
    headers = {k: h for k, h in npz_headers(path, name).items() if k not in skipped}
    _check_kinds({k: h for k, h in headers.items() if not k.startswith(EXPECTED_PREFIX)}, graph, what)  # unread yet
    _check_expected_sizes({k: h for k, h in headers.items() if k.startswith(EXPECTED_PREFIX)}, graph, what)
    _, z = _open_npz(path, name)
    try:
        with z:
            arrays = {k: np.asarray(z[k]) for k in z.files if k not in skipped}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{p}: not a readable .npz file of arrays ({why})") from None
    expected = {k[len(EXPECTED_PREFIX):]: arrays.pop(k) for k in list(arrays) if k.startswith(EXPECTED_PREFIX)}
    checked = check_inputs(arrays, graph, what)
    return InputSet(checked.name, checked.what, checked.feeds, expected)


def _check_kinds(found: Mapping[str, tuple[tuple[int, ...], np.dtype]], graph: Graph, what: str) -> None:
    """Names, shapes and dtype kinds of `found` (name -> (shape, dtype)) against the graph's inputs."""
    names = {n.attrs["name"]: n for n in graph.inputs}
    extra = sorted(set(found) - set(names))
    if extra:
        raise ValueError(f"{what}: unknown input(s) {', '.join(extra)}; the graph takes {', '.join(names)}")
    for name, n in names.items():
        if name not in found:
            raise ValueError(f"{what}: no array for input {name!r} ({n.type})")
        shape, dtype = found[name]
        if tuple(shape) != n.shape:
            raise ValueError(f"{what}: input {name!r} has shape {list(shape)}, the graph needs {list(n.shape)}")
        if dtype.kind not in "biuf" or (dtype.kind == "f") != n.dtype.is_float:
            raise ValueError(f"{what}: input {name!r} is {dtype}, the graph needs {n.dtype}")
        if dtype != n.dtype.numpy:
            raise ValueError(f"{what}: input {name!r} is {dtype}, the graph needs {n.dtype} ({n.dtype.numpy}): cast "
                             f"it first (numpy: a.astype(np.{n.dtype.numpy})); it is not converted silently")


_INDEX_PASSTHROUGH = (Op.RESHAPE, Op.EXPAND, Op.TRANSPOSE, Op.NARROW, Op.CAST)
"""Ops whose output holds (a selection of) their first operand's values: an index fed through them is still
the input's value."""


def index_bounds(graph: Graph) -> dict[str, list[tuple[int, str]]]:
    """Graph inputs whose values index a table: input name -> `(rows, what)` for every `gather` whose indices
    are that input (directly or through reshape/expand/transpose/narrow/an integer cast). The values must lie
    in `0..rows-1`: the MLX runtime does not check them (an index out of range reads outside the table)."""
    out: dict[str, list[tuple[int, str]]] = {}
    for node in graph:
        if node.op != Op.GATHER or len(node.inputs) != 2:
            continue
        table, src = graph.operands(node)
        while src.op in _INDEX_PASSTHROUGH and src.inputs and (src.op != Op.CAST or src.dtype.is_int):
            src = graph.operands(src)[0]
        if src.op != Op.INPUT or not table.shape:
            continue
        axis = int(node.attrs.get("axis", 0) or 0)
        rows = table.shape[axis] if -len(table.shape) <= axis < len(table.shape) else table.shape[0]
        label = (f"the rows of {table.attrs['name']!r}" if table.op == Op.PARAM and "name" in table.attrs
                 else f"the rows of %{table.id}")
        if "word_embeddings" in str(table.attrs.get("name", "")):
            label = "the vocabulary"
        out.setdefault(src.attrs["name"], []).append((int(rows), label))
    return out


def check_inputs(arrays: Mapping[str, np.ndarray], graph: Graph, what: str = "user inputs") -> InputSet:
    """`arrays` as an `InputSet("user")` after checking them against the graph's inputs: the one check of user
    inputs (`load_inputs` calls it after the headers; the notebooks call it on arrays).

    Checks names, shapes and dtype kinds (`_check_kinds`), then values: float inputs finite; keep and bool mask
    inputs (`mask_inputs`, `mask_form`) only 0 and 1, additive masks only 0 and negative values (-inf allowed);
    integer inputs that index a table (`index_bounds`: token ids into an
    embedding, any gather fed by an input) inside it.

    Raises:
        ValueError: one line naming the input, what it must hold and what it holds.
    """
    _check_kinds({k: (tuple(np.shape(a)), np.asarray(a).dtype) for k, a in arrays.items()}, graph, what)
    forms = {n.attrs["name"]: mask_form(graph, n) for n in mask_inputs(graph)}
    bounds = index_bounds(graph)
    feeds: dict[str, np.ndarray] = {}
    for n in graph.inputs:
        name = n.attrs["name"]
        a = np.asarray(arrays[name])
        if forms.get(name) == "additive":
            wrong = np.isnan(a) | (a > 0)
            if wrong.any():
                bad = a[wrong].flat[0]
                raise ValueError(f"{what}: input {name!r} is an additive mask and must hold 0 (keep) or negative "
                                 f"values (masked: -inf or a large negative number), got {bad}")
        elif n.dtype.is_float and a.dtype.kind == "f" and not np.isfinite(a).all():
            raise ValueError(f"{what}: input {name!r} must hold finite numbers (it holds NaN or infinity)")
        if forms.get(name) in ("keep", "bool") and a.size and not np.isin(a, (0, 1)).all():
            bad = a[~np.isin(a, (0, 1))].flat[0]
            raise ValueError(f"{what}: input {name!r} is a mask and must hold only 0 and 1, got {bad}")
        for rows, label in bounds.get(name, ()):
            if a.size and (a.min() < 0 or a.max() >= rows):
                raise ValueError(f"{what}: input {name!r} must lie in 0..{rows - 1} ({label}), got "
                                 f"{int(a.min())}..{int(a.max())}")
        feeds[name] = a.astype(n.dtype.numpy)
    return InputSet("user", what, feeds)


__all__ = ["DESCRIPTIONS", "KINDS", "Battery", "InputSet", "battery", "check_inputs", "float_inputs",
           "index_bounds", "load_inputs", "mask_form", "mask_inputs", "mask_values", "npz_headers"]
