"""Issue 39's newcomer run, in a real browser: the Matches & rejections table says what it lists and can follow the
selected version's pass; the rejection count on the selected chip is drawn on a white badge (red on the chip's dark
blue was unreadable). tests/test_app_matches_table.py holds the same without a browser."""

import pytest
from playwright.sync_api import expect
from served import ART, WAIT_MS, browser_fixture, open_tab, shared_server_fixture, watched_page

expect.set_options(timeout=WAIT_MS)

server = shared_server_fixture()
browser = browser_fixture()


@pytest.mark.slow
def test_the_table_says_what_it_lists_and_follows_the_selected_pass(browser, server):
    with watched_page(browser, server[0], 1280, 800) as pg:
        pg.locator(".rv-start-break button").click()
        expect(pg.locator(".rv-message")).to_contain_text("NOT fused", timeout=3 * WAIT_MS)
        expect(pg.locator(".rv-progress-text")).to_be_hidden(timeout=3 * WAIT_MS)
        badge = pg.locator(".rv-chip[style*='#1565c0'] span.rv-rejected")
        expect(badge).to_have_css("background-color", "rgb(255, 255, 255)")
        expect(badge).to_have_css("color", "rgb(198, 40, 40)")
        open_tab(pg, "Matches")
        about = pg.locator(".rv-decisions-about")
        expect(about).to_contain_text("The whole run: every pass's matches and rejections")
        every = pg.locator(".rv-decisions .tabulator-row").count()
        pg.locator(".rv-decisions-only input").check()
        expect(about).to_contain_text("after fuse_transformer_layer only")
        rows = pg.locator(".rv-decisions .tabulator-row")
        expect(rows.first).to_contain_text("fuse_transformer_layer")
        assert 0 < rows.count() < every
        for i in range(rows.count()):
            expect(rows.nth(i).locator(".tabulator-cell[tabulator-field=pass]")).to_have_text("fuse_transformer_layer")


@pytest.mark.slow
@pytest.mark.parametrize("width,height", [(1920, 1080), (1280, 800)])
def test_the_table_fills_the_tab_and_its_columns_fit(browser, server, width, height):
    """A newcomer run at 1920x1080: the table stood at 420 px ("(18 rows)", 12 in view) above ~400 blank px, with no
    scroll bar in sight, and its hint and fix columns ran past its right edge. Now it reaches the window's foot,
    every column (hint and fix included) ends inside it, and its scroll bar takes room when rows overflow."""
    with watched_page(browser, server[0], width, height) as pg:
        pg.locator(".rv-start-break button").click()
        expect(pg.locator(".rv-message")).to_contain_text("NOT fused", timeout=3 * WAIT_MS)
        expect(pg.locator(".rv-progress-text")).to_be_hidden(timeout=3 * WAIT_MS)
        open_tab(pg, "Matches")
        table = pg.locator(".rv-decisions .tabulator").first
        expect(table.locator(".tabulator-row").first).to_be_visible()
        pg.wait_for_timeout(300)  # the table's fit after its rows
        box = table.bounding_box()
        assert box["y"] + box["height"] >= height - 60, (box, height)  # down to the window's foot
        right = box["x"] + box["width"]
        for col in ("message", "hint", "fix"):
            head = table.locator(f".tabulator-col[tabulator-field='{col}']").bounding_box()
            assert head["width"] >= 60 and head["x"] + head["width"] <= right + 1, (col, head, box)
        # every header readable whole (at 1280 "layer" and "anchor" were cut to "la…" and "anc…")
        cut = table.locator(".tabulator-col-title").evaluate_all(
            "es => es.filter(e => e.textContent.trim() && e.scrollWidth > e.clientWidth + 1).map(e => e.textContent)")
        assert not cut, cut
        pg.screenshot(path=str(ART / f"matches-table-{width}x{height}.png"))
        # the scroll bar's rule reaches the table (headless chromium hides every scroll bar, so its room is not
        # measurable here), and the rows past the foot scroll
        holder = table.locator(".tabulator-tableholder")
        rules = holder.evaluate("e => [...e.getRootNode().querySelectorAll('style')].map(s => s.textContent).join()")
        assert ".tabulator-tableholder::-webkit-scrollbar { width: 12px" in rules
        holder.hover()
        for _ in range(40):  # the mouse wheel, down to the last row
            pg.mouse.wheel(0, 300)
            pg.wait_for_timeout(30)
        moved = holder.evaluate("e => [e.scrollHeight > e.clientHeight, e.scrollTop]")
        assert not moved[0] or moved[1] > 0, moved
        pg.wait_for_timeout(500)  # the rows drawn for the new scroll position
        rows = table.locator(".tabulator-row")
        tops = [b["y"] for i in range(rows.count()) if (b := rows.nth(i).bounding_box())]
        assert any(box["y"] < y < box["y"] + box["height"] for y in tops), (tops, box)  # rows in view, not blank
        pg.screenshot(path=str(ART / f"matches-table-{width}x{height}-end.png"))
