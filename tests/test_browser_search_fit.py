"""A newcomer run's findings on the graph panes' search and fit, in a real browser (graphpane.js `find`, `fit`):

1. "softmax" typed, then Enter, opened on hit 2/6 (the typing showed hit 1, Enter stepped past it): the first Enter
   after a new query shows hit 1 (opening its folded layer, if any), each later Enter steps on.
2. A term carried over in the box to another model zoomed the panes onto its hits (the before pane's picture off the
   right edge), and "fit" in the before pane then gave the after pane the before pane's frame with the offset a
   search's centring left it (a node cut at its right edge): a new model's picture is fitted on arrival, the carried
   term marks its hits without moving the view, and "fit" fits each linked pane to its own picture.

`panel serve app.py` on a free localhost port (tests/served.py), Debian's chromium at 1280x800 with the sidebar open;
the page's console must stay free of errors and no request may leave the machine.
"""

import re

import pytest
from playwright.sync_api import expect
from served import (
    ART,
    WAIT_MS,
    browser_fixture,
    choose_preset,
    idle,
    open_sidebar,
    settled,
    shared_server_fixture,
    watched_page,
)

pytestmark = pytest.mark.slow
expect.set_options(timeout=WAIT_MS)

server = shared_server_fixture()
browser = browser_fixture()

AFTER, BEFORE = ".rv-after", ".rv-before"


def _counter(pg, pane: str) -> tuple[str, str | None]:
    """(the pane's hit counter, the key of the node it names)."""
    found = pg.locator(f"{pane} .rv-found")
    return found.inner_text(), found.get_attribute("data-hit")


def _outside(pg, pane: str) -> dict[str, float]:
    """How far (px) the pane's drawing reaches past each edge of its picture area (0 where it is inside)."""
    g = pg.locator(f"{pane} .rv-inner svg").bounding_box()
    w = pg.locator(f"{pane} .rv-wrap").bounding_box()
    return {"left": max(0.0, w["x"] - g["x"]), "top": max(0.0, w["y"] - g["y"]),
            "right": max(0.0, g["x"] + g["width"] - w["x"] - w["width"]),
            "bottom": max(0.0, g["y"] + g["height"] - w["y"] - w["height"])}


def _fitted(pg, pane: str) -> None:
    """The pane's whole drawing lies inside its picture area (1 px of rounding)."""
    out = _outside(pg, pane)
    assert all(v <= 1 for v in out.values()), (pane, out)


def test_the_first_enter_after_a_new_query_shows_hit_1(browser, server):
    with watched_page(browser, server[0], 1280, 800) as pg:
        idle(pg)
        box, found = pg.locator(f"{AFTER} .rv-search"), pg.locator(f"{AFTER} .rv-found")
        box.fill("softmax")  # minilm's input graph: one softmax node per layer
        expect(found).to_have_text(re.compile(r"^1/\d+$"))
        typed, first = _counter(pg, AFTER)
        total = int(typed.split("/")[1])
        assert total >= 2, typed
        box.press("Enter")  # shows hit 1 (it stepped to 2/N)
        expect(found).to_have_text(f"1/{total}")
        assert _counter(pg, AFTER)[1] == first
        box.press("Enter")
        expect(found).to_have_text(f"2/{total}")
        assert _counter(pg, AFTER)[1] != first
        # a new query starts again at hit 1: its first Enter shows it
        box.fill("layernorm")
        expect(found).to_have_text(re.compile(r"^1/\d+$"))
        shown = _counter(pg, AFTER)
        box.press("Enter")
        expect(found).to_have_text(shown[0])
        assert _counter(pg, AFTER) == shown


