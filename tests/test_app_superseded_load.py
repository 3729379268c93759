"""A load superseded by a newer one (the user picked another model while the first was still running) leaves the
page busy and says nothing: the newer load, queued behind it, stops the progress and shows its own outcome.

The superseded load cleared `busy` between the two jobs; a teaching variant clicked in that gap took the model still
shown (the superseded one) for a refused load and went back to it (`AppState.shown_source`), so the page ended on
the first model with the variant, while the sidebar had asked for the second (CI, `test_browser_problems.py::
test_6`, on a cold kernel cache)."""

from __future__ import annotations

from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState


def _superseded(s: AppState) -> int:
    """A generation a newer `Runs.load` has replaced, as when the user changed the model during the job (the newer
    load's call made the page busy, on the page's thread, as `Runs.load` does)."""
    s.runs._generation += 1
    s._start("Loading the model…")
    return s.runs._generation - 1


def test_a_superseded_load_leaves_the_page_busy_for_the_newer_one():
    s = AppState(runner=Runner(background=False), preset="bert-tiny")
    assert s.trace is not None and not s.busy
    s.runs._load_job(_superseded(s))
    assert s.busy, "the newer load, still queued, owns the progress bar"
    assert s.shown_source() is None, "a variant clicked now must not go back to the model shown"
    s.runs._load_job(s.runs._generation)  # the newer load
    assert not s.busy


def test_a_superseded_loads_failure_is_not_said(monkeypatch):
    s = AppState(runner=Runner(background=False), preset="bert-tiny")
    before = (s.message, s.message_kind)

    def newer_load_then_boom(model):  # noqa: ANN001, ANN202 - stands in for Runs._run_pipeline
        s.runs._generation += 1  # the user picked another model while this pipeline ran
        raise RuntimeError("the superseded model broke")

    monkeypatch.setattr(s.runs, "_run_pipeline", newer_load_then_boom)
    s.runs._load_job(s.runs._generation)
    assert (s.message, s.message_kind) == before and s.busy
    monkeypatch.setattr(s.runs, "_run_pipeline", lambda model: (_ for _ in ()).throw(RuntimeError("broke")))
    s.runs._load_job(s.runs._generation)  # the current load's failure is said
    assert s.message_kind == "danger" and s.message != before[0] and not s.busy


def test_the_page_is_busy_from_the_change_not_from_the_jobs_start():
    """A load queued behind a running job: the page says busy at once, so a variant clicked before the job starts
    applies to the model asked for."""
    s = AppState(runner=Runner(background=False), preset="bert-tiny")
    s.runner = Runner(background=True)
    gate = s.runner.submit("other", lambda: __import__("time").sleep(0.3))  # the worker is taken for a moment
    s.preset = "minilm"  # the load waits in the queue
    assert s.busy and s.shown_source() is None
    gate.result()
    s.runner.wait(60)
    assert not s.busy and s.runs._model_key[:2] == ("preset", "minilm")
