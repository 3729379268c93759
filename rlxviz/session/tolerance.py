"""The one tolerance table the session judges a graph version's outputs with: `runtime.tolerance.TABLE`.

A version is correct on an input set when its outputs are within the table's tolerance of the oracle (the
unfused graph in float64) for the graph's dtype and the MLX device, every value finite
(`runtime.compare`). `precision_policy(graph)` is what the CLI and the page print.
"""

from __future__ import annotations

from typing import Any

from ..ir import DType, Graph
from ..runtime.tolerance import TABLE, PrecisionPolicy, device_kind, policy_for

_NAMES = {"float64": DType.f64, "float32": DType.f32, "float16": DType.f16, "bfloat16": DType.bf16}


def tolerance(dtype: str = "float32", device: str = "cpu") -> tuple[float, float]:
    """`(rtol, atol)` against the oracle for outputs of `dtype` on `device` (unknown dtypes get float32's)."""
    t = TABLE.get((_NAMES.get(dtype, DType.f32), device), TABLE[DType.f32, "cpu"])[0]
    return t.rtol, t.atol


def precision_policy(graph: Graph, executor: Any = None) -> PrecisionPolicy:
    """The graph's dtype on the executor's device (default: the device `runtime.devices` picks), with both
    tolerances (`runtime.tolerance.policy_for`; TF32 on CUDA included)."""
    return policy_for(graph, device_kind(None if executor is None else executor.device))


__all__ = ["PrecisionPolicy", "precision_policy", "tolerance"]
