"""What rlxviz's CPU kernels buy: MiniLM's input version, its final fused version with the kernels (with and
without rlxviz's GEMM for the dense layers) and without them, PyTorch eager (when torch imports; the row says
"not installed" otherwise) and ONNX Runtime, on `--threads` threads everywhere, in wall time and in CPU time.

On a shared machine the wall time of a 2-thread run follows the other processes' load; the CPU time of a
1-thread run (`--threads 1`: one OpenBLAS thread, one kernel thread, one CPU stream, one ORT intra-op thread,
`torch.set_num_threads(1)`) barely does, since a single thread is either running or waiting. So `--threads 1`
gives ratios that hold under load, `--threads 2` the figures the targets are stated in (read them with the
load average printed).

Rows are timed in interleaved rounds (each round calls every row once, in rotated order), each call ending
in `mx.eval` (MLX) or returning NumPy arrays (ORT); per row: median and min wall ms, median CPU ms (this
process's `time.process_time`, all its threads), and the ratios of medians to ORT's and to the input
version's. Each output is checked against the NumPy reference of the input graph (max abs err).

Usage: .venv/bin/python benchmarks/bench_kernels.py [--batches 8 1] [--seq 128] [--threads 1] [--repeat 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 1])
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)  # read when rlxviz loads the BLAS (below)

    import numpy as np
    from bench_runtime import load, ort_session

    from rlxviz import kernels
    from rlxviz.kernels.blas import blas_threads
    from rlxviz.kernels.mlx_backend import blas_summary, mx
    from rlxviz.models.onnx.export import export_onnx
    from rlxviz.passes import Pipeline
    from rlxviz.runtime import run_reference
    from rlxviz.runtime.executor import MlxExecutor
    from rlxviz.runtime.lowering import LoweringOptions
    from rlxviz.runtime.timing import kernels_line

    mod = kernels.load()
    if mod is not None:
        mod.set_threads(args.threads)
    print(f"{kernels.status()}; {blas_summary()} (OpenBLAS threads {blas_threads()}); {args.threads} thread(s) "
          f"everywhere; load average {os.getloadavg()[0]:.2f}")
    for batch in args.batches:
        hf, _rlx, source = load(batch, args.seq)
        feeds = hf.random_feeds(seed=batch)
        ref = run_reference(hf.graph, feeds, hf.weights)[0]
        final = Pipeline.canonical().run(hf.graph).final
        rows: list[tuple[str, Callable[[], object], float]] = []
        on = MlxExecutor(LoweringOptions(kernels=True, gemm=True, cpu_streams=args.threads), device="cpu")
        no_gemm = MlxExecutor(LoweringOptions(kernels=True, gemm=False, cpu_streams=args.threads), device="cpu")
        off = MlxExecutor(LoweringOptions(kernels=False, cpu_streams=args.threads), device="cpu")
        n_final = len(final.compute_nodes())
        for name, g, ex in ((f"rlxviz input ({len(hf.graph.compute_nodes())} ops)", hf.graph, on),
                            (f"rlxviz final ({n_final} ops), rlxviz CPU kernels + GEMM", final, on),
                            (f"rlxviz final ({n_final} ops), rlxviz CPU kernels, OpenBLAS dense layers (default)",
                             final, no_gemm),
                            (f"rlxviz final ({n_final} ops), MLX lowering only", final, off)):
            prog, xs = ex.bind(g, feeds, hf.weights)
            err = float(np.abs(ex.run(g, feeds, hf.weights)[0] - ref).max())
            rows.append((name, lambda p=prog, xs=xs: mx.eval(p.fn(*xs)), err))
        torch_row = torch_eager(_rlx, feeds, ref, args.threads)
        if torch_row is not None:
            rows.append(torch_row)
        with tempfile.TemporaryDirectory() as tmp:
            import onnxruntime as ort

            export_onnx(hf.graph, hf.weights, f"{tmp}/m.onnx")
            sess = ort_session(f"{tmp}/m.onnx", args.threads)
            inp = {i.name: feeds[i.name] for i in sess.get_inputs()}
            err = float(np.abs(sess.run(None, inp)[0] - ref).max())
            rows.append((f"ONNX Runtime {ort.__version__}", lambda s=sess, i=inp: s.run(None, i), err))
            load_before = os.getloadavg()[0]
            for _ in range(args.warmup):
                for _name, call, _e in rows:
                    call()
            wall: list[list[float]] = [[] for _ in rows]
            cpu: list[list[float]] = [[] for _ in rows]
            for k in range(args.repeat):
                for j in range(len(rows)):
                    i = (j + k) % len(rows)
                    t, c = time.perf_counter(), time.process_time()
                    rows[i][1]()
                    wall[i].append((time.perf_counter() - t) * 1e3)
                    cpu[i].append((time.process_time() - c) * 1e3)
        med = [statistics.median(w) for w in wall]
        cmed = [statistics.median(c) for c in cpu]
        print(f"\n**{source}, f32, batch {batch}, seq {args.seq}, {args.threads} thread(s)** ({args.repeat} "
              f"interleaved rounds; load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after; "
              f"{kernels_line(on)})\n")
        print("| row | median ms | min ms | CPU ms | x ORT (wall) | x ORT (CPU) | input / row (CPU) | max abs err |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for i, (name, _call, err) in enumerate(rows):
            print(f"| {name} | {med[i]:.1f} | {min(wall[i]):.1f} | {cmed[i]:.1f} | {med[i] / med[-1]:.2f} | "
                  f"{cmed[i] / cmed[-1]:.2f} | {cmed[0] / cmed[i]:.2f} | {err:.1e} |")
        if torch_row is None:
            print("| PyTorch eager | not installed (pip install torch) | | | | | | |")
        sys.stdout.flush()


def torch_eager(rlx, feeds, ref, threads: int):  # noqa: ANN001, ANN201
    """(row name, call, max abs err) for the same encoder in PyTorch eager (`bench_runtime.torch_encoder`) on
    `threads` threads, or None when torch does not import."""
    from bench_runtime import torch_encoder

    tt = torch_encoder(rlx.config, rlx.weights)
    if tt is None:
        return None
    import numpy as np

    model, torch = tt
    torch.set_num_threads(threads)
    ids, mask = torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"])

    def call():  # noqa: ANN202
        with torch.inference_mode():
            return model(ids, mask).numpy()

    err = float(np.abs(call() - ref).max())
    return f"PyTorch {torch.__version__} eager", call, err


if __name__ == "__main__":
    main()
