"""rlxviz's own CPU kernels as MLX primitives (C++ in `src/`, built on first use by `build`), and what MLX itself
loads first: the CBLAS its CPU matmul calls (`blas`, which also counts the cores this process may use) and the one
`import mlx.core` after it (`mlx_backend`). The runtime routes to all of them; nothing here imports the runtime.

Float32 kernels, each an `mlx::core::Primitive` with `eval_cpu` (vectorized for the machine that
built it, threaded over rows or (batch, head, query block) work items on the CPUs this process may use):

* `attention(q, k, v, bias, heads, kv_heads, head_dim, scale)`: scores, scale, additive bias, softmax and
  `P V` per head in one pass over K/V tiles (online softmax, flash-attention style). A row whose bias is
  the lowest float everywhere is uniform, as in the NumPy reference; a row of -inf is NaN, as there.
* `bias_act(x, bias, act)`: `act(x + bias)` over the last axis, `act` one of none, gelu, gelu_tanh, silu, relu,
  relu2.
* `softmax(x)`: over the last axis.
* `residual_norm(x, residual, bias, gamma, beta, eps, rms)`: LayerNorm / RMSNorm of `x + residual [+ bias]`.
* `pack_weights(w)` and `gemm(x, packed, n, bias, residual, act)`: `act(x @ w + bias) + residual` on a weight
  packed once into column panels (`gemm_tile()` gives the micro-kernel's rows x columns: 6 x 16 on AVX2,
  12 x 32 on AVX-512); each output sums K products in order, within `K * eps * sum |x w|` of the exact
  product like BLAS's (`tests/test_gemm.py`). The lowering uses it as `LoweringOptions.gemm` says (CPU default
  `"auto"`: AVX-512 builds, layers of at most 512 rows).

The work items run on one persistent pool (`src/pool.h`): its waits poll for `RLXVIZ_POOL_SPIN_US`
microseconds (default 50; 0 blocks at once) before sleeping, so back-to-back kernels find the worker awake.

Beside the kernels, `program_tape(outputs)` (`src/tape.cpp`) reads MLX's unevaluated graph of `outputs`: one
record per primitive with the shape, dtype and nbytes of its inputs and outputs (`session.program.ProgramBytes`
counts the bytes a lowered version moves from it).

Their transcendentals are `rlxviz.runtime.fast`'s formulas (exp 2e-7 relative, erf 4.2e-7 and tanh
3.6e-7 absolute), so they agree with the fast-math lowering they replace to float32 rounding.

`load()` returns the module (or None) and `status()` says which: `built` / `cached` / `off`
(`RLXVIZ_KERNELS=0`) / `unavailable` with the reason, which for a fault of the cache (a library that differs
from its build record and cannot be built again, an unwritable cache, a build lock held past its deadline)
names the path to remove and is printed as one line on stderr (`build`). The lowering (`runtime.lowering`) uses them
for fused ops on the CPU only; everything else keeps MLX's kernels.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from types import ModuleType

from .blas import cpu_cores
from .build import KernelStatus, build_kernels, cache_root, find_toolchain

_LOCK = threading.Lock()
_LOADED: tuple[KernelStatus, ModuleType | None] | None = None
RETRY_S = 10.0
"""Seconds between asks after a wait for another process's build ran out (`KernelStatus.retry`)."""
_RETRY_AT = 0.0


def load() -> ModuleType | None:
    """The kernels module of this process (built or loaded from the cache once), or None."""
    return _ensure()[1]


def status() -> KernelStatus:
    """Whether this process has the kernels (building them on first call), and why not; `threads` is the
    count the kernels use now (`set_threads`)."""
    st, module = _ensure()
    return st if module is None else replace(st, threads=module.threads())


def _ensure() -> tuple[KernelStatus, ModuleType | None]:
    """The cached (status, module); built or loaded on first call. A first call that gave up waiting for another
    process's build (`retry`) is asked again, without waiting, at most every `RETRY_S` seconds, so that a
    long-lived process (the app's server and workers) gets the kernels once that build is done."""
    global _LOADED, _RETRY_AT
    with _LOCK:
        again = _LOADED is not None and _LOADED[0].retry and time.monotonic() >= _RETRY_AT
        if _LOADED is None or again:
            st, module = build_kernels(wait=0.0) if again else build_kernels()
            _RETRY_AT = time.monotonic() + RETRY_S
            if again and st.retry:
                st = _LOADED[0]  # still held: keep the first answer (it names the wait that ran out)
            if module is not None:
                module.set_threads(cpu_cores())
                st = replace(st, threads=module.threads())
            _LOADED = (st, module)
        return _LOADED


__all__ = ["KernelStatus", "build_kernels", "cache_root", "find_toolchain", "load", "status"]
