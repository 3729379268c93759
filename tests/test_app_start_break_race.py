"""② clicked while the first load's passes still run (the page shows the input graph drawn first): the page ends on
the broken run, at the pass that refused the layer, with the variant's notice. The first load, superseded by ②'s,
had already passed its last check in the job's thread when ② was clicked, and its run was still shown on the page's
thread after the click: that run (of the model as built) took ②'s jump to the refusing pass, so ②'s run stayed on
the input with no jump left (CI: `test_browser_matches_table.py`, 2 of 4 runs under load).

The page's thread is a queue pumped by hand here, so the click lands exactly between the job's check and its step."""

from __future__ import annotations

import time
from collections.abc import Callable

from rlxviz.app.jobs import Runner
from rlxviz.app.start import StartHere
from rlxviz.app.state import AppState

WAIT_S = 120


class Page:
    """A page thread run by hand: `Runner.on_page` steps wait in `queue` until `pump` runs them, in order."""

    def __init__(self) -> None:
        self.queue: list[Callable[[], None]] = []

    def pump_until(self, done: Callable[[], bool], what: str) -> None:
        """Run queued steps one by one until `done()` holds after one."""
        t0 = time.time()
        while not done():
            if self.queue:
                self.queue.pop(0)()
            elif time.time() - t0 > WAIT_S:
                raise AssertionError(f"timed out waiting for {what}")
            else:
                time.sleep(0.01)

    def wait_queued(self) -> None:
        """Wait (running nothing) until the job has queued its next step."""
        t0 = time.time()
        while not self.queue:
            assert time.time() - t0 < WAIT_S, "the job queued nothing"
            time.sleep(0.01)


def _page_state() -> tuple[AppState, Page]:
    page = Page()
    s = AppState(runner=Runner(background=True, page=(page.queue.append, lambda: True)), autorun=False,
                 preset="bert-tiny")
    return s, page


def _drain(s: AppState, page: Page) -> None:
    """Run the page's steps until every job is done and nothing is queued."""
    t0 = time.time()
    while True:
        page.pump_until(lambda: not page.queue, "the queue")
        if s.runner.last is None or s.runner.last.done():
            time.sleep(0.05)
            if not page.queue and s.runner.last.done():
                return
        assert time.time() - t0 < WAIT_S
        time.sleep(0.01)


def test_break_clicked_as_the_first_run_arrives_ends_on_the_refusing_pass():
    s, page = _page_state()
    start = StartHere(state=s, show_why=lambda: None)
    s.autorun = True
    s.load()  # the page's first load (`main._start`)
    page.pump_until(lambda: s.input_first, "the input graph drawn first")
    page.pump_until(lambda: s.progress_text.startswith("Running the fusion pipeline"), "the pipeline's start")
    page.wait_queued()  # the first run is done in the job and waits to be shown: ② is clicked now
    start.break_layer()
    _drain(s, page)
    assert s.runs._model_key == s.model_key() and not s.input_first and not s.busy
    first = s.layer_status(1).first
    assert first is not None, "② breaks layer 1"
    assert s.version_labels[s.version] == f"after {first.pass_name}"
    assert "NOT fused" in s.message


def test_break_clicked_while_the_first_run_is_on_its_way_ends_on_the_refusing_pass():
    """The same, ② clicked before the first run is done: its job sees it is superseded."""
    s, page = _page_state()
    start = StartHere(state=s, show_why=lambda: None)
    s.autorun = True
    s.load()
    page.pump_until(lambda: s.input_first, "the input graph drawn first")
    start.break_layer()
    _drain(s, page)
    first = s.layer_status(1).first
    assert first is not None and s.version_labels[s.version] == f"after {first.pass_name}"
    assert "NOT fused" in s.message and not s.busy
