"""The ONNX importer's handler context: what every op handler takes and may use, apart from the driver.

`_Ctx` (the builder, the opset, the weights and the node being read), `Value` (an ONNX value during import),
the handler registry (`HANDLERS`, filled by `@handles(op, domain=...)`), the import errors, and the small helpers
handlers share (`_const`, `_axis`, `_last_axis`, `_zeros_like_gamma`). The driver (`driver`) and the op
handler modules (`handlers.*`) import this module; it imports none of them,
so a handler module never imports the driver that calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...ir import Builder, DType
from ...ir.emitter import Ref
from ...ir.host_rules import ONNX_DTYPES
from ...ir.identity import IdentityMap

CONTRIB = "com.microsoft"


class OnnxImportError(ValueError):
    """An ONNX file that cannot be imported; the message names the file, op, node and opset."""


class UnsupportedForm(OnnxImportError):
    """A valid node in a form its handler does not map (GatherND with computed indices, ArgMax with
    select_last_index): the driver makes it an opaque host node when ONNX can type it, else reports this."""


def _onnx() -> Any:
    try:
        import onnx
    except ImportError:  # pragma: no cover - onnx is a dependency
        raise OnnxImportError("reading .onnx files needs the 'onnx' package (pip install onnx)") from None
    return onnx


def node_label(n: Any) -> str:
    """How a message names ONNX node `n`: `Expand node 'expand_3'`, or for a node with no name by its first output,
    `Expand node (unnamed, output 'y')` (an empty name, `''`, names nothing)."""
    label = repr(n.name) if n.name else f"(unnamed, output {n.output[0]!r})" if any(n.output) else "(unnamed)"
    return f"{n.op_type or '(no op type)'} node {label}"


Value = Ref | np.ndarray | None
"""An ONNX value during import: a node id (computed at run time), a constant array, or None (absent)."""


@dataclass
class _Ctx:
    b: Builder
    opset: int
    weights: dict[str, np.ndarray]
    node: Any = None
    materialized: IdentityMap[np.ndarray, Ref] = field(default_factory=IdentityMap)
    """The node made for each constant array (by identity: the map holds the array, so its id is never reused)."""
    names: set[str] = field(default_factory=set)
    value_names: IdentityMap[np.ndarray, str] = field(default_factory=IdentityMap)
    """The ONNX value name of each constant array (initializers, folded outputs)."""
    seq: int | None = None
    """The sequence length the inputs were bound to (`import_graph`'s `seq`, or dim 1 of a given input shape)."""
    max_bytes: int | None = None
    """The memory limit every folded constant is checked against before it is allocated (None: unchecked)."""
    held_bytes: int = 0
    """Bytes of NumPy constants held so far: the initializers and every folded output."""

    def fail(self, why: str, kind: type[OnnxImportError] = OnnxImportError) -> OnnxImportError:
        return kind(f"{node_label(self.node)} (opset {self.opset}): {why}")

    def unsupported(self, why: str) -> OnnxImportError:
        """`fail` for a valid form the handler does not map (`UnsupportedForm`: the host may run it)."""
        return self.fail(why, UnsupportedForm)

    def ref(self, v: Value, dtype: DType | None = None) -> Ref:
        """A node for `v`: constants of one element become `const`, larger ones a named param."""
        if isinstance(v, Ref):
            return v
        if v is None:
            raise self.fail("a required input is missing")
        hit = self.materialized.get(v)
        if hit is not None:
            return hit
        arr = np.asarray(v)
        dt = dtype or DType.from_numpy(arr.dtype)
        if arr.size == 1 and arr.ndim <= 1:
            x = arr.reshape(()).item()
            r = self.b.const(x, dt) if arr.ndim == 0 else self.b.const((x,), dt)
        else:
            base = self.value_names.get(v, "const")
            if "." not in base and self.b.path:  # an exporter's generated name (val_95): prefix the module path
                base = f"{self.b.path}.{base}"
            name = self._unique(base)
            self.weights[name] = arr
            r = self.b.param(name, arr.shape, dt)
        self.materialized[v] = r
        return r

    def _unique(self, base: str) -> str:
        name, k = base, 1
        while name in self.names:
            name, k = f"{base}.{k}", k + 1
        self.names.add(name)
        return name

    def shape(self, v: Value) -> tuple[int, ...]:
        return tuple(v.shape) if isinstance(v, np.ndarray) else self.b.shape_of(v)

    def dtype(self, v: Value) -> DType:
        if isinstance(v, np.ndarray):
            return DType.from_numpy(v.dtype)
        return self.b.dtype_of(v)


Handler = Callable[[_Ctx, Any, list[Value], dict[str, Any]], list[Value]]
HANDLERS: dict[tuple[str, str], Handler] = {}


def handles(*ops: str, domain: str = "") -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for op in ops:
            HANDLERS[(domain, op)] = fn
        return fn
    return register


def _const(v: Value) -> np.ndarray:
    return v if isinstance(v, np.ndarray) else None  # type: ignore[return-value]


def _axis(ctx: _Ctx, axis: int, rank: int, what: str = "axis") -> int:
    """`axis` in [0, rank) from ONNX's [-rank, rank - 1]; outside it, the node is refused (never wrapped to
    another axis)."""
    if not -rank <= axis < rank:
        raise ctx.fail(f"{what} {axis} is outside [-{rank}, {rank - 1}] for a rank-{rank} operand")
    return axis % rank


def _last_axis(ctx: _Ctx, v: Value, axis: int) -> None:
    r = len(ctx.shape(v))
    if _axis(ctx, axis, r) != r - 1:
        raise ctx.unsupported(f"normalisation over axis {axis} of rank {r}: only the last axis is supported")


def _zeros_like_gamma(ctx: _Ctx, g: Value) -> Ref:
    shape = ctx.shape(g)
    return ctx.ref(np.zeros(shape, dtype=ctx.dtype(g).numpy))


_DTYPES = ONNX_DTYPES
"""ONNX TensorProto element type -> DType."""


def onnx_dtype(code: int) -> DType:
    """DType of an ONNX element type code. Raises OnnxImportError for types the IR lacks."""
    if code not in _DTYPES:
        name = dtype_name(code)
        raise OnnxImportError(f"element type {name} has no IR dtype (supported: float, float16, bfloat16, "
                              f"double, int8, uint8, int32, int64, bool)")
    return _DTYPES[code]


def dtype_name(code: int) -> str:
    """An ONNX element type code in words: `COMPLEX64`, or `999 (no ONNX data type)`."""
    try:
        return _onnx().TensorProto.DataType.Name(code)
    except ValueError:
        return f"{code} (no ONNX data type)"


def _ints(ctx: _Ctx, v: Value, what: str) -> list[int]:
    if not isinstance(v, np.ndarray):
        raise ctx.fail(f"{what} must be a constant once batch and seq are bound (it depends on a model input)")
    return [int(x) for x in np.asarray(v).reshape(-1)]


__all__ = ["CONTRIB", "HANDLERS", "Handler", "OnnxImportError", "UnsupportedForm", "Value", "handles",
           "node_label"]
