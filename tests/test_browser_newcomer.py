"""Issue 39's fresh newcomer run, in a real browser at a laptop's 1280x800 (tests/test_app_newcomer.py holds the same
faults without a browser).

- ① then ②: both panes show the pass that refused the broken layer (the left one stayed on "before fuse_sdpa").
- The sidebar's Built-in tab keeps an uploaded model until a built-in one is asked for, and the message says what
  replaced what.
- A sequence length out of range says the range and why, and the app goes on with the nearest one.
- The server's log holds no Bokeh W-1005 (FIXED_SIZING_MODE) warning.
"""

import re
from pathlib import Path

import pytest
from playwright.sync_api import expect
from served import ART, WAIT_MS, browser_fixture, open_sidebar, open_tab, shared_server_fixture, watched_page

expect.set_options(timeout=WAIT_MS)

server = shared_server_fixture()
browser = browser_fixture()
W, H = 1280, 800
ONNX = Path(__file__).parent / "fixtures" / "onnx"


def _idle(pg):
    expect(pg.locator(".rv-progress-text")).to_be_hidden(timeout=3 * WAIT_MS)


def _titles(pg):
    return [pg.locator(f"{p} .rv-title").text_content() for p in (".rv-before", ".rv-after")]


@pytest.mark.slow
def test_step_then_break_moves_both_panes_to_the_refusing_pass(browser, server):
    with watched_page(browser, server[0], W, H) as pg:
        expect(pg.locator(".rv-version select")).to_contain_text("after")  # the passes ran (not the input first)
        _idle(pg)
        pg.locator(".rv-start-step button").click()  # ①
        expect(pg.locator(".rv-start-note")).to_contain_text("Showing after")
        first = pg.locator(".rv-after .rv-title").text_content()
        assert first.startswith("after "), first
        expect(pg.locator(".rv-before .rv-title")).to_have_text(f"before {first[len('after '):]}")
        pg.locator(".rv-start-break button").click()  # ②
        expect(pg.locator(".rv-message")).to_contain_text("layer 1 NOT fused", timeout=3 * WAIT_MS)
        expect(pg.locator(".rv-version select option:checked")).to_contain_text("after fuse_transformer_layer")
        expect(pg.locator(".rv-after .rv-title")).to_have_text("after fuse_transformer_layer")
        expect(pg.locator(".rv-before .rv-title")).to_have_text("before fuse_transformer_layer")
        _idle(pg)
        pg.wait_for_timeout(500)  # nothing later puts the old picture back
        assert _titles(pg) == ["before fuse_transformer_layer", "after fuse_transformer_layer"], _titles(pg)
        # the left picture is the graph the pass read: it still holds the layers' unfused residual norms
        assert pg.locator(".rv-before g.node").count() > pg.locator(".rv-after g.node").count()


@pytest.mark.slow
def test_built_in_tab_keeps_the_upload_until_a_model_is_asked_for(browser, server):
    with watched_page(browser, server[0], W, H) as pg:
        _idle(pg)
        open_sidebar(pg)
        pg.get_by_role("button", name="Upload").click()
        pg.locator(".rv-upload input[type=file]").set_input_files(str(ONNX / "gpt2.onnx"))
        msg = pg.locator(".rv-message")
        expect(msg).to_contain_text("equals the ONNX model", timeout=3 * WAIT_MS)
        _idle(pg)
        versions = pg.locator(".rv-version select").inner_text()
        pg.get_by_role("button", name="Built-in").click()  # a look at the list
        note = pg.locator(".rv-preset-note")
        expect(note).to_contain_text("Showing gpt2 (Upload)")
        show = pg.locator(".rv-load-preset button")
        expect(show).to_have_text(re.compile(r"^Show \S+"))
        pg.wait_for_timeout(1500)
        assert pg.locator(".rv-version select").inner_text() == versions  # gpt2 still shown
        expect(msg).to_contain_text("equals the ONNX model")
        name = show.text_content().removeprefix("Show ")
        show.click()
        expect(msg).to_contain_text(f"Now showing {name} (built-in), was gpt2 (upload).", timeout=3 * WAIT_MS)
        expect(pg.locator(".rv-version select")).not_to_have_text(versions)
        expect(note).to_be_hidden()
        expect(show).to_be_hidden()


@pytest.mark.slow
@pytest.mark.parametrize("typed, becomes", [("0", "2"), ("9000", "512")])
def test_a_sequence_length_out_of_range_says_the_range(browser, server, typed, becomes):
    with watched_page(browser, server[0], W, H) as pg:
        _idle(pg)
        open_sidebar(pg)
        seq = pg.locator(".rv-seq input")
        seq.fill(typed)
        seq.press("Tab")
        msg = pg.locator(".rv-message")
        expect(msg).to_contain_text(f"Sequence length {typed} is out of range 2..512", timeout=3 * WAIT_MS)
        expect(msg).to_contain_text("position table has 512 rows")
        expect(msg).to_contain_text(f"so it became {becomes}")
        expect(seq).to_have_value(becomes)
        _idle(pg)  # the app went on: the model at the new length
        expect(pg.locator(".rv-message")).to_be_visible()
        pg.locator(".rv-after g.node").first.wait_for()


@pytest.mark.slow
def test_the_server_log_holds_no_sizing_warning(browser, server):
    with watched_page(browser, server[0], W, H) as pg:
        _idle(pg)
        for tab in ("Matches", "Why", "Timing", "IR & diff", "IR editor", "Graph"):
            open_tab(pg, tab)
        open_sidebar(pg)
        pg.get_by_role("button", name="Upload").click()
        pg.wait_for_timeout(500)
    log = (ART / server[2]).read_text()  # the shared server's: every shared file's pages wrote to it
    assert "Bokeh app running" in log
    assert "W-1005" not in log and "FIXED_SIZING_MODE" not in log, [ln for ln in log.splitlines() if "W-10" in ln]
