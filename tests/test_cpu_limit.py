"""Import time limits count CPU time, not wall-clock time (issue 37, item 9): on a loaded machine a 175-node file was
refused because "the import has taken over 120 s". A load that computes past its limit is stopped (a fake busy
child); one whose wall time passes while it waits for a core, using little CPU, completes; a stopped child still ends
at the wall-clock backstop (`bounded.WALL_FACTOR` times the limit; tests/test_isolated.py)."""

from __future__ import annotations

import time
from pathlib import Path

import isolation_helpers as helpers
import pytest

from rlxviz import session
from rlxviz.ir.bounded import Deadline, cap_cpu
from rlxviz.models.onnx import driver, validate
from rlxviz.models.onnx import read as onnx_import
from rlxviz.session import isolated

GPT2 = Path(__file__).resolve().parent / "fixtures/onnx/gpt2.onnx"


def test_a_busy_child_is_stopped_at_its_cpu_time_limit():
    """60 s of computing on a 3 s limit: stopped by the CPU limit (the wall backstop, 30 s, leaves room for a
    loaded machine's slower start)."""
    with pytest.raises(session.StoppedError) as e:
        isolated.run_isolated(helpers.spin, 60.0, timeout_s=3, what="busy.onnx")
    assert str(e.value) == "busy.onnx: stopped after 3 s of CPU time (the CPU-time limit on a load)"


def test_a_child_slow_in_wall_time_but_light_on_cpu_completes():
    """3 s of wall time on a 1 s limit: a wall-clock limit refused it; its CPU time is far under the limit."""
    assert isolated.run_isolated(helpers.idle, 3.0, 7, timeout_s=1, what="slow.onnx") == 7


def test_deadline_counts_this_threads_cpu_time_with_a_wall_backstop():
    d = Deadline(0.2)
    time.sleep(0.3)  # wall time passes, no CPU: within the limit
    assert d.exceeded() == ""
    helpers.spin(0.3)
    assert d.exceeded() == "taken over 0.2 s of CPU time"
    w = Deadline(0.05, wall_factor=2)
    time.sleep(0.15)
    assert w.exceeded() == ("taken over 0.1 s of wall time (2x its 0.05 s CPU-time limit: the process was stopped "
                            "or starved)")


def test_the_importer_states_its_limit_in_cpu_time(monkeypatch):
    monkeypatch.setattr(driver, "MAX_IMPORT_SECONDS", 1e-9)
    with pytest.raises(onnx_import.OnnxImportError, match=r"the import has taken over 1e-09 s of CPU time; stopped "
                                                          r"here \(a graph of [\d,]+ nodes\)"):
        onnx_import.load_onnx(GPT2, batch=1, seq=8)


def test_shape_inference_child_is_bounded_in_cpu_time_not_wall_time(monkeypatch):
    monkeypatch.setattr(validate, "VALIDATE_SECONDS", 2.0)
    assert validate._isolated(lambda: (time.sleep(1.0), "fine")[1]) == "fine"  # 1 s wall, no CPU
    assert validate._isolated(lambda: str(helpers.spin(30.0))) == (
        "ONNX's shape inference took over 2 s of CPU time on this file; refused")


def test_cap_cpu_refuses_a_non_positive_budget():
    with pytest.raises(ValueError, match="positive"):
        cap_cpu(0)
