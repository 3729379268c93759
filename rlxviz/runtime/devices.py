"""Where MLX can run on this machine, which device to use, and the float32 precision policy there.

Devices are named `cpu` and `gpu`. The GPU is Metal on macOS (the `mlx` wheel) or CUDA on Linux
(`pip install "rlxviz[cuda]"`, which pulls `mlx[cuda13]`); the CPU is always there. The default is
the GPU when present. A session passes its device to `MlxExecutor(device=...)`; nothing here changes
MLX's process-wide default device.

Precision policy: MLX's CUDA backend runs float32 matmuls in TF32 (10-bit mantissa inputs, float32
accumulation) unless `MLX_ENABLE_TF32=0` is set before MLX starts; Metal and the CPU compute float32
matmuls in float32. Every timing row records the policy, and equivalence checks use the tolerance
of the policy in force (`PrecisionPolicy.rtol` / `atol`).
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from .blas import cpu_cores
from .mlx_backend import mx

DEVICES = ("cpu", "gpu")
TF32_ENV = "MLX_ENABLE_TF32"


class DeviceError(ValueError):
    """A device name is unknown or the device is not available on this machine (one-line message)."""


@dataclass(frozen=True)
class DeviceInfo:
    """One device MLX can run on here.

    Attributes:
        name: `cpu` or `gpu` (what `--device` takes).
        backend: `cpu`, `metal` or `cuda`.
        label: for people, e.g. `CPU (AMD EPYC, 2 cores)` or `GPU (CUDA)`.
    """

    name: str
    backend: str
    label: str


def gpu_backend() -> str | None:
    """`metal` (macOS), `cuda` (Linux with mlx-cuda) or None when MLX has no GPU here."""
    try:
        if not mx.is_available(mx.gpu):
            return None
    except Exception:  # noqa: BLE001 - an MLX build without GPU support may raise instead of answering
        return None
    if sys.platform == "darwin":
        return "metal"
    return "cuda" if getattr(mx, "cuda", None) is not None and mx.cuda.is_available() else "gpu"


def _device_name(device: mx.Device) -> str:
    try:
        return str(mx.device_info(device).get("device_name", "")) if hasattr(mx, "device_info") else ""
    except Exception:  # noqa: BLE001 - older MLX: device_info() takes no device
        return ""


def available_devices() -> list[DeviceInfo]:
    """The devices MLX can use on this machine, the default first (GPU when present, then CPU)."""
    cpu_name = _device_name(mx.cpu) or platform.processor() or platform.machine()
    out = [DeviceInfo("cpu", "cpu", f"CPU ({cpu_name}, {cpu_cores()} cores)")]
    backend = gpu_backend()
    if backend is not None:
        name = _device_name(mx.gpu)
        out.insert(0, DeviceInfo("gpu", backend, f"GPU ({backend.upper() if backend == 'cuda' else backend.title()}"
                                                 f"{': ' + name if name else ''})"))
    return out


def default_device() -> str:
    """`gpu` when MLX has a GPU here, else `cpu`."""
    return available_devices()[0].name


def resolve_device(name: str | None) -> str:
    """Validate a device name; None or `auto` gives `default_device()`.

    Raises:
        DeviceError: unknown name, or `gpu` on a machine without an MLX GPU (says how to get one).
    """
    if name is None or name == "auto":
        return default_device()
    if name not in DEVICES:
        raise DeviceError(f"unknown device {name!r}: use one of {', '.join(DEVICES)}")
    if name == "gpu" and gpu_backend() is None:
        raise DeviceError("no GPU for MLX on this machine (MLX here is the CPU build); on Linux with an NVIDIA "
                          "GPU install \"rlxviz[cuda]\", on macOS use Apple silicon, or pass --device cpu")
    return name


def mx_device(name: str) -> mx.Device:
    """The `mx.Device` for `cpu` / `gpu`."""
    return mx.Device(mx.gpu if name == "gpu" else mx.cpu)


@dataclass(frozen=True)
class PrecisionPolicy:
    """How float32 matmuls are computed on a device, and the tolerance that goes with it.

    Attributes:
        name: `f32` (float32 inputs and accumulation) or `tf32` (inputs rounded to TF32's 10-bit
            mantissa, float32 accumulation: relative error per product ~5e-4).
        rtol / atol: tolerance for comparing an output with the float64-checked NumPy reference.
        note: where the policy comes from (e.g. `MLX_ENABLE_TF32 unset: MLX's CUDA default`).
    """

    name: str
    rtol: float
    atol: float
    note: str = ""

    def __str__(self) -> str:
        return self.name


def _tolerance() -> dict[str, tuple[float, float]]:
    from ..ir import DType
    from .tolerance import TABLE

    f32, tf32 = TABLE[DType.f32, "cpu"][0], TABLE[DType.f32, "cuda+tf32"][0]
    return {"f32": (f32.rtol, f32.atol), "tf32": (tf32.rtol, tf32.atol)}


TOLERANCE: dict[str, tuple[float, float]] = _tolerance()
"""`(rtol, atol)` vs the oracle per float32 matmul policy, from the one table `runtime.tolerance.TABLE`
(float32 on the CPU / Metal / CUDA without TF32, and on CUDA with TF32). tf32: inputs rounded to 11
significant bits give ~5e-4 relative error per product; over a 384-1536-long dot product and six
LayerNorm'd layers the error of O(1) hidden states grows to ~1e-2 (issue 11 measured 4.1e-3 on an H200)."""


def precision_policy(device: str, backend: str | None = None, env: Mapping[str, str] | None = None) -> PrecisionPolicy:
    """The float32 matmul policy on `device` (`cpu` / `gpu`).

    Args:
        device: `cpu` or `gpu`.
        backend: the GPU backend (`metal`, `cuda`); default: this machine's (`gpu_backend()`).
        env: environment to read `MLX_ENABLE_TF32` from (default `os.environ`).
    """
    env = os.environ if env is None else env
    if device == "gpu" and (backend or gpu_backend()) == "cuda":
        flag = env.get(TF32_ENV)
        if flag is not None and flag.strip() == "0":
            return PrecisionPolicy("f32", *TOLERANCE["f32"], f"{TF32_ENV}=0: full float32 matmuls on CUDA")
        return PrecisionPolicy("tf32", *TOLERANCE["tf32"],
                               f"{TF32_ENV} {'=' + flag if flag is not None else 'unset'}: MLX's CUDA default (TF32)")
    where = "Metal" if device == "gpu" else "CPU"
    return PrecisionPolicy("f32", *TOLERANCE["f32"], f"{where}: float32 matmuls")


__all__ = ["DEVICES", "DeviceError", "DeviceInfo", "PrecisionPolicy", "TOLERANCE", "available_devices", "cpu_cores",
           "default_device", "gpu_backend", "mx_device", "precision_policy", "resolve_device"]
