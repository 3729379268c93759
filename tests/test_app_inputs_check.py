"""The Timing tab checks version 0 on an inputs file's arrays as `rlxviz explain --inputs` does (a newcomer run: after
granite_io.npz was chosen, the banner read "version 0 equals the ONNX model ... max err 4.8e-07", a check on random
inputs that did not say so, and the file's expected output was only "set aside"; the CLI gave 3.6e-07 on the file's
arrays and "equals the expected outputs in granite_io.npz: 2.4e-07"). Now the app runs `session.fidelity.onnx_check`
on the file's arrays (the CLI's `import_checks`, one list), names the inputs each check used, and checks the file's
expected outputs."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.app.timingview import TimingView
from rlxviz.runtime import run_reference
from rlxviz.session import load_inputs
from rlxviz.session.fidelity import RANDOM_INPUTS, import_checks, onnx_check

CASES = Path(__file__).parent / "fixtures" / "onnx" / "cases"


def npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def choose(view: TimingView, name: str, data: bytes) -> None:
    view.inputs.param.update(filename=name, value=data)


def bert_io(s: AppState, shift: float = 0.0) -> bytes:
    """bert-tiny's inputs at the shown shape and, as `out:last_hidden_state`, what the model computes (+ `shift`)."""
    b, n = s.model.graph.inputs[0].shape
    feeds = {"input_ids": np.arange(b * n, dtype=np.int64).reshape(b, n) % 100,
             "attention_mask": np.ones((b, n), np.int64)}
    want = run_reference(s.model.graph, feeds, s.model.weights)[0] + shift
    return npz(**feeds, **{"out:last_hidden_state": want})


@pytest.mark.parametrize("shift, ok", [(0.0, True), (0.5, False)])
def test_an_inputs_files_expected_outputs_are_checked_as_the_cli_checks_them(shift, ok):
    s = AppState(runner=Runner(background=False), preset="bert-tiny", batch=1, seq=8)
    view = TimingView(state=s)
    data = bert_io(s, shift)
    choose(view, "mine.npz", data)
    assert s.user_inputs is not None and s.inputs_file == "mine.npz", s.message
    # the CLI's lines (`rlxviz explain --inputs mine.npz`), on the same arrays
    user = load_inputs(data, s.model.graph, "mine.npz")
    cli = import_checks(s.model, user.feeds, user.expected, "mine.npz")
    assert [c.ok for c in cli] == [ok]
    assert f"On the arrays of mine.npz: {cli[0].line()}" in s.message, s.message
    assert "set aside" not in s.message
    assert s.message_kind == ("info" if ok else "danger"), s.message


def test_onnx_check_names_the_inputs_it_used():
    s = AppState(runner=Runner(background=False), preset="bert-tiny", batch=1, seq=8)
    user = load_inputs(bert_io(s), s.model.graph, "mine.npz")
    line, ok = onnx_check(s.model, user)
    assert ok and line.startswith("On the arrays of mine.npz: version 0 equals the expected outputs in mine.npz")
    assert onnx_check(s.model) == ("", True)  # no ONNX file and no expected outputs: nothing to check
    assert RANDOM_INPUTS == "random inputs (seed 0)"


@pytest.mark.sweep  # slow, only computes: the upload loads in the isolated child process and is checked against
# ONNX Runtime there
def test_granite_io_is_checked_on_its_arrays_and_its_expected_output(capsys):
    from clirun import run

    s = AppState(runner=Runner(background=False), preset="bert-tiny", batch=1, seq=16)
    view = TimingView(state=s)
    s.load_upload({"granite.onnx": (CASES / "granite.onnx").read_bytes()})
    assert s.model.name == "granite", s.message
    assert f"On {RANDOM_INPUTS}: version 0 equals the ONNX model" in s.message, s.message
    data = (CASES / "granite_io.npz").read_bytes()
    choose(view, "granite_io.npz", data)
    assert s.user_inputs is not None and (s.batch, s.seq) == (2, 8), s.message
    code, out, _ = run(capsys, "explain", CASES / "granite.onnx", "--inputs", CASES / "granite_io.npz")
    cli = [ln for ln in out.splitlines() if ln.startswith("version 0 ")]  # `rlxviz explain --inputs`'s two lines
    assert code in (0, 1) and len(cli) == 2 and "the expected outputs in granite_io.npz" in cli[1], out
    assert "On the arrays of granite_io.npz: " + "; ".join(cli) in s.message, s.message
    assert s.message_kind == "info" and "set aside" not in s.message
    assert f"On {RANDOM_INPUTS}: version 0 equals the ONNX model" in s.message  # the load's own check, named too
