"""The app's Timing tab against `rlxviz time`, MiniLM seq 16, side by side in one run; and why they once differed.

Default: starts `panel serve app.py` on a free localhost port and, alternating, runs `rlxviz time minilm --seq 16
--json` (the CLI, a subprocess) and clicks the Timing tab's "Time every version" / "Time again" in a headless
Chromium (Playwright, /usr/bin/chromium), reading the table the page shows (the app times in its worker process,
`rlxviz/app/timeproc.py`, with the CLI's `session.time_versions`). Prints per version every app run's median and
IQR next to every CLI run's, and whether each app run agrees with the CLI run before it: the two ranges
median +- IQR/2 overlap.

`--cause`: the mechanism, in one process and in interleaved alternations (a load change hits every condition):
the same versions timed by `session.time_versions` (random inputs only: the timing, not the battery)
  - `worker process`: the app's path (`timeproc.time_in_worker`), nothing else running in the parent;
  - `worker process + busy thread`: the same while a Python thread spins in the parent (a busy server thread:
    another session's pipeline run or render, or a spinning event loop);
  - `server thread`: the old app's path, timing from a worker thread of the server process itself;
  - `server thread + busy thread`: the old path next to the spinning Python thread (GIL and one core);
  - `server thread + busy process`: the old path next to a spinning separate process (one core, no GIL).
Each condition's figure is the median, over the alternations, of its per-version medians; `x` is that over
the `worker process` figure.

    .venv/bin/python benchmarks/bench_app_vs_cli_timing.py [--runs 2] [--repeat 10]
    .venv/bin/python benchmarks/bench_app_vs_cli_timing.py --cause [--runs 3] [--repeat 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

Rows = dict[str, tuple[float, float]]
"""version label -> (median ms, IQR ms); versions a pass left unchanged are left out."""


def machine() -> str:
    """Date, CPU count and load average, for the header of every figure."""
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return (f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, load average {load} "
            f"(1/5/15 min)")


def cli_rows(seq: int, repeat: int, warmup: int) -> Rows:
    """`rlxviz time minilm --seq SEQ --repeat R --warmup W --json` in a subprocess."""
    out = subprocess.run([str(BIN / "rlxviz"), "time", "minilm", "--seq", str(seq), "--repeat", str(repeat),
                          "--warmup", str(warmup), "--json"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    return {v["label"]: (v["median_ms"], v["iqr_ms"]) for v in json.loads(out)["versions"] if v["same_as"] is None}


def side_by_side(runs: int, seq: int, repeat: int, warmup: int) -> None:
    """CLI, app, CLI, app, ..., CLI; a table per version."""
    from playwright.sync_api import expect
    from served import child_cpu_seconds, chromium, free_port, served_app

    expect.set_options(timeout=600_000)  # a timing run on a loaded 2-core machine takes minutes
    port = free_port()
    print(f"MiniLM, batch 1, seq {seq}, {repeat} interleaved rounds after {warmup} warm-up; {machine()}")
    cli: list[Rows] = []
    app: list[Rows] = []
    spent: list[str] = []
    with served_app(port, "127.0.0.1", [f"127.0.0.1:{port}"], dict(os.environ), "bench-timing-server.log"), \
            chromium() as browser:
        pg = browser.new_page(viewport={"width": 1600, "height": 1000})
        pg.set_default_timeout(600_000)
        pg.goto(f"http://127.0.0.1:{port}/app")
        pg.locator(".rv-after g.node").first.wait_for()
        box = pg.locator(".rv-seq input")
        if box.input_value() != str(seq):
            box.fill(str(seq))
            box.press("Enter")
        pg.locator(".bk-tab", has_text="Timing").click()
        box = pg.locator(".rv-repeat input")
        box.fill(str(repeat))
        box.press("Enter")
        where = ""
        for k in range(runs):
            cli.append(cli_rows(seq, repeat, warmup))
            print(f"  CLI run {k + 1} done ({machine()})", flush=True)
            c0, t0 = child_cpu_seconds(), time.perf_counter()
            pg.locator(".rv-time-again button" if k else ".rv-time button").click()
            expect(pg.locator(".rv-progress-text")).to_be_visible()  # this run started (minutes long)...
            expect(pg.locator(".rv-progress-text")).to_be_hidden()  # ... and ended: the table holds its rows
            c1, wall = child_cpu_seconds(), time.perf_counter() - t0
            spent.append(", ".join(f"{kind} {c1[kind] - c0[kind]:.2f}" for kind in c1) + f" CPU s in {wall:.1f} s")
            n = pg.locator(".rv-version select option").count()
            expect(pg.locator(".rv-timings .tabulator-row")).to_have_count(n)
            rows = pg.eval_on_selector_all(".rv-timings .tabulator-row", """rows => rows.map(r => Object.fromEntries(
                [...r.querySelectorAll('.tabulator-cell')].map(c => [c.getAttribute('tabulator-field'),
                                                                   c.textContent.trim()])))""")
            app.append({r["version"]: (float(r["median_ms"]), float(r["iqr_ms"])) for r in rows})
            where = pg.locator(".rv-blas p").first.inner_text()
            print(f"  app run {k + 1} done ({machine()})", flush=True)
        cli.append(cli_rows(seq, repeat, warmup))
    print(f"app: {where}")
    print(f"CLI: rlxviz time minilm --seq {seq} --repeat {repeat} --warmup {warmup} --json, before and after each "
          "app run")
    head = "".join(f" {'CLI ' + str(k + 1):>15} {'app ' + str(k + 1):>15}" for k in range(runs))
    print(f"{'version':<32}{head} {'CLI ' + str(runs + 1):>15}  agree")
    agree = total = 0
    for label in cli[0]:
        cells, oks = [], []
        for k in range(runs):
            for rows in (cli[k], app[k]):
                m, q = rows.get(label, (float("nan"), float("nan")))
                cells.append(f"{m:>8.2f} ±{q / 2:>5.2f}")
            am, aq = app[k].get(label, (float("nan"), 0.0))
            ok = any(abs(cm - am) <= (cq + aq) / 2 for cm, cq in (cli[k][label], cli[k + 1][label]))
            oks.append(ok)
        m, q = cli[runs][label]
        cells.append(f"{m:>8.2f} ±{q / 2:>5.2f}")
        agree += sum(oks)
        total += len(oks)
        verdicts = " ".join("yes" if o else "NO" for o in oks)
        print(f"{label:<32} " + " ".join(f"{c:>15}" for c in cells) + "  " + verdicts)
    print(f"median ± IQR/2 in ms; {agree}/{total} app runs overlap the CLI run just before or just after")
    for k, text in enumerate(spent):
        print(f"while app run {k + 1} timed: {text}")
    print(f"done: {machine()}")


def cause(runs: int, seq: int, repeat: int, warmup: int) -> None:
    """Interleaved alternations of five conditions (see the module docstring)."""
    from rlxviz.app.timeproc import time_in_worker
    from rlxviz.models import load_model
    from rlxviz.passes import CANONICAL_ORDER, Pipeline
    from rlxviz.session import timing

    model = load_model("minilm", 1, seq)
    trace = Pipeline(list(CANONICAL_ORDER), {}, "bench").run(model.graph)
    feeds = model.random_feeds(seed=0)
    sets = timing.input_sets(trace.input, feeds, battery=False)

    def in_process() -> list[float]:  # what the old app did: time from a worker thread of the server process
        out: list = []

        def job() -> None:
            timing.TIMINGS.clear()
            out.append(timing.time_versions(trace, feeds, model.weights, warmup, repeat, inputs=sets))

        t = threading.Thread(target=job)
        t.start()
        t.join()
        return [r.median_ms for r in out[0] if r.same_as is None]

    def in_worker() -> list[float]:
        run = time_in_worker(trace, feeds, model.weights, warmup=warmup, repeat=repeat, inputs=sets)
        return [r.median_ms for r in run.rows if r.same_as is None]

    def busy_thread(fn: Callable[[], list[float]]) -> Callable[[], list[float]]:
        def run() -> list[float]:
            stop = threading.Event()

            def spin() -> None:
                x = 0
                while not stop.is_set():
                    x += 1

            t = threading.Thread(target=spin, daemon=True)
            t.start()
            try:
                return fn()
            finally:
                stop.set()
                t.join()
        return run

    def busy_process(fn: Callable[[], list[float]]) -> Callable[[], list[float]]:
        def run() -> list[float]:
            p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            try:
                time.sleep(0.2)
                return fn()
            finally:
                p.kill()
                p.wait()
        return run

    conditions = {"worker process": in_worker, "worker process + busy thread": busy_thread(in_worker),
                  "server thread": in_process, "server thread + busy thread": busy_thread(in_process),
                  "server thread + busy process": busy_process(in_process)}
    labels = [lbl for i, (lbl, _g) in enumerate(trace.versions()) if i == 0 or trace.steps[i - 1].changed]
    print(f"MiniLM, batch 1, seq {seq}: {len(labels)} distinct versions, {repeat} interleaved rounds after {warmup} "
          f"warm-up, random inputs; {runs} alternations of {len(conditions)} conditions, order rotated; "
          f"switch interval {sys.getswitchinterval() * 1e3:.0f} ms")
    print(f"start: {machine()}")
    in_worker()  # start the worker process (imports) outside the measurement
    got: dict[str, list[list[float]]] = {name: [] for name in conditions}
    names = list(conditions)
    for k in range(runs):
        for name in names[k % len(names):] + names[:k % len(names)]:
            ms = conditions[name]()
            got[name].append(ms)
            print(f"  {k} {name:<30}" + " ".join(f"{x:>7.1f}" for x in ms), flush=True)
    print(f"end: {machine()}")
    short = [lbl.replace("after ", "")[:10] for lbl in labels]
    print(f"{'median ms over the alternations':<31}" + " ".join(f"{s:>10}" for s in short)
          + f" {'mean x':>7} {'worst run':>10}")
    base = [statistics.median(col) for col in zip(*got["worker process"], strict=True)]
    for name in names:
        med = [statistics.median(col) for col in zip(*got[name], strict=True)]
        ratio = statistics.mean(m / b for m, b in zip(med, base, strict=True))
        worst = max(max(run) for run in got[name])
        print(f"{name:<31}" + " ".join(f"{m:>10.1f}" for m in med) + f" {ratio:>6.2f}x {worst:>10.1f}")
    print("x: mean over versions of the ratio to `worker process`; worst run: the slowest version median of any "
          "alternation (ms)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cause", action="store_true", help="time from a server thread vs a worker process next to a "
                                                         "busy thread or process")
    ap.add_argument("--runs", type=int, default=None, help="app runs (default 2) or alternations (--cause, default 3)")
    ap.add_argument("--seq", type=int, default=16, help="sequence length (default: %(default)s, as issue 16)")
    ap.add_argument("--repeat", type=int, default=10, help="interleaved rounds (rlxviz time --repeat)")
    a = ap.parse_args()
    from rlxviz.session import DEFAULT_WARMUP  # the app's warm-up rounds (no control in the page)

    if a.cause:
        cause(a.runs or 3, a.seq, a.repeat, DEFAULT_WARMUP)
    else:
        side_by_side(a.runs or 2, a.seq, a.repeat, DEFAULT_WARMUP)


if __name__ == "__main__":
    main()
