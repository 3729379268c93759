"""What the CPU's default lowering picks on this machine, for tests whose expected MLX program depends on it."""

from rlxviz.kernels.mlx_backend import mx
from rlxviz.runtime.lowering import LoweringOptions, MlxEmitter


def default_gemm(rows: int) -> bool:
    """Whether the CPU's default lowering runs a fused dense layer of `rows` rows as rlxviz's GEMM here
    (`LoweringOptions.gemm="auto"`: kernels built for AVX-512, at most `GEMM_AUTO_MAX_ROWS` rows)."""
    e = MlxEmitter(LoweringOptions(), "cpu")
    return e.cpu_kernels is not None and e.gemm_wanted(mx.zeros((rows, 1)))
