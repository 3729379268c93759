"""MLX vs NumPy float32 GEMM throughput on MiniLM's projection shapes, and which BLAS MLX uses.

Usage: .venv/bin/python benchmarks/bench_gemm.py [--repeat 20]
       RLXVIZ_BLAS=none .venv/bin/python benchmarks/bench_gemm.py   # MLX's bundled BLAS, for contrast
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from rlxviz.runtime.mlx_backend import blas_summary, mx

SHAPES = [(384, 1152), (384, 1536), (1536, 384)]  # (K, N): qkv, fc1, fc2


def _median_s(fn, repeat: int) -> float:
    for _ in range(3):
        fn()
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    print(blas_summary())
    print(f"{'B':>3} {'M x K x N':>18} {'MLX GF/s':>9} {'NumPy GF/s':>10} {'MLX/NumPy':>9}")
    rng = np.random.default_rng(0)
    for b in (1, 8, 32):
        m = b * 128
        for k, n in SHAPES:
            a_np = rng.standard_normal((m, k), dtype=np.float32)
            w_np = rng.standard_normal((k, n), dtype=np.float32)
            a, w = mx.array(a_np), mx.array(w_np)
            mx.eval(a, w)
            flop = 2.0 * m * k * n
            t_mx = _median_s(lambda a=a, w=w: mx.eval(a @ w), args.repeat)
            t_np = _median_s(lambda a=a_np, w=w_np: a @ w, args.repeat)
            g_mx, g_np = flop / t_mx / 1e9, flop / t_np / 1e9
            print(f"{b:>3} {f'{m}x{k}x{n}':>18} {g_mx:9.1f} {g_np:10.1f} {g_mx / g_np:9.2f}")


if __name__ == "__main__":
    main()
