"""`mx.compile` of each FusedTransformerLayer / of the whole graph on the CPU vs MLX's op-by-op lowering.

The final MiniLM version under four lowerings (`session.time_lowerings`: interleaved rounds kept in order),
each against MLX's op-by-op lowering with `session.paired_verdict` (median per-round ratio, 95% bootstrap CI):

    PYTHONPATH=. .venv/bin/python benchmarks/bench_compile_layers.py --batch 8 --seq 128 --repeat 21
"""

from __future__ import annotations

import argparse
import time

from rlxviz import session
from rlxviz.models import load_model
from rlxviz.passes import Pipeline
from rlxviz.runtime.lowering import LoweringOptions
from rlxviz.session import Lowering


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=21)
    a = ap.parse_args()
    model = load_model("minilm", batch=a.batch, seq=a.seq)
    final = Pipeline.canonical().run(model.graph).final
    plain = LoweringOptions(kernels=False)
    lowerings = [Lowering("MLX's lowering, op by op", plain),
                 Lowering("each layer mx.compile'd", LoweringOptions(kernels=False, compile_layers=True)),
                 Lowering("whole graph mx.compile'd", plain, compile_graph=True),
                 Lowering("rlxviz's CPU kernels (default)")]
    t0 = time.perf_counter()
    rows, progs = session.time_lowerings(final, model.random_feeds(0), model.weights, lowerings, warmup=1,
                                         repeat=a.repeat, device="cpu")
    print(f"MiniLM final version, batch {a.batch}, seq {a.seq}, {a.repeat} paired rounds "
          f"({time.perf_counter() - t0:.0f} s); {rows[0].context}")
    for r, p in zip(rows, progs, strict=True):
        v = session.paired_verdict(rows[0], r) if r.index else None
        verdict = f"{v.words} (ratio {v.ratio:.3f}, 95% CI {v.low:.3f}..{v.high:.3f})" if v else "baseline"
        print(f"  {r.label:<28} median {r.median_ms:8.1f} ms  min {r.min_ms:8.1f}  compiled kernels "
              f"{p.compiled:>3}  {verdict}")


if __name__ == "__main__":
    main()
