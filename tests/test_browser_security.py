"""Hostile model text in a real browser (issue 15): `panel serve app.py` listening on every interface, driven
by Playwright with Debian's chromium.

* `xss_paths.ir` (markup in the graph name, node names and paths) and an invalid graph that quotes such paths
  in its error are loaded; every view that shows model text is opened and every node clicked. No script runs
  (`alert` is replaced before the page's scripts and would set `window.__pwned`; no dialog opens) and no
  request leaves the server's own origin. The text is shown literally.
* A session from a non-loopback address is refused with a clear page (remote use needs `RLXVIZ_ALLOW_REMOTE`).
"""

import os
import socket
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import expect
from served import ART, WAIT_MS, chromium, close_inspector, context, free_port, open_tab, served_app

DATA = Path(__file__).parent / "data" / "reliability"

HOOK = """
window.__pwned = false;
for (const f of ['alert', 'confirm', 'prompt']) { window[f] = () => { window.__pwned = true; }; }
"""


DEEP_TEXT = """(el) => { const out = [];
  const walk = (n) => { if (n.nodeType === 3) out.push(n.textContent);
    if (n.shadowRoot) walk(n.shadowRoot); for (const c of n.childNodes) walk(c); };
  walk(el); return out.join(''); }"""
"""The text under an element, shadow roots included (Panel renders panes inside them)."""


