"""The app's timing/overlay jobs are bounded (issue 40): each in its own child through `session.run_isolated`,
killed past `RLXVIZ_TIMING_SECONDS`, its address space capped from the memory budget, and a stuck job of one
session does not hold another session's job."""
import operator
import os
import threading
import time

import isolation_helpers
import pytest

from rlxviz import session
from rlxviz.app import timeproc


def test_a_stuck_job_is_stopped_at_its_limit_while_another_completes(monkeypatch):
    monkeypatch.setenv("RLXVIZ_TIMING_SECONDS", "8")
    outcome: list[BaseException] = []

    def hostile():
        try:
            timeproc._bounded(time.sleep, 10_000, what="timing hostile")
        except BaseException as e:  # noqa: BLE001 - kept for the assertions
            outcome.append(e)

    t0 = time.monotonic()
    t = threading.Thread(target=hostile)
    t.start()
    time.sleep(0.5)
    assert timeproc._bounded(operator.add, 2, 3, what="timing other") == 5  # not queued behind the stuck job
    assert t.is_alive(), "the stuck job should still be running when the other one completes"
    t.join(60)
    assert not t.is_alive() and len(outcome) == 1
    e = outcome[0]
    assert isinstance(e, session.StoppedError)
    assert str(e) == "timing hostile: stopped after 8 s (the wall-time limit on a timing job)"
    assert 7.5 <= time.monotonic() - t0 < 60


def test_a_job_past_the_memory_budget_gives_one_line(monkeypatch):
    monkeypatch.setenv("RLXVIZ_MAX_MEMORY_MB", "64")
    with pytest.raises(session.StoppedError, match=r"^timing big: out of memory while timing \(the timing job may "):
        timeproc._bounded(isolation_helpers.allocate, 8 << 30, what="timing big")


@pytest.mark.parametrize(("raw", "want"), [("", 300.0), ("7.5", 7.5), ("-1", 300.0), ("soon", 300.0)])
def test_time_limit_setting(monkeypatch, raw, want):
    monkeypatch.setenv("RLXVIZ_TIMING_SECONDS", raw)
    assert timeproc.timing_seconds() == want


def test_time_in_worker_runs_the_clis_timing_in_a_child():
    model = session.load("bert-tiny", 1, 8)
    trace = session.run_pipeline(model.graph, session.build_pipeline("canonical"))
    run = timeproc.time_in_worker(trace, session.feeds(model, ""), model.weights, warmup=0, repeat=1)
    assert run.pid != os.getpid() and len(run.rows) == len(trace.versions())
