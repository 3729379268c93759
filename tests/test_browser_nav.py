"""Graph navigation in a real browser: the minimap pans, a layer expands in place in the collapsed overview and
folds back, focus stays reachable, and the culprit of a rejection is drawn and marked (dead_h1_user).

`panel serve app.py` on a free localhost port (tests/served.py), Debian's chromium through Playwright; the
page's console must stay free of errors and no request may leave the machine. Screenshots go to
test-artifacts/nav-*.png.
"""

import re
from pathlib import Path

import pytest
from playwright.sync_api import expect
from served import (
    ART,
    OWN_FTL,
    WAIT_MS,
    browser_fixture,
    choose_version,
    close_inspector,
    open_sidebar,
    open_tab,
    shared_server_fixture,
    watched_page,
)

expect.set_options(timeout=WAIT_MS)

BART = Path(__file__).parent / "fixtures" / "onnx" / "zoo" / "bart.encdec.onnx"


server = shared_server_fixture()
browser = browser_fixture()


@pytest.fixture
def page(browser, server):
    """A 1280x800 page, watched (`served.watched_page`) for the whole test."""
    with watched_page(browser, server[0], 1280, 800) as pg:
        yield pg


def _transform(pg, pane=".rv-after"):
    return pg.locator(f"{pane} .rv-inner").evaluate("el => el.style.transform")


def _frame(pg, pane=".rv-after"):
    """(left, top) of the minimap's viewport frame, px."""
    return pg.locator(f"{pane} .rv-mini-view").evaluate("el => [parseFloat(el.style.left), parseFloat(el.style.top)]")


def test_navigation_flow(page):
    """One session (a page load costs 20-50 s on the shared 2-core machine): the minimap, a layer expanded in
    place and folded back, focus, a search hit inside a folded layer, then the dead_h1_user variant's culprit."""
    _minimap_and_layer_expand_in_place(page)
    _search_opens_a_folded_layer(page)
    _culprit_drawn_for_dead_h1_user(page)
    _encdec_layer_box_opens_itself(page)


def _minimap_and_layer_expand_in_place(pg):
    # MiniLM's full graph is taller than the pane: the minimap shows, framing the visible part
    mini = pg.locator(".rv-after .rv-mini")
    expect(mini).to_be_visible()
    box = mini.bounding_box()
    assert 20 < box["height"] <= 200 and box["width"] <= 180, box
    before, frame = _transform(pg), _frame(pg)
    mini.click(position={"x": box["width"] / 2, "y": box["height"] * 0.8})  # jump near the bottom
    expect(pg.locator(".rv-after .rv-inner")).not_to_have_attribute("style", re.compile(re.escape(before)))
    moved, frame2 = _transform(pg), _frame(pg)
    assert frame2[1] > frame[1] + 10, (frame, frame2)  # the frame followed the view down
    box = mini.bounding_box()  # the click scrolled the page to show the minimap
    pg.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] * 0.8)  # drag back up
    pg.mouse.down()
    pg.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] * 0.3, steps=4)
    pg.mouse.up()
    assert _frame(pg)[1] < frame2[1] - 10 and _transform(pg) != moved
    pg.screenshot(path=str(ART / "nav-minimap.png"))
    pg.locator(".rv-after .rv-map").click()  # the map can be put away (it covers a corner of the graph)
    expect(mini).to_be_hidden()

    # the collapsed overview: a click on a layer box opens that layer in place, the others stay boxes
    choose_version(pg, "after fuse_transformer_layer")
    pg.locator(".rv-view select").select_option("collapsed")
    pg.locator(".rv-after g#layer2.node").wait_for()
    boxes = pg.locator(".rv-after g.node").count()
    pg.locator(".rv-after g#layer2.node").click()
    pg.locator(".rv-after g#layer2.cluster").wait_for()
    expect(pg.locator(".rv-after g#layer1.node")).to_have_count(1)
    expect(pg.locator(".rv-after g#layer3.node")).to_have_count(1)
    inner = pg.locator(".rv-after g.node[id^=n]", has=pg.locator("text", has_text=OWN_FTL))
    expect(inner).to_have_count(1)  # layer 2's own op, drawn as a node inside the overview
    assert pg.locator(".rv-after g.node").count() > boxes
    pg.screenshot(path=str(ART / "nav-expanded.png"))
    inner.click()  # a node inside an open layer is a node: the inspector shows it
    expect(pg.locator(".rv-inspector")).to_contain_text("FusedTransformerLayer")
    close_inspector(pg)
    # a click on the open layer's frame folds it back
    pg.locator(".rv-after g#layer2.cluster text").first.click()
    pg.locator(".rv-after g#layer2.node").wait_for()
    expect(pg.locator(".rv-after g.cluster")).to_have_count(0)
    # two layers open, one button folds them all
    pg.locator(".rv-after g#layer4.node").click()
    pg.locator(".rv-after g#layer4.cluster").wait_for()
    pg.locator(".rv-after .rv-fit").click()  # layer 4 was centred: back to the whole overview
    pg.locator(".rv-after g#layer0.node").click()
    pg.locator(".rv-after g#layer0.cluster").wait_for()
    expect(pg.locator(".rv-after g#layer4.cluster")).to_have_count(1)
    pg.locator(".rv-fold button").click()
    pg.locator(".rv-after g#layer4.node").wait_for()
    expect(pg.locator(".rv-after g.cluster")).to_have_count(0)
    expect(pg.locator(".rv-fold button")).to_be_hidden()
    # the folded overview fits the pane: with the map switched back on, there is no minimap to show
    pg.locator(".rv-after .rv-fit").click()
    pg.locator(".rv-after .rv-map").click()
    expect(pg.locator(".rv-after .rv-mini")).to_be_hidden()
    pg.locator(".rv-after .rv-zoom-in").click()  # zoomed in past the pane: it is back
    pg.locator(".rv-after .rv-zoom-in").click()
    pg.locator(".rv-after .rv-zoom-in").click()
    expect(pg.locator(".rv-after .rv-mini")).to_be_visible()
    # focus stays one choice away, on the layer clicked last
    pg.locator(".rv-view select").select_option("focus")
    expect(pg.locator(".rv-focus-layer select option:checked")).to_have_text("layer 0")
    expect(pg.locator(".rv-after .rv-title")).to_be_visible()
    expect(pg.locator(".rv-after .rv-caption")).to_contain_text("layer 0")


