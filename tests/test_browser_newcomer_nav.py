"""What the last newcomer run found misleading, in a real browser (issue 39): the search finds a softmax absorbed into
the fused attention and says so, the minimap is readable with a labelled head whose × covers none of it, the version
strip says why the numbers skip, "Time again" waits for a timing, the round boxes clamp out-of-range values with a
message, and the empty IR editor reads as an editor. `test_app_newcomer_nav.py` checks the same without a browser.

`panel serve app.py` on a free localhost port (tests/served.py), Debian's chromium at 1280x800; the page's console
must stay free of errors and no request may leave the machine. Screenshots go to test-artifacts/newcomer-nav-*.png.
"""

import re

import pytest
from playwright.sync_api import expect
from served import ART, WAIT_MS, browser_fixture, choose_version, open_tab, server_fixture, watched_page

from rlxviz.session import MAX_REPEAT

pytestmark = pytest.mark.slow
expect.set_options(timeout=WAIT_MS)

server = server_fixture("server-newcomer-nav.log")
browser = browser_fixture()


def _inside(inner: dict, outer: dict) -> bool:
    return (inner["x"] >= outer["x"] - 1 and inner["y"] >= outer["y"] - 1
            and inner["x"] + inner["width"] <= outer["x"] + outer["width"] + 1
            and inner["y"] + inner["height"] <= outer["y"] + outer["height"] + 1)


def test_newcomer_findings_at_1280(browser, server):
    """One session (a page load costs 20-50 s on the shared 2-core machine)."""
    with watched_page(browser, server[0], 1280, 800) as pg:
        _minimap_is_readable_and_its_close_covers_nothing(pg)
        _the_strip_says_why_numbers_skip(pg)
        _search_finds_an_absorbed_softmax(pg)
        _timing_rounds_clamp_and_time_again_waits(pg)
        _empty_ir_editor_reads_as_an_editor(pg)


def _minimap_is_readable_and_its_close_covers_nothing(pg):
    mini = pg.locator(".rv-after .rv-mini")
    expect(mini).to_be_visible()  # MiniLM's full graph is taller than the pane
    box = mini.bounding_box()
    assert box["width"] >= 90 and box["height"] <= 200, box  # it was ~19 px wide: a stray scrollbar
    expect(pg.locator(".rv-after .rv-mini-label")).to_contain_text("map")
    body = pg.locator(".rv-after .rv-mini-body").bounding_box()
    close = pg.locator(".rv-after .rv-mini-close").bounding_box()
    assert close["y"] + close["height"] <= body["y"] + 1, (close, body)  # the × sits in the head, above the picture
    assert body["height"] > 60 and body["width"] >= 90, body
    pane = pg.locator(".rv-after .rv-wrap").bounding_box()  # newcomer run 18: 170 x 176 px covered ~40% at 1280
    assert body["width"] <= 0.25 * pane["width"] + 1 and body["height"] <= 0.25 * pane["height"] + 1, (body, pane)
    view = pg.locator(".rv-after .rv-mini-view").bounding_box()
    assert _inside(view, body), (view, body)  # the frame of the visible part is inside the (cropped) map
    pg.screenshot(path=str(ART / "newcomer-nav-minimap.png"))
    pg.locator(".rv-after .rv-mini-close").click()
    expect(mini).to_be_hidden()
    pg.locator(".rv-after .rv-map").click()
    expect(mini).to_be_visible()


def _the_strip_says_why_numbers_skip(pg):
    note = pg.locator(".rv-version label", has_text="hidden")
    expect(note).to_have_text(re.compile(r"Version · \d+ unchanged steps? hidden"))
    box, select = note.bounding_box(), pg.locator(".rv-version select").bounding_box()
    assert box["width"] <= select["width"] + 1, (box, select)  # the label stays over its list
    # the first version after hidden steps names them in its chip's tooltip
    titles = pg.locator(".rv-counts .rv-chip").evaluate_all("cs => cs.map((c) => c.title)")
    assert any(re.search(r"steps? \d+(-\d+)? changed nothing, hidden", t) for t in titles), titles
    pg.locator(".rv-hide input").uncheck()
    expect(note).to_have_count(0)
    pg.locator(".rv-hide input").check()
    expect(note).to_have_count(1)


