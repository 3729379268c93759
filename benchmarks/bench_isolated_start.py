"""What starting an isolated child costs (`session.isolated`): N back-to-back `load_isolated` calls of one small ONNX
file, each a new copy (the cache misses), with a fresh interpreter per child (as before the fork server: each pays
the imports of numpy, onnx and the importer) vs a fork of the zygote (`ir.forkserver`), side by side.

Each mode starts cold (no spare, no zygote) and ends with `isolated.shutdown()`, so that every child (the zygote
included) has been reaped and counted: CPU is `getrusage(RUSAGE_CHILDREN)` over the mode (user + system, all
children and theirs), wall is the N calls. Prints each mode's total and median per call, and the load average.
Run: .venv/bin/python benchmarks/bench_isolated_start.py [MODEL.onnx] [--calls 10] [--mode both|fresh|fork]
"""

import argparse
import os
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from rlxviz.session import isolated

CASES = Path("/work/shared/cases/onnx")


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(model: Path, calls: int, fork: bool, folder: Path) -> tuple[float, float, list[float]]:
    """(wall seconds of the calls, CPU seconds of every child, each call's wall seconds) for one mode."""
    isolated.USE_FORK_SERVER = fork
    isolated.shutdown()
    copies = []
    for k in range(calls):
        copy = folder / f"{'fork' if fork else 'fresh'}-{k}-{model.name}"
        shutil.copyfile(model, copy)
        copies.append(copy)
    cpu0, each = _children_cpu(), []
    t0 = time.perf_counter()
    for copy in copies:
        t = time.perf_counter()
        isolated.load_isolated(str(copy), 1, 16)
        each.append(time.perf_counter() - t)
    wall = time.perf_counter() - t0
    isolated.shutdown()  # reaps the spare and the zygote: their CPU (and their children's) is counted now
    return wall, _children_cpu() - cpu0, each


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    smallest = min(CASES.glob("*.onnx"), key=lambda p: p.stat().st_size, default=None)
    ap.add_argument("model", nargs="?", default=str(smallest))
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--mode", choices=("both", "fresh", "fork"), default="both")
    a = ap.parse_args()
    model = Path(a.model)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "?")
    print(f"{model.name} ({model.stat().st_size:,} bytes), {a.calls} calls; CPU: {cpu}, {os.cpu_count()} cores")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    modes = {"both": (False, True), "fresh": (False,), "fork": (True,)}[a.mode]
    with tempfile.TemporaryDirectory() as folder:
        for fork in modes:
            wall, cpu_s, each = run(model, a.calls, fork, Path(folder))
            name = "fork of the zygote" if fork else "fresh interpreter"
            print(f"{name:>20}: wall {wall:6.2f} s, children's CPU {cpu_s:6.2f} s; per call: median "
                  f"{statistics.median(each) * 1e3:6.0f} ms, first {each[0] * 1e3:6.0f} ms, "
                  f"rest {[round(x * 1e3) for x in each[1:]]}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
