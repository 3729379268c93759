"""Issue 39's newcomer run, in a real browser: the Matches & rejections table says what it lists and can follow the
selected version's pass; the rejection count on the selected chip is drawn on a white badge (red on the chip's dark
blue was unreadable). tests/test_app_matches_table.py holds the same without a browser."""

import pytest
from playwright.sync_api import expect
from served import WAIT_MS, browser_fixture, open_tab, server_fixture, watched_page

expect.set_options(timeout=WAIT_MS)

server = server_fixture("server-matches-table.log")
browser = browser_fixture()


@pytest.mark.slow
def test_the_table_says_what_it_lists_and_follows_the_selected_pass(browser, server):
    with watched_page(browser, server[0], 1280, 800) as pg:
        pg.locator(".rv-start-break button").click()
        expect(pg.locator(".rv-message")).to_contain_text("NOT fused", timeout=3 * WAIT_MS)
        expect(pg.locator(".rv-progress-text")).to_be_hidden(timeout=3 * WAIT_MS)
        badge = pg.locator(".rv-chip[style*='#1565c0'] span[title='rejections of this pass']")
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
