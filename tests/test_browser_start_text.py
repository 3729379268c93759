"""The start strip's text, whole, at 1280x800 with the sidebar open (a newcomer's run: beside the open sidebar the
text got 121 px and was cut after "Three clicks: ① step through the passes…", the rest only in its tooltip; after ①
it was cut at "on the…"). Before ① and after each of ①, ② and ③ the text shows whole, in at most three lines, and
the strip is never taller than the page opened with (the graph keeps its room). Watched page (tests/served.py):
no console error, no request off the machine. Screenshots: test-artifacts/start-text-*.png."""

import pytest
from playwright.sync_api import expect
from served import ART, WAIT_MS, browser_fixture, idle, open_sidebar, shared_server_fixture, watched_page

expect.set_options(timeout=WAIT_MS)

server = shared_server_fixture()
browser = browser_fixture()

pytestmark = pytest.mark.slow

W, H = 1280, 800

CLIPPED_JS = """e => { const r = e.getBoundingClientRect();
  return { text: e.textContent, title: e.getAttribute('title'), scrollW: e.scrollWidth, clientW: e.clientWidth,
           scrollH: e.scrollHeight, clientH: e.clientHeight, width: r.width, top: r.top, bottom: r.bottom }; }"""
"""The text's box and the size its text needs: whole when what it scrolls fits what it shows."""


def _whole(pg, step: str) -> dict:
    """Assert the strip's text shows whole: not scrolled nor cut (scroll size within its client size), all of the
    tooltip's text drawn, at most three lines of 16 px, inside the strip; returns the strip's box."""
    pg.wait_for_timeout(400)  # the text and the layout settle
    note = pg.locator(".rv-start-note .rv-note-line").evaluate(CLIPPED_JS)
    strip = pg.locator(".rv-start").bounding_box()
    pg.screenshot(path=str(ART / f"start-text-{step}.png"))
    assert note["scrollH"] <= note["clientH"] + 1 and note["scrollW"] <= note["clientW"] + 1, (step, note)
    assert note["text"] == note["title"], (step, note)  # the whole line is drawn, not only in the tooltip
    assert note["clientH"] <= 3 * 16 + 1 and note["width"] >= 300, (step, note)  # readable, not a narrow column
    assert strip["y"] - 1 <= note["top"] and note["bottom"] <= strip["y"] + strip["height"] + 1, (step, note, strip)
    return strip


def test_the_start_strip_text_is_whole_beside_the_open_sidebar(browser, server):
    with watched_page(browser, server[0], W, H) as pg:
        expect(pg.locator(".rv-version select")).to_contain_text("after")
        idle(pg)
        open_sidebar(pg)
        for _ in range(40):  # the sidebar slides open
            if pg.locator("#sidebar").bounding_box()["width"] > 300:
                break
            pg.wait_for_timeout(100)
        first = _whole(pg, "steps")
        assert first["height"] <= 110, first  # as the page opens: the drop zone's height, the text beside it
        pg.locator(".rv-start-step button").click()
        expect(pg.locator(".rv-start-note")).to_contain_text("Showing after")
        assert _whole(pg, "step")["height"] <= first["height"], "the strip grew past its first height"
        pg.locator(".rv-start-break button").click()
        expect(pg.locator(".rv-message")).to_contain_text("layer 1 NOT fused", timeout=3 * WAIT_MS)
        idle(pg)
        expect(pg.locator(".rv-start-note")).to_contain_text("dead extra reader")
        assert _whole(pg, "break")["height"] <= first["height"]
        pg.locator(".rv-start-why button").click()
        expect(pg.locator(".rv-start-note")).to_contain_text("Why tab")
        assert _whole(pg, "why")["height"] <= first["height"]
