"""What loading in a child process costs (`session.isolated`): milliseconds of `session.load` in this process
vs `session.run_isolated(load)` (a warm spare child, then a cold one that imports first), alternating, a pause
between runs so the spare's imports do not overlap a load.

Prints each run, the medians and the machine's load average before and after.
Run: .venv/bin/python benchmarks/bench_isolated_load.py MODEL.onnx [--rounds 4] [--seq 16]
"""

import argparse
import os
import statistics
import time

from rlxviz.session import isolated, loading


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--pause", type=float, default=6.0, help="seconds between runs (the spare's imports)")
    a = ap.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    isolated.spare_ready()
    here, child = [], []
    for _ in range(a.rounds):
        time.sleep(a.pause)
        loading.MODELS.clear()
        t = time.perf_counter()
        loading.load(a.model, 1, a.seq)
        here.append((time.perf_counter() - t) * 1e3)
        time.sleep(a.pause)
        t = time.perf_counter()
        isolated.run_isolated(loading.load, a.model, 1, a.seq, max_bytes=2048 << 20)
        child.append((time.perf_counter() - t) * 1e3)
    isolated.shutdown()
    t = time.perf_counter()
    isolated.run_isolated(loading.load, a.model, 1, a.seq, max_bytes=2048 << 20)
    cold = (time.perf_counter() - t) * 1e3
    isolated.shutdown()
    print(f"in this process (ms): {[round(x) for x in here]}, median {statistics.median(here):.0f}")
    print(f"in a spare child (ms): {[round(x) for x in child]}, median {statistics.median(child):.0f}")
    print(f"in a cold child, imports first (ms): {cold:.0f}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
