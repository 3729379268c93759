"""The precision policy: which dtype a graph runs in, on which device, and how close is close enough.

One table (`TABLE`) gives two tolerances per float dtype and device:

* `oracle`: a version's output vs the oracle (`run_oracle`: the unfused graph in float64);
* `same_backend`: a version's output vs the unfused graph run on the same backend in the same dtype
  (fused vs unfused; a difference here is a pass's fault, not the dtype's).

An output is within a tolerance when every element satisfies `|got - want| <= atol + rtol * |want|`
(`numpy.allclose`). The values, and why:

| dtype | device | vs oracle (rtol, atol) | fused vs unfused (rtol, atol) |
|---|---|---|---|
| f64 | cpu | 1e-9, 1e-9 | 1e-9, 1e-9 |
| f32 | cpu, metal, cuda without TF32 | 1e-3, 1e-4 | 1e-4, 1e-4 |
| f32 | cuda with TF32 (MLX's default) | 2e-2, 2e-2 | 2e-2, 2e-2 |
| f16 | any | 1e-2, 1e-2 | 1e-2, 1e-2 |
| bf16 | any | 5e-2, 5e-2 | 5e-2, 5e-2 |

Why: f64 rounds at 2^-53 over a few hundred ops; f32 (2^-24) runs through 6+ layers and fast-math
kernels (<= ~1e-6 each); TF32 rounds matmul operands to a 10-bit mantissa (2^-11; 4.1e-3 measured on
minilm-shaped, issue 11, and ~1e-2 expected over six layers); f16 (2^-11) and bf16 (2^-8) round every intermediate.

A graph's dtype is its narrowest float dtype among inputs, params and outputs (a mixed graph is judged
by its weakest part). TF32 is on for float32 matmuls on CUDA unless `MLX_ENABLE_TF32=0`
(`runtime.devices.precision_policy`, whose per-policy tolerances are this table's f32 rows).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import DType, Graph, Op


@dataclass(frozen=True)
class Tolerance:
    """`|got - want| <= atol + rtol * |want|` element-wise."""

    rtol: float
    atol: float

    def __str__(self) -> str:
        return f"rtol {self.rtol:g}, atol {self.atol:g}"


_F64, _F32, _TF32 = Tolerance(1e-9, 1e-9), Tolerance(1e-3, 1e-4), Tolerance(2e-2, 2e-2)
TABLE: dict[tuple[DType, str], tuple[Tolerance, Tolerance]] = {
    (DType.f64, "cpu"): (_F64, _F64),
    (DType.f32, "cpu"): (_F32, Tolerance(1e-4, 1e-4)),
    (DType.f32, "metal"): (_F32, Tolerance(1e-4, 1e-4)),
    (DType.f32, "cuda"): (_F32, Tolerance(1e-4, 1e-4)),
    (DType.f32, "cuda+tf32"): (_TF32, _TF32),
    **{(DType.f16, d): (Tolerance(1e-2, 1e-2), Tolerance(1e-2, 1e-2)) for d in ("cpu", "metal", "cuda", "cuda+tf32")},
    **{(DType.bf16, d): (Tolerance(5e-2, 5e-2), Tolerance(5e-2, 5e-2)) for d in ("cpu", "metal", "cuda", "cuda+tf32")},
}
"""(dtype, device) -> (vs oracle, fused vs unfused). Devices: `cpu`, `metal`, `cuda`, `cuda+tf32`."""

_RANK = {DType.bf16: 0, DType.f16: 1, DType.f32: 2, DType.f64: 3}


@dataclass(frozen=True)
class PrecisionPolicy:
    """How a graph was run and judged.

    Attributes:
        dtype: the graph's float dtype (its narrowest among inputs, params and outputs).
        device: `cpu`, `metal`, `cuda` or `cuda+tf32`.
        oracle / same_backend: the tolerances from `TABLE`.
    """

    dtype: DType
    device: str
    oracle: Tolerance
    same_backend: Tolerance

    @property
    def tf32(self) -> bool:
        return self.device == "cuda+tf32"

    def describe(self) -> str:
        """One line for the CLI and the page."""
        dev = "CUDA, float32 matmuls in TF32" if self.tf32 else {"cpu": "CPU", "metal": "Metal GPU",
                                                                  "cuda": "CUDA (TF32 off)"}[self.device]
        return (f"precision: {self.dtype} on MLX {dev}; oracle: the unfused graph in float64 "
                f"({self.oracle}); fused vs unfused on MLX in {self.dtype} ({self.same_backend})")


def graph_dtype(graph: Graph) -> DType:
    """The narrowest float dtype among the graph's inputs, params and outputs (f32 if it has none)."""
    found = [n.dtype for n in graph if n.op in (Op.INPUT, Op.PARAM) and n.dtype in _RANK]
    found += [graph[o].dtype for o in graph.outputs if graph[o].dtype in _RANK]
    return min(found, key=_RANK.__getitem__) if found else DType.f32


def device_kind(device: str | None = None) -> str:
    """An MLX device (`cpu` / `gpu`; default: the one `runtime.devices` picks) as a `TABLE` key: `cpu`,
    `metal`, `cuda` or `cuda+tf32` (CUDA's float32 matmuls are TF32 unless `MLX_ENABLE_TF32=0`)."""
    from .devices import gpu_backend, precision_policy, resolve_device

    name = resolve_device(device)
    if name == "cpu":
        return "cpu"
    backend = gpu_backend()
    if backend != "cuda":
        return "metal"
    return "cuda+tf32" if precision_policy("gpu", "cuda").name == "tf32" else "cuda"


def policy_for(graph: Graph, device: str | None = None) -> PrecisionPolicy:
    """The policy for running `graph` on `device`, a `TABLE` device key (default: `device_kind()`).

    Raises:
        KeyError: no entry for the graph's dtype on that device (names both).
    """
    dtype, dev = graph_dtype(graph), device or device_kind()
    if (dtype, dev) not in TABLE:
        raise KeyError(f"no tolerance for {dtype} on {dev}; known: "
                       + ", ".join(f"{d}/{v}" for d, v in TABLE))
    oracle, same = TABLE[dtype, dev]
    return PrecisionPolicy(dtype, dev, oracle, same)


__all__ = ["TABLE", "PrecisionPolicy", "Tolerance", "device_kind", "graph_dtype", "policy_for"]
