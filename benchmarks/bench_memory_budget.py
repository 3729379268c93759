"""The memory budget against what runs: for each graph and workload, the estimate the budget checks
(`ir.memory.workload_peak`, what `Limits.check` refuses on) next to the measured peak RSS of a child process
doing that work, over its RSS before (imports, MLX and a warm-up run on a tiny graph already paid).

Workloads: `run` (NumPy reference, `runtime.run_reference`), `run-mlx` (`MlxExecutor().run`) and `time`
(`rlxviz time GRAPH -r 1 --warmup 0`: the pipeline, the battery, the oracle and every version on MLX).
The estimate must never be below the measurement (`OK`); it may be well above (it counts every copy as live
at once). Exit 1 if any row is below.
Run: .venv/bin/python benchmarks/bench_memory_budget.py [--scale 1.0]
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from rlxviz.ir import parse_ir
from rlxviz.ir.memory import workload_peak


def graphs(scale: float) -> dict[str, str]:
    """IR texts: a large param reduced (the held-back case budget_param_381mb), an outer product, an expand
    broadcast, a broadcasting add and an elementwise chain."""
    n = int(6000 * scale ** 0.5)
    big = int(100_000_000 * scale)
    return {
        "param_reduce": f"""graph t {{
  %0 = input {{name="x"}} : f32[4]
  %1 = param {{name="p"}} : f32[{big}]
  %2 = reduce_sum(%1) {{axes=[0], keepdims=false}} : f32[]
  %3 = add(%0, %2) : f32[4]
  return %3
}}""",
        "outer_matmul": f"""graph t {{
  %0 = input {{name="a"}} : f32[{n}, 1]
  %1 = input {{name="b"}} : f32[1, {n}]
  %2 = matmul(%0, %1) : f32[{n}, {n}]
  %3 = reduce_sum(%2) {{axes=[0, 1], keepdims=false}} : f32[]
  return %3
}}""",
        "expand": f"""graph t {{
  %0 = input {{name="x"}} : f32[1]
  %1 = expand(%0) {{shape=[{n}, {n}]}} : f32[{n}, {n}]
  %2 = reduce_sum(%1) {{axes=[0, 1], keepdims=false}} : f32[]
  return %2
}}""",
        "broadcast_add": f"""graph t {{
  %0 = input {{name="a"}} : f32[{n}, 1]
  %1 = input {{name="b"}} : f32[1, {n}]
  %2 = add(%0, %1) : f32[{n}, {n}]
  %3 = tanh(%2) : f32[{n}, {n}]
  return %3
}}""",
        "chain": f"""graph t {{
  %0 = input {{name="x"}} : f32[{n // 2}, {n // 2}]
  %1 = param {{name="w"}} : f32[{n // 2}, {n // 2}]
  %2 = mul(%0, %1) : f32[{n // 2}, {n // 2}]
  %3 = relu(%2) : f32[{n // 2}, {n // 2}]
  %4 = add(%3, %1) : f32[{n // 2}, {n // 2}]
  %5 = exp(%4) : f32[{n // 2}, {n // 2}]
  return %5
}}""",
    }


CHILD = r"""
import json, resource, sys
from rlxviz.session import Limits, load_ir_text
path, workload, tiny = sys.argv[1], sys.argv[2], sys.argv[3]

def work(p):
    if workload == "time":
        from rlxviz.cli import main
        main(["time", p, "-r", "1", "--warmup", "0", "--max-memory-mb", "1000000"])
        return
    m = load_ir_text(open(p).read(), Limits(1e6))
    feeds = m.random_feeds(seed=0)
    if workload == "run":
        from rlxviz.runtime import run_reference
        run_reference(m.graph, feeds, m.weights)
    else:
        from rlxviz.runtime.executor import MlxExecutor
        MlxExecutor(device="cpu").run(m.graph, feeds, m.weights)

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()

work(tiny)  # imports, MLX and first-call costs are the baseline
base = rss()
work(path)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"base": base, "peak": peak}))
"""

TINY = """graph t {
  %0 = input {name="x"} : f32[4]
  %1 = relu(%0) : f32[4]
  return %1
}"""


def measure(path: Path, workload: str, tiny: Path) -> tuple[int, int]:
    """(baseline RSS, peak RSS) in bytes of a child doing `workload` on the IR file `path`."""
    r = subprocess.run([sys.executable, "-c", CHILD, str(path), workload, str(tiny)], capture_output=True,
                       text=True, timeout=600)
    line = [x for x in r.stdout.splitlines() if x.startswith("{")]
    if r.returncode != 0 or not line:
        raise RuntimeError(f"{path.name} {workload}: child failed: {r.stderr.strip().splitlines()[-1:]}")
    d = json.loads(line[-1])
    return d["base"], d["peak"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="scale of the graphs' sizes (default: %(default)s)")
    ap.add_argument("--workloads", default="run,run-mlx,time", help="comma-separated (default: %(default)s)")
    args = ap.parse_args()
    mib = 1 << 20
    bad = 0
    print(f"{'graph':>14} {'workload':>8} {'estimate MiB':>12} {'measured MiB':>12} {'ratio':>6}")
    with tempfile.TemporaryDirectory() as d:
        tiny = Path(d) / "tiny.ir"
        tiny.write_text(TINY)
        for name, text in graphs(args.scale).items():
            path = Path(d) / f"{name}.ir"
            path.write_text(text)
            for workload in args.workloads.split(","):
                est, _ = workload_peak(parse_ir(text), workload)
                base, peak = measure(path, workload, tiny)
                used = max(peak - base, 0)
                ok = est >= used
                bad += not ok
                print(f"{name:>14} {workload:>8} {est / mib:>12.1f} {used / mib:>12.1f} {est / max(used, 1):>6.2f}"
                      f"  {'OK' if ok else 'BELOW'}", flush=True)
    print("estimate never below the measured peak" if not bad else f"{bad} row(s) with the estimate below")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
