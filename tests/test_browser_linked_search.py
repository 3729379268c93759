"""A newcomer run's finding, in a real browser: with MiniLM after ①, `softmax` searched in the before pane panned the
linked after pane so that its own hit (the attention node that absorbed a softmax, named by its note) sat cut off at
the pane's left edge. Each pane's shown hit must be inside its pane: the after pane centres the node that absorbed
the before pane's hit where it lacks that node itself, and its own hit where it has one (graphpane.js `onBus`).

`panel serve app.py` on a free localhost port (tests/served.py), Debian's chromium at 1280x800; the page's console
must stay free of errors and no request may leave the machine. Screenshot: test-artifacts/linked-search.png.
"""

import re

import pytest
from playwright.sync_api import expect
from served import ART, WAIT_MS, browser_fixture, idle, settled, shared_server_fixture, watched_page

pytestmark = pytest.mark.slow
expect.set_options(timeout=WAIT_MS)

server = shared_server_fixture()
browser = browser_fixture()


def _hit_box(pg, pane: str) -> tuple[dict, dict]:
    """(the box of the node the pane's counter shows, the pane's viewport box)."""
    key = pg.locator(f"{pane} .rv-found").get_attribute("data-hit")
    node = pg.locator(f"{pane} .rv-inner g#{key}").bounding_box()
    return node, pg.locator(f"{pane} .rv-wrap").bounding_box()


def _inside(node: dict, wrap: dict) -> bool:
    return (node["x"] >= wrap["x"] - 1 and node["y"] >= wrap["y"] - 1
            and node["x"] + node["width"] <= wrap["x"] + wrap["width"] + 1
            and node["y"] + node["height"] <= wrap["y"] + wrap["height"] + 1)


def test_a_search_in_one_pane_keeps_both_panes_hits_in_view(browser, server):
    with watched_page(browser, server[0], 1280, 800) as pg:
        pg.locator(".rv-start-step button").click()
        expect(pg.locator(".rv-start-note")).to_contain_text("Showing after")
        idle(pg)
        pg.locator(".rv-before g.node").first.wait_for()
        settled(pg, ".rv-before", ".rv-after")  # type once both panes are laid out
        after, before = pg.locator(".rv-after .rv-search"), pg.locator(".rv-before .rv-search")
        after.fill("softmax")  # the after pane's hit: the fused attention that absorbed a softmax
        expect(pg.locator(".rv-after .rv-found")).to_have_text(re.compile(r"^1/\d+$"))
        expect(pg.locator(".rv-after .rv-found-note")).to_have_text(re.compile(r"^softmax: absorbed into "))
        before.fill("softmax")  # the before pane's hit: a softmax node; the after pane follows it
        expect(pg.locator(".rv-before .rv-found")).to_have_text(re.compile(r"^1/\d+$"))
        settled(pg, ".rv-before", ".rv-after")  # both panes centred (the after pane follows the before pane's hit)
        pg.screenshot(path=str(ART / "linked-search.png"))
        for pane in (".rv-before", ".rv-after"):
            node, wrap = _hit_box(pg, pane)
            assert _inside(node, wrap), (pane, node, wrap)
        # the next hit (Enter: the first shows hit 1, the second steps on) in the before pane: both hits still in view
        before.press("Enter")
        expect(pg.locator(".rv-before .rv-found")).to_have_text(re.compile(r"^1/\d+$"))
        before.press("Enter")
        expect(pg.locator(".rv-before .rv-found")).to_have_text(re.compile(r"^2/\d+$"))
        settled(pg, ".rv-before", ".rv-after")
        for pane in (".rv-before", ".rv-after"):
            node, wrap = _hit_box(pg, pane)
            assert _inside(node, wrap), (pane, "after Enter", node, wrap)
