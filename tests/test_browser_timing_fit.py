"""Newcomer run 8 in the real page: at 1280x800 with the sidebar open the Timing tab cut its text: the speed-up plot's
title ran into the error plot's ("fusion and rlxviz's kernels togethe"), its axis label lost its end ("whisker: 95%
int"), table cells lost theirs ("1.10x faste", "within nois"), headers broke inside words ("media n ms", "vs previo
us"), and at 1920 version names were cut ("19: after fuse_shared_input_ma"). Now every title line and axis label fits
its plot, and every table header and cell shows each of its words whole, at 1280x800 and 1920x1080. The "Time every
version" tooltip, shown while the pointer rests on the button after a click, covers neither "↻ Time again" nor the
rounds' labels. One timing run of 3 rounds per size; every page is watched (tests/served.py)."""

import pytest
from playwright.sync_api import expect
from served import WAIT_MS, browser_fixture, server_fixture, watched_page
from test_browser_timing import time_bert_tiny

expect.set_options(timeout=WAIT_MS)

server = server_fixture("server-timing-fit.log")
browser = browser_fixture()

pytestmark = pytest.mark.slow

PLOT_TEXT_JS = """() => { const out = [];
  const ctx = document.createElement('canvas').getContext('2d');
  const width = (text, size, style, font) => {
    ctx.font = `${style} ${size} ${font}`; return ctx.measureText(text).width; };
  const walk = (v) => { if (!v) return;
    if (v.frame && v.model && v.model.title && v.model.title.text) {
      const t = v.model.title, room = v.bbox.right - v.frame.bbox.left;
      for (const line of t.text.split('\\n'))
        out.push({what: 'title', text: line, need: width(line, t.text_font_size, t.text_font_style, t.text_font),
                  room});
      for (const axis of v.model.below || []) if (axis.axis_label)
        out.push({what: 'axis', text: axis.axis_label, room: v.frame.bbox.width,
                  need: width(axis.axis_label, axis.axis_label_text_font_size, axis.axis_label_text_font_style,
                              axis.axis_label_text_font)});
    }
    for (const c of (v.child_views || [])) walk(c); };
  for (const id in Bokeh.index) walk(Bokeh.index[id]);
  return out; }"""
"""Each Bokeh plot's title lines (room: from the plot area's left edge to the plot's right edge, where the canvas cuts
it) and x-axis label (room: the plot area's width, under which it is centred), with the width each needs, px."""

WORDS_FIT_JS = """(els) => { const ctx = document.createElement('canvas').getContext('2d'); const out = [];
  for (const e of els) { if (!e.offsetParent) continue;
    const cs = getComputedStyle(e); ctx.font = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
    const room = e.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
    const text = e.innerText.trim(); if (!text) continue;
    const widest = Math.max(...text.split(/\\s+/).map((w) => ctx.measureText(w).width));
    out.push({text, room, widest, scroll: e.scrollWidth, client: e.clientWidth}); }
  return out; }"""
"""Each shown table header title / cell: its text, the room inside its padding, its widest word's width and its
scroll and client widths, px."""


@pytest.mark.parametrize("size", [(1280, 800), (1920, 1080)])
def test_timing_titles_labels_and_cells_are_not_cut(browser, server, size):
    with watched_page(browser, server[0], *size) as pg:
        time_bert_tiny(pg, rounds=3)
        button = pg.locator(".rv-time button")
        button.hover()  # the pointer rests on the button, as after a click: its tooltip shows
        pg.wait_for_timeout(900)
        tips = [t for t in pg.locator(".bk-tooltip, .bk-Tooltip").all() if t.is_visible()]
        for tip in tips:
            box = tip.bounding_box()
            for other in (".rv-time-again", ".rv-repeat", ".rv-warmup"):
                o = pg.locator(other).bounding_box()
                apart = (box["x"] + box["width"] <= o["x"] or o["x"] + o["width"] <= box["x"]
                         or box["y"] + box["height"] <= o["y"] or o["y"] + o["height"] <= box["y"])
                assert apart, (other, box, o)
        pg.mouse.move(0, size[1] - 1)
        chart = pg.locator(".rv-timing-chart")
        expect(chart.locator("canvas").first).to_be_visible()
        pg.wait_for_timeout(300)  # the plots' layout after the canvas is drawn
        texts = pg.evaluate(PLOT_TEXT_JS)
        assert {t["what"] for t in texts} == {"title", "axis"}, texts
        cut = [t for t in texts if t["need"] > t["room"] + 1]
        assert not cut, cut
        table = pg.locator(".rv-timings")
        expect(table.locator(".tabulator-row .tabulator-cell[tabulator-field=version]").first).to_be_visible()
        for selector in (".tabulator-col-title", ".tabulator-row .tabulator-cell"):
            seen = table.locator(selector).evaluate_all(WORDS_FIT_JS)
            assert len(seen) > 5, (selector, seen)
            # no word cut or broken inside: each fits its cell, and nothing runs past the cell's edge
            cut = [c for c in seen if c["widest"] > c["room"] + 1 or c["scroll"] > c["client"] + 1]
            assert not cut, (selector, cut)
        versions = table.locator(".tabulator-row .tabulator-cell[tabulator-field=version]").all_inner_texts()
        assert versions and all(":" in v for v in versions), versions
