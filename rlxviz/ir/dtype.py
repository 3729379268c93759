"""Element types of IR tensors.

The names and promotion order follow RLX's `rlx-ir/src/dtype.rs` (see `docs/rlx.md` §1.3);
only the dtypes a transformer inference graph needs are kept (i8/u8: the quantized tensors of QDQ and dynamically
quantized exports; arithmetic on them is written by the importer as casts to wider types).
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np


class DType(StrEnum):
    """Element type of a tensor; prints lower-case (`f32`, `i64`, ...)."""

    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"
    f64 = "f64"
    i8 = "i8"
    u8 = "u8"
    i32 = "i32"
    i64 = "i64"
    bool = "bool"

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_int(self) -> bool:
        return self in (DType.i8, DType.u8, DType.i32, DType.i64)

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return _ITEMSIZE[self]

    @property
    def numpy(self) -> np.dtype:
        """The NumPy dtype used by the reference interpreter (bf16 is computed as f32)."""
        return np.dtype(_NUMPY[self])

    @classmethod
    def from_numpy(cls, dtype: np.dtype | type) -> DType:
        """Map a NumPy dtype to a DType. Raises ValueError for unsupported dtypes."""
        name = np.dtype(dtype).name
        for d, n in _NUMPY.items():
            if n == name and d is not DType.bf16:
                return d
        raise ValueError(f"[DType.from_numpy] unsupported numpy dtype {name!r}")


_FLOATS = frozenset({DType.f32, DType.f16, DType.bf16, DType.f64})
_ITEMSIZE = {DType.f32: 4, DType.f16: 2, DType.bf16: 2, DType.f64: 8, DType.i8: 1, DType.u8: 1, DType.i32: 4,
             DType.i64: 8, DType.bool: 1}
_NUMPY = {
    DType.f32: "float32", DType.f16: "float16", DType.bf16: "float32", DType.f64: "float64",
    DType.i8: "int8", DType.u8: "uint8", DType.i32: "int32", DType.i64: "int64", DType.bool: "bool",
}
_RANK = {DType.bool: 0, DType.u8: 1, DType.i8: 2, DType.bf16: 3, DType.f16: 4, DType.i32: 5, DType.i64: 6, DType.f32: 7,
         DType.f64: 8}


def promote(a: DType, b: DType) -> DType:
    """Result dtype of a binary op on `a` and `b` (RLX promotion order; f16 with bf16 gives f32)."""
    if a == b:
        return a
    if {a, b} == {DType.f16, DType.bf16}:
        return DType.f32
    if a.is_float != b.is_float:
        f, i = (a, b) if a.is_float else (b, a)
        return f if f.itemsize >= i.itemsize else DType.f64 if i.itemsize > 4 else DType.f32
    return a if _RANK[a] >= _RANK[b] else b
