"""`explain` cost vs layer count: seconds of the whole check (`session.check_fusion` over every layer, what
`rlxviz explain MODEL` runs after the pipeline) at 1k, 2k, 4k and 8k layers, for two layouts:

- `many`: N layers of 2 nodes each (`layer.K.n0`, `layer.K.n1`), one rejection per layer, so each layer is
  compared with a sibling that fused;
- `wide`: 12 layers holding N nodes between them (the layout of the held-back case
  `ir_layered_4000_explain_15s.ir`, where the sibling diff was close to cubic: 15 s at 4,000).

`explain s` is what scales with the layers; `pipeline s` (the passes, run once) is printed beside it.

Prints the seconds and the ratio to the previous size (near linear: about 2x per doubling).
Run: .venv/bin/python benchmarks/bench_explain_scaling.py [--max 8000] [--sizes 1000,4000,10000]
"""

import argparse
import sys
import time

from rlxviz.ir import parse_ir
from rlxviz.passes import Pipeline
from rlxviz.session import check_fusion


def layered_ir(nodes: int, layers: int) -> str:
    """IR text of a chain of `nodes` alternating neg/relu nodes spread round-robin over `layers` layers."""
    lines = ["graph layered {", '  %0 = input {name="x"} : f32[1, 16, 8]']
    for i in range(1, nodes + 1):
        op = "neg" if i % 2 else "relu"
        lines.append(f"  %{i} = {op}(%{i - 1}) : f32[1, 16, 8] @layer.{(i - 1) % layers}.n{i - 1}")
    lines += [f"  return %{nodes}", "}"]
    return "\n".join(lines)


def many_layers_ir(layers: int) -> str:
    """`layers` layers, each `neg -> relu`; every third layer's relu is also a graph output (an extra user)."""
    lines = ["graph many {", '  %0 = input {name="x"} : f32[1, 4]']
    outs = []
    for k in range(layers):
        a, b = 2 * k + 1, 2 * k + 2
        lines.append(f"  %{a} = neg(%{a - 1}) : f32[1, 4] @layer.{k}.n0")
        lines.append(f"  %{b} = relu(%{a}) : f32[1, 4] @layer.{k}.n1")
        if k % 3 == 0:
            outs.append(f"%{a}")
    lines += [f"  return {', '.join([f'%{2 * layers}', *outs[:50]])}", "}"]
    return "\n".join(lines)


def seconds(text: str) -> tuple[float, float, int]:
    """(pipeline seconds, check seconds, layers checked) for IR `text`."""
    g = parse_ir(text)
    t0 = time.perf_counter()
    trace = Pipeline.canonical().run(g)
    t1 = time.perf_counter()
    check = check_fusion(trace, "bench")
    return t1 - t0, time.perf_counter() - t1, len(check.layers)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max", type=int, default=8000, help="largest layer/node count (default: %(default)s)")
    ap.add_argument("--layouts", default="many,wide", help="comma-separated (default: %(default)s)")
    ap.add_argument("--sizes", default="1000,2000,4000,8000,16000",
                    help="comma-separated layer/node counts, up to --max (default: %(default)s)")
    args = ap.parse_args()
    sizes = [n for n in map(int, args.sizes.split(",")) if n <= args.max]
    print(f"{'layout':>6} {'N':>6} {'layers':>6} {'pipeline s':>10} {'explain s':>9} {'x prev':>6}")
    layouts = {"many": many_layers_ir, "wide": lambda n: layered_ir(n, 12)}
    for name in args.layouts.split(","):
        make = layouts[name]
        prev = None
        for n in sizes:
            pipe, sec, layers = seconds(make(n))
            ratio = f"{sec / prev:.1f}" if prev else "-"
            print(f"{name:>6} {n:>6} {layers:>6} {pipe:>10.2f} {sec:>9.2f} {ratio:>6}", flush=True)
            prev = max(sec, 1e-3)
    return 0


if __name__ == "__main__":
    sys.exit(main())
