"""Newcomer run, in a real browser: falcon's inspector named the softmax `ONNX node node_Softmax_144 (Softmax)`, and
typing that name in the search box said "no match". `test_app_onnx_name_search.py` checks the index Python sends
(`SvgGraph.names`); this drives the page's half (graphpane's ESM: `named`, `absorbedNote`).

`panel serve app.py` on a free localhost port (tests/served.py), Debian's chromium; the page's console must stay free
of errors and no request may leave the machine."""

import re
from pathlib import Path

import onnx
import pytest
from playwright.sync_api import expect
from served import WAIT_MS, browser_fixture, idle, open_sidebar, shared_server_fixture, watched_page

pytestmark = pytest.mark.slow
expect.set_options(timeout=WAIT_MS)

CASES = Path(__file__).parent / "fixtures" / "onnx" / "cases"
server = shared_server_fixture()
browser = browser_fixture()


def test_the_onnx_node_name_is_found_at_the_input_and_through_the_fused_node(browser, server):
    falcon = CASES / "falcon.onnx"
    name = next(n.name for n in onnx.load(str(falcon), load_external_data=False).graph.node if n.op_type == "Softmax")
    with watched_page(browser, server[0], 1600, 1000) as pg:
        idle(pg)
        open_sidebar(pg)
        pg.get_by_role("button", name="Folder").click()
        pg.locator(".rv-path input").fill(str(falcon))
        pg.get_by_role("button", name="Load path").click()
        expect(pg.locator(".rv-message")).to_contain_text("falcon", timeout=3 * WAIT_MS)
        idle(pg)
        sel = pg.locator(".rv-version select")
        options = sel.locator("option")
        sel.select_option(value=options.nth(0).get_attribute("value"))  # version 0: the imported softmax itself
        idle(pg)
        box, found = pg.locator(".rv-after .rv-search"), pg.locator(".rv-after .rv-found")
        box.fill(name)
        expect(found).to_have_text("1/1")
        box.press("Enter")
        expect(found).to_have_text("1/1")
        expect(pg.locator(".rv-after .rv-found-note")).to_have_text(f"ONNX node {name}")  # why it is a hit
        sel.select_option(value=options.nth(options.count() - 1).get_attribute("value"))  # fused away
        idle(pg)
        expect(found).to_have_text(re.compile(r"^1/\d+$"))
        expect(pg.locator(".rv-after .rv-found-note")).to_contain_text(f"{name} (softmax): absorbed into")
