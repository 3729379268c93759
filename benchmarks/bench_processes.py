"""MiniLM's fully fused version under lowering and thread-pool settings, and ONNX Runtime, each timed in its
own process: the A/B harness for settings that a process reads once (the BLAS's thread count, the kernels'
build) and for runtimes whose threads outlive a call.

Why its own process: in one process, timing one runtime right after another measures the first one's threads
too. ONNX Runtime's intra-op threads spin for a while after each run and OpenBLAS's wait in a spin loop, so on
2 cores an MLX call made right after an ORT call (interleaved rounds, `bench_kernels.py`) shares the cores with
them (measured 2026-12-02 on an Intel Xeon: MLX's batch-1 call 40 -> 66 ms). Here each configuration runs alone
in a fresh process — load, lower, `--warmup` untimed calls, then `--calls` timed calls back to back, as a user's
program does — and the processes of all configurations alternate for `--rounds` rounds, so a load spike from
other processes hits every configuration alike.

Configurations (`--configs`; default ort default gemm openblas):
  ort            ONNX Runtime on rlxviz's ONNX export of the input graph, `--threads` intra-op threads
  torch          the same encoder in PyTorch eager (`bench_runtime.torch_encoder`), `--threads` threads
  default        the final version, the CPU's default lowering (`LoweringOptions()` on the CPU; `gemm="auto"`)
  gemm           ... with rlxviz's GEMM for the fused dense layers (`gemm=True`)
  openblas       ... with OpenBLAS's sgemm for them (`gemm=False`)
  nospin         ... with the kernels' pool waits blocking at once (`RLXVIZ_POOL_SPIN_US=0`; default 50 us)
  nokernels      ... without rlxviz's CPU kernels (`RLXVIZ_KERNELS=0`: MLX's own lowering)
  blas-timeout4  ... with `OPENBLAS_THREAD_TIMEOUT=4` (OpenBLAS's workers sleep at once instead of spinning)
  input          the input version (196 ops), the CPU's default lowering
  compiled       `default` with the whole graph in `mx.compile` (`MlxExecutor(compile_graph=True)`)
  input-compiled `input` with the whole graph in `mx.compile`
  baseline       `default` run by another checkout of rlxviz (`--baseline PATH`, its root on the child's
                 PYTHONPATH; e.g. `git worktree add /tmp/before HEAD~1`): a change's A/B in one run, its
                 kernels built from that checkout's sources into their own cache entry

Per configuration: the median of all its timed calls (wall ms), the median of its processes' medians, the
fastest call, the median CPU time per call (this process's `time.process_time`, all its threads: a thread that
spins while it waits counts), the ratio of medians to ORT's, and the largest max abs error of its outputs
against the NumPy reference of the input graph (over 1e-3 stops the run). Wall time on `--threads` threads;
the load average before and after.

Usage: .venv/bin/python benchmarks/bench_processes.py [--batches 8 1] [--rounds 5] [--calls 15] [--threads 2]
       [--configs ort default gemm openblas] [--baseline PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONFIGS: dict[str, tuple[str, dict[str, str]]] = {
    # name: (what it runs, environment added to the child's)
    "ort": ("ort", {}),
    "torch": ("torch", {}),
    "default": ("final", {}),
    "gemm": ("final-gemm", {}),
    "openblas": ("final-openblas", {}),
    "nokernels": ("final", {"RLXVIZ_KERNELS": "0"}),
    "blas-timeout4": ("final", {"OPENBLAS_THREAD_TIMEOUT": "4"}),
    "input": ("input", {}),
    "nospin": ("final", {"RLXVIZ_POOL_SPIN_US": "0"}),
    "compiled": ("final-compiled", {}),
    "input-compiled": ("input-compiled", {}),
    "baseline": ("final", {}),  # PYTHONPATH set from --baseline
}


def child(what: str, batch: int, seq: int, threads: int, warmup: int, calls: int) -> None:
    """Time `calls` calls of `what` at (`batch`, `seq`) and print one JSON line: wall and CPU ms per call, the
    kernels' status line and the last output's max abs error against the NumPy reference of the input graph."""
    os.environ["OPENBLAS_NUM_THREADS"] = str(threads)  # read when rlxviz loads the BLAS (below)
    import numpy as np
    from bench_runtime import load, ort_session

    from rlxviz import kernels
    from rlxviz.kernels.mlx_backend import mx
    from rlxviz.passes import Pipeline
    from rlxviz.runtime import run_reference
    from rlxviz.runtime.executor import MlxExecutor
    from rlxviz.runtime.lowering import LoweringOptions

    hf, _rlx, _source = load(batch, seq)
    feeds = hf.random_feeds(seed=batch)
    if what == "ort":
        import tempfile

        from rlxviz.models.onnx.export import export_onnx

        tmp = tempfile.mkdtemp()
        export_onnx(hf.graph, hf.weights, f"{tmp}/m.onnx")
        sess = ort_session(f"{tmp}/m.onnx", threads)
        inp = {i.name: feeds[i.name] for i in sess.get_inputs()}

        def call() -> object:
            return sess.run(None, inp)
    elif what == "torch":
        from bench_kernels import torch_eager

        row = torch_eager(_rlx, feeds, run_reference(hf.graph, feeds, hf.weights)[0], threads)
        if row is None:
            sys.exit("torch does not import (pip install -r benchmarks/requirements.txt)")
        call = row[1]
    else:
        mod = kernels.load()
        if mod is not None:
            mod.set_threads(threads)
        gemm = {"final-gemm": True, "final-openblas": False}.get(what)
        graph = hf.graph if what.startswith("input") else Pipeline.canonical().run(hf.graph).final
        ex = MlxExecutor(LoweringOptions(gemm=gemm, cpu_streams=threads), compile_graph=what.endswith("-compiled"),
                         device="cpu")
        prog, xs = ex.bind(graph, feeds, hf.weights)

        def call() -> object:
            out = prog.fn(*xs)
            mx.eval(out)
            return out
    for _ in range(warmup):
        call()
    samples, cpu = [], []
    for _ in range(calls):
        t, c = time.perf_counter(), time.process_time()
        out = call()
        samples.append((time.perf_counter() - t) * 1e3)
        cpu.append((time.process_time() - c) * 1e3)
    first = np.asarray(out[0] if isinstance(out, list | tuple) else out)
    err = float(np.abs(first - run_reference(hf.graph, feeds, hf.weights)[0]).max())
    status = "" if what in ("ort", "torch") else str(kernels.status())
    import rlxviz

    print(json.dumps({"ms": samples, "cpu_ms": cpu, "kernels": status, "err": err, "rlxviz": rlxviz.__file__}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 1])
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--configs", nargs="+", default=["ort", "default", "gemm", "openblas"], choices=CONFIGS)
    ap.add_argument("--baseline", metavar="PATH", help="another rlxviz checkout, for the `baseline` configuration")
    ap.add_argument("--child", nargs=2, metavar=("WHAT", "BATCH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.baseline:
        root = os.path.abspath(args.baseline)
        if not os.path.isfile(os.path.join(root, "rlxviz", "__init__.py")):
            ap.error(f"--baseline {args.baseline}: not an rlxviz checkout (no rlxviz/__init__.py)")
        CONFIGS["baseline"] = ("final", {"PYTHONPATH": root})
        if "baseline" not in args.configs:
            args.configs.append("baseline")
    elif "baseline" in args.configs:
        ap.error("the baseline configuration needs --baseline PATH")
    if args.child:
        child(args.child[0], int(args.child[1]), args.seq, args.threads, args.warmup, args.calls)
        return
    import platform

    from bench_runtime import cpu_name

    print(f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {cpu_name()}, {os.cpu_count()} "
          f"CPU(s), Python {platform.python_version()}; {args.threads} thread(s) everywhere; {args.rounds} rounds "
          f"of one process per configuration, {args.warmup} warm-up + {args.calls} timed calls each.")
    for batch in args.batches:
        samples: dict[str, list[float]] = {c: [] for c in args.configs}
        cpu: dict[str, list[float]] = {c: [] for c in args.configs}
        errs = dict.fromkeys(args.configs, 0.0)
        medians: dict[str, list[float]] = {c: [] for c in args.configs}
        statuses: dict[str, str] = {}
        load_before = os.getloadavg()[0]
        for k in range(args.rounds):
            for j in range(len(args.configs)):
                name = args.configs[(j + k) % len(args.configs)]
                what, env = CONFIGS[name]
                cmd = [sys.executable, __file__, "--child", what, str(batch), "--seq", str(args.seq),
                       "--threads", str(args.threads), "--warmup", str(args.warmup), "--calls", str(args.calls)]
                res = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, check=False)
                if res.returncode != 0:
                    sys.exit(f"{name} (batch {batch}) failed: {res.stderr.strip().splitlines()[-1:]}")
                got = json.loads(res.stdout.strip().splitlines()[-1])
                root = env.get("PYTHONPATH")
                if root and not got["rlxviz"].startswith(root + os.sep):
                    sys.exit(f"{name} imported rlxviz from {got['rlxviz']}, not from {root}")
                if not got["err"] <= 1e-3:  # NaN fails too
                    sys.exit(f"{name} (batch {batch}) differs from the reference: max abs err {got['err']}")
                errs[name] = max(errs[name], got["err"])
                samples[name] += got["ms"]
                cpu[name] += got["cpu_ms"]
                medians[name].append(statistics.median(got["ms"]))
                if got["kernels"]:
                    statuses.setdefault(got["kernels"], name)
        ort = statistics.median(samples["ort"]) if "ort" in samples else None
        print(f"\n**MiniLM, f32, batch {batch}, seq {args.seq}** (load average {load_before:.2f} before, "
              f"{os.getloadavg()[0]:.2f} after; " + "; ".join(f"{n}: {st}" for st, n in statuses.items()) + ")\n")
        print("| configuration | median ms | median of process medians | min ms | CPU ms | x ORT | max abs err |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name in args.configs:
            med = statistics.median(samples[name])
            ratio = f"{med / ort:.2f}" if ort else ""
            print(f"| {name} ({describe(name)}) | {med:.1f} | {statistics.median(medians[name]):.1f} | "
                  f"{min(samples[name]):.1f} | {statistics.median(cpu[name]):.1f} | {ratio} | {errs[name]:.1e} |")
        sys.stdout.flush()


def describe(name: str) -> str:
    """The configuration's one-line meaning for the table."""
    what, env = CONFIGS[name]
    text = {"ort": "ONNX Runtime", "torch": "PyTorch eager", "final": "fused, CPU default",
            "final-gemm": "fused, rlxviz GEMM", "final-openblas": "fused, OpenBLAS GEMM",
            "input": "input version", "final-compiled": "fused, CPU default, whole graph mx.compile'd",
            "input-compiled": "input version, whole graph mx.compile'd"}[what]
    if name == "baseline":
        return f"{text}, the checkout at {env['PYTHONPATH']}"
    return ", ".join([text, *(f"{k}={v}" for k, v in env.items())])


if __name__ == "__main__":
    main()
