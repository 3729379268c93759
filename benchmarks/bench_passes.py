"""Pipeline cost vs graph size: nodes, canonical-pipeline wall time and microseconds per node for BERT
encoders of 1, 12, 96 and 768 layers (small hidden size: graph size is what matters).

Checks: us/node within 2x from 12 to 768 layers; the 768-layer pipeline under 10 s.
Times are the best of a few runs (the machine is shared); the graph is built once and frozen for the GC.
Run: .venv/bin/python benchmarks/bench_passes.py
"""

import gc
import sys
import time

from rlxviz.ir import Op
from rlxviz.models import BertConfig, build_bert
from rlxviz.passes import Pipeline


def bench(layers: int, repeats: int) -> tuple[int, float, int]:
    cfg = BertConfig(vocab_size=64, hidden=16, heads=2, intermediate=32, layers=layers, max_position=16)
    g = build_bert(cfg, batch=1, seq=8, style="hf")
    best = float("inf")
    fused = 0
    gc.collect()
    gc.freeze()  # the input graph is long-lived: keep the cyclic GC from rescanning it during the timed runs
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        trace = Pipeline.canonical().run(g)
        best = min(best, time.perf_counter() - t0)
        fused = len(trace.final.find(Op.FUSED_TRANSFORMER_LAYER))
        del trace
    gc.unfreeze()
    return len(g), best, fused


def main() -> int:
    rows = []
    print(f"{'layers':>6} {'nodes':>8} {'pipeline ms':>12} {'us/node':>8} {'FTL':>5}")
    for layers, repeats in ((1, 7), (12, 7), (96, 3), (768, 2)):
        n, sec, fused = bench(layers, repeats)
        rows.append((layers, n, sec))
        print(f"{layers:>6} {n:>8} {sec * 1e3:>12.1f} {sec * 1e6 / n:>8.1f} {fused:>5}")
    per = {layers: sec * 1e6 / n for layers, n, sec in rows}
    ratio = per[768] / per[12]
    ok = ratio <= 2.0 and rows[-1][2] < 10.0
    print(f"us/node 768 vs 12 layers: {ratio:.2f}x (limit 2x); 768 layers: {rows[-1][2]:.2f} s (limit 10 s): "
          f"{'OK' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
