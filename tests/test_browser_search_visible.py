"""Newcomer run, in a real browser: the search "found" a node the user could not see.

(a) glm by path, 1280x800, version 26, the node drawer opened and closed: `node_Softmax_274` answered `1/1` and
ringed attention %298, drawn almost wholly left of the after pane; `o_proj` put its matmul wholly outside. The pane
had been centred for its size at the search, then resized (the row took the before pane beside it): the view kept
its top-left corner, not its centre. (b) roberta, collapsed view, the drawer open: the hit was centred in the pane,
under the drawer (only the ring's left edge showed). Now the hit is centred in the part of the pane the drawer leaves
visible, and a pane that changes size keeps its view's centre.

`panel serve app.py` on a free localhost port (tests/served.py), Debian's chromium; the page's console must stay free
of errors and no request may leave the machine."""

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect
from served import (
    WAIT_MS,
    browser_fixture,
    close_inspector,
    idle,
    open_sidebar,
    settled,
    shared_server_fixture,
    watched_page,
)

pytestmark = pytest.mark.slow
expect.set_options(timeout=WAIT_MS)

FIX = Path(__file__).parent / "fixtures" / "onnx"
server = shared_server_fixture()
browser = browser_fixture()


def _load(pg: Page, path: Path) -> None:
    """Load the ONNX file at `path` through the sidebar's Folder box and wait until no job runs."""
    open_sidebar(pg)
    pg.get_by_role("button", name="Folder").click()
    pg.locator(".rv-path input").fill(str(path))
    pg.get_by_role("button", name="Load path").click()
    expect(pg.locator(".rv-message")).to_contain_text(path.name.split(".")[0], timeout=3 * WAIT_MS)
    idle(pg)


def _visible(pg: Page) -> tuple[float, float, float, float]:
    """The after pane's picture area not under the node drawer, as (left, top, right, bottom) page px."""
    w = pg.locator(".rv-after .rv-wrap").bounding_box()
    right = w["x"] + w["width"]
    drawer = pg.locator(".rv-inspector-drawer")
    if drawer.is_visible():
        right = min(right, drawer.bounding_box()["x"])
    return w["x"], w["y"], right, w["y"] + w["height"]


def _shown(pg: Page, query: str, enter: bool = False) -> str:
    """Search the after pane for `query` (and press Enter when `enter`); the key of the hit, once its whole box (or
    its folded layer's) lies in the pane's visible area (AssertionError with both boxes otherwise)."""
    box, found = pg.locator(".rv-after .rv-search"), pg.locator(".rv-after .rv-found")
    if enter:
        box.press("Enter")
    else:
        box.fill(query)
    expect(found).to_have_text(re.compile(r"^\d+/\d+$"))
    idle(pg)
    settled(pg, ".rv-after")  # a late layout of the row (the before pane placed beside) moved the hit away
    key = found.get_attribute("data-hit")
    g = pg.locator(f".rv-after .rv-inner g#{key}")  # else the folded layer's box that holds it, ringed
    b = (g if g.count() else pg.locator(".rv-after .rv-inner g.rv-found-node").first).bounding_box()
    left, top, right, bottom = _visible(pg)
    assert (left <= b["x"] and b["x"] + b["width"] <= right and top <= b["y"]
            and b["y"] + b["height"] <= bottom), (query, key, b, (left, top, right, bottom))
    return key


def test_a_hit_lies_in_the_pane_after_the_row_changed_and_the_drawer_closed(browser, server):
    with watched_page(browser, server[0], 1280, 800) as pg:
        idle(pg)
        _load(pg, FIX / "zoo" / "glm.dynamo-eager.onnx")
        sel = pg.locator(".rv-version select")
        sel.select_option(value=sel.locator("option", has_text="26: after dead_code").first.get_attribute("value"))
        idle(pg)
        key = _shown(pg, "post_attention_layernorm")
        pg.locator(f".rv-after .rv-inner g#{key}").click()
        expect(pg.locator(".rv-inspector-drawer")).to_be_visible()
        close_inspector(pg)
        idle(pg)
        assert _shown(pg, "node_Softmax_274") == "n298"
        expect(pg.locator(".rv-after .rv-found-note")).to_contain_text("node_Softmax_274 (softmax): absorbed into")
        assert _shown(pg, "node_Softmax_274", enter=True) == "n298"
        _shown(pg, "o_proj")
        _shown(pg, "o_proj", enter=True)


def test_a_hit_is_centred_beside_the_open_drawer_not_under_it(browser, server):
    with watched_page(browser, server[0], 1280, 800) as pg:
        idle(pg)
        _load(pg, FIX / "cases" / "roberta.onnx")
        pg.locator(".rv-view select").select_option("collapsed")
        idle(pg)
        # the collapsed picture (layer boxes), not the full one it replaces: a click on the full picture's node, just
        # before it went, opened no drawer (beside two CPU burners, 2026-12-07)
        expect(pg.locator(".rv-after .rv-inner g.node#layer0")).to_be_attached()
        settled(pg, ".rv-after")
        pg.locator(".rv-after .rv-inner g.node").first.click()  # the drawer opens, and stays open
        expect(pg.locator(".rv-inspector-drawer")).to_be_visible()
        _shown(pg, "encoder.layer.1.output.dense")
        _shown(pg, "encoder.layer.1.output.dense", enter=True)
        expect(pg.locator(".rv-inspector-drawer")).to_be_visible()
