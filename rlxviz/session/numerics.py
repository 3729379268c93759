"""What a fused lowering changes in the numbers, measured: fast-math transcendentals and `mx.addmm`'s rounding.

A fusion is valid when it computes the same function (`docs/passes.md`); its kernels need not give the same
bits. The notebooks (01, 02) measure the two sources the CPU lowering adds with these functions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def fast_erf_error(lo: float = -6.0, hi: float = 6.0, points: int = 200001) -> float:
    """Largest |`runtime.fast.erf`(x) - erf(x)| over an even float32 grid of `points` on [lo, hi], erf exact
    in float64 (`scipy.special.erf`). The fast erf is the rational approximation the CPU lowering and
    rlxviz's kernels compute (about 4e-7 absolute, `runtime.fast`)."""
    from scipy.special import erf

    from ..kernels.mlx_backend import mx
    from ..runtime.fast import erf as fast_erf

    grid = np.linspace(lo, hi, points, dtype=np.float32)
    return float(np.abs(np.asarray(fast_erf(mx.array(grid)), np.float64) - erf(grid.astype(np.float64))).max())


@dataclass(frozen=True)
class AddmmRounding:
    """`mx.addmm(bias, x, w)` against `x @ w + bias` computed as two ops, in one dtype.

    Attributes:
        dtype: `float32` or `bfloat16`.
        max_diff: largest |difference| of the two outputs (read as float32).
        ulps: `max_diff` in units of the last place at the largest |output| (2^(floor(log2 max|y|) - mantissa)).
    """

    dtype: str
    max_diff: float
    ulps: float


def addmm_rounding(m: int = 16, k: int = 384, n: int = 384, dtype: str = "float32", seed: int = 0,
                   device: str = "cpu") -> AddmmRounding:
    """How far one `mx.addmm` (the bias added inside the GEMM's accumulation, what `Emitter.linear` emits) is
    from a matmul followed by an add, for standard-normal `x [m, k]`, `w [k, n]`, `bias [n]` in `dtype`.

    Raises:
        ValueError: a dtype other than `float32` / `bfloat16`. DeviceError: unknown device or no GPU here.
    """
    from ..kernels.mlx_backend import mx
    from ..runtime.devices import resolve_device

    mantissa = {"float32": 23, "bfloat16": 7}
    if dtype not in mantissa:
        raise ValueError(f"[addmm_rounding] dtype must be float32 or bfloat16, got {dtype!r}")
    dt = getattr(mx, dtype)
    rng = np.random.default_rng(seed)
    with mx.stream(getattr(mx, resolve_device(device))):
        x, w, b = (mx.array(rng.standard_normal(s).astype(np.float32)).astype(dt) for s in ((m, k), (k, n), (n,)))
        split = (x @ w + b).astype(mx.float32)
        diff = mx.abs(mx.addmm(b, x, w).astype(mx.float32) - split).max().item()
        ulp = 2.0 ** (np.floor(np.log2(mx.abs(split).max().item())) - mantissa[dtype])
    return AddmmRounding(dtype, float(diff), float(diff / ulp))


__all__ = ["AddmmRounding", "addmm_rounding", "fast_erf_error"]
