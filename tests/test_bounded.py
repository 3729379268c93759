"""The one bounded child-process helper (`rlxviz.ir.bounded`): job slots, the forked child's limits, and that every
isolation goes through it (the importer's validation, lint's host-node checks, the session's loads, the app's
timing jobs)."""

from __future__ import annotations

import ast
import os
import signal
import threading
import time
from pathlib import Path

import isolation_helpers as helpers
import pytest

from rlxviz.ir import bounded
from rlxviz.ir.bounded import ForkedFailure, JobSlots, forked

PACKAGE = Path(__file__).resolve().parents[1] / "rlxviz"


@pytest.mark.parametrize("n", [1, 2, 3])
def test_job_slots_hold_at_most_n_jobs_and_read_their_count_once(n: int):
    calls = []

    def count() -> int:
        calls.append(1)
        return n

    slots = JobSlots(count)
    assert calls == []  # read at the first job, not when made
    held = [slots.held().acquire(blocking=False) for _ in range(n + 1)]
    assert held == [True] * n + [False]
    for _ in range(n):
        slots.held().release()
    assert len(calls) == 1


def test_job_slots_make_a_second_job_wait_for_the_first():
    slots, order = JobSlots(lambda: 1), []

    def job(name: str, seconds: float) -> None:
        with slots.held():
            order.append(f"{name} in")
            time.sleep(seconds)
            order.append(f"{name} out")

    first = threading.Thread(target=job, args=("a", 0.2))
    first.start()
    while not order:
        time.sleep(0.005)
    job("b", 0.0)
    first.join()
    assert order == ["a in", "a out", "b in", "b out"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forked children need os.fork")
def test_a_forked_child_reports_a_crash_and_a_failure_apart():
    assert forked(lambda: "text", 10, cpu_s=5) == "text"
    with pytest.raises(ForkedFailure) as e:
        forked(lambda: os.kill(os.getpid(), signal.SIGABRT) or "", 10, cpu_s=5)
    assert e.value.signal == "SIGABRT" and not e.value.timed_out
    with pytest.raises(ForkedFailure) as e:
        forked(lambda: str(1 / 0), 10)
    assert e.value.signal == "" and not e.value.timed_out and e.value.said() == "failed"


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="forked children need os.fork")
def test_a_forked_child_past_its_cpu_time_is_ended_by_sigxcpu():
    with pytest.raises(ForkedFailure) as e:
        forked(lambda: str(helpers.spin(30.0)), 60, cpu_s=1)
    assert e.value.signal == "SIGXCPU"


def _imports(path: Path) -> set[str]:
    """Every module name `path` imports from, relative ones resolved to their last part (`..ir.bounded` -> bounded)."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[-1])
            names.update(f"{node.module.split('.')[-1]}.{a.name}" for a in node.names)
    return names


@pytest.mark.parametrize("module", ["models/onnx/validate.py", "ir/host_rules.py", "session/isolated.py",
                                   "app/timeproc.py"])
def test_every_isolation_uses_the_one_helper_and_starts_no_child_of_its_own(module: str):
    path = PACKAGE / module
    text = path.read_text()
    assert "bounded" in _imports(path), module
    for own in ("os.fork(", "subprocess.Popen(", "BoundedSemaphore(", "setrlimit(", "prctl("):
        assert own not in text, f"{module} starts or limits a child itself ({own}): use rlxviz.ir.bounded"


def test_the_helper_stands_on_the_bottom_floor():
    assert bounded.__name__ == "rlxviz.ir.bounded"
    tree = ast.parse(Path(bounded.__file__).read_text())
    own = [ast.unparse(n) for n in ast.walk(tree) if (isinstance(n, ast.ImportFrom) and (n.level or (n.module or "")
           .startswith("rlxviz"))) or (isinstance(n, ast.Import) and any(a.name.startswith("rlxviz") for a in n.names))]
    assert own == []  # the standard library only: any package may use it
