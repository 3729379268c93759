"""Issue 39's newcomer run, in a real browser: a zoom kept across a model switch (the Why tab's pane kept MiniLM's
zoom on bert-tiny's drawing: an empty pane), and the search for an op absorbed two fused nodes deep ("no match").
`test_app_zoom_scope.py` and `test_app_absorbed_search.py` check what Python sends; this drives the page's half
(graphpane's ESM: which scope fits, how the note reads).

`panel serve app.py` on a free localhost port (tests/served.py), Debian's chromium at 1280x800 (1920x1080 for the
path load after ②); the page's console must stay free of errors and no request may leave the machine."""

import re
from pathlib import Path

import pytest
from playwright.sync_api import expect
from served import (
    WAIT_MS,
    browser_fixture,
    choose_preset,
    idle,
    open_sidebar,
    open_tab,
    settled,
    shared_server_fixture,
    watched_page,
)

pytestmark = pytest.mark.slow
expect.set_options(timeout=WAIT_MS)

CASES = Path(__file__).parent / "fixtures" / "onnx" / "cases"
server = shared_server_fixture()
browser = browser_fixture()

WHY = ".rv-why-graph"


_idle = idle
_preset = choose_preset


def _view(pg, pane):
    return pg.locator(f"{pane} .rv-inner").evaluate("el => el.style.transform")


def _nodes_in_view(pg, pane) -> int:
    return pg.locator(f"{pane} .rv-wrap").evaluate("""(w) => { const r = w.getBoundingClientRect(); let k = 0;
      for (const g of w.querySelectorAll('.rv-inner g.node')) { const b = g.getBoundingClientRect();
        if (b.right > r.left && b.left < r.right && b.bottom > r.top && b.top < r.bottom) k++; } return k; }""")


def _zoom_into_a_corner(pg, pane):
    for _ in range(5):
        pg.locator(f"{pane} .rv-zoom-in").click()
    w = pg.locator(f"{pane} .rv-wrap").bounding_box()
    for _ in range(2):
        pg.mouse.move(w["x"] + 40, w["y"] + 40)
        pg.mouse.down()
        pg.mouse.move(w["x"] + w["width"] - 20, w["y"] + w["height"] - 20, steps=5)
        pg.mouse.up()
    return _view(pg, pane)


