"""The app served for browser tests: `panel serve app.py` on a free port, and Debian's chromium.

One place for what `test_browser_app.py`, `test_browser_security.py` and `benchmarks/bench_sessions.py` need.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

ROOT = Path(__file__).resolve().parents[1]
ART = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
START_TIMEOUT_S = 60
OWN_FTL = re.compile(r"^FusedTransformerLayer$")
"""The op name's own text element of a drawn FusedTransformerLayer (its title line is `FusedTransformerLayer`, ` `,
`%397`), not a label line that names one (`now in FusedTransformerLayer %397)`: a concat made beside a matmul the
layer absorbed)."""
WAIT_MS = 60_000  # every wait and navigation: ends as soon as met; a loaded 2-core runner answers slowly
SMALL_IR = """graph small {
  %0 = input {name="x"} : f32[2, 8]
  %1 = tanh(%0) : f32[2, 8]
  %2 = exp(%1) : f32[2, 8]
  %3 = add(%1, %2) : f32[2, 8]
  return %3
}"""
"""IR text without layer paths (four ops): typed into the IR editor by the browser tests."""


def free_port() -> int:
    """A TCP port nobody listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served_app(port: int, address: str, origins: Sequence[str], env: dict[str, str], log_name: str,
               extra: Sequence[str] = (), start_timeout_s: float = START_TIMEOUT_S) -> Iterator[float]:
    """Run `panel serve app.py` (plus `extra` arguments) until the block ends; yields the start time
    (`time.time()`, s). Used by the browser tests and `benchmarks/bench_sessions.py`.

    Raises:
        RuntimeError: the server exited or did not answer within `start_timeout_s` (its log is
            `test-artifacts/LOG_NAME`).
    """
    panel = Path(sys.executable).parent / "panel"
    ART.mkdir(exist_ok=True)
    with open(ART / log_name, "w") as log:
        proc = subprocess.Popen([str(panel), "serve", "app.py", "--address", address, "--port", str(port),
                                 *(f"--allow-websocket-origin={o}" for o in origins), "--num-procs", "1", *extra],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own process group: `--num-procs N` workers end too
        t0 = time.time()
        try:
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/static/extensions/panel/css/alerts.css",
                                           timeout=1)
                    break
                except OSError:
                    if proc.poll() is not None or time.time() - t0 > start_timeout_s:
                        raise RuntimeError(f"panel serve did not start; see test-artifacts/{log_name}") from None
                    time.sleep(0.2)
            yield t0
        finally:
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            _signal_group(proc, signal.SIGKILL)  # forked workers that outlived the server's own process


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send `sig` to the server's process group (the server and any workers it forked); gone already is fine."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@contextmanager
def chromium() -> Iterator[Browser]:
    """Debian's chromium, headless, through Playwright."""
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()


def context(browser: Browser, width: int = 1600, height: int = 1000) -> BrowserContext:
    """A browser context of `width` x `height` px whose waits and navigations time out after `WAIT_MS`."""
    ctx = browser.new_context(viewport={"width": width, "height": height})
    ctx.set_default_timeout(WAIT_MS)
    ctx.set_default_navigation_timeout(2 * WAIT_MS)
    return ctx


LOCAL = re.compile(r"^(https?|wss?)://(127\.0\.0\.1|localhost)(:\d+)?/|^(data|blob|about):")
"""URLs that stay on this machine (and the browser's own data:, blob:, about: ones)."""


@contextmanager
def watched_page(browser: Browser, url: str, width: int, height: int) -> Iterator[Page]:
    """The app at `url` in a `width` x `height` page whose console errors, page errors and requests are recorded
    from its first request, ready when the after-pane shows a node; when the block ends no request may have left
    the machine and the console must hold no error (AssertionError otherwise)."""
    ctx = context(browser, width, height)
    pg = ctx.new_page()
    seen: dict[str, list[str]] = {"urls": [], "errors": []}
    pg.on("request", lambda r: seen["urls"].append(r.url))
    pg.on("websocket", lambda ws: seen["urls"].append(ws.url))
    pg.on("console", lambda m: m.type == "error" and seen["errors"].append(m.text))
    pg.on("pageerror", lambda e: seen["errors"].append(str(e)))
    pg.goto(url)
    pg.locator(".rv-after g.node").first.wait_for()
    yield pg
    pg.wait_for_load_state("networkidle")
    outside = [u for u in seen["urls"] if not LOCAL.match(u)]
    ctx.close()
    assert seen["urls"] and not outside, outside
    assert not seen["errors"], seen["errors"]