def _search_opens_a_folded_layer(pg):
    """In the collapsed overview, `%130` (an add of layer 2, folded) is found through its layer's box; Enter opens
    the layer and the search finds the node itself inside it. Leaves the focus view on layer 0."""
    choose_version(pg, "input")
    pg.locator(".rv-view select").select_option("collapsed")
    pg.locator(".rv-after g#layer2.node").wait_for()
    box = pg.locator(".rv-after .rv-search")
    box.fill("%130")
    expect(pg.locator(".rv-after .rv-found")).to_have_text("1/1")
    assert pg.locator(".rv-after g.rv-found-node").evaluate_all("gs => gs.map((g) => g.id)") == ["layer2"]
    box.fill("encoder.layer.3.output")  # a path: found through layer 3's box
    expect(pg.locator(".rv-after g#layer3.rv-found-node")).to_have_count(1)
    box.fill("%130")
    box.press("Enter")  # the hit is a folded layer: it opens
    pg.locator(".rv-after g#layer2.cluster").wait_for()
    expect(pg.locator(".rv-after g#n130.rv-found-node")).to_have_count(1)
    expect(pg.locator(".rv-after .rv-found")).to_have_text("1/1")
    pg.screenshot(path=str(ART / "nav-search-folded.png"))
    box.fill("")
    pg.locator(".rv-fold button").click()
    pg.locator(".rv-after g#layer2.node").wait_for()
    pg.locator(".rv-view select").select_option("focus")
    pg.locator(".rv-focus-layer select").select_option(label="layer 0")
    expect(pg.locator(".rv-after .rv-caption")).to_contain_text("layer 0")


def _culprit_drawn_for_dead_h1_user(pg):
    open_sidebar(pg)
    layer = pg.locator(".rv-variant-layer input").input_value()  # the layer the variant breaks: the box's (1)
    pg.locator(".rv-variant-dead_h1_user button").click()
    expect(pg.locator(".rv-message")).to_contain_text("h1")
    expect(pg.locator(".rv-progress-text")).to_be_hidden()
    open_tab(pg, "Why didn't layer N fuse?")
    pg.locator(".rv-why-layer select").select_option(label=f"layer {layer}")
    expect(pg.locator(".rv-why")).to_contain_text(f"layer {layer}: NOT fused")
    culprit = pg.locator(".rv-why-graph g.node.offending")
    expect(culprit).to_have_count(1)
    expect(culprit).to_contain_text("reduce_mean")
    expect(culprit).to_contain_text("offending: h1_user_count")
    # h1's two legitimate users are drawn, and not as offending
    for op in ("FusedMatMulBiasAct", "FusedResidualLN"):
        expect(pg.locator(".rv-why-graph g.node:not(.offending)", has_text=op).first).to_be_visible()
    expect(pg.locator(".rv-why-graph g.edge.offending")).to_have_count(1)
    pg.screenshot(path=str(ART / "nav-culprit.png"))
    # the Graph tab's pane before fuse_transformer_layer marks the same node (in the focus view on layer 0 left
    # by the first part: the culprit is drawn whole there too)
    open_tab(pg, "Graph")
    choose_version(pg, "after fuse_transformer_layer")
    expect(pg.locator(".rv-before .rv-title")).to_have_text("before fuse_transformer_layer")
    expect(pg.locator(".rv-before g.node.offending")).to_contain_text("reduce_mean")


def _encdec_layer_box_opens_itself(pg):
    """bart's boxes are `layer_encoder_0` ... `layer_decoder_1`: a click on one opened nothing (the pane took only
    `layer<i>` ids and sent `parseInt(id.slice(5))`, NaN). A click on decoder layer 0 opens that box, encoder layer 0
    stays a box, and the layer clicked is the one focus shows."""
    open_sidebar(pg)
    pg.get_by_role("button", name="Upload").click()
    pg.locator(".rv-upload input[type=file]").set_input_files(str(BART))
    expect(pg.locator(".rv-version select")).to_contain_text("fuse_transformer_layer", timeout=3 * WAIT_MS)
    expect(pg.locator(".rv-progress-text")).to_be_hidden(timeout=3 * WAIT_MS)
    open_tab(pg, "Graph")
    pg.locator(".rv-view select").select_option("collapsed")
    dec0 = pg.locator(".rv-after g#layer_decoder_0.node")
    dec0.wait_for()
    expect(pg.locator(".rv-after g.cluster")).to_have_count(0)
    dec0.click()
    pg.locator(".rv-after g#layer_decoder_0.cluster").wait_for()
    expect(pg.locator(".rv-after g.cluster")).to_have_count(1)
    expect(pg.locator(".rv-after g#layer_encoder_0.node")).to_have_count(1)
    pg.screenshot(path=str(ART / "nav-encdec-open.png"))
    pg.locator(".rv-after g#layer_decoder_0.cluster text").first.click()  # its frame folds it back
    dec0.wait_for()
    expect(pg.locator(".rv-after g.cluster")).to_have_count(0)
    pg.locator(".rv-view select").select_option("focus")
    expect(pg.locator(".rv-focus-layer select option:checked")).to_have_text("decoder layer 0")
