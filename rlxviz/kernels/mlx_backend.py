"""The one module that imports `mlx.core`, after loading an optimized CBLAS (see `blas.py`).

Everything in rlxviz that needs MLX does `from rlxviz.kernels.mlx_backend import mx`.
"""

from __future__ import annotations

from .blas import BlasRecord, active_blas, load_blas

BLAS: BlasRecord = load_blas()

import mlx.core as mx  # noqa: E402 - must come after load_blas()

__all__ = ["BLAS", "active_blas", "blas_summary", "mx"]


def blas_summary() -> str:
    """One line for apps and benchmarks, e.g. `MLX 0.32.4 cpu, BLAS: cmeel-openblas (/.../libopenblas.so.0)`."""
    return f"MLX {mx.__version__} {mx.default_device()}, BLAS: {active_blas()}"