def pane_text(loc) -> str:
    """The text a Panel pane shows (it renders inside its element's shadow root)."""
    return loc.evaluate("e => (e.shadowRoot || e).textContent")


def open_tab(pg: Page, name: str) -> None:
    """Open tab `name` and wait until the browser shows it active. A click that a server update overrode (CI, a loaded
    2-core machine: the tab stayed inactive for 60 s after one click) is clicked again, up to 3 times in all."""
    tab = pg.locator(".bk-tab", has_text=name)
    active = re.compile(r"\bbk-active\b")
    for _ in range(2):
        tab.click()
        try:
            expect(tab).to_have_class(active, timeout=15_000)
            return
        except AssertionError:
            continue
    tab.click()
    expect(tab).to_have_class(active)


VIEW_JS = """(panes) => JSON.stringify(panes.map((p) => {
  const w = document.querySelector(p + ' .rv-wrap'), i = document.querySelector(p + ' .rv-inner');
  if (!w || !i) return null;
  const box = (e) => { if (!e) return null; const r = e.getBoundingClientRect();
    return [r.x, r.y, r.width, r.height]; };
  return [box(w), i.style.transform, i.innerHTML.length, box(w.querySelector('.rv-mini'))]; }))"""
"""Each pane's view as the page draws it: its picture area's box, the picture's transform and size (characters of
its SVG), its map's box (null where a pane or a map is missing)."""


def settled(pg: Page, *panes: str, still_ms: int = 1000) -> None:
    """Wait until the views of `panes` (`.rv-after`, `.rv-before`, `.rv-why-graph`) rest: `VIEW_JS` reads the same
    for `still_ms` ms in a row (read every 250 ms), so a late picture, layout or centring lands before a test reads
    the view; AssertionError after 2 WAIT_MS of motion."""
    last, since = None, 0.0
    end = time.monotonic() + 2 * WAIT_MS / 1000
    while time.monotonic() < end:
        now, t = pg.evaluate(VIEW_JS, list(panes)), time.monotonic()
        if now != last:
            last, since = now, t
        elif (t - since) * 1000 >= still_ms:
            return
        pg.wait_for_timeout(250)
    raise AssertionError(f"{panes}: the view did not rest in {2 * WAIT_MS} ms: {last}")


def open_sidebar(pg: Page) -> None:
    """Unfold the sidebar if the page opened with it folded (a window narrower than `layout.NARROW_PX`)."""
    if pg.locator("#sidebar.hidden").count():
        pg.locator("#sidebar-button").click()
    expect(pg.locator("#sidebar")).not_to_have_class(re.compile(r"\bhidden\b"))


def idle(pg: Page) -> None:
    """Wait until no job runs (the progress text is hidden)."""
    expect(pg.locator(".rv-progress-text")).to_be_hidden(timeout=3 * WAIT_MS)


def choose_preset(pg: Page, name: str) -> None:
    """Choose built-in model `name` in the sidebar and wait until the version list is the new model's and no job
    runs."""
    open_sidebar(pg)
    pg.get_by_role("button", name="Built-in").click()
    before = pg.locator(".rv-version select").inner_text()
    pg.locator(".rv-preset select").select_option(name)
    expect(pg.locator(".rv-version select")).not_to_have_text(before, timeout=3 * WAIT_MS)
    idle(pg)


def open_path(pg: Page, path: Path | str, says: str) -> None:
    """Open the model at `path` (under the server's allowed folders) through the sidebar's Folder source, wait until
    the message names it (`says`) and no job runs."""
    open_sidebar(pg)
    pg.get_by_role("button", name="Folder").click()
    pg.locator(".rv-path input").fill(str(path))
    pg.get_by_role("button", name="Load path").click()
    expect(pg.locator(".rv-message")).to_contain_text(says, timeout=3 * WAIT_MS)
    idle(pg)


def close_inspector(pg: Page) -> None:
    """Close the node drawer (it covers the after pane's right edge while open)."""
    pg.locator(".rv-inspector-close button").click()
    expect(pg.locator(".rv-inspector-drawer")).to_be_hidden()


