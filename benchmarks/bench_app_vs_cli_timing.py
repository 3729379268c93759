"""The app's Timing tab against `rlxviz time`, MiniLM seq 16, side by side in one run.

Default: starts `panel serve app.py` on a free localhost port, clicks "Time every version" in a headless
Chromium (Playwright, /usr/bin/chromium) and reads the table, with `rlxviz time minilm --seq 16` run just
before and just after (same rounds); prints per version the app's median and IQR next to both CLI medians
and IQRs, and whether they agree (the app's median +- IQR/2 overlaps a CLI run's median +- IQR/2).

`--cause`: the mechanism, in one process: the same versions timed (a) from the main thread, (b) from a
worker thread while another Python thread spins (what a server thread can meet), (c) in the app's timing
worker process while the same thread spins in the parent.

    .venv/bin/python benchmarks/bench_app_vs_cli_timing.py [--cause] [--repeat 10]
"""

from __future__ import annotations

import argparse
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def cli_medians(repeat: int) -> dict[str, tuple[float, float]]:
    """`rlxviz time minilm --seq 16`: version label -> (median ms, IQR ms) (unchanged versions left out)."""
    out = subprocess.run([str(BIN / "rlxviz"), "time", "minilm", "--seq", "16", "--repeat", str(repeat),
                          "--warmup", "2"], cwd=ROOT, capture_output=True, text=True, check=False).stdout
    rows = {}
    for line in out.splitlines():
        m = re.match(r"\s*\d+\s+(input|after \S+)\s+\d+\s+([\d.]+)\s+[\d.]+\s+([\d.]+)\s", line)
        if m and m.group(1) not in rows:
            rows[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    return rows


def app_rows(repeat: int) -> tuple[list[dict[str, str]], str]:
    """The Timing tab's table in a real browser against `panel serve app.py`."""
    from playwright.sync_api import expect, sync_playwright

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(BIN / "panel"), "serve", "app.py", "--address", "127.0.0.1", "--port", str(port),
                             f"--allow-websocket-origin=127.0.0.1:{port}"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        t0 = time.time()
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/static/extensions/panel/css/alerts.css", timeout=1)
                break
            except OSError:
                if time.time() - t0 > 60:
                    raise RuntimeError("panel serve did not start") from None
                time.sleep(0.3)
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--headless"])
            pg = b.new_page(viewport={"width": 1600, "height": 1000})
            pg.set_default_timeout(300_000)
            pg.goto(f"http://127.0.0.1:{port}/app")
            pg.locator(".rv-after g.node").first.wait_for()
            pg.locator(".bk-tab", has_text="Timing").click()
            box = pg.locator(".rv-repeat input")
            box.fill(str(repeat))
            box.press("Enter")
            pg.locator(".rv-time button").click()
            n = pg.locator(".rv-version select option").count()
            expect(pg.locator(".rv-timings .tabulator-row")).to_have_count(n, timeout=600_000)
            expect(pg.locator(".rv-blas")).to_contain_text("worker process")
            rows = pg.eval_on_selector_all(".rv-timings .tabulator-row", """rows => rows.map(r => Object.fromEntries(
                [...r.querySelectorAll('.tabulator-cell')].map(c => [c.getAttribute('tabulator-field'),
                                                                   c.textContent.trim()])))""")
            where = pg.locator(".rv-blas p").first.inner_text()
            b.close()
    finally:
        proc.terminate()
        proc.wait(10)
    return rows, where


def side_by_side(repeat: int) -> None:
    before = cli_medians(repeat)
    rows, where = app_rows(repeat)
    after = cli_medians(repeat)
    print(f"MiniLM seq 16; app: {where}")
    print(f"CLI: rlxviz time minilm --seq 16 --repeat {repeat} --warmup 2, run before and after the app")
    print(f"{'version':<34} {'app median':>10} {'IQR':>6} {'CLI before':>10} {'IQR':>6} {'CLI after':>10} {'IQR':>6}"
          "  agree")
    agree = 0
    for r in rows:
        label = r["version"]
        med, iqr = float(r["median_ms"]), float(r["iqr_ms"])
        cli = [x for x in (before.get(label), after.get(label)) if x is not None]
        ok = any(abs(m - med) <= (q + iqr) / 2 for m, q in cli)
        agree += ok
        cells = " ".join(f"{x[0]:>10.2f} {x[1]:>6.2f}" if x else f"{'-':>10} {'-':>6}"
                         for x in (before.get(label), after.get(label)))
        print(f"{label:<34} {med:>10.2f} {iqr:>6.2f} {cells}  {'yes' if ok else 'NO'}")
    print(f"{agree}/{len(rows)} versions: the app's median +- IQR/2 overlaps a CLI run's")


def cause(repeat: int) -> None:
    sys.path.insert(0, str(ROOT))
    from rlxviz.models import load_model
    from rlxviz.passes import CANONICAL_ORDER, Pipeline
    from rlxviz.session import timing

    def time_versions(*a):  # noqa: ANN002, ANN202 - the CLI's function, measuring every time
        timing.TIMINGS.clear()
        return timing.time_versions(*a)

    from rlxviz.app.timeproc import time_in_worker

    model = load_model("minilm", 1, 16)
    trace = Pipeline(list(CANONICAL_ORDER), {}, "bench").run(model.graph)
    feeds = model.random_feeds(seed=0)

    def medians(rows: list) -> list[float]:
        return [r.median_ms for r in rows if r.same_as is None]

    def spinning(fn):  # noqa: ANN001, ANN202
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

    def in_thread():  # noqa: ANN202
        out: list = []
        t = threading.Thread(target=lambda: out.append(time_versions(trace, feeds, model.weights, 2, repeat)))
        t.start()
        t.join()
        return out[0]

    labels = [lbl for i, (lbl, _g) in enumerate(trace.versions()) if i == 0 or trace.steps[i - 1].changed]
    print(f"MiniLM seq 16, {repeat} interleaved rounds; median ms per version "
          f"(switch interval {sys.getswitchinterval() * 1e3:.0f} ms)")
    print("    " + " ".join(f"{lbl.replace('after ', '')[:12]:>12}" for lbl in labels))
    for r in range(2):
        res = {
            "main thread": medians(time_versions(trace, feeds, model.weights, 2, repeat)),
            "thread + busy thread": medians(spinning(in_thread)),
            "process + busy thread": medians(spinning(
                lambda: time_in_worker(trace, feeds, model.weights, warmup=2, repeat=repeat)).rows),
        }
        for name, ms in res.items():
            print(f"{r} {name:<22}" + " ".join(f"{x:>12.2f}" for x in ms), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cause", action="store_true", help="time from a thread vs a process next to a busy thread")
    ap.add_argument("--repeat", type=int, default=10, help="interleaved rounds (rlxviz time --repeat)")
    a = ap.parse_args()
    (cause if a.cause else side_by_side)(a.repeat)


if __name__ == "__main__":
    main()
