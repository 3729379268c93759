"""Time to interactive of N app sessions opened together (issue 15: 8 sessions within 6 s each on 2 cores).

Starts `panel serve app.py --warm` (as `make app` does) on a free localhost port (the browser tests'
`tests/served.py` helper; `--no-warm` leaves `--warm` out), opens N
browser pages at the same moment (Playwright, Debian's chromium) and prints, per session, the seconds from the
request until the first graph node is drawn (`.rv-after g.node`: the model is loaded, the pipeline has run, the
SVG is shown), with the seconds until the page itself had loaded (`goto` returned: the server built the
session's document) and until the sidebar's controls were drawn. A first single session warms the server's
caches (as any user before them would); `--cold` skips it. It also prints the CPU seconds the server and the
browser spent while the N sessions opened, which other work on the machine does not inflate as it does the
wall-clock figures, and the load average (`os.getloadavg`) before and after.

    .venv/bin/python benchmarks/bench_sessions.py            # 8 sessions
    .venv/bin/python benchmarks/bench_sessions.py -n 4 --cold

`--server-only` leaves the browsers out: each session's document is pulled over the websocket as a page would
get it (`bokeh.client.pull_session`) and timed until it holds the drawn graph (`.rv-after`'s SVG has a node),
which is the server's share of the time to interactive (a real user's browser runs on the user's machine).

Prints figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from served import ARGS, CHROMIUM, child_cpu_seconds, free_port, served_app  # noqa: E402 - the browser tests' server helper

CONTROLS = ".rv-passes input"
"""The pipeline's pass checkboxes, the last of the sidebar's controls."""


@dataclass
class Opened:
    """One session's seconds from `goto` to: the page loaded, the sidebar controls drawn, the first graph node
    drawn (inf: it never happened within the timeout)."""

    page_s: float = float("inf")
    controls_s: float = float("inf")
    graph_s: float = float("inf")


async def one(browser, url: str, timeout_s: float, keep: list | None = None) -> Opened:
    """Open one page and time it; its context is closed at the end, or appended to `keep` for the caller to close
    (after it read the CPU seconds: a closed context's renderer process is gone, and its seconds with it)."""
    ctx = await browser.new_context(viewport={"width": 1600, "height": 900})  # wide: the sidebar opens unfolded
    page = await ctx.new_page()
    out = Opened()
    t0 = time.perf_counter()

    async def until(selector: str) -> float:
        await page.locator(selector).first.wait_for(timeout=timeout_s * 1000)
        return time.perf_counter() - t0

    try:
        await page.goto(url, timeout=timeout_s * 1000)
        out.page_s = time.perf_counter() - t0
        out.graph_s, out.controls_s = await asyncio.gather(until(".rv-after g.node"), until(CONTROLS))
    except Exception as e:  # noqa: BLE001 - a session that never became interactive is reported as such
        print(f"a session failed: {type(e).__name__}: {str(e).splitlines()[0]}", file=sys.stderr)
    finally:
        if keep is None:
            await ctx.close()
        else:
            keep.append(ctx)
    return out


async def run(n: int, url: str, cold: bool, timeout_s: float) -> tuple[Opened | None, list[Opened], dict]:
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        warm = None if cold else await one(browser, url, timeout_s)
        before = child_cpu_seconds()
        contexts: list = []
        opened = await asyncio.gather(*(one(browser, url, timeout_s, contexts) for _ in range(n)))
        after = child_cpu_seconds()  # before the contexts close: their renderer processes still count
        for ctx in contexts:
            await ctx.close()
        await browser.close()
    return warm, list(opened), {k: after[k] - before[k] for k in after}


def pulled(url: str) -> float:
    """Seconds until a session's document, pulled as a page gets it, holds the drawn graph (inf: it did not)."""
    import panel  # noqa: F401 - registers Panel's models, to read the document
    from bokeh.client import pull_session

    import rlxviz.app.graphpane  # noqa: F401 - registers the graph pane's model

    t0 = time.perf_counter()
    session = pull_session(url=url, max_message_size=2**28)
    dt = time.perf_counter() - t0
    try:
        drawn = any('class="node"' in (getattr(getattr(m, "data", None), "svg", "") or "")
                    for m in session.document.models if "rv-after" in (getattr(m, "css_classes", None) or []))
    finally:
        session.close()
    return dt if drawn else float("inf")


def run_server_only(n: int, url: str) -> tuple[float, list[float], float]:
    """(one session alone, N sessions pulled together, server CPU seconds while they were pulled)."""
    from concurrent.futures import ThreadPoolExecutor

    server = next(p for p in psutil.Process().children(recursive=True) if "serve" in " ".join(p.cmdline()))
    alone = pulled(url)
    c0 = sum(server.cpu_times()[:2])
    with ThreadPoolExecutor(n) as pool:
        times = list(pool.map(lambda _: pulled(url), range(n)))
    return alone, times, sum(server.cpu_times()[:2]) - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=8, help="sessions opened together (default 8)")
    ap.add_argument("--cold", action="store_true", help="no warm-up session first")
    ap.add_argument("--timeout", type=float, default=120, help="seconds before a session counts as failed")
    ap.add_argument("--no-warm", action="store_true", help="serve without --warm (the default model is first run "
                                                               "by the first session, not at server start)")
    ap.add_argument("--server-only", action="store_true", help="pull the sessions' documents, no browser")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra argument for panel serve")
    a = ap.parse_args()
    serve_args = ([] if a.no_warm else ["--warm"]) + a.serve_arg
    load_before = os.getloadavg()[0]
    port = free_port()
    with served_app(port, "127.0.0.1", [f"127.0.0.1:{port}"], dict(os.environ), "server-bench.log", serve_args,
                    start_timeout_s=a.timeout):
        if a.server_only:
            time.sleep(0 if a.no_warm else 5)  # let the --warm run finish, as it does before any user arrives
            alone, times, server_cpu = run_server_only(a.n, f"http://127.0.0.1:{port}/app")
        else:
            warm, opened, cpu = asyncio.run(run(a.n, f"http://127.0.0.1:{port}/app", a.cold, a.timeout))
    if a.server_only:
        print(f"panel serve app.py {' '.join(serve_args)}; documents pulled, no browser")
        print(f"cpus: {os.cpu_count()}, load average before: {load_before:.1f}, after: {os.getloadavg()[0]:.1f}")
        print(f"one session alone: {alone:.2f} s until its document holds the graph")
        for i, t in enumerate(sorted(times)):
            print(f"session {i + 1}/{a.n}: {t:.2f} s")
        ok = [t for t in times if t != float("inf")]
        if ok:
            print(f"{a.n} together: median {statistics.median(ok):.2f} s, max {max(ok):.2f} s, {len(ok)}/{a.n} drawn")
        print(f"server CPU while they opened: {server_cpu:.1f} s ({server_cpu / a.n:.2f} s a session)")
        return
    print(f"panel serve app.py {' '.join(serve_args)}")
    print(f"cpus: {os.cpu_count()}, load average before: {load_before:.1f}, after: {os.getloadavg()[0]:.1f}")
    if warm is not None:
        print(f"warm-up session alone: {warm.graph_s:.2f} s to interactive (page {warm.page_s:.2f} s, "
              f"controls {warm.controls_s:.2f} s)")
    for i, o in enumerate(sorted(opened, key=lambda o: o.graph_s)):
        print(f"session {i + 1}/{a.n}: {o.graph_s:.2f} s to interactive (page {o.page_s:.2f} s, "
              f"controls {o.controls_s:.2f} s)")
    ok = [o.graph_s for o in opened if o.graph_s != float("inf")]
    if ok:
        print(f"{a.n} together: median {statistics.median(ok):.2f} s, max {max(ok):.2f} s, "
              f"{len(ok)}/{a.n} interactive")
    print(f"CPU while they opened: server {cpu['server']:.1f} s ({cpu['server'] / a.n:.2f} s a session), "
          f"browser {cpu['browser']:.1f} s ({cpu['browser'] / a.n:.2f} s a session)")


if __name__ == "__main__":
    main()
