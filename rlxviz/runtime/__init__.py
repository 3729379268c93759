"""Execution: the NumPy reference interpreter (the oracle) and the MLX runtime.

The MLX parts are imported lazily (first attribute access), so `import rlxviz.runtime` stays
cheap and `blas.load_blas()` always runs before `mlx.core` is imported (both live one floor down, in
`rlxviz.kernels`: `blas` and `mlx_backend`).
"""

from importlib import import_module
from typing import Any

from ..kernels.blas import BlasRecord, active_blas, load_blas
from .reference import IMPLS, NumpyEmitter, bind_leaf, run_oracle, run_reference

_LAZY = {
    "MlxExecutor": "executor", "default_executor": "executor", "run_mlx": "executor",
    "LOWERINGS": "lowering", "LoweringError": "lowering", "LoweringOptions": "lowering",
    "Timing": "timing", "OutputDiff": "timing", "time_version": "timing", "equivalence": "timing",
    "blas_summary": "..kernels.mlx_backend",
    "MlxEmitter": "lowering", "options_for": "lowering", "DEVICE_LOWERING": "lowering",
    "time_versions_interleaved": "timing", "InterleavedTimings": "timing", "TimingContext": "timing",
    "available_devices": "devices", "default_device": "devices", "resolve_device": "devices",
    "DeviceError": "devices", "PrecisionPolicy": "precision", "precision_policy": "precision",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = _LAZY[name]
        return getattr(import_module(module if module.startswith(".") else f".{module}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["IMPLS", "BlasRecord", "NumpyEmitter", "active_blas", "bind_leaf", "load_blas", "run_oracle",
           "run_reference", *_LAZY]
