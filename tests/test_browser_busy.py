"""Issue 39's busy-machine flag on a forced busy run, in the real page: the server runs with `RLXVIZ_FORCE_BUSY`
(`app.timeproc.force_busy`: every round but each row's fastest 3x slower, as a busy machine leaves them), and the
Timing tab says "Busy machine" above every ratio, and says "faster" or "slower" nowhere: not in the chart's labels,
the table or the fusion/kernels rows. "Time again" is a button that looks like one, and measures anew (busy again).
At 1280x800 and 1920x1080; every page is watched (tests/served.py): no console error, no request off the machine.
"""

import re
import time

import pytest
from playwright.sync_api import expect
from served import ART, WAIT_MS, browser_fixture, pane_text, server_fixture, watched_page
from test_browser_timing import BARS_JS, PLOTS_JS, time_bert_tiny

from rlxviz.app.timeproc import FORCE_BUSY_ENV
from rlxviz.app.timingchart import BUSY_SPEEDUP_HEAD
from rlxviz.session.timing import NOT_READ

expect.set_options(timeout=WAIT_MS)

server = server_fixture("server-busy.log", env={FORCE_BUSY_ENV: "1"})
browser = browser_fixture()

pytestmark = pytest.mark.slow


def _idle(pg):
    expect(pg.locator(".rv-progress-text")).to_be_hidden(timeout=3 * WAIT_MS)


def _read_busy(pg):
    """The Timing tab of a busy run: the verdict first, no "faster"/"slower" anywhere, every verdict not read."""
    machine = pg.locator(".rv-machine")
    expect(machine).to_contain_text("Busy machine")
    chart = pg.locator(".rv-timing-chart")
    expect(chart.locator("canvas").first).to_be_visible()
    assert machine.bounding_box()["y"] < chart.bounding_box()["y"]  # the verdict before any ratio
    bars = pg.evaluate(BARS_JS)
    assert bars, "no timing chart data in the page"
    for b in bars:
        assert not any(re.search(r"faster|slower", t) for t in b["xl"]), b["xl"]
    # no empty speed-up plot (only its rule at 1): a message with the busy flag's figures in its place
    note = chart.locator(".rv-speedup-busy")
    expect(note).to_contain_text(BUSY_SPEEDUP_HEAD)
    expect(note).to_contain_text(re.compile(r"\d+\.\d+ ms"))
    assert not [p for p in pg.evaluate(PLOTS_JS) if p["title"].startswith("speed-up")]
    table = pg.locator(".rv-timings")
    words = " ".join(table.locator(".tabulator-cell").all_inner_texts())
    assert NOT_READ in words and not re.search(r"\bfaster\b|\bslower\b", words), words
    # the speed-up column holds no number, the input's own row included, as `rlxviz time`'s `x input` (`speedup_text`)
    speed = table.locator(".tabulator-row .tabulator-cell[tabulator-field=speedup]")
    cells = [c.strip() for c in speed.all_inner_texts()]
    assert cells and all(c == NOT_READ for c in cells), cells
    split = pg.locator(".rv-fusion-kernels")
    expect(split).to_contain_text("Fusion or kernels?")
    text = pane_text(split)
    assert not re.search(r"\bfaster\b|\bslower\b", text), text
    if "MLX's own lowering" in text:  # on the CPU: the split's own check says busy too
        assert "busy machine" in text, text


@pytest.mark.parametrize("size", [(1280, 800), (1920, 1080)])
def test_a_forced_busy_run_reads_busy_first_and_no_faster(browser, server, size):
    with watched_page(browser, server[0], *size) as pg:
        time_bert_tiny(pg)
        _read_busy(pg)
        pg.screenshot(path=str(ART / f"busy-{size[0]}x{size[1]}.png"))
        # "Time again" looks like a button (it read as plain text): a visible border in the accent colour, a
        # pointer, and a box of a button's size
        again = pg.locator(".rv-time-again button")
        expect(again).to_be_visible()
        look = again.evaluate("""b => { const c = getComputedStyle(b);
            return [c.borderTopWidth, c.borderTopStyle, c.borderTopColor, c.backgroundColor, c.cursor]; }""")
        assert float(look[0].rstrip("px")) >= 1 and look[1] != "none", look
        assert look[2] != look[3] and look[2] not in ("rgba(0, 0, 0, 0)", "transparent"), look
        assert look[4] == "pointer", look
        box = again.bounding_box()
        assert box["height"] >= 24 and box["width"] >= 80, box
        figures = pane_text(pg.locator(".rv-machine"))  # the worst row's median and minimum, ms
        again.click()  # measures anew: other figures, busy again
        deadline = time.time() + 5 * WAIT_MS / 1000  # (the pane lies in nested shadow roots: polled from here)
        while pane_text(pg.locator(".rv-machine")) == figures and time.time() < deadline:
            pg.wait_for_timeout(500)
        assert pane_text(pg.locator(".rv-machine")) != figures, "Time again measured nothing anew"
        _idle(pg)
        _read_busy(pg)
