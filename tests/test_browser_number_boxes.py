"""Issue 39's newcomer run, in a real browser: a value that is no whole number in Batch or the attention gate was put
back by the page's own integer filter, and the server never heard of it, so the banner kept the last message (about
99999). The boxes now send their text and the server says what it kept (tests/test_app_number_boxes.py holds the
same without a browser)."""

import pytest
from playwright.sync_api import expect
from served import WAIT_MS, browser_fixture, open_sidebar, shared_server_fixture, watched_page

expect.set_options(timeout=WAIT_MS)

server = shared_server_fixture()
browser = browser_fixture()
W, H = 1280, 800


def _idle(pg):
    expect(pg.locator(".rv-progress-text")).to_be_hidden(timeout=3 * WAIT_MS)


def _type(pg, box, text):
    pg.locator(box).fill(text)
    pg.locator(box).press("Enter")


@pytest.mark.slow
def test_unreadable_numbers_are_said_and_a_valid_one_clears_the_note(browser, server):
    with watched_page(browser, server[0], W, H) as pg:
        _idle(pg)
        open_sidebar(pg)
        msg, batch = pg.locator(".rv-message"), ".rv-batch input"
        before = pg.locator(batch).input_value()
        _type(pg, batch, "99999")
        expect(msg).to_contain_text("Batch 99999 is out of range", timeout=3 * WAIT_MS)
        _idle(pg)
        became = pg.locator(batch).input_value()
        for typed in ("2.5", "abc", "1e3"):
            _type(pg, batch, typed)
            expect(msg).to_contain_text(f"Batch must be a whole number; {typed} is not, so it stays {became}")
            expect(pg.locator(batch)).to_have_value(became)
        _type(pg, batch, before)
        expect(msg).to_be_hidden(timeout=3 * WAIT_MS)
        _idle(pg)
        gate = ".rv-threshold input"
        _type(pg, gate, "1.5")
        expect(msg).to_contain_text("Attention gate must be a whole number (or empty for the pipeline's default); "
                                    "1.5 is not")
        expect(pg.locator(gate)).to_have_value("")
        pg.locator(".rv-apply button").click()  # a run applied: the note about the gate goes
        expect(msg).to_be_hidden(timeout=3 * WAIT_MS)


@pytest.mark.slow
def test_the_clamped_value_entered_again_clears_the_range_note(browser, server):
    """After a clamp the box shows the value it became; entering that same value (a change the page does not send,
    only the Enter event) is a valid value entered: the range note goes (it stayed up)."""
    with watched_page(browser, server[0], W, H) as pg:
        _idle(pg)
        open_sidebar(pg)
        msg, batch = pg.locator(".rv-message"), ".rv-batch input"
        _type(pg, batch, "0")
        expect(msg).to_contain_text("Batch 0 is out of range", timeout=3 * WAIT_MS)
        _idle(pg)
        became = pg.locator(batch).input_value()
        _type(pg, batch, became)  # the text the box already shows
        expect(msg).to_be_hidden(timeout=3 * WAIT_MS)
