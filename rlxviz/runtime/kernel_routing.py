"""Kernel routing: which pieces of a fused op run on rlxviz's own CPU kernels (`rlxviz.kernels`), and running them.

The MLX emitter (`runtime.lowering.MlxEmitter`) asks this before it lowers a dense layer, an attention or a residual
norm: each `*_applies` states exactly when a kernel computes what MLX's lowering would (float32 operands, the shapes
the kernel takes, an activation its epilogue computes), and each kernel call records what ran (`ran`, for timing
headers). Routing never changes a number beyond float32 rounding: the kernels compute `ir.fused`'s decomposition
with `runtime.fast`'s transcendentals (`kernels/src/kernels.h`).
"""

from __future__ import annotations

from typing import Any

from .. import kernels
from ..ir.ops import KERNEL_ACTIVATIONS
from ..kernels.mlx_backend import mx
from .packing import PackedWeights

KERNEL_ACTS = frozenset(a.value for a in KERNEL_ACTIVATIONS)
"""Activations the `bias_act` / `gemm` CPU kernels compute, by name (others take the activation's own lowering):
derived from `ir.ops.SPECS` (`OpSpec.kernel_act`)."""

GEMM_AUTO_MAX_ROWS = 512
"""`gemm="auto"`: the most rows (batch x seq) a dense layer may have for rlxviz's GEMM (MiniLM at seq 128: up to
batch 4); above it OpenBLAS's kernel was faster end to end (`DEVICE_LOWERING["cpu"]["gemm"]`)."""


