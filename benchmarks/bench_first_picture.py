"""Time to the first drawn graph of an `.onnx` file opened by path: rlxviz's app next to Model Explorer's, in one run
(issue 39: "a first picture as fast as a graph viewer").

Both viewers are served on 127.0.0.1 and driven by the same headless chromium (`/usr/bin/chromium`, the browser
tests' flags, Playwright, a 1600x1000 viewport, a fresh browser context per measurement, every request leaving
127.0.0.1 refused and counted). Each is timed the same way: the viewer's page is already open, the file's absolute
path is typed into the viewer's own path box, both servers (with their child processes) are left to go quiet
(`settle`), and the clock runs from the click that asks for the file to the first drawn graph, the page looked at
every 50 ms:

* **rlxviz** (`panel serve app.py --warm` as `make app` runs it, from this checkout or `--app-root DIR`,
  `RLXVIZ_ALLOWED_DIRS` set to the models' folders): after the default model's graph is drawn, the Folder source
  is picked, the sequence length set (a different one each round, so nothing comes from the app's caches) and the
  path typed; the clock starts at the "Load path" click. First picture: the version list names the new model's
  input (`0: input (N ops)`) and the after-pane holds its SVG drawing. Passes done (printed too, not compared):
  the version selector offers more than the input.
* **Model Explorer** (`model-explorer --host 127.0.0.1 --port P --no_open_in_browser --extensions
  model_explorer_onnx`, its pip server with the ONNX adapter, from a throwaway venv: `--me-venv`, default
  `/tmp/me-venv`, made with `pip install ai-edge-model-explorer model-explorer-onnx` when missing): on its home page
  the path is typed into "Absolute file paths (recommended for large models)" and added with Enter; the clock
  starts at the "View selected models" click. First picture: its graph renderer (`webgl-renderer`) holds a canvas
  of non-zero size. Checked by screenshots: the frame it first holds in already shows the model's collapsed graph
  (inputs, one box for the top layer, outputs); the "Processing graph..." notice lingers about 0.7 s longer and is
  not waited for (the earlier signal, in Model Explorer's favour). After the signal the canvas is screenshotted
  (untimed) and its count of non-white pixels printed, so a blank canvas would show.

Models (the first from the repo, the other two written by `scripts/make_big_onnx.py` into `--models-dir`, default
`/tmp/rlxviz-bench-first-picture`, kept there between runs and never in the repo):

* a 2-layer Phi-3 export: `tests/fixtures/onnx/zoo/phi3.dynamo-eager.onnx` (torch.onnx dynamo; 205 ONNX nodes);
* a BERT-base-sized export: 12 layers, hidden 768, 12 heads, vocab 30522, MLP width 2048, about 108 M float32
  parameters written for real (seeded random) and stored inside the one `.onnx` file (about 434 MB, as a
  BERT-base export's 436-440 MB), LLaMA-structured (the generator's decoder; no torch here);
* a 32-layer LLaMA-3-8B-shaped export with its weights as external data in a sparse file (about 28 GiB apparent,
  a few MB on disk).

Each model is opened `--rounds` times by each viewer, rlxviz then Model Explorer within a round; the table prints
every round and the median, with the machine (CPU model from /proc/cpuinfo), its load average before and after,
and the date.

    .venv/bin/python benchmarks/bench_first_picture.py                      # both viewers, three models
    .venv/bin/python benchmarks/bench_first_picture.py --only bert --rounds 1
    .venv/bin/python benchmarks/bench_first_picture.py --app-root /tmp/before --no-me
    .venv/bin/python benchmarks/bench_first_picture.py --only bert --rounds 3 --baseline-root /tmp/before

Prints figures only; nothing is asserted. Errors: a viewer that draws nothing within `BENCH_WAIT_S` (default 600 s)
raises TimeoutError (a screenshot goes to `test-artifacts/`); a server that does not answer raises RuntimeError.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
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

import psutil
from playwright.sync_api import BrowserContext, Page, Route, sync_playwright

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from served import ARGS, CHROMIUM, free_port  # noqa: E402 - the browser tests' helpers

PHI3 = ROOT / "tests/fixtures/onnx/zoo/phi3.dynamo-eager.onnx"
WAIT_MS = int(float(os.environ.get("BENCH_WAIT_S", "600")) * 1000)
ME_PACKAGES = ["ai-edge-model-explorer", "model-explorer-onnx"]
BERT_BASE = ["--layers", "12", "--hidden", "768", "--heads", "12", "--kv-heads", "12", "--intermediate", "2048",
             "--vocab", "30522"]
"""`make_big_onnx.py` sizes of the BERT-base-sized export (about 108 M parameters, 434 MB of float32)."""

POLL_S = 0.05
"""How often the page is looked at while waiting (the figures' resolution)."""

QUIET_CPU = 0.1
"""Before each click the servers (with their children) must have used less than this fraction of one core over
`QUIET_WINDOW_S` (at most `QUIET_MAX_S` is waited): no job of the last measurement or of the page's own start
(the default model's run, a spare loader's imports) runs on the clock of the next."""
QUIET_WINDOW_S = 1.0
QUIET_MAX_S = 60.0

ARTIFACTS = ROOT / "test-artifacts"


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


def start(cmd: list[str], cwd: Path, env: dict[str, str], log: Path, ready: str, what: str) -> subprocess.Popen:
    """Run `cmd` in its own process group, output to `log`; return once `ready` (a URL) answers, else stop it and
    raise RuntimeError (after 120 s or when it exits)."""
    out = open(log, "w")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    t0 = time.time()
    while True:
        try:
            urllib.request.urlopen(ready, timeout=1)
            return proc
        except OSError:
            if proc.poll() is not None or time.time() - t0 > 120:
                stop(proc)
                raise RuntimeError(f"{what} did not start; see {log}") from None
            time.sleep(0.3)


def serve_rlxviz(root: Path, port: int, env: dict[str, str], log: str = "bench-first-picture-server.log"
                 ) -> subprocess.Popen:
    """`panel serve app.py` in `root` on 127.0.0.1:`port` as `make app` serves it (`--warm`: the default model run
    and a spare loader started at server start), answering once its static files do."""
    panel = Path(sys.executable).parent / "panel"
    return start([str(panel), "serve", "app.py", "--address", "127.0.0.1", "--port", str(port), "--warm",
                  "--websocket-max-message-size", "268435456", f"--allow-websocket-origin=127.0.0.1:{port}",
                  "--num-procs", "1"], root,
                 {**env, "PYTHONPATH": str(root)}, ARTIFACTS / log,
                 f"http://127.0.0.1:{port}/static/extensions/panel/css/alerts.css", "panel serve")


def me_venv(venv: Path) -> Path:
    """The `model-explorer` command of the throwaway venv `venv`, made (`python -m venv` + `pip install` of
    `ME_PACKAGES`) when it lacks one. Raises CalledProcessError when pip fails (e.g. no route to PyPI)."""
    exe = venv / "bin" / "model-explorer"
    if not exe.exists():
        print(f"making {venv}: pip install {' '.join(ME_PACKAGES)}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *ME_PACKAGES], check=True)
    return exe


def serve_me(exe: Path, port: int) -> subprocess.Popen:
    """Model Explorer's server with the ONNX adapter on 127.0.0.1:`port`, answering once `/check_health` does."""
    return start([str(exe), "--host", "127.0.0.1", "--port", str(port), "--no_open_in_browser",
                  "--extensions", "model_explorer_onnx"], Path(tempfile.gettempdir()), dict(os.environ),
                 ARTIFACTS / "bench-first-picture-me.log", f"http://127.0.0.1:{port}/check_health", "model-explorer")


def cpu_seconds(procs: list[subprocess.Popen]) -> float:
    """CPU seconds (user + system) used so far by `procs` and their living descendants."""
    total = 0.0
    for proc in procs:
        try:
            root = psutil.Process(proc.pid)
            for p in [root, *root.children(recursive=True)]:
                try:
                    t = p.cpu_times()
                    total += t.user + t.system
                except psutil.Error:
                    continue
        except psutil.Error:
            continue
    return total


def settle(procs: list[subprocess.Popen]) -> float:
    """Wait until `procs` are quiet (`QUIET_CPU`); seconds waited (`QUIET_MAX_S` at most: a busy server is timed
    as it is)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < QUIET_MAX_S:
        c0 = cpu_seconds(procs)
        time.sleep(QUIET_WINDOW_S)
        if cpu_seconds(procs) - c0 < QUIET_CPU * QUIET_WINDOW_S:
            break
    return time.perf_counter() - t0


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


def make_models(folder: Path) -> tuple[Path, Path]:
    """(BERT-base-sized export, 32-layer 8B-shaped export) under `folder`, written when missing: the first with every
    weight inside the `.onnx` (written with external data by `make_big_onnx.py --real`, then saved as one file),
    the second with a sparse external-data file."""
    folder.mkdir(parents=True, exist_ok=True)
    gen = [sys.executable, str(ROOT / "scripts/make_big_onnx.py")]
    bert, big = folder / "bert-base-sized.onnx", folder / "llama8b.onnx"
    if not bert.exists():
        import onnx

        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            ext = Path(tmp) / "bert.onnx"
            subprocess.run([*gen, *BERT_BASE, "--real", str(ext)], check=True, capture_output=True)
            onnx.save_model(onnx.load(ext), bert.with_suffix(".part"))
        bert.with_suffix(".part").rename(bert)
    if not (big.exists() and big.with_name(big.name + ".data").exists()):
        subprocess.run([*gen, "--shape", "8b", str(big)], check=True, capture_output=True)
    return bert, big


class Outside:
    """Refuses every request a context makes outside 127.0.0.1 (and data:/blob:), counting them."""

    def __init__(self) -> None:
        self.refused: list[str] = []

    def __call__(self, route: Route) -> None:
        url = route.request.url
        if url.startswith(("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:")):
            route.continue_()
        else:
            self.refused.append(url)
            route.abort()


def fresh(browser, outside: Outside) -> tuple[BrowserContext, Page]:  # noqa: ANN001 - playwright's Browser
    """A new context and page at 1600x1000 with outside requests refused."""
    ctx = browser.new_context(viewport={"width": 1600, "height": 1000})
    ctx.route("**/*", outside)
    pg = ctx.new_page()
    pg.set_default_timeout(WAIT_MS)
    return ctx, pg


def rlxviz_open(pg: Page, port: int, path: Path, seq: int, quiet: Callable[[], object]) -> tuple[float, float]:
    """(first picture, passes done) in seconds after "Load path" is pressed for `path` at sequence length `seq`,
    once `quiet()` returned."""
    pg.goto(f"http://127.0.0.1:{port}/app", timeout=WAIT_MS)
    pg.locator(".rv-after g.node").first.wait_for(timeout=WAIT_MS)
    pg.get_by_role("button", name="Folder").click()  # nothing typed yet: a one-line note, no load
    seq_box = pg.locator(".rv-seq input").first
    seq_box.fill(str(seq))
    seq_box.press("Tab")  # the default model runs again at the new length: waited for by `quiet`
    # the path box: `.rv-path` in this checkout; an older one's only text input under the Folder source
    box = pg.locator(".rv-path input") if pg.locator(".rv-path input").count() else pg.get_by_placeholder("/")
    box.first.fill(str(path))
    quiet()
    pg.locator(".rv-progress-text").first.wait_for(state="hidden")
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


def me_open(pg: Page, port: int, path: Path, quiet: Callable[[], object]) -> tuple[float, int]:
    """(first picture in seconds after "View selected models" is clicked for `path`, once `quiet()` returned;
    non-white pixels of the drawn canvas) in Model Explorer."""
    from PIL import Image

    pg.goto(f"http://127.0.0.1:{port}/", timeout=WAIT_MS)
    box = pg.locator("model-source-input input").first
    box.fill(str(path))
    box.press("Enter")  # adds the path to the list of models to view
    view = pg.get_by_role("button", name="View selected models")
    view.wait_for()
    canvas = pg.locator("webgl-renderer canvas")

    def picture() -> bool:
        return bool(pg.evaluate("() => { const c = document.querySelector('webgl-renderer canvas');"
                                " return !!c && c.width > 0 && c.height > 0; }"))

    quiet()
    t0 = time.perf_counter()
    view.click()
    first = wait_until(pg, picture, t0)
    img = Image.open(io.BytesIO(canvas.first.screenshot())).convert("L")
    inked = sum(n for level, n in enumerate(img.histogram()) if level < 240)
    return first, inked


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--app-root", type=Path, default=ROOT, help="the checkout to serve (default: this one)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", choices=["phi3", "bert", "8b"], action="append", help="these models only (repeatable)")
    ap.add_argument("--models-dir", type=Path, default=Path(tempfile.gettempdir()) / "rlxviz-bench-first-picture")
    ap.add_argument("--me-venv", type=Path, default=Path(tempfile.gettempdir()) / "me-venv")
    ap.add_argument("--no-me", action="store_true", help="rlxviz only (Model Explorer's column says so)")
    ap.add_argument("--baseline-root", type=Path, default=None,
                    help="a second checkout (e.g. before a change) served too and timed in the same rounds, its own "
                         "column: the two rlxviz alternate which goes first each round, Model Explorer after both")
    a = ap.parse_args()
    ARTIFACTS.mkdir(exist_ok=True)
    bert, big = make_models(a.models_dir)
    models = {"phi3": ("2-layer Phi-3 export", PHI3), "bert": ("BERT-base-sized export (434 MB)", bert),
              "8b": ("32-layer 8B-shaped export", big)}
    if a.only:
        models = {k: v for k, v in models.items() if k in a.only}
    env = {**os.environ, "RLXVIZ_ALLOWED_DIRS": os.pathsep.join(sorted({str(p.parent) for _, p in models.values()}))}
    me_exe = None if a.no_me else me_venv(a.me_venv)
    rl_port, me_port = free_port(), free_port()
    load0 = os.getloadavg()
    when = datetime.datetime.now(datetime.UTC)
    procs = [serve_rlxviz(a.app_root, rl_port, env)]
    base_port = free_port() if a.baseline_root is not None else None
    if a.baseline_root is not None:
        procs.append(serve_rlxviz(a.baseline_root, base_port, env, "bench-first-picture-baseline.log"))
    rows: dict[str, list[tuple[float, float, float | None, int | None]]] = {k: [] for k in models}
    base_rows: dict[str, list[float]] = {k: [] for k in models}
    out_rl, out_me = Outside(), Outside()
    try:
        if me_exe is not None:
            procs.append(serve_me(me_exe, me_port))
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            for key, (_, path) in models.items():
                for r in range(a.rounds):
                    sides = [(rl_port, 8 + 8 * r)] + ([(base_port, 8 + 8 * r)] if base_port is not None else [])
                    for port, seq in sides[::-1] if r % 2 == 0 else sides:  # the baseline first in rounds 1, 3, ...
                        ctx, pg = fresh(b, out_rl)
                        try:
                            got = rlxviz_open(pg, port, path, seq, lambda: settle(procs))
                        except Exception:
                            pg.screenshot(path=str(ARTIFACTS / "bench-first-picture-failed.png"))
                            raise
                        finally:
                            ctx.close()
                        if port == rl_port:
                            first, done = got
                        else:
                            base_rows[key].append(got[0])
                    me_first = inked = None
                    if me_exe is not None:
                        ctx, pg = fresh(b, out_me)
                        try:
                            me_first, inked = me_open(pg, me_port, path, lambda: settle(procs))
                        except Exception:
                            pg.screenshot(path=str(ARTIFACTS / "bench-first-picture-me-failed.png"))
                            raise
                        finally:
                            ctx.close()
                    rows[key].append((first, done, me_first, inked))
                    print(f"  {key} round {r + 1}: rlxviz {first:.2f} s (passes {done:.2f} s)"
                          + (f", baseline {base_rows[key][-1]:.2f} s" if base_rows[key] else "")
                          + (f", Model Explorer {me_first:.2f} s" if me_first is not None else ""),
                          file=sys.stderr, flush=True)
            b.close()
    finally:
        for proc in procs:
            stop(proc)
    load1 = os.getloadavg()
    print(f"first picture of an .onnx opened by path; rlxviz served from {a.app_root}"
          + (f"; baseline rlxviz from {a.baseline_root}" if a.baseline_root is not None else ""))
    print(f"machine: {cpu_model()}; date: {when:%Y-%m-%d %H:%M} UTC")
    print(f"load average before: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; "
          f"after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    if me_exe is not None:
        print("Model Explorer: " + json.dumps(installed(a.me_venv)))
    print(f"requests refused (leaving 127.0.0.1): rlxviz {len(out_rl.refused)}, Model Explorer {len(out_me.refused)}")
    print()
    print(f"{'model':<34} {'round':>5} {'rlxviz first (s)':>17} {'ME first (s)':>13} {'rlxviz passes (s)':>18} "
          f"{'ME ink px':>10}")
    verdicts = []
    for key, (label, _) in models.items():
        got = rows[key]
        for r, (first, done, me_first, inked) in enumerate(got):
            me_s = f"{me_first:.2f}" if me_first is not None else "not measured"
            print(f"{label:<34} {r + 1:>5} {first:>17.2f} {me_s:>13} {done:>18.2f} {inked or '':>10}")
        rl_med = statistics.median(f for f, _, _, _ in got)
        me_vals = [m for _, _, m, _ in got if m is not None]
        me_med = statistics.median(me_vals) if me_vals else None
        me_s = f"{me_med:.2f}" if me_med is not None else "not measured"
        print(f"{label:<34} {'med':>5} {rl_med:>17.2f} {me_s:>13} {statistics.median(d for _, d, _, _ in got):>18.2f}")
        if base_rows[key]:
            print(f"{label:<34} baseline rlxviz first (s): "
                  + ", ".join(f"{v:.2f}" for v in base_rows[key]) + f"; median {statistics.median(base_rows[key]):.2f}")
        if me_med is not None:
            verdict = "rlxviz at or below" if rl_med <= me_med else f"rlxviz slower by {rl_med - me_med:.2f} s"
            verdicts.append(f"{label}: rlxviz {rl_med:.2f} s vs Model Explorer {me_med:.2f} s -> {verdict}")
    print()
    print("\n".join(verdicts) if verdicts else "Model Explorer not measured (--no-me); rlxviz's column only.")


def installed(venv: Path) -> dict[str, str]:
    """Versions of `ME_PACKAGES` in `venv` (by its pip)."""
    got = subprocess.run([str(venv / "bin" / "pip"), "list", "--format", "json"], capture_output=True, text=True)
    try:
        names = {d["name"].lower().replace("_", "-"): d["version"] for d in json.loads(got.stdout)}
    except (ValueError, KeyError):
        return {}
    return {n: names.get(n, "?") for n in ME_PACKAGES}


if __name__ == "__main__":
    main()
