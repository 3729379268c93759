"""Time DOT building and layout for the 12-layer BERT-base graph, full (params folded) and layer-collapsed.

Usage: .venv/bin/python benchmarks/bench_render.py [--style rlx|hf] [--repeat 3]

Cases: `full` (input graph, params folded), `full+clusters` (the same with one cluster per match of the
first pass that matched), `layers` (collapsed input graph), `layers+trace` (collapsed final graph with
fusion status from the trace).

Targets (2-core machine): full view under 2 s, collapsed view under 0.3 s (DOT build + layout).
Prints a markdown table: median seconds over `--repeat` runs, after one warm-up run per engine.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

from rlxviz.models import load_model
from rlxviz.passes import Pipeline
from rlxviz.viz import Overlay, available_engines, layout, render_dot

TARGETS = {"full": 2.0, "full+clusters": 2.0, "layers": 0.3, "layers+trace": 0.3}


def median_time(fn, repeat):
    times = []
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--style", default="rlx", choices=("rlx", "hf"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args()
    g = load_model("bert-base-shaped", 1, args.seq, style=args.style).graph
    print(f"graph: {g.name} style={args.style}, {len(g)} nodes ({len(g.compute_nodes())} ops, {len(g.params)} params)")
    trace = Pipeline.canonical().run(g)
    step = next(s for s in trace.steps if s.matches)  # the first pass that matched: clusters on the unfused graph
    cases = {
        "full": lambda: render_dot(g),
        "full+clusters": lambda: render_dot(step.before, Overlay.before(step, trace=trace)),
        "layers": lambda: render_dot(g, view="layers"),
        "layers+trace": lambda: render_dot(trace.final, Overlay.trace_summary(trace), view="layers"),
    }
    print(f"full+clusters: {len(step.matches)} match clusters of {step.pass_name}; layers+trace: final graph")
    print()
    print("| view | engine | nodes drawn | DOT build (s) | layout (s) | total (s) | target (s) | ok |")
    print("|---|---|---|---|---|---|---|---|")
    for view, build in cases.items():
        t_dot, dot = median_time(build, args.repeat)
        drawn = len(re.findall(r"^\t+\w+ \[", dot, re.M))  # node statements
        for engine in available_engines():
            layout(dot, engine=engine)  # warm-up (page cache, fonts)
            t_lay, out = median_time(lambda d=dot, e=engine: layout(d, engine=e), args.repeat)
            assert 'id="out0"' in out.svg
            total = t_dot + t_lay
            ok = "yes" if total < TARGETS[view] else "NO"
            print(f"| {view} | {engine} | {drawn} | {t_dot:.3f} | {t_lay:.3f} | {total:.3f} | {TARGETS[view]} | {ok} |")


if __name__ == "__main__":
    main()