def test_zoom_is_fitted_on_a_model_switch_and_kept_on_a_step_and_search_goes_deep(browser, server):
    """One session (a page load costs 20-50 s on the shared 2-core machine)."""
    with watched_page(browser, server[0], 1280, 800) as pg:
        _idle(pg)
        open_tab(pg, "Why didn't layer N fuse?")
        pg.locator(f"{WHY} g.node").first.wait_for()
        settled(pg, WHY)
        zoomed = _zoom_into_a_corner(pg, WHY)
        assert _nodes_in_view(pg, WHY) == 0, zoomed  # the corner: nothing of MiniLM's layer in view
        drawn = _picture(pg, WHY)
        _preset(pg, "bert-tiny")  # another model: its layer drawn whole (it kept MiniLM's zoom: an empty pane)
        expect(pg.locator(f"{WHY} g.node").first).to_be_attached()
        # a loaded machine draws the new model's layer later: MiniLM's nodes were still there, and a resize of the
        # pane moved MiniLM's kept view (read as the new one: 0 nodes in view, 2026-12-07)
        for _ in range(4 * WAIT_MS // 250):
            if _picture(pg, WHY) != drawn and _view(pg, WHY) != zoomed:
                break
            pg.wait_for_timeout(250)
        settled(pg, WHY)  # the new picture fitted, the pane laid out
        shown = _view(pg, WHY)
        assert shown != zoomed and _nodes_in_view(pg, WHY) > 0, (zoomed, shown)
        pg.locator(f"{WHY} .rv-fit").click()
        assert _view(pg, WHY) == shown  # fitted: "fit" changes nothing
        # a version step of the same model keeps the user's zoom
        pg.locator(f"{WHY} .rv-zoom-in").click()
        kept = _view(pg, WHY)
        sel = pg.locator(".rv-version select")
        options = sel.locator("option")
        # the whole run's versions, not the input graph drawn first (a loaded machine runs the passes after it: the
        # last option was then "input", and the full run kept the version asked before the switch)
        expect(sel).to_contain_text("mark_elementwise_regions", timeout=3 * WAIT_MS)
        sel.select_option(value=options.nth(options.count() - 1).get_attribute("value"))
        _idle(pg)
        settled(pg, WHY)
        assert _view(pg, WHY) == kept

        # bert-tiny after the last pass: attention sits in a FusedAttentionBlock that a FusedTransformerLayer absorbed
        open_tab(pg, "Graph")
        expect(pg.locator(".rv-after .rv-title")).to_have_text(re.compile("after mark_elementwise_regions"),
                                                               timeout=30_000)  # a loaded machine draws slowly
        pg.locator(".rv-after g.node").first.wait_for()
        box = pg.locator(".rv-after .rv-search")
        box.fill("attention")  # exact hits first (a node whose path names attention), then the two layers
        expect(pg.locator(".rv-after .rv-found")).to_have_text(re.compile(r"^1/[3-9]$"))
        total = int(pg.locator(".rv-after .rv-found").inner_text().split("/")[1])
        box.press("Enter")  # the first Enter after a new query shows hit 1; each later one steps on
        expect(pg.locator(".rv-after .rv-found")).to_have_text(f"1/{total}")
        notes = []
        for _ in range(total):
            note = pg.locator(".rv-after .rv-found-note")
            notes.append(note.inner_text() if note.is_visible() else "")
            if notes[-1]:  # a line of its own under the bar: it covered the drawing's title at the picture's top
                below, wrap = note.bounding_box(), pg.locator(".rv-after .rv-wrap").bounding_box()
                assert below["y"] + below["height"] <= wrap["y"] + 1, (below, wrap)
            box.press("Enter")
        deep = [n for n in notes if n]
        assert len(deep) == 2, notes
        for k, n in enumerate(deep):  # the block itself matches too ("FusedAttentionBlock: absorbed into ...")
            assert any(re.fullmatch(rf"attention: absorbed into FusedTransformerLayer %\d+ \(layer {k}\) "
                                    r"via FusedAttentionBlock %\d+", part) for part in n.split("; ")), notes
        pg.locator(".rv-after .rv-search").fill("%21")  # an id two levels down (bert-tiny's first attention node)
        expect(pg.locator(".rv-after .rv-found-note")).to_have_text(re.compile(
            r"^%21: absorbed into FusedTransformerLayer %\d+ \(layer 0\) via FusedAttentionBlock %\d+$"))

        # the linked panes follow the node, not the coordinates (newcomer run 3: the after pane scrolled to empty
        # space): a node both versions hold, drawn at another height in each, searched in the before pane
        tops = [dict(pg.locator(f"{p} .rv-inner g.node").evaluate_all(
            "gs => gs.filter((g) => /^n\\d+$/.test(g.id)).map((g) => [g.id, g.getBoundingClientRect().top])"))
            for p in (".rv-before", ".rv-after")]
        both = [k for k in tops[0] if k in tops[1]]
        assert both, tops
        ident = max(both, key=lambda k: abs(tops[0][k] - tops[1][k]))
        pg.locator(".rv-before .rv-search").fill(f"%{ident[1:]}")
        settled(pg, ".rv-before", ".rv-after")  # both panes centred on the node
        pane = pg.locator(".rv-after .rv-wrap").bounding_box()
        node = pg.locator(f".rv-after .rv-inner g#{ident}").bounding_box()
        assert (pane["x"] - 1 <= node["x"] and node["x"] + node["width"] <= pane["x"] + pane["width"] + 1
                and pane["y"] - 1 <= node["y"] and node["y"] + node["height"] <= pane["y"] + pane["height"] + 1), \
            (ident, pane, node)

        # the layers view: Enter steps through the hits inside folded layers in one fixed order, opening the layer
        # that holds the next one (it went round in circles: each re-render after a reveal restarted at hit 1)
        pg.locator(".rv-before .rv-search").fill("")
        pg.locator(".rv-view select").select_option("collapsed")
        _idle(pg)
        expect(pg.locator(".rv-after g.node#layer0")).to_be_attached()
        box.fill("attention")
        found = pg.locator(".rv-after .rv-found")
        expect(found).to_have_text(re.compile(r"^1/\d+$"))
        total = int(found.inner_text().split("/")[1])
        assert total >= 3, total  # bert-tiny: a node named attention, then the two fused layers
        box.press("Enter")  # shows hit 1 (opening its layer when folded); each later Enter steps on
        expect(found).to_have_text(f"1/{total}")
        _idle(pg)
        seen = [found.get_attribute("data-hit")]
        drawn = 0
        for k in range(1, total + 1):
            box.press("Enter")
            expect(found).to_have_text(f"{k % total + 1}/{total}")
            _idle(pg)
            settled(pg, ".rv-after")
            expect(found).to_have_text(f"{k % total + 1}/{total}")  # the re-render kept the place
            seen.append(found.get_attribute("data-hit"))
            drawn += pg.locator(f".rv-after .rv-inner g.node#{seen[-1]}").count()
        assert len(set(seen[:total])) == total and seen[total] == seen[0], seen  # N distinct hits, then round
        assert drawn >= total - 1, (drawn, seen)  # each hit drawn (its layer opened), the first perhaps still folded


def test_a_kept_search_finds_its_hits_in_the_next_model(browser, server):
    """Newcomer run: "softmax" typed on bert-tiny (built with the attention op: no match), then minilm chosen: the
    box kept the word and read "no match" until retyped, though minilm's fused layers hold six softmax ops."""
    with watched_page(browser, server[0], 1280, 800) as pg:
        _preset(pg, "bert-tiny")
        box = pg.locator(".rv-after .rv-search")
        box.fill("softmax")
        expect(pg.locator(".rv-after .rv-found")).to_have_text("no match")
        _preset(pg, "minilm")
        expect(pg.locator(".rv-after .rv-found")).to_have_text(re.compile(r"^1/\d+$"))


def test_a_node_id_query_is_cleared_on_a_model_switch(browser, server):
    """Newcomer run: `%795` stayed in the after pane's box on the next model and read "no match" there; a node id is
    one model's, so the switch clears it (a term carries over: the test above)."""
    with watched_page(browser, server[0], 1280, 800) as pg:
        pg.locator(".rv-after g.node").first.wait_for()
        drawn = _picture(pg, ".rv-after")
        _preset(pg, "bert-tiny")
        # bert-tiny's picture, not MiniLM's: a query typed before the new model's scope came was cleared by it
        _wait_for_another_picture(pg, ".rv-after", drawn)
        box, found = pg.locator(".rv-after .rv-search"), pg.locator(".rv-after .rv-found")
        node = pg.locator(".rv-after g.node[id^='n']").first.get_attribute("id")
        box.fill(f"%{node[1:]}")
        expect(found).to_have_text("1/1")
        _preset(pg, "minilm")
        expect(box).to_have_value("")
        expect(found).to_have_text("")
        expect(pg.locator(".rv-after g.rv-found-node")).to_have_count(0)


SET_INDEX = """([cls, empty]) => { for (const m of Bokeh.documents[0].all_models) {
    if (m.css_classes && m.css_classes.includes(cls) && m.data && 'absorbed' in m.data.properties) {
      if (empty) { window.__index = [m.data.absorbed, m.data.folded]; m.data.folded = {}; m.data.absorbed = {}; }
      else { m.data.folded = window.__index[1]; m.data.absorbed = window.__index[0]; }
      return true; } } return false; }"""
"""Empties the pane's index of held ops (what fused nodes and folded layers hold), or puts it back."""


def test_a_kept_search_runs_again_when_the_index_of_held_ops_changes(browser, server):
    """The order the picture and its index of held ops arrive in is not forced by a model switch, so this test sets
    the index by hand, as a late index arrives: a kept search reads the index it has now (emptied, minilm's softmax
    ops, held by fused nodes and folded layers, are not found; put back, they are). Before, the box kept its count
    from the index before until retyped."""
    with watched_page(browser, server[0], 1280, 800) as pg:
        _preset(pg, "minilm")
        sel = pg.locator(".rv-version select")
        last = sel.evaluate("e => e.options[e.options.length - 1].value")
        sel.select_option(last)  # the last version: every softmax op is held by a fused node
        _idle(pg)
        box, found = pg.locator(".rv-after .rv-search"), pg.locator(".rv-after .rv-found")
        box.fill("softmax")
        expect(pg.locator(".rv-after .rv-found-note")).to_contain_text("absorbed into")
        expect(found).to_have_text(re.compile(r"^1/\d+$"))
        assert pg.evaluate(SET_INDEX, ["rv-after", True])
        expect(found).to_have_text("no match")
        assert pg.evaluate(SET_INDEX, ["rv-after", False])
        expect(found).to_have_text(re.compile(r"^1/\d+$"))


PANES = (".rv-before", ".rv-after")
MAP = """(w) => { const m = w.querySelector('.rv-mini'); if (!m || getComputedStyle(m).display === 'none') return null;
  const a = w.getBoundingClientRect(), b = m.getBoundingClientRect(); return [b.left - a.left, b.top - a.top, b.width,
  b.height]; }"""
"""The pane's map box relative to its picture's area (x, y, width, height, px), or None while it is hidden."""
COVERED = """(w) => { const m = w.querySelector('.rv-mini').getBoundingClientRect();
  const hit = (b) => b.right > m.left && b.left < m.right && b.bottom > m.top && b.top < m.bottom; const out = [];
  for (const c of w.querySelectorAll('.rv-inner g.cluster[id^="r"]')) { const b = c.getBoundingClientRect();
    const edges = [[b.left, b.top, b.right, b.top + 3], [b.left, b.bottom - 3, b.right, b.bottom],
      [b.left, b.top, b.left + 3, b.bottom], [b.right - 3, b.top, b.right, b.bottom]];
    if (edges.some(([l, t, r, bt]) => hit({ left: l, top: t, right: r, bottom: bt }))) out.push(c.id + ' border');
    for (const g of c.querySelectorAll('g.node')) if (hit(g.getBoundingClientRect())) out.push(g.id); }
  return out; }"""
"""What of the rejection clusters (`r<k>`, red) the pane's map covers: `r0 border`, node ids."""


def _picture(pg, pane) -> int:
    """The size of `pane`'s drawing (characters of its SVG): another model's picture is another size."""
    return pg.locator(f"{pane} .rv-inner").evaluate("el => el.innerHTML.length")


def _wait_for_another_picture(pg, pane, drawn: int) -> None:
    """Wait until `pane` draws another picture than the one of size `drawn` (`_picture`), at most 4 WAIT_MS."""
    for _ in range(4 * WAIT_MS // 250):
        if _picture(pg, pane) != drawn:
            return
        pg.wait_for_timeout(250)
    raise AssertionError(f"{pane}: no new picture")


def _all_fitted(pg, panes) -> None:
    """Each pane's view is the fitted one ("fit" changes nothing) with the drawing in view; all read before any "fit"
    is clicked (a pane's "fit" moves the panes linked to it)."""
    shown = {p: _view(pg, p) for p in panes}
    for p in panes:
        assert _nodes_in_view(pg, p) > 0, (p, shown)
    for p in panes:
        pg.locator(f"{p} .rv-fit").click()
        assert _view(pg, p) == shown[p], (p, shown)


def test_a_path_load_after_a_break_fits_both_panes_and_the_maps_sit_alike(browser, server):
    """Newcomer run at 1920x1080: ① then ② on the default model, then the Folder source's "Load path" of BART: the
    after pane's drawing sat at y = -1790, above the view, its map without a view box, blank after a version step
    too: the model switch centred the new picture on ②'s highlight (the old model's ids) and kept that as the
    user's zoom. And after ②, the maps (each in its pane's lower right corner, of two heights) hid ln2 and the red
    border of the rejection in the before pane: both now sit alike, where they cover least."""
    with watched_page(browser, server[0], 1920, 1080) as pg:
        pg.locator(".rv-start-step button").click()  # ①
        pg.locator(".rv-before g.node").first.wait_for()
        pg.locator(".rv-start-break button").click()  # ②: centres the refused layer in both panes
        expect(pg.locator(".rv-message")).to_contain_text("NOT fused")
        _idle(pg)
        settled(pg, *PANES)  # the maps are placed once the view rests
        maps = [pg.locator(f"{p} .rv-wrap").evaluate(MAP) for p in PANES]
        assert all(maps) and all(abs(a - b) <= 1 for a, b in zip(*maps, strict=True)), maps  # one place, one size
        assert pg.locator(".rv-before .rv-inner g.cluster[id^='r']").count(), "no rejection drawn after ②"
        covered = pg.locator(".rv-before .rv-wrap").evaluate(COVERED)
        assert not covered, (covered, maps)

        open_sidebar(pg)
        pg.get_by_role("button", name="Folder").click()
        pg.locator(".rv-path input").fill(str(CASES / "bart-full.onnx"))
        before = pg.locator(".rv-version select").inner_text()
        drawn = [_picture(pg, p) for p in PANES]
        pg.get_by_role("button", name="Load path").click()
        expect(pg.locator(".rv-version select")).not_to_have_text(before, timeout=3 * WAIT_MS)
        expect(pg.locator(".rv-before .rv-title")).to_have_text(re.compile(r"^before "), timeout=3 * WAIT_MS)
        expect(pg.locator(".rv-message")).to_contain_text("bart-full", timeout=3 * WAIT_MS)  # the whole run shown
        _idle(pg)
        # the version list and the message name BART before its pictures arrive: on a loaded machine both panes
        # still showed ②'s pictures, centred on its highlight at 0.9 zoom, when they were read (in 2 of 7 runs
        # beside two CPU burners, 2026-12-07)
        for p, d in zip(PANES, drawn, strict=True):
            _wait_for_another_picture(pg, p, d)
        settled(pg, *PANES)
        _all_fitted(pg, PANES)
        shown = pg.locator(".rv-after .rv-wrap").evaluate(MAP)
        if shown is not None:  # a map frames the part in view (it framed nothing: a 0 px high box)
            frame = pg.locator(".rv-after .rv-mini-view").bounding_box()
            assert frame["width"] > 2 and frame["height"] > 2, frame
        # a version step of the loaded model shows its drawing (it stayed blank until "fit")
        sel = pg.locator(".rv-version select")
        sel.select_option(value=sel.locator("option").nth(1).get_attribute("value"))
        _idle(pg)
        settled(pg, ".rv-after")
        assert _nodes_in_view(pg, ".rv-after") > 0, _view(pg, ".rv-after")
