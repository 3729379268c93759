"""Issue 40 in the real page: one session's hostile work never holds another session. Two browser sessions on one
server: the first loads the handed `onnx_op` Loop (refused at load, one message) and then times a graph whose
timing runs far past the server's job limit (`RLXVIZ_TIMING_SECONDS=15`); the second session's Timing completes
meanwhile, and the first one's job is stopped at its limit with one line."""

from pathlib import Path

from playwright.sync_api import expect
from served import WAIT_MS, browser_fixture, open_sidebar, open_tab, server_fixture, watched_page

DATA = Path(__file__).parent / "data" / "reliability"
LIMIT_S = 15
server = server_fixture("server-jobs.log", {"RLXVIZ_TIMING_SECONDS": str(LIMIT_S)})
browser = browser_fixture()


def _heavy_ir(n: int = 1500, chain: int = 60) -> str:
    """A graph whose timing takes minutes (a chain of [n, n] matmuls), well under the memory limit."""
    body = [f"  %{i + 2} = matmul(%{i + 1 if i else 0}, %1) : f32[{n}, {n}]" for i in range(chain)]
    return "\n".join([f'graph heavy {{\n  %0 = input {{name="x"}} : f32[{n}, {n}]',
                      f'  %1 = param {{name="w"}} : f32[{n}, {n}]', *body, f"  return %{chain + 1}", "}"])


def _paste_ir(pg, text: str) -> None:
    pg.get_by_role("button", name="IR text").click()
    pg.locator(".rv-ir-text .ace_content").click()
    pg.keyboard.press("Control+a")
    pg.keyboard.insert_text(text)
    pg.locator(".rv-load-ir button").click()


def test_a_hostile_job_is_bounded_and_another_sessions_timing_completes(browser, server):
    with watched_page(browser, server[0], 1280, 800) as a, watched_page(browser, server[0], 1280, 800) as b:
        open_sidebar(a)
        _paste_ir(a, (DATA / "ir_hostop_loop_forever.ir").read_text())
        expect(a.locator(".rv-message")).to_contain_text("Loop", timeout=2 * WAIT_MS)  # refused at load
        _paste_ir(a, _heavy_ir())
        expect(a.locator(".rv-version select")).to_contain_text("0: input (60 ops)", timeout=3 * WAIT_MS)
        open_tab(a, "Timing")
        a.locator(".rv-time button").click()  # runs far past the limit
        open_sidebar(b)
        b.get_by_role("button", name="Built-in").click()
        before = b.locator(".rv-version select").inner_text()
        b.locator(".rv-preset select").select_option("bert-tiny")
        expect(b.locator(".rv-version select")).not_to_have_text(before, timeout=3 * WAIT_MS)
        expect(b.locator(".rv-progress-text")).to_be_hidden(timeout=3 * WAIT_MS)
        open_tab(b, "Timing")
        b.locator(".rv-time button").click()
        expect(b.locator(".rv-timings")).to_contain_text("after", timeout=5 * WAIT_MS)  # not queued behind a's
        expect(a.locator(".rv-message")).to_contain_text(f"stopped after {LIMIT_S} s", timeout=5 * WAIT_MS)
