"""The Timing tab's "Previous run:" mark (`timingview.PREVIOUS_MARK`) is only ever on the previous run's figures.

Newcomer run: after "↻ Time again" the new run's result (pid 26025) showed for about a second as "Previous run: Busy
machine: …" under the "A new timing run is under way" banner: the job showed the new figures in one page step and
cleared `AppState.timing_running` in a later one. Runs are fabricated (`timeproc.time_in_worker` replaced)."""

from __future__ import annotations

import pytest
from test_app_timing_origin import fabricated_rows

from rlxviz.app import timeproc
from rlxviz.app.measure import TIMING_RUNS

WATCHED = ["timings", "blas", "timing_policy", "timing_split", "timing_origin", "timing_when", "timing_running"]


@pytest.fixture
def numbered_worker(monkeypatch):
    """Each timing run gets its own pid: 1001, 1002, …"""
    pids = iter(range(1001, 2000))
    monkeypatch.setattr(timeproc, "time_in_worker",
                        lambda trace, *a, **k: timeproc.WorkerTiming(fabricated_rows(trace, busy=True), next(pids),
                                                                     None))
    TIMING_RUNS.clear()
    yield
    TIMING_RUNS.clear()


def test_the_new_runs_figures_are_never_marked_as_the_previous_runs(numbered_worker):
    """Old result shown, a new run starts (its figures marked "Previous run"), the new result arrives: from the first
    view that shows the new run's pid on, nothing reads "Previous run" and the under-way banner is gone."""
    from rlxviz.app.jobs import Runner
    from rlxviz.app.state import AppState
    from rlxviz.app.timingview import PREVIOUS_MARK, TimingView

    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8, repeat=21, warmup=0)
    view = TimingView(state=s)
    s.time_all()
    assert "pid 1001" in view.blas.object and not view.previous.visible
    seen: list[tuple[str, str, bool, bool]] = []
    # after the view's own watcher (watchers run in the order they were added): what the tab shows at each change
    s.param.watch(lambda *e: seen.append((view.blas.object, view.machine.object, view.previous.visible,
                                          s.timing_running)), WATCHED)
    s.time_all(fresh=True)
    mark = PREVIOUS_MARK.strip()
    old = [v for v in seen if "pid 1001" in v[0]]
    new = [v for v in seen if "pid 1002" in v[0]]
    assert old and new, seen
    # while the new run measured, the old figures were marked (the mark itself still works)
    assert any(v[2] and mark in v[0] and mark in v[1] for v in old), old
    for blas, machine, banner, _ in new:
        assert mark not in blas and mark not in machine and not banner, (blas, machine, banner)
    assert not s.timing_running and not view.previous.visible


def test_the_stored_result_note_is_the_previous_runs_while_a_new_run_measures(numbered_worker):
    """Newcomer run: a stored result shown, "↻ Time again" pressed: under the under-way banner the yellow "Stored
    result, not a new measurement: … ↻ Time again measures anew." stayed at full strength over the faded figures, as
    if it spoke of the run just asked for. While the new run measures it is faded and marked as the previous run's,
    as the verdict is; the new run's figures come without it."""
    from rlxviz.app.jobs import Runner
    from rlxviz.app.state import AppState
    from rlxviz.app.timingview import PREVIOUS_MARK, TimingView

    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8, repeat=21, warmup=0)
    view = TimingView(state=s)
    s.time_all()
    s.time_all()  # the stored run, shown again with its note
    assert "Stored result" in view.origin.object and view.origin.visible
    assert view.origin.styles.get("opacity", "1") == "1"
    seen: list[tuple[str, bool, str, bool]] = []
    s.param.watch(lambda *e: seen.append((view.origin.object, view.origin.visible,
                                          view.origin.styles.get("opacity", "1"), view.previous.visible)), WATCHED)
    s.time_all(fresh=True)
    under_way = [v for v in seen if v[3]]
    assert under_way and all(v[1] and "Stored result" in v[0] for v in under_way), seen
    for text, _, opacity, _ in under_way:
        assert text.startswith(f"**{PREVIOUS_MARK.strip()}**") and opacity == "0.45", (text, opacity)
    assert not view.previous.visible and not view.origin.visible and view.origin.styles.get("opacity", "1") == "1"
