"""A drawing's title is text above the picture, readable at any zoom (newcomer findings, rlxviz issue 39).

The Why tab's layer drawing carried its long title (`fused as far as rlxviz's ops go: △ ... @ %207: default_scale
...; before fuse_attention_block, in this layer: ...`) as the graph's DOT label: at the fit zoom of a tall layer at
1280x800 it rendered 4-5 px high. The app draws its panes untitled and shows the title (`session.render.caption`) in
the pane's `rv-caption` line over the top of the picture area, set as text, the picture fitted below it; the Graph
tab's panes do the same."""

from pathlib import Path

import pytest
from playwright.sync_api import expect
from served import ART, WAIT_MS, browser_fixture, idle, open_sidebar, open_tab, shared_server_fixture, watched_page

GRANITE = Path(__file__).parent / "fixtures" / "onnx" / "cases" / "granite.onnx"

pytestmark = pytest.mark.slow
expect.set_options(timeout=WAIT_MS)

server = shared_server_fixture()
browser = browser_fixture()

CAPTION_JS = """(e) => { const s = getComputedStyle(e); const r = e.getBoundingClientRect();
  return {size: parseFloat(s.fontSize), top: r.top, bottom: r.bottom, text: e.textContent,
          kids: e.children.length}; }"""
"""A caption's font size (px), where it lies, its text and how many elements it holds (none: text, never markup)."""


def _readable(cap, svg) -> dict:
    """The caption's figures, asserted readable, outside the picture and over its area's top, the fitted picture
    below it (nothing of the drawing under the text)."""
    got = cap.evaluate(CAPTION_JS)
    assert got["size"] >= 11 and got["kids"] == 0 and cap.evaluate("e => e.closest('svg') === null"), got
    assert abs(got["top"] - svg.evaluate("e => e.closest('.rv-wrap').getBoundingClientRect().top")) <= 2, got
    assert svg.evaluate("e => e.getBoundingClientRect().top") >= got["bottom"] - 1, got
    return got


def test_the_why_and_graph_titles_are_html_text_above_the_drawing(browser, server):
    with watched_page(browser, server[0], 1280, 800) as pg:
        open_sidebar(pg)
        pg.get_by_role("button", name="Folder").click()
        pg.locator(".rv-path input").fill(str(GRANITE))
        pg.get_by_role("button", name="Load path").click()
        expect(pg.locator(".rv-after .rv-title")).to_contain_text("input", timeout=3 * WAIT_MS)
        expect(pg.locator(".rv-after .rv-caption")).to_have_text("granite: 137 ops", timeout=3 * WAIT_MS)
        idle(pg)
        svg = pg.locator(".rv-after svg")
        _readable(pg.locator(".rv-after .rv-caption"), svg)
        assert "137 ops" not in svg.text_content()

        open_tab(pg, "Why didn't layer N fuse?")
        cap = pg.locator(".rv-caption:visible", has_text="in this layer")
        expect(cap).to_contain_text("fused as far as rlxviz's ops go: △ fuse_attention_block.qkv_attention_out @ %207")
        expect(cap).to_contain_text("before fuse_attention_block, in this layer: ")
        svg = pg.locator(".rv-wrap svg:visible", has_text="attention").first
        got = _readable(cap, svg)
        assert "default_scale" in got["text"] and "in this layer" not in svg.text_content()
        pg.screenshot(path=str(ART / "drawing-title-why-1280x800.png"))
