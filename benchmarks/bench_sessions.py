"""Time to interactive of N app sessions opened together (issue 15: 8 sessions within 6 s each on 2 cores).

Starts `panel serve app.py` on a free localhost port (as `make app` does), opens N browser pages at the same
moment (Playwright, Debian's chromium) and prints, per session, the seconds from the request until the first
graph node is drawn (`.rv-after g.node`: the model is loaded, the pipeline has run, the SVG is shown).
A first single session warms the server's caches (as any user before them would); `--cold` skips it.

    .venv/bin/python benchmarks/bench_sessions.py            # 8 sessions
    .venv/bin/python benchmarks/bench_sessions.py -n 4 --cold

Prints figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, extra: list[str]) -> subprocess.Popen:
    panel = Path(sys.executable).parent / "panel"
    proc = subprocess.Popen([str(panel), "serve", "app.py", "--address", "127.0.0.1", "--port", str(port),
                             f"--allow-websocket-origin=127.0.0.1:{port}", *extra],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ))
    t0 = time.time()
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/static/extensions/panel/css/alerts.css", timeout=1)
            return proc
        except OSError:
            if proc.poll() is not None or time.time() - t0 > 90:
                proc.kill()
                raise SystemExit("panel serve did not start") from None
            time.sleep(0.2)


async def one(browser, url: str, timeout_s: float) -> float:
    ctx = await browser.new_context(viewport={"width": 1400, "height": 900})
    page = await ctx.new_page()
    t0 = time.perf_counter()
    try:
        await page.goto(url, timeout=timeout_s * 1000)
        await page.locator(".rv-after g.node").first.wait_for(timeout=timeout_s * 1000)
        return time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - a session that never became interactive is reported as such
        print(f"a session failed: {type(e).__name__}: {str(e).splitlines()[0]}", file=sys.stderr)
        return float("inf")
    finally:
        await ctx.close()


async def run(n: int, url: str, cold: bool, timeout_s: float) -> tuple[float | None, list[float]]:
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        warm = None if cold else await one(browser, url, timeout_s)
        times = await asyncio.gather(*(one(browser, url, timeout_s) for _ in range(n)))
        await browser.close()
    return warm, list(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=8, help="sessions opened together (default 8)")
    ap.add_argument("--cold", action="store_true", help="no warm-up session first")
    ap.add_argument("--timeout", type=float, default=120, help="seconds before a session counts as failed")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra argument for panel serve")
    a = ap.parse_args()
    load_before = os.getloadavg()[0]
    port = _free_port()
    proc = start_server(port, a.serve_arg)
    try:
        warm, times = asyncio.run(run(a.n, f"http://127.0.0.1:{port}/app", a.cold, a.timeout))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    print(f"cpus: {os.cpu_count()}, load average before: {load_before:.1f}, after: {os.getloadavg()[0]:.1f}")
    if warm is not None:
        print(f"warm-up session alone: {warm:.2f} s to interactive")
    for i, t in enumerate(sorted(times)):
        print(f"session {i + 1}/{a.n}: {t:.2f} s to interactive")
    ok = [t for t in times if t != float("inf")]
    if ok:
        print(f"{a.n} together: median {statistics.median(ok):.2f} s, max {max(ok):.2f} s, "
              f"{len(ok)}/{a.n} interactive")


if __name__ == "__main__":
    main()