def test_a_term_carried_to_another_model_keeps_its_picture_fitted(browser, server):
    with watched_page(browser, server[0], 1280, 800) as pg:
        idle(pg)
        pg.locator(".rv-start-step button").click()  # ①: both panes
        expect(pg.locator(".rv-start-note")).to_contain_text("Showing after")
        idle(pg)
        pg.locator(f"{BEFORE} g.node").first.wait_for()
        pg.locator(".rv-view select").select_option("collapsed")
        idle(pg)
        expect(pg.locator(f"{AFTER} g.node#layer0")).to_be_attached()
        open_sidebar(pg)
        box, found = pg.locator(f"{AFTER} .rv-search"), pg.locator(f"{AFTER} .rv-found")
        box.fill("matmul")  # inside the folded layers (minilm-shaped holds no softmax op)
        expect(found).to_have_text(re.compile(r"^1/\d+$"))
        box.press("Enter")  # opens the first layer and centres the hit: both panes move, zoomed in
        idle(pg)

        for pane in (AFTER, BEFORE):  # the old model's pictures, told apart from the new one's
            pg.locator(f"{pane} .rv-inner svg").evaluate("el => el.setAttribute('data-old', '')")
        choose_preset(pg, "minilm-shaped")  # another model: the term stays in the box
        # the whole run's versions (the input graph is drawn first, the passes run after it)
        expect(pg.locator(".rv-version select")).to_contain_text("mark_elementwise_regions", timeout=3 * WAIT_MS)
        idle(pg)
        expect(box).to_have_value("matmul")
        for pane in (AFTER, BEFORE):
            pg.locator(f"{pane} .rv-inner svg:not([data-old]) g.node#layer0").wait_for()
        expect(found).to_have_text(re.compile(r"^1/\d+$"))  # its hits marked and counted ...
        expect(pg.locator(f"{AFTER} g.rv-found-node").first).to_be_attached()
        settled(pg, AFTER, BEFORE)
        pg.screenshot(path=str(ART / "search-fit-switch.png"))
        for pane in (AFTER, BEFORE):  # ... the view not moved: each picture whole in its pane
            _fitted(pg, pane)
        shown = pg.locator(f"{AFTER} .rv-inner").evaluate("el => el.style.transform")
        pg.locator(f"{AFTER} .rv-fit").click()
        assert pg.locator(f"{AFTER} .rv-inner").evaluate("el => el.style.transform") == shown  # fitted already

        # Enter centres hit 1 (opening its layer; both panes move with it); "fit" in the before pane fits both, each
        # to its own picture (the after pane took the before pane's frame: cut at its right edge)
        total = found.inner_text().split("/")[1]
        box.press("Enter")
        expect(found).to_have_text(f"1/{total}")  # it read 1/N before Enter too: wait for the hit's layer drawn
        pg.locator(f"{AFTER} .rv-inner g#{found.get_attribute('data-hit')}").wait_for()
        idle(pg)
        settled(pg, AFTER, BEFORE)
        pg.locator(f"{BEFORE} .rv-fit").click()
        settled(pg, AFTER, BEFORE)
        view = {p: pg.locator(f"{p} .rv-inner").evaluate("el => el.style.transform") for p in (AFTER, BEFORE)}
        for pane in (AFTER, BEFORE):  # a tall picture is fitted to the width, drawn from its top
            out = _outside(pg, pane)
            assert out["left"] <= 1 and out["right"] <= 1 and out["top"] <= 1, (pane, out, view)
        pg.locator(f"{AFTER} .rv-fit").click()
        assert pg.locator(f"{AFTER} .rv-inner").evaluate("el => el.style.transform") == view[AFTER]

        # a fitted view follows the pane's size: the sidebar folded, the panes wider, each picture fitted again
        pg.locator("#sidebar-button").click()
        expect(pg.locator("#sidebar")).to_have_class(re.compile(r"\bhidden\b"))
        settled(pg, AFTER, BEFORE)  # the panes widened, each picture fitted again
        view = {p: pg.locator(f"{p} .rv-inner").evaluate("el => el.style.transform") for p in (AFTER, BEFORE)}
        for pane in (AFTER, BEFORE):
            pg.locator(f"{pane} .rv-fit").click()
            assert pg.locator(f"{pane} .rv-inner").evaluate("el => el.style.transform") == view[pane], (pane, view)
