"""How many CPU streams pay on this machine: the final fused MiniLM version with N row-parallel CPU
streams and M OpenBLAS threads, timed in interleaved rounds (each round runs every setting once, in a
rotated order, so load from other processes hits all settings alike).

Usage: .venv/bin/python benchmarks/bench_streams.py [--batch 8] [--seq 128] [--streams 1 2 4] [--rounds 12]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from rlxviz.kernels.blas import blas_threads, cpu_cores, set_blas_threads
from rlxviz.kernels.mlx_backend import blas_summary, mx
from rlxviz.models import load_model
from rlxviz.passes import Pipeline
from rlxviz.runtime import run_reference
from rlxviz.runtime.executor import MlxExecutor
from rlxviz.runtime.lowering import LoweringOptions
from rlxviz.runtime.timing import diff


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--streams", type=int, nargs="+", default=sorted({1, 2, cpu_cores()}))
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    print(f"{blas_summary()} | {cpu_cores()} cores | OpenBLAS threads at start {blas_threads()} | "
          f"load average {os.getloadavg()[0]:.1f} | {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    try:
        model = load_model("minilm", args.batch, args.seq)
    except Exception as e:  # noqa: BLE001 - no checkpoint package: the shaped preset
        print(f"[note] real MiniLM unavailable ({e}); minilm-shaped random weights")
        model = load_model("minilm-shaped", args.batch, args.seq, style="hf")
    feeds = model.random_feeds(seed=args.batch)
    final = Pipeline.canonical().run(model.graph).final
    ref = run_reference(model.graph, feeds, model.weights)[0]
    settings = [(n, m) for n in args.streams for m in sorted({n, cpu_cores()})]
    rows = []
    for n, m in settings:
        ex = MlxExecutor(LoweringOptions(cpu_streams=n), device="cpu")
        set_blas_threads(m)
        err = diff(ex.run(final, feeds, model.weights)[0], ref).max_abs
        prog, xs = ex.bind(final, feeds, model.weights)
        rows.append({"n": n, "m": m, "prog": prog, "xs": xs, "err": err, "ms": []})
    for k in range(args.warmup + args.rounds):
        for j in range(len(rows)):
            r = rows[(j + k) % len(rows)]
            set_blas_threads(r["m"])
            t = time.perf_counter()
            mx.eval(r["prog"].fn(*r["xs"]))
            if k >= args.warmup:
                r["ms"].append((time.perf_counter() - t) * 1e3)
    set_blas_threads(cpu_cores())
    base = statistics.median(rows[0]["ms"])
    print(f"{model.name}, final canonical version ({len(final.compute_nodes())} ops), batch {args.batch}, "
          f"seq {args.seq}, {args.rounds} interleaved rounds; load average now {os.getloadavg()[0]:.1f}")
    print(f"{'CPU streams':>11} {'BLAS threads':>12} {'median ms':>9} {'min ms':>8} {'IQR':>7} {'x first':>7} "
          f"{'max|err|':>9}")
    for r in rows:
        q = statistics.quantiles(r["ms"], n=4)
        med = statistics.median(r["ms"])
        print(f"{r['n']:>11} {r['m']:>12} {med:9.1f} {min(r['ms']):8.1f} {q[2] - q[0]:7.1f} {base / med:7.2f} "
              f"{r['err']:9.1e}")
    print("x first: median of the first row / this row's median (> 1 is faster)")
    assert all(np.isfinite(r["err"]) for r in rows)


if __name__ == "__main__":
    main()
