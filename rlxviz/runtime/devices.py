"""Where MLX can run on this machine, and which device to use.

Devices are named `cpu` and `gpu`. The GPU is Metal on macOS (the `mlx` wheel) or CUDA on Linux
(`pip install "rlxviz[cuda]"`, which pulls `mlx[cuda13]`); the CPU is always there. The default is
the GPU when present. A session passes its device to `MlxExecutor(device=...)`; nothing here changes
MLX's process-wide default device.

How float32 matmuls run on each device (TF32 on CUDA) and the tolerances that go with it are the
precision policy, `runtime.precision`, which reads this module; this module never reads it.
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass

from ..kernels.blas import cpu_cores
from ..kernels.mlx_backend import mx

DEVICES = ("cpu", "gpu")


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


__all__ = ["DEVICES", "DeviceError", "DeviceInfo", "available_devices", "cpu_cores", "default_device", "gpu_backend",
           "mx_device", "resolve_device"]
