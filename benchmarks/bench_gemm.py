"""rlxviz's GEMM kernel (`rlxviz.kernels`: packed weights, bias in the store) against MLX's `mx.addmm`
(OpenBLAS), ONNX Runtime's Gemm (MLAS, B a constant initializer, so prepacked) and `torch.addmm` (when torch
imports) at all-MiniLM-L6-v2's dense-layer shapes: M = batch x seq rows (128: batch 1; 1024: batch 8),
K x N of the QKV (384 x 1152), output (384 x 384), FFN up (384 x 1536) and down (1536 x 384) layers.

The rows of one shape are timed in interleaved rounds (`--repeat`, after `--warmup`); per row the median
wall ms, median and min CPU ms (this process's `time.process_time`, all threads; under load the minimum is the
run least disturbed by other processes), GFLOP/s of the min CPU time (2 M K N flops) and the ratio of min CPU
times to rlxviz's; each result is checked against float64 NumPy (max abs err). Every library runs on
`--threads` threads (OpenBLAS, rlxviz's pool, ORT's intra-op threads, torch). With `--threads 1` the CPU
time holds under load; read `--threads 2` with the load average printed.

Usage: python benchmarks/bench_gemm.py [--threads 1] [--rows 128 1024] [--repeat 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

SHAPES = [(384, 1152, "QKV"), (384, 384, "output"), (384, 1536, "FFN up"), (1536, 384, "FFN down")]


def ort_gemm(w, b, threads: int):  # noqa: ANN001, ANN201
    """An ORT session of one Gemm node `x @ w + b` with w and b as initializers, or None without ORT."""
    try:
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    k, n = w.shape
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"])], "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, nargs="+", default=[128, 1024])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)  # read when rlxviz loads the BLAS (below)

    import numpy as np

    from rlxviz import kernels
    from rlxviz.kernels.blas import blas_threads
    from rlxviz.kernels.mlx_backend import blas_summary, mx

    mod = kernels.load()
    if mod is None:
        raise SystemExit(f"bench_gemm: {kernels.status()}")
    mod.set_threads(args.threads)
    try:
        import torch

        torch.set_num_threads(args.threads)
    except ImportError:
        torch = None
    print(f"{kernels.status()}, tile {mod.gemm_tile()}; {blas_summary()} (OpenBLAS threads {blas_threads()}); "
          f"torch {torch.__version__ if torch else 'not installed'}; {args.threads} thread(s); load average "
          f"{os.getloadavg()[0]:.2f}\n")
    print("| M x K x N (layer) | row | median ms | CPU ms | min CPU ms | GFLOP/s (min CPU) | x rlxviz (min CPU) "
          "| max abs err |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    rng = np.random.default_rng(0)
    for m in args.rows:
        for k, n, layer in SHAPES:
            x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n), (n,)))
            want = x.astype(np.float64) @ w + b
            mxx, mxw, mxb = mx.array(x), mx.array(w), mx.array(b)
            packed = mod.pack_weights(mxw)
            mx.eval(packed, mxx, mxw, mxb)
            def ours(a=mxx, p=packed, n=n, b=mxb) -> mx.array:  # noqa: ANN001
                return mod.gemm(a, p, n, b, None, "none")

            def blas(a=mxx, w=mxw, b=mxb) -> mx.array:  # noqa: ANN001
                return mx.addmm(b, a, w)

            rows: list[tuple[str, Callable[[], object]]] = [
                ("rlxviz gemm (packed, bias in the store)", lambda f=ours: mx.eval(f())),
                ("MLX addmm (OpenBLAS)", lambda f=blas: mx.eval(f()))]
            outs: list[Callable[[], np.ndarray]] = [lambda f=ours: np.array(f()), lambda f=blas: np.array(f())]
            sess = ort_gemm(w, b, args.threads)
            if sess is not None:
                import onnxruntime as ort

                rows.append((f"ORT {ort.__version__} Gemm (MLAS)", lambda s=sess, x=x: s.run(None, {"x": x})))
                outs.append(lambda s=sess, x=x: s.run(None, {"x": x})[0])
            if torch is not None:
                tx, tw, tb = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b)
                rows.append((f"torch {torch.__version__} addmm", lambda a=tx, w=tw, b=tb: torch.addmm(b, a, w)))
                outs.append(lambda a=tx, w=tw, b=tb: torch.addmm(b, a, w).numpy())
            else:
                print(f"| {m} x {k} x {n} ({layer}) | torch addmm | not installed | | | | | |")
            errs = [float(np.abs(f() - want).max()) for f in outs]
            for _ in range(args.warmup):
                for _name, call in rows:
                    call()
            wall: list[list[float]] = [[] for _ in rows]
            cpu: list[list[float]] = [[] for _ in rows]
            for r in range(args.repeat):
                for j in range(len(rows)):
                    i = (j + r) % len(rows)
                    t, c = time.perf_counter(), time.process_time()
                    rows[i][1]()
                    wall[i].append((time.perf_counter() - t) * 1e3)
                    cpu[i].append((time.process_time() - c) * 1e3)
            lo = [min(v) for v in cpu]
            for i, (name, _call) in enumerate(rows):
                print(f"| {m} x {k} x {n} ({layer}) | {name} | {statistics.median(wall[i]):.2f} | "
                      f"{statistics.median(cpu[i]):.2f} | {lo[i]:.2f} | {2 * m * k * n / lo[i] / 1e6:.1f} | "
                      f"{lo[i] / lo[0]:.2f} | {errs[i]:.1e} |", flush=True)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
