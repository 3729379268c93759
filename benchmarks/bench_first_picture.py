"""Time to the first drawn graph of an `.onnx` file opened by path in the app (issue 39: "a first picture as fast as a
graph viewer").

Serves the app (`panel serve app.py`, from this checkout or `--app-root DIR`, e.g. an older commit unpacked with
`git archive`) with `RLXVIZ_ALLOWED_DIRS` set to the models' folders, opens it in headless chromium
(`/usr/bin/chromium --no-sandbox`, Playwright), waits for the default model's graph, then for each model: picks the
Folder source, types the file's path, presses "Load path" and measures (polling the page every 50 ms) the
seconds until

* **first picture**: the version list names the new model's input (`0: input (N ops)`) and the after-pane
  holds its drawing, and
* **passes done**: the version selector offers more than the input (the pipeline has run; verdicts follow).

Models: a 2-layer Phi-3 export (`tests/fixtures/onnx/zoo/phi3.dynamo-eager.onnx`) and a 32-layer LLaMA-3-8B-shaped
export with sparse external data (written by `scripts/make_big_onnx.py --shape 8b` into a temp folder; about 28 GiB
apparent, a few MB on disk). Each model is opened `--rounds` times (a different sequence length each round, so
nothing comes from the app's caches); the table prints every round and the median, with the machine (CPU model from
/proc/cpuinfo), its load average and the date.

Model Explorer is not measured yet (its column says so): it installs into a throwaway venv here
(`pip install ai-edge-model-explorer model-explorer-onnx`), but driving its page to a "first drawn graph" signal was
not built; the table prints rlxviz's column only.

    .venv/bin/python benchmarks/bench_first_picture.py
    .venv/bin/python benchmarks/bench_first_picture.py --app-root /tmp/before --rounds 1

Measured 2026-12-04 (Intel Xeon, 2 cores shared with other work, load average 2-3; median of 2 rounds, s):

    model                       first picture before -> after    passes done before -> after
    2-layer Phi-3 export             3.64 -> 1.95                     3.66 -> 3.87
    32-layer 8B-shaped export        4.08 -> 1.40                     4.10 -> 3.96

("before": main at 8d34a06, where the import check and the pipeline ran before the first picture.)

Prints figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from served import ARGS, CHROMIUM, free_port  # noqa: E402 - the browser tests' helpers

PHI3 = ROOT / "tests/fixtures/onnx/zoo/phi3.dynamo-eager.onnx"
WAIT_MS = int(float(os.environ.get("BENCH_WAIT_S", "600")) * 1000)

POLL_S = 0.05
"""How often the page is looked at while waiting (the figures' resolution)."""


def wait_until(pg: Page, seen: Callable[[], bool], t0: float) -> float:
    """Seconds from `t0` (`time.perf_counter`) until `seen()` holds, looked at every `POLL_S` (Playwright locators
    pierce the widgets' shadow roots). Raises TimeoutError past `WAIT_MS`."""
    while not seen():
        if time.perf_counter() - t0 > WAIT_MS / 1e3:
            raise TimeoutError("no picture within the wait")
        pg.wait_for_timeout(POLL_S * 1e3)
    return time.perf_counter() - t0


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (else `platform.processor()`), with the core count."""
    try:
        name = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        name = platform.processor() or "unknown CPU"
    return f"{name}, {os.cpu_count()} cores"


def serve(root: Path, port: int, env: dict[str, str], log: Path) -> subprocess.Popen:
    """`panel serve app.py` in `root` on 127.0.0.1:`port`, answering once its static files do (else RuntimeError)."""
    panel = Path(sys.executable).parent / "panel"
    out = open(log, "w")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen([str(panel), "serve", "app.py", "--address", "127.0.0.1", "--port", str(port),
                             f"--allow-websocket-origin=127.0.0.1:{port}", "--num-procs", "1"],
                            cwd=root, env={**env, "PYTHONPATH": str(root)}, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    t0 = time.time()
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/static/extensions/panel/css/alerts.css", timeout=1)
            return proc
        except OSError:
            if proc.poll() is not None or time.time() - t0 > 120:
                stop(proc)
                raise RuntimeError(f"panel serve did not start; see {log}") from None
            time.sleep(0.3)


def stop(proc: subprocess.Popen) -> None:
    """End the server's process group (its isolated children too)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(10)
            return
        except subprocess.TimeoutExpired:
            continue


def open_by_path(pg: Page, path: Path, seq: int) -> tuple[float, float]:
    """(first picture, passes done) in seconds after "Load path" is pressed for `path` at sequence length `seq`."""
    pg.get_by_role("button", name="Folder").click()  # nothing typed yet: a one-line note, no load
    seq_box = pg.locator(".rv-seq input").first
    seq_box.fill(str(seq))
    seq_box.press("Tab")
    time.sleep(1.0)  # the note for the new length (still no path) is shown before the clock starts
    # the path box: `.rv-path` in this checkout; an older one's only text input under the Folder source
    box = pg.locator(".rv-path input") if pg.locator(".rv-path input").count() else pg.get_by_placeholder("/")
    box.first.fill(str(path))
    shown = pg.locator(".rv-version select option").first.text_content()  # `0: input (N ops)` of the default
    t0 = time.perf_counter()
    pg.get_by_role("button", name=re.compile(r"^Load (path|folder)$")).click()
    # the new model's input graph drawn: the version list names another input and the after-pane holds a drawing
    first_opt = pg.locator(".rv-version select option").first
    drawn = pg.locator(".rv-after svg")

    def picture() -> bool:
        return drawn.count() > 0 and first_opt.count() > 0 and first_opt.text_content() != shown

    first = wait_until(pg, picture, t0)
    done = wait_until(pg, lambda: picture() and pg.locator(".rv-version select option").count() > 1, t0)
    return first, done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--app-root", type=Path, default=ROOT, help="the checkout to serve (default: this one)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", choices=["phi3", "8b"], help="one model only")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-first-picture-") as tmp:
        big = Path(tmp) / "llama8b.onnx"
        subprocess.run([sys.executable, str(ROOT / "scripts/make_big_onnx.py"), "--shape", "8b", str(big)],
                       check=True, capture_output=True)
        models = {"phi3": ("2-layer Phi-3 export", PHI3), "8b": ("32-layer LLaMA-3-8B-shaped export", big)}
        if a.only:
            models = {a.only: models[a.only]}
        env = {**os.environ, "RLXVIZ_ALLOWED_DIRS": os.pathsep.join(str(p.parent) for _, p in models.values())}
        port = free_port()
        log = ROOT / "test-artifacts" / "bench-first-picture-server.log"
        log.parent.mkdir(exist_ok=True)
        proc = serve(a.app_root, port, env, log)
        rows: list[tuple[str, list[tuple[float, float]]]] = []
        load = os.getloadavg()
        try:
            with sync_playwright() as p:
                b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                for label, path in models.values():
                    got = []
                    for r in range(a.rounds):  # a fresh session each round, each at its own sequence length
                        ctx = b.new_context(viewport={"width": 1600, "height": 1000})
                        pg = ctx.new_page()
                        pg.set_default_timeout(WAIT_MS)
                        pg.goto(f"http://127.0.0.1:{port}/app", timeout=WAIT_MS)
                        pg.locator(".rv-after g.node").first.wait_for(timeout=WAIT_MS)
                        try:
                            got.append(open_by_path(pg, path, 8 + 8 * r))
                        except Exception:
                            pg.screenshot(path=str(log.parent / "bench-first-picture-failed.png"))
                            raise
                        ctx.close()
                    rows.append((label, got))
                b.close()
        finally:
            stop(proc)
    print(f"first picture of an .onnx opened by path: {a.app_root}")
    print(f"machine: {cpu_model()}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
          f"date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC")
    print(f"{'model':<36} {'round':>5} {'rlxviz first picture (s)':>25} {'passes done (s)':>16} "
          f"{'Model Explorer':>15}")
    for label, got in rows:
        for r, (first, done) in enumerate(got):
            print(f"{label:<36} {r + 1:>5} {first:>25.2f} {done:>16.2f} {'not measured':>15}")
        print(f"{label:<36} {'med':>5} {statistics.median(f for f, _ in got):>25.2f} "
              f"{statistics.median(d for _, d in got):>16.2f} {'not measured':>15}")
    print("Model Explorer not measured by this script (not built yet); rlxviz's column only.")


if __name__ == "__main__":
    main()