def _search_finds_an_absorbed_softmax(pg):
    choose_version(pg, "after fuse_sdpa")
    # the before pane opens beside it (the input showed one pane): type once both are laid out
    expect(pg.locator(".rv-before .rv-title")).to_have_text("before fuse_sdpa")
    pg.locator(".rv-before g.node").first.wait_for()
    pg.wait_for_timeout(500)
    found = pg.locator(".rv-after .rv-found")
    box = pg.locator(".rv-after .rv-search")
    box.fill("softmax")  # no softmax node is left after fuse_sdpa: the attention node absorbed it
    expect(found).to_have_text(re.compile(r"^1/\d+$"))
    note = pg.locator(".rv-after .rv-found-note")
    expect(note).to_have_text(re.compile(r"^softmax: absorbed into \S+ %\d+ \(layer \d+\)$"))
    hit = pg.locator(".rv-after g.rv-found-node").first
    node = hit.bounding_box()
    wrap = pg.locator(".rv-after .rv-wrap").bounding_box()
    seen_w = min(node["x"] + node["width"], wrap["x"] + wrap["width"]) - max(node["x"], wrap["x"])
    seen_h = min(node["y"] + node["height"], wrap["y"] + wrap["height"]) - max(node["y"], wrap["y"])
    assert seen_w >= node["width"] / 2 and seen_h >= node["height"] / 2, (node, wrap)  # centred: in the pane
    pg.screenshot(path=str(ART / "newcomer-nav-search-absorbed.png"))
    # exact node matches still come first: in the before pane the softmax nodes themselves, with no note
    before = pg.locator(".rv-before .rv-search")
    before.fill("softmax")
    expect(pg.locator(".rv-before .rv-found")).to_have_text(re.compile(r"^1/\d+$"))
    expect(pg.locator(".rv-before .rv-found-note")).to_be_hidden()
    bar = pg.locator(".rv-after .rv-bar").bounding_box()
    assert bar["height"] < 30, bar  # the note wraps no button onto a second line
    box.fill("")
    expect(note).to_be_hidden()
    before.fill("")


def _timing_rounds_clamp_and_time_again_waits(pg):
    open_tab(pg, "Timing")
    expect(pg.locator(".rv-time button")).to_be_visible()
    expect(pg.locator(".rv-time-again")).to_be_hidden()  # nothing timed yet: nothing to time again
    repeat = pg.locator(".rv-repeat input")
    repeat.fill(str(MAX_REPEAT + 4000))
    repeat.press("Enter")
    expect(repeat).to_have_value(str(MAX_REPEAT))
    expect(pg.locator(".rv-message")).to_contain_text(f"out of range 1..{MAX_REPEAT}")
    warmup = pg.locator(".rv-warmup input")
    warmup.fill("-3")
    warmup.press("Enter")
    expect(warmup).to_have_value("0")
    expect(pg.locator(".rv-message")).to_contain_text("Untimed rounds -3 is out of range 0..")
    # no whole number (the page's integer box made 2.5 into 25 and put back abc unsaid): said, the rounds stay
    repeat.fill("2.5")
    repeat.press("Enter")
    expect(pg.locator(".rv-message")).to_contain_text(f"Timed rounds must be a whole number; 2.5 is not, so it stays "
                                                      f"{MAX_REPEAT}.")
    expect(repeat).to_have_value(str(MAX_REPEAT))
    warmup.fill("abc")
    warmup.press("Enter")
    expect(pg.locator(".rv-message")).to_contain_text("Untimed rounds must be a whole number; abc is not")
    expect(warmup).to_have_value("0")
    repeat.fill("3")
    repeat.press("Enter")
    expect(pg.locator(".rv-message")).not_to_contain_text("out of range")
    expect(pg.locator(".rv-message")).to_contain_text("Untimed rounds must be")  # the other box's note stays
    warmup.fill("1")
    warmup.press("Enter")
    expect(pg.locator(".rv-message")).not_to_contain_text("whole number")


def _empty_ir_editor_reads_as_an_editor(pg):
    open_tab(pg, "IR editor")
    hint = pg.locator(".rv-ir-placeholder")
    expect(hint).to_be_visible()
    expect(hint).to_contain_text("paste or type IR text")
    expect(hint).to_contain_text(re.compile(r"%1 = tanh\(%0\)"))
    editor = pg.locator(".rv-ir-text").first
    assert editor.bounding_box()["height"] >= 250
    border = editor.evaluate("el => getComputedStyle(el).borderTopWidth")
    assert float(border.rstrip("px")) >= 1, border
    pg.screenshot(path=str(ART / "newcomer-nav-ir-editor.png"))
    pg.locator(".rv-ir-text .ace_content").click()
    pg.keyboard.type("graph g {")
    expect(hint).to_be_hidden()
