"""The app's timing path against the CLI's on one model, alternating, with both machine checks per run.

The app times in its worker process (`app.timeproc.time_in_worker`), `rlxviz time` in its own process
(`session.timing.time_versions_and_own`, called here in-process); both run the same code on the same rounds. Each run
prints the input's, the final version's and the final version on MLX's own lowering's median +- IQR (min), where it
ran (`TimingContext`: BLAS, threads, CPU streams, which rlxviz kernels ran), and whether the busy check reads it busy
by the old rule (a median above `BUSY_RATIO` x its minimum) and by the current one (`session.busy_warning`: also an
IQR above `NOISY_IQR` x its median). Random inputs only (the timing, not the battery).

    .venv/bin/python benchmarks/bench_paths_agree.py [--model bert-tiny] [--seq 16] [--runs 3] [--repeat 21]
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bert-tiny")
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3, help="alternations (default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=21, help="interleaved rounds (default: %(default)s)")
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()

    from rlxviz.app.timeproc import time_in_worker
    from rlxviz.models import load_model
    from rlxviz.passes import CANONICAL_ORDER, Pipeline
    from rlxviz.session import timing

    model = load_model(args.model, 1, args.seq)
    trace = Pipeline(list(CANONICAL_ORDER), {}, "bench").run(model.graph)
    feeds = model.random_feeds(seed=0)
    sets = timing.input_sets(trace.input, feeds, battery=False)
    print(f"{args.model} seq {args.seq}, {args.repeat} rounds after {args.warmup} warm-up; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("path  load  input ms (min)         final ms (min)         own lowering ms (min)  old rule  new rule")
    seen = set()
    for _ in range(args.runs):
        for how in ("cli", "app"):
            load = os.getloadavg()[0]
            if how == "cli":
                timing.TIMINGS.clear()
                rows, own = timing.time_versions_and_own(trace, feeds, model.weights, args.warmup, args.repeat,
                                                         inputs=sets, own_lowering=True)
            else:
                run = time_in_worker(trace, feeds, model.weights, warmup=args.warmup, repeat=args.repeat, inputs=sets)
                rows, split = run.rows, run.split
                own = split.rows[1] if split is not None and not isinstance(split, str) else None
            t = [r for r in rows if r.same_as is None] + ([own] if isinstance(own, timing.VersionTiming) else [])
            old = any(r.median_ms > timing.BUSY_RATIO * r.min_ms for r in t)
            cells = "  ".join(f"{r.median_ms:5.2f} ± {r.iqr_ms:5.2f} ({r.min_ms:4.2f})" for r in (t[0], *t[-2:]))
            print(f"{how:<4}  {load:4.1f}  {cells}   {'busy' if old else 'quiet':<8}  "
                  f"{'busy' if timing.busy_warning(*t) else 'quiet'}")
            if t[0].context is not None and str(t[0].context) not in seen:
                seen.add(str(t[0].context))
                print(f"      ({how}) {t[0].context}")


if __name__ == "__main__":
    main()
