"""Weights of an ONNX file left in their external-data file until something needs their values.

The graph, the passes and `explain`'s verdicts need no weight matrix: only shapes and dtypes (from the file) and
the small constants the import folds and the passes read (shape tensors, scales, masks, RoPE `inv_freq`, norm
weights). So `models.onnx.load_onnx` reads external data by size:

* an external initializer of at most `LAZY_ELEMENTS` elements is read at load (bounded: at most that many
  elements each, and they count against the memory limit), and the import treats it as it always did;
* a larger one stays in its file: the import makes it a `param` node at its first use (named and placed as an
  eager import names and places it), and the model's weights are a `LazyWeights` mapping that reads it from the
  file on first access (`run`, `time`, the ONNX Runtime check) and keeps it.

`explain`, `render`, `ir` and `export --json` never index such a weight, so an 8B-shaped export (15 GB of
weights) is explained without reading them; the memory limit's `load` check does not count them
(`lazy_names`), while `run`/`time` count every weight (they read them all).

Exactness: a lazily bound weight is the same array the eager import would hold (same bytes, dtype and shape, the
same param name), except that the import no longer folds an op whose only operands are such weights (it becomes an
IR node computing the same values) nor drops an `x + 0` whose zero is one (the add stays; the numbers are equal).

Every byte read from an external-data file goes through `read_bytes` (tests replace it to count what is read).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

LAZY_ELEMENTS = 1 << 16
"""External initializers with more elements than this (64 Ki: a 256 x 256 matrix) are left in their file until
their values are needed; smaller ones (norm weights, biases, `inv_freq`, shape tensors) are read at load."""


class ExternalDataError(ValueError):
    """An external-data entry that cannot be read: a location outside the model's folder, a missing file, a
    short read. The message names the initializer."""


def read_bytes(path: Path, offset: int, length: int) -> bytes:
    """`length` bytes of `path` from `offset`. Raises ExternalDataError on a short read, OSError if unreadable."""
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(length)
    if len(data) != length:
        raise ExternalDataError(f"{path.name}: {len(data)} of {length} bytes at offset {offset}")
    return data


@dataclass(frozen=True)
class ExternalTensor:
    """One initializer left in its external-data file.

    Attributes:
        name: the initializer's ONNX name.
        file: the data file (inside the model's folder).
        offset, length: where its bytes are (length = elements x itemsize, checked at load).
        data_type: its ONNX element type code.
        stored: its dims in the file.
        perm: a transpose applied on reading (a `Transpose` node of the file over the weight), or None.
    """

    name: str
    file: Path
    offset: int
    length: int
    data_type: int
    stored: tuple[int, ...]
    perm: tuple[int, ...] | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        """Its dims as the graph reads it (`stored`, permuted by `perm`)."""
        return self.stored if self.perm is None else tuple(self.stored[i] for i in self.perm)

    @property
    def size(self) -> int:
        """Elements."""
        return math.prod(self.stored)

    @property
    def nbytes(self) -> int:
        return self.length

    def load(self) -> np.ndarray:
        """Its values, read through `read_bytes`, converted as `onnx.numpy_helper.to_array` converts them (and
        transposed by `perm` into a contiguous array)."""
        from onnx import TensorProto, helper, numpy_helper

        raw = read_bytes(self.file, self.offset, self.length)
        if self.data_type in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT32,
                              TensorProto.INT64, TensorProto.INT8, TensorProto.UINT8, TensorProto.BOOL):
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(self.data_type)).newbyteorder("<")
            arr = np.frombuffer(raw, dtype=dtype).reshape(self.stored).astype(dtype.newbyteorder("="), copy=False)
        else:
            arr = numpy_helper.to_array(TensorProto(name=self.name, data_type=self.data_type, dims=list(self.stored),
                                                    raw_data=raw))
        return arr if self.perm is None else np.ascontiguousarray(arr.transpose(self.perm))


def _external_info(t: Any, folder: Path) -> tuple[Path, int, int]:
    """(file, offset, length) of an external initializer (length set by `read._bound_external_data`).
    Raises ExternalDataError for a location outside `folder` or a missing file."""
    from onnx import helper

    info = {e.key: e.value for e in t.external_data}
    where = info.get("location", "")
    f = (folder / where).resolve()
    if not where or not f.is_relative_to(folder.resolve()):
        raise ExternalDataError(f"initializer {t.name!r}: external data location {where!r} is outside the model's "
                                f"folder")
    if not f.is_file():
        raise ExternalDataError(f"initializer {t.name!r}: external data file {where!r} does not exist")
    need = math.prod(t.dims) * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    length = int(info.get("length") or need)
    return f, int(info.get("offset", 0) or 0), length


def split_external(proto: Any, folder: Path, lazy_elements: int | None = LAZY_ELEMENTS) -> dict[str, ExternalTensor]:
    """Read the small external initializers of `proto` into it (as `raw_data`, so the import sees ordinary
    tensors) and return the large ones, left external, by name. `lazy_elements` None reads every one (the eager
    import). Every read goes through `read_bytes`.

    Raises:
        ExternalDataError: a location outside `folder`, a missing file, a short read.
    """
    from onnx import TensorProto

    left: dict[str, ExternalTensor] = {}
    for t in proto.graph.initializer:
        if t.data_location != TensorProto.EXTERNAL:
            continue
        f, offset, length = _external_info(t, folder)
        if lazy_elements is not None and math.prod(t.dims) > lazy_elements:
            left[t.name] = ExternalTensor(t.name, f, offset, length, int(t.data_type),
                                          tuple(int(d) for d in t.dims))
            continue
        t.raw_data = read_bytes(f, offset, length)
        del t.external_data[:]
        t.data_location = TensorProto.DEFAULT
    return left


def eager_bytes(proto: Any, external: Mapping[str, ExternalTensor] | frozenset[str] | set[str]) -> int:
    """Bytes of the initializers the import holds in memory: all but the ones in `external` (declared sizes)."""
    from onnx import helper

    return sum(math.prod(t.dims) * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
               for t in proto.graph.initializer if t.name not in external)


def externals_as_inputs(proto: Any) -> None:
    """Turn the initializers of `proto` still in an external-data file into graph inputs of the same type and shape,
    CHANGING `proto` (call it on a copy): `onnx.checker` looks for external data relative to the working directory
    when given a model in memory, and its structural checks need only the values' types (where the data lies is
    checked by `split_external`)."""
    from onnx import TensorProto, helper

    kept = [t for t in proto.graph.initializer if t.data_location != TensorProto.EXTERNAL]
    moved = [t for t in proto.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    if not moved:
        return
    declared = {vi.name for vi in proto.graph.input}
    proto.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in moved
                             if t.name not in declared)
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(kept)


class LazyWeights(Mapping[str, np.ndarray]):
    """Param name -> array, where the arrays of `pending` are read from their file on first access and kept.

    Iteration lists every name (in memory first, then the pending ones); `len` counts both; `items()`/`values()`
    read every pending array (what `run` needs). `in_memory()` gives what is held without reading anything.
    """

    def __init__(self, loaded: MutableMapping[str, np.ndarray], pending: Mapping[str, ExternalTensor]) -> None:
        self._loaded: dict[str, np.ndarray] = dict(loaded)
        self._pending: dict[str, ExternalTensor] = dict(pending)
        self._sources: dict[str, ExternalTensor] = dict(pending)
        self._lazy = frozenset(pending)

    def __getitem__(self, key: str) -> np.ndarray:
        hit = self._loaded.get(key)
        if hit is not None:
            return hit
        t = self._pending.pop(key)  # KeyError for an unknown name, as a dict
        arr = self._loaded[key] = t.load()
        return arr

    def __iter__(self) -> Iterator[str]:
        yield from list(self._loaded)
        yield from [k for k in list(self._pending) if k not in self._loaded]

    def __len__(self) -> int:
        return len(self._loaded) + len(self._pending)

    def __contains__(self, key: object) -> bool:
        return key in self._loaded or key in self._pending

    @property
    def lazy(self) -> frozenset[str]:
        """The names that were left in their file at load (read since or not)."""
        return self._lazy

    def pending_bytes(self) -> int:
        """Bytes not read yet."""
        return sum(t.nbytes for t in self._pending.values())

    def lazy_bytes(self) -> int:
        """Bytes of every weight left in its file at load (read since or not), from declared shapes."""
        return self.pending_bytes() + sum(self._loaded[k].nbytes for k in self._lazy if k in self._loaded)

    def in_memory(self) -> dict[str, np.ndarray]:
        """The arrays held now (nothing is read)."""
        return dict(self._loaded)

    def share_host(self, key: str, current: np.ndarray, view: np.ndarray) -> bool:
        """Hold `view` (a read-only NumPy view of the same values in another runtime's memory: the MLX CPU copy)
        in place of the array read from the file, so the values are in memory once, not twice (an 8B slice's
        weights: 3.9 GB). Only for a weight read from its file that is still `current`, with the same shape and
        dtype. Returns whether it was taken."""
        if key not in self._lazy or self._loaded.get(key) is not current or view.shape != current.shape \
                or view.dtype != current.dtype:
            return False
        view.flags.writeable = False
        self._loaded[key] = view
        return True

    def source(self, key: str) -> ExternalTensor | None:
        """Where a weight left in its file at load is read from (read since or not); None for the others."""
        return self._sources.get(key)

    def shape_dtype(self, key: str) -> tuple[tuple[int, ...], Any]:
        """(shape, numpy dtype) of a weight without reading it."""
        if key in self._loaded:
            a = self._loaded[key]
            return tuple(a.shape), a.dtype
        from onnx import helper

        t = self._pending[key]
        return t.shape, np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))


def lazy_names(weights: Mapping[str, np.ndarray]) -> frozenset[str]:
    """The weights of `weights` left in their file at load (empty for an ordinary dict)."""
    return weights.lazy if isinstance(weights, LazyWeights) else frozenset()


def in_memory(weights: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
    """The arrays of `weights` held now, reading nothing (`weights` itself for an ordinary dict)."""
    return weights.in_memory() if isinstance(weights, LazyWeights) else weights


ON_DEMAND_OPS = frozenset({"Gather", "GatherElements", "GatherND", "Slice"})
"""Ops that select part of their data operand: a weight left in its file that one of them reads with constant
indices (a RoPE `cos_cached` table gathered at the bound positions, a position table sliced to `seq`) is read
then, so the import folds the selection into the small constant the passes read, as an eager import does."""

ON_DEMAND_ELEMENTS = 1 << 22
"""The most elements (16 MiB at f32) a table read on demand may have; a larger one stays a param (the selection
becomes an IR node computing the same values)."""


def read_on_demand(pending: dict[str, ExternalTensor], node: Any, env: dict[str, Any]) -> np.ndarray | None:
    """When `node` selects from a weight still pending in its file (`ON_DEMAND_OPS`, data operand first) with every
    other operand a constant, read the weight (at most `ON_DEMAND_ELEMENTS`), put it in `env` under its name, and
    return it (the caller counts its bytes); else None, reading nothing."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in ON_DEMAND_OPS or not node.input:
        return None
    name = node.input[0]
    t = pending.get(name)
    if t is None or name in env or t.size > ON_DEMAND_ELEMENTS:
        return None
    if any(i and not isinstance(env.get(i), np.ndarray) for i in node.input[1:]):
        return None  # indices or bounds computed at run time: the selection is an IR node on a param
    arr = env[name] = t.load()
    return arr


def transposed_view(pending: dict[str, ExternalTensor], node: Any, env: Mapping[str, Any]) -> bool:
    """When `node` is a default-domain `Transpose` of a weight still pending in its file (torch's `[out, in]`
    linear weight, which the dynamo exporter without its optimizer transposes in the graph), record its output
    as a pending view of the same bytes read transposed, and return True (the node is then not imported: an eager
    import folds it into a param the same way). Else False. Reads nothing."""
    if node.domain not in ("", "ai.onnx") or node.op_type != "Transpose" or len(node.input) != 1 \
            or len(node.output) != 1 or not node.output[0]:
        return False
    t = pending.get(node.input[0])
    if t is None or node.input[0] in env or t.perm is not None:
        return False
    perm = next((tuple(int(i) for i in a.ints) for a in node.attribute if a.name == "perm"), None)
    rank = len(t.stored)
    perm = perm if perm is not None else tuple(reversed(range(rank)))
    if sorted(perm) != list(range(rank)):
        return False  # an invalid perm: the import's handler reports it
    pending[node.output[0]] = ExternalTensor(node.output[0], t.file, t.offset, t.length, t.data_type, t.stored, perm)
    return True


def bind_external(pending: dict[str, ExternalTensor], names: Any, env: dict[str, Any],
                  make_param: Callable[[ExternalTensor], Any]) -> None:
    """Make each of `names` that is a pending external initializer a param (`make_param`, which the import
    names and places under the node being imported) in `env`, once; reads nothing."""
    for name in names:
        if name and name in pending and name not in env:
            env[name] = make_param(pending[name])


__all__ = ["LAZY_ELEMENTS", "ExternalDataError", "ExternalTensor", "LazyWeights", "bind_external", "eager_bytes",
           "externals_as_inputs", "in_memory", "lazy_names", "read_bytes", "read_on_demand", "split_external",
           "transposed_view"]
