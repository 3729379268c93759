"""Newcomer run, in a real browser: convbert.qdq (2739 ops, the auto view draws layer boxes), `softmax`, Enter. The
search opened layer 0 (1289 ops) among the boxes; Graphviz's `dot` crashed on it after 30-40 s and the pane read
`Not shown: LayoutError: [layout] system failed (exit -11):`, the counter `no match`. Now the layer is drawn alone
(`session.render.OPEN_IN_PLACE_NODES`) and the hit is drawn and centred; `test_big_layer_opens_alone.py` checks the
drawing in Python.

`panel serve app.py` on a free localhost port (tests/served.py), Debian's chromium; the page's console must stay free
of errors and no request may leave the machine."""

import re
import time
from pathlib import Path

import pytest
from playwright.sync_api import expect
from served import WAIT_MS, browser_fixture, idle, open_path, settled, shared_server_fixture, watched_page

pytestmark = pytest.mark.slow
expect.set_options(timeout=WAIT_MS)

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"
server = shared_server_fixture()
browser = browser_fixture()



def _centred(pg, pane: str, key: str) -> bool:
    """Whether node `key`'s middle lies in the middle half of `pane`'s view."""
    w, b = pg.locator(f"{pane} .rv-wrap").bounding_box(), pg.locator(f"{pane} .rv-inner g#{key}").bounding_box()
    return (abs(b["x"] + b["width"] / 2 - w["x"] - w["width"] / 2) < w["width"] / 4
            and abs(b["y"] + b["height"] / 2 - w["y"] - w["height"] / 2) < w["height"] / 4)


def test_enter_on_a_hit_in_a_big_folded_layer_draws_and_centres_it(browser, server):
    with watched_page(browser, server[0], 1600, 1000) as pg:
        idle(pg)
        open_path(pg, ZOO / "convbert.qdq.onnx", "convbert")
        sel = pg.locator(".rv-version select")
        sel.select_option(value=sel.locator("option").nth(0).get_attribute("value"))
        idle(pg)
        expect(pg.locator(".rv-after g.node#layer0")).to_have_count(1)  # the auto view: layer boxes
        box, found = pg.locator(".rv-after .rv-search"), pg.locator(".rv-after .rv-found")
        box.fill("softmax")
        expect(found).to_have_text(re.compile(r"^1/\d+$"))  # the 4 softmax ops, then the Q/DQ nodes named after them
        total = int(found.inner_text().split("/")[1])
        t0 = time.perf_counter()
        box.press("Enter")
        key = found.get_attribute("data-hit")
        pg.locator(f".rv-after .rv-inner g#{key}").wait_for(timeout=3 * WAIT_MS)
        idle(pg)
        print(f"Enter -> {key} drawn: {time.perf_counter() - t0:.1f} s")
        assert key == "n1332", key  # the first softmax op (an exact hit) comes first
        expect(found).to_have_text(re.compile(r"^1/\d+$"))  # layer 1's box is not drawn beside the layer drawn alone
        assert int(found.inner_text().split("/")[1]) < total
        settled(pg, ".rv-after")  # centred once the layer drawn alone is laid out
        assert _centred(pg, ".rv-after", key)
        expect(pg.locator(".rv-graph-note")).not_to_contain_text("Not shown")
        expect(pg.locator(".rv-after .rv-caption, .rv-after .rv-title").first).to_be_visible()


def _nodes_in_view(pg, pane: str) -> int:
    return pg.locator(f"{pane} .rv-wrap").evaluate("""(w) => { const r = w.getBoundingClientRect(); let k = 0;
      for (const g of w.querySelectorAll('.rv-inner g.node')) { const b = g.getBoundingClientRect();
        if (b.right > r.left && b.left < r.right && b.bottom > r.top && b.top < r.bottom) k++; } return k; }""")


def test_the_linked_before_pane_shows_the_layer_a_hit_opens(browser, server):
    """Newcomer run: ernie.qdq's last version (986 ops, layer boxes), `node_softmax_1`, Enter: the after pane drew
    layer 1 alone and centred softmax %1871, but the before pane, its caption naming layer 1 drawn alone too, was
    empty white: its new picture kept the view centred on the old picture's layer-1 box. It now centres the node
    again in the new picture (graphpane.js `follow`)."""
    with watched_page(browser, server[0], 1600, 1000) as pg:
        idle(pg)
        open_path(pg, ZOO / "ernie.qdq.onnx", "quantized")
        sel = pg.locator(".rv-version select")
        sel.select_option(value=sel.locator("option").last.get_attribute("value"))
        idle(pg)
        expect(pg.locator(".rv-before g.node").first).to_be_attached()
        box, found = pg.locator(".rv-after .rv-search"), pg.locator(".rv-after .rv-found")
        box.fill("node_softmax_1")
        expect(found).to_have_text("1/1")
        box.press("Enter")
        key = found.get_attribute("data-hit")
        for pane in (".rv-after", ".rv-before"):  # the layer drawn alone in both panes, the node in each
            pg.locator(f"{pane} .rv-inner g#{key}").wait_for(timeout=3 * WAIT_MS)
        idle(pg)
        settled(pg, ".rv-after", ".rv-before")  # each pane's new picture centred on the node (`follow`)
        assert _centred(pg, ".rv-after", key)
        assert _nodes_in_view(pg, ".rv-before") > 0, pg.locator(".rv-before .rv-inner").evaluate(
            "el => el.style.transform")
        assert _centred(pg, ".rv-before", key)