class KernelRouting:
    """rlxviz's CPU kernels for one emitter: whether each applies, and the calls (recorded in `ran`).

    Args:
        module: the loaded kernels module (`kernels.load()`), None when off, unavailable or not on the CPU.
        gemm: `LoweringOptions.gemm` (True, False or `"auto"`).
    """

    def __init__(self, module: Any, gemm: bool | str | None) -> None:
        self.module = module
        """rlxviz's CPU kernels module (`rlxviz.kernels`), None when off, unavailable or not on the CPU."""
        self.isa: str | None = module.isa() if module is not None else None
        """The vector ISA the kernels were built for (`avx512`, `avx2`, ...), None without them."""
        self.gemm_option = gemm
        self.ran: set[str] = set()
        """The kernels run so far (`attention`, `bias+gelu`, `gemm+bias`, ...), for timing headers."""
        self.packed = PackedWeights(module.pack_weights if module is not None else None)
        """The GEMM's packed weights (`PackedWeights`), once per weight array."""

    @classmethod
    def load(cls, kernels_on: bool | None, device: str, gemm: bool | str | None) -> KernelRouting:
        """The routing for an emitter: the kernels loaded (built on first use) when `kernels_on` on the CPU."""
        return cls(kernels.load() if kernels_on and device == "cpu" else None, gemm)

    # -- when a kernel applies ---------------------------------------------------------------------------------
    def gemm_wanted(self, x: mx.array) -> bool:
        """`options.gemm` for `x [..., K]`: True / False as set; `"auto"`: the kernels target AVX-512 and `x`
        has at most `GEMM_AUTO_MAX_ROWS` rows (the product of its leading axes)."""
        if self.gemm_option != "auto":
            return bool(self.gemm_option)
        rows = x.size // x.shape[-1] if x.ndim and x.shape[-1] else 0
        return self.isa == "avx512" and rows <= GEMM_AUTO_MAX_ROWS

    def gemm_applies(self, x: mx.array, w: mx.array, b: mx.array | None, act: str | None) -> bool:
        """Whether a dense layer runs rlxviz's GEMM: kernels loaded and `gemm` on, float32 `x [..., K]` and
        `w [K, N]`, a bias of rank <= 1 and size 1 or N (or none), and no activation or one the epilogue
        computes (`KERNEL_ACTS`)."""
        return (self.module is not None and hasattr(self.module, "gemm") and self.gemm_wanted(x)
                and (act is None or act in KERNEL_ACTS) and x.dtype == w.dtype == mx.float32
                and w.ndim == 2 and x.ndim >= 1 and x.shape[-1] == w.shape[0] and w.shape[1] > 0
                and (b is None or (b.dtype == mx.float32 and b.ndim <= 1 and b.size in (1, w.shape[1]))))

    def bias_act_applies(self, x: mx.array, w: mx.array, b: mx.array | None, act: str | None) -> bool:
        """Whether `linear_act` runs the `bias_act` kernel: kernels loaded, an activation it computes,
        float32 operands and a bias of rank <= 1."""
        return (self.module is not None and act in KERNEL_ACTS and x.dtype == w.dtype == mx.float32
                and (b is None or (b.dtype == mx.float32 and b.ndim <= 1)))

    def residual_norm_applies(self, x: mx.array, residual: mx.array, bias: mx.array | None, gamma: mx.array,
                              beta: mx.array | None) -> bool:
        """Whether `residual_norm` runs the kernel: kernels loaded, float32, `x` and `residual` of one
        shape, bias/gamma/beta of rank <= 1 and size 1 or the last axis."""
        n = x.shape[-1] if x.ndim else 0
        vecs = [v for v in (bias, gamma, beta) if v is not None]
        return (self.module is not None and x.ndim > 0 and x.shape == residual.shape
                and x.dtype == residual.dtype == mx.float32
                and all(v.dtype == mx.float32 and v.ndim <= 1 and v.size in (1, n) for v in vecs))

    def attention_applies(self, q: mx.array, k: mx.array, v: mx.array) -> bool:
        """Whether an attention runs the `attention` kernel: kernels loaded and float32 q, k, v."""
        return self.module is not None and q.dtype == k.dtype == v.dtype == mx.float32

    # -- the kernels ---------------------------------------------------------------------------------------------
    def gemm(self, x: mx.array, w: mx.array, b: mx.array | None, act: str | None) -> mx.array:
        """`act(x @ w + b)` as one `RlxvizGemm` on `w` packed once (`packed`): `x [..., K]`, `w [K, N]`,
        `b [N]` or None -> `[..., N]` float32. Each output is a float32 sum over K in another order than
        BLAS's (both within `K * eps * sum |x w|` of the exact product, `tests/test_kernels.py`)."""
        self.ran.add("gemm" + ("+bias" if b is not None else "") + (f"+{act}" if act else ""))
        return self.module.gemm(x, self.packed.get(w), int(w.shape[1]), b, None, act or "none")

    def bias_act(self, x: mx.array, w: mx.array, b: mx.array | None, act: str) -> mx.array:
        """`act(x @ w + b)` as `mx.matmul`, then the `bias_act` kernel (bias add and activation in one pass)."""
        self.ran.add(f"bias+{act}")
        return self.module.bias_act(mx.matmul(x, w), b, act)

    def residual_norm(self, x: mx.array, residual: mx.array, bias: mx.array | None, gamma: mx.array,
                      beta: mx.array | None, eps: float, kind: str) -> mx.array:
        """LayerNorm / RMSNorm (`kind`) of `x + residual [+ bias]` as one `residual_norm` kernel."""
        self.ran.add(f"residual+{kind}")
        return self.module.residual_norm(x, residual, bias, gamma, beta, float(eps), kind == "rms_norm")

    def attention(self, q: mx.array, k: mx.array, v: mx.array, bias: mx.array | None, heads: int, kv_heads: int,
                  head_dim: int, scale: float) -> mx.array:
        """Packed `[B, S, heads*head_dim]` attention with an additive `bias` (or None) as one kernel."""
        self.ran.add("attention")
        b = None if bias is None else bias.astype(mx.float32)
        return self.module.attention(q, k, v, b, heads, kv_heads, head_dim, scale)


__all__ = ["GEMM_AUTO_MAX_ROWS", "KERNEL_ACTS", "KernelRouting"]