def choose_version(pg: Page, label: str) -> None:
    """Select the version whose label contains `label` and wait until the after-pane shows it."""
    sel = pg.locator(".rv-version select")
    sel.select_option(value=sel.locator("option", has_text=label).first.get_attribute("value"))
    expect(pg.locator(".rv-after .rv-title")).to_have_text(re.compile(re.escape(label)))


def child_cpu_seconds() -> dict[str, float]:
    """User+system CPU seconds so far of this process's children, by kind: the app server (`panel serve`), its
    children (`session.isolated`: loads, timing and overlay jobs) and the browser (chromium). For the benchmarks."""
    import psutil

    out = {"server": 0.0, "timing worker": 0.0, "browser": 0.0}
    for p in psutil.Process().children(recursive=True):
        try:
            cmd, t = " ".join(p.cmdline()), p.cpu_times()
        except psutil.Error:
            continue
        kind = ("timing worker" if "isolated.serve" in cmd else "server" if "panel" in cmd and "serve" in cmd
                else "browser" if "chrom" in cmd else None)
        if kind:
            out[kind] += t.user + t.system
    return out


FIXTURES = ROOT / "tests" / "fixtures" / "onnx"
SHARED_ENV = {"RLXVIZ_ALLOWED_DIRS": os.pathsep.join(str(FIXTURES / d) for d in ("zoo", "cases"))}
"""The environment of the served app the shared browser files use (`shared_server_fixture`): paths under the zoo's
and the handed cases' folders open; every other setting the app's default."""


class ServerPool:
    """Served apps kept for the whole pytest process, one per environment, so browser files that need the same one
    start it once (each start costs ~6 s of CPU: Panel's import, the first session, the isolated loader's spare),
    stopped when the process ends (`server_pool`)."""

    def __init__(self) -> None:
        self._stack = ExitStack()
        self._served: dict[tuple, tuple[str, float, str]] = {}

    def get(self, env: dict[str, str]) -> tuple[str, float, str]:
        """(page URL, start time, log name under test-artifacts/) of the app served with `env` over the
        environment, started on first use."""
        key = tuple(sorted(env.items()))
        if key not in self._served:
            port = free_port()
            log = f"server-shared-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{len(self._served)}.log"
            t0 = self._stack.enter_context(served_app(port, "127.0.0.1", [f"127.0.0.1:{port}"],
                                                      {**os.environ, **env}, log))
            self._served[key] = (f"http://127.0.0.1:{port}/app", t0, log)
        return self._served[key]

    def close(self) -> None:
        self._stack.close()


def pool_fixture():  # noqa: ANN201 - a pytest fixture
    """The session-scoped `server_pool` fixture (tests/conftest.py defines it with this)."""
    import pytest

    @pytest.fixture(scope="session")
    def server_pool() -> Iterator[ServerPool]:
        pool = ServerPool()
        try:
            yield pool
        finally:
            pool.close()

    return server_pool


def shared_server_fixture():  # noqa: ANN201 - a pytest fixture
    """A module-scoped fixture: the app served with `SHARED_ENV`, shared by every file of this pytest process that
    asks for it (`ServerPool`); yields (page URL, server start time, log name). For browser files whose tests leave
    nothing behind on the server that another file could see (no Timing run, no stored result)."""
    import pytest

    @pytest.fixture(scope="module")
    def server(server_pool: ServerPool) -> tuple[str, float, str]:
        return server_pool.get(SHARED_ENV)

    return server


def server_fixture(log_name: str, env: dict[str, str] | None = None):  # noqa: ANN201 - a pytest fixture
    """A module-scoped fixture serving the app (`served_app` on a free localhost port, `env` over the environment);
    it yields (page URL, server start time, log name). One definition for every browser test module that needs a
    served app of its own (`shared_server_fixture` otherwise)."""
    import pytest

    @pytest.fixture(scope="module")
    def server() -> Iterator[tuple[str, float, str]]:
        port = free_port()
        with served_app(port, "127.0.0.1", [f"127.0.0.1:{port}"], {**os.environ, **(env or {})}, log_name) as t0:
            yield f"http://127.0.0.1:{port}/app", t0, log_name

    return server


def browser_fixture():  # noqa: ANN201 - a pytest fixture
    """A module-scoped fixture: Debian's chromium, headless (`chromium`)."""
    import pytest

    @pytest.fixture(scope="module")
    def browser() -> Iterator[Browser]:
        with chromium() as b:
            yield b

    return browser
