"""The one tolerance table the session judges a graph version's outputs with.

A version is correct when `np.allclose(got, reference, rtol, atol)` holds for every output and every
value on both sides is finite. Replace `tolerance` (e.g. with a dtype/device table) to change the
verdicts of every front end at once.
"""

from __future__ import annotations

TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-3, 1e-4),
}
"""dtype name -> (rtol, atol) for MLX float32 kernels against the float64-free NumPy reference."""


def tolerance(dtype: str = "float32") -> tuple[float, float]:
    """`(rtol, atol)` for outputs of `dtype` (unknown dtypes get float32's)."""
    return TOLERANCES.get(dtype, TOLERANCES["float32"])


__all__ = ["TOLERANCES", "tolerance"]
