"""Where the time goes: per-op profile of all-MiniLM-L6-v2 on MLX, grouped by op.

Each compute node is evaluated on its own (eager, best of `--repeat`), so the total exceeds a lazy
run; the shares show what bounds the time. Prints the active BLAS.

Usage: .venv/bin/python benchmarks/profile_ops.py [--batch 8] [--seq 128] [--version input|final]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from rlxviz.models import load_model
from rlxviz.passes import Pipeline
from rlxviz.runtime.executor import MlxExecutor
from rlxviz.runtime.mlx_backend import blas_summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--version", choices=("input", "final"), default="input")
    args = ap.parse_args()

    model = load_model("minilm", args.batch, args.seq)
    graph = model.graph if args.version == "input" else Pipeline.canonical().run(model.graph).final
    ex = MlxExecutor()
    rows = ex.profile(graph, model.random_feeds(), model.weights, repeat=args.repeat)
    by_op: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        by_op[r["op"]].append(r["ms"])
    total = sum(r["ms"] for r in rows)
    print(f"all-MiniLM-L6-v2, {args.version} graph, batch {args.batch}, seq {args.seq}; {blas_summary()}")
    print(f"{'op':<26}{'count':>6}{'total ms':>10}{'share':>8}{'ms/op':>8}")
    for op, ms in sorted(by_op.items(), key=lambda kv: -sum(kv[1])):
        print(f"{op:<26}{len(ms):>6}{sum(ms):>10.2f}{sum(ms) / total:>8.1%}{sum(ms) / len(ms):>8.2f}")
    print(f"{'total (eager, per op)':<26}{len(rows):>6}{total:>10.2f}")


if __name__ == "__main__":
    main()