def _outside_address() -> str | None:
    """An address of this machine that is not loopback (what a client on another machine would connect to)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            ip = s.getsockname()[0]
    except OSError:
        return None
    return None if ip.startswith("127.") else ip


@pytest.fixture(scope="module")
def server():
    port = free_port()
    outside = _outside_address()
    env = {k: v for k, v in os.environ.items() if k != "RLXVIZ_ALLOW_REMOTE"}
    origins = [f"127.0.0.1:{port}"] + ([f"{outside}:{port}"] if outside else [])
    with served_app(port, "0.0.0.0", origins, env, "server-security.log"):
        yield port, outside


@pytest.fixture(scope="module")
def browser():
    with chromium() as b:
        yield b


@contextmanager
def _guarded_page(browser, origin: str):
    """The app at `origin` + /app in a page whose dialogs, script hook and requests outside `origin` are recorded
    (outside ones aborted); yields (page, what was seen), its context closed at the end."""
    ctx = context(browser, 1600, 1000)
    ctx.add_init_script(HOOK)
    seen = {"dialogs": [], "outside": []}

    def route(r):
        if r.request.url.startswith(origin) or r.request.url.startswith(("data:", "blob:")):
            r.continue_()
        else:
            seen["outside"].append(r.request.url)
            r.abort()

    ctx.route("**/*", route)
    try:
        pg = ctx.new_page()
        pg.on("dialog", lambda d: (seen["dialogs"].append(d.message), d.dismiss()))
        pg.set_default_timeout(60_000)
        pg.goto(origin + "/app", timeout=120_000)
        yield pg, seen
    finally:
        ctx.close()


def _assert_clean(pg, seen):
    assert pg.evaluate("window.__pwned") is False
    assert seen["dialogs"] == [] and seen["outside"] == []
    assert pg.locator("script:not([src])", has_text="alert(").count() == 0
    assert pg.evaluate("document.querySelectorAll('[onerror], [onload]').length") == 0


def _paste_ir(pg, text):
    """Replace the IR editor's text (Panel's CodeEditor, Ace) as a paste would."""
    pg.locator(".rv-ir-text .ace_content").click()
    pg.keyboard.press("Control+a")
    pg.keyboard.insert_text(text)


def _gutter_tooltip(pg, mark, text: str):
    """Hover a gutter mark until Ace shows the tooltip holding *text* (the page may hold other, empty Ace
    tooltips; a loaded machine can miss the first mouse move, so it moves away and back, up to 5 times)."""
    tip = pg.locator(".ace_tooltip", has_text=text)
    for _ in range(5):
        pg.mouse.move(0, 0)
        mark.hover()
        try:
            tip.wait_for(state="visible", timeout=5_000)
            break
        except PlaywrightTimeout:
            continue
    return tip


def _inspected_text(pg) -> str:
    """What the node inspector shows for each node of the after-pane, clicked in turn, joined by lines."""
    shown = []
    for i in range(pg.locator(".rv-after g.node").count()):
        node = pg.locator(".rv-after g.node").nth(i)
        key = node.get_attribute("id") or ""
        node.click()
        if key.startswith("n") and key[1:].isdigit():  # an IR node: wait until the inspector tells it (a loaded
            # machine took longer than a fixed 400 ms, and the text read was the drawer's style alone)
            expect(pg.locator(".rv-inspector").first).to_contain_text(f"%{key[1:]}", timeout=WAIT_MS)
        else:
            pg.wait_for_timeout(400)
        shown.append(pg.locator(".rv-inspector").first.evaluate(DEEP_TEXT))
        if pg.locator(".rv-inspector-drawer").is_visible():  # a node that is not an IR node opens none
            close_inspector(pg)
    return "\n".join(shown)


def test_hostile_model_text_is_shown_as_text_everywhere(browser, server):
    port, _ = server
    origin = f"http://127.0.0.1:{port}"
    with _guarded_page(browser, origin) as (pg, seen):
        pg.locator(".rv-after g.node").first.wait_for(timeout=60_000)
        pg.get_by_role("button", name="IR text").click()
        _paste_ir(pg, (DATA / "xss_paths.ir").read_text())
        pg.locator(".rv-load-ir button").click()
        expect(pg.locator(".rv-version select")).to_contain_text("0: input (3 ops)")
        # node inspector: click every node; together they show every hostile path and name, literally
        text = _inspected_text(pg)
        for literal in ('"><script>alert(1)</script>', "<img src=x onerror=alert(2)>",
                        "a`<img src=x onerror=alert(3)>`b", "![t](http://example.org/leak.png)",
                        'x\\"><script>alert(8)</script>'):
            assert literal in text, (literal, text)
        _assert_clean(pg, seen)
        for tab in ("Matches & rejections", "Why didn't layer N fuse?", "Timing", "IR & diff"):
            pg.locator(".bk-tab", has_text=tab).click()
            pg.wait_for_timeout(800)
        expect(pg.locator(".rv-ir")).to_contain_text('@"<img src=x onerror=alert(2)>"')  # the IR, as text
        _assert_clean(pg, seen)
        # an invalid graph whose error message quotes the hostile lines: the status bar shows them as text
        bad = (DATA / "xss_paths.ir").read_text().replace("exp(%2) : f32[2, 4]", "exp(%2) : f32[3, 4]")
        open_tab(pg, "IR editor")  # the source is IR text already
        _paste_ir(pg, bad)
        pg.locator(".rv-load-ir button").click()
        expect(pg.locator(".rv-message")).to_contain_text("@![t](http://example.org/leak.png)")
        # the editor marks the line of the node the error names; its tooltip quotes the hostile path as text
        mark = pg.locator(".rv-ir-text .ace_gutter-cell.ace_error")
        expect(mark).to_have_count(1)
        tip = _gutter_tooltip(pg, mark, "%3 (exp @![t](http://example.org/leak.png)): declared")
        expect(tip).to_be_visible()
        pg.screenshot(path=str(ART / "app-hostile-text.png"))
        _assert_clean(pg, seen)


TEX_IR = """graph "tex $$y^2$$" {
  %0 = input {name="x"} : f32[2, 4] @"$$\\\\sum_i a_i$$ \\\\(x^2\\\\)"
  %1 = relu(%0) : f32[2, 4] @"$$x^2$$"
  return %1
}
"""


def test_tex_in_model_text_is_shown_as_text_and_no_mathjax_is_loaded(browser, server):
    """TeX delimiters in node paths reach the inspector as written (no MathJax typesets them), and the page
    loads no MathJax bundle (`main.no_mathjax`)."""
    port, _ = server
    origin = f"http://127.0.0.1:{port}"
    with _guarded_page(browser, origin) as (pg, seen):
        pg.locator(".rv-after g.node").first.wait_for(timeout=60_000)
        scripts = pg.evaluate("[...document.scripts].map(s => s.src)")
        assert scripts and not [u for u in scripts if "mathjax" in u.lower()], scripts
        pg.get_by_role("button", name="IR text").click()
        _paste_ir(pg, TEX_IR)
        pg.locator(".rv-load-ir button").click()
        expect(pg.locator(".rv-version select")).to_contain_text("0: input (1 ops)")
        text = _inspected_text(pg)
        for literal in ("$$x^2$$", "$$\\sum_i a_i$$ \\(x^2\\)"):
            assert literal in text, (literal, text)
        assert pg.locator(".rv-inspector mjx-container, .rv-inspector svg").count() == 0
        _assert_clean(pg, seen)


def test_a_session_from_another_machine_is_refused(browser, server):
    port, outside = server
    if outside is None:
        pytest.skip("this machine has no non-loopback address to connect from")
    origin = f"http://{outside}:{port}"
    with _guarded_page(browser, origin) as (pg, seen):
        expect(pg.locator(".rv-refused")).to_contain_text("only serves this machine", timeout=60_000)
        expect(pg.locator(".rv-refused")).to_contain_text("RLXVIZ_ALLOW_REMOTE=1")
        assert pg.locator(".rv-after").count() == 0 and pg.locator(".rv-ir-text").count() == 0
        _assert_clean(pg, seen)
