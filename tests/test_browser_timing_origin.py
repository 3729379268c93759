"""Issue 39's newcomer run, in the real page: a second browser session pressing "Time every version on MLX" got the
first session's stored run in under a second, its pid and busy verdict as if just measured. Now the tab says, above
the verdict, that the figures are stored, when and in which session they were measured, and the busy verdict names
that time. The server runs with `RLXVIZ_FORCE_BUSY` (every run reads busy). 1280x800, every page watched."""

import re

import pytest
from playwright.sync_api import expect
from served import ART, WAIT_MS, browser_fixture, pane_text, server_fixture, watched_page
from test_browser_timing import time_bert_tiny

from rlxviz.app.timeproc import FORCE_BUSY_ENV

expect.set_options(timeout=WAIT_MS)

server = server_fixture("server-origin.log", env={FORCE_BUSY_ENV: "1"})
browser = browser_fixture()

pytestmark = pytest.mark.slow


def test_a_second_session_is_told_the_timing_is_stored(browser, server):
    with watched_page(browser, server[0], 1280, 800) as first:
        time_bert_tiny(first)
        expect(first.locator(".rv-machine")).to_contain_text("Busy machine")
        assert not first.locator(".rv-timing-origin").is_visible()  # a new measurement: no note
    with watched_page(browser, server[0], 1280, 800) as second:
        time_bert_tiny(second)  # the same model and settings: the first session's run, from the app's cache
        origin = second.locator(".rv-timing-origin")
        expect(origin).to_be_visible()
        note = pane_text(origin)
        assert re.search(r"measured (\d\d:\d\d) UTC \((under a minute|\d+ min) ago, in another session\)", note), note
        assert "Time again" in note
        when = re.search(r"(\d\d:\d\d) UTC", note).group(1)
        machine = second.locator(".rv-machine")
        assert f"Busy machine at {when} UTC" in pane_text(machine)
        assert origin.bounding_box()["y"] < machine.bounding_box()["y"]
        chart = second.locator(".rv-timing-chart")
        assert origin.bounding_box()["y"] < chart.bounding_box()["y"]
        second.screenshot(path=str(ART / "timing-stored-1280x800.png"))
        chart.screenshot(path=str(ART / "timing-stored-chart-1280x800.png"))
        second.locator(".rv-fusion-kernels").screenshot(path=str(ART / "timing-stored-split-1280x800.png"))
