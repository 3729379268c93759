"""Version 0 is checked against the model itself, so an import that changes the numbers can never pass silently:
against the ONNX file (ONNX Runtime) in `explain` and `time`, against the exporter's outputs stored in the inputs
`.npz` as `out:NAME` (`run`, `time`), and against `--expect OUT.npz`. A wrong version 0 (a weight changed after
import, outputs perturbed) gives a DIFFERS line and exit 1; a name that is no output, or a wrong shape, is one
line, exit 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from clirun import one_line_error, run

from rlxviz.models.onnx import load_onnx
from rlxviz.session import load_inputs
from rlxviz.session.fidelity import against_expected, against_onnx

CASES = Path(__file__).parent / "fixtures" / "onnx" / "cases"
FALCON, FALCON_IO = CASES / "falcon.onnx", CASES / "falcon_io.npz"


def _falcon():
    m = load_onnx(FALCON, batch=2, seq=8)
    return m, load_inputs(FALCON_IO, m.graph)


def test_a_faithful_import_equals_the_onnx_model_and_the_exporters_outputs():
    m, user = _falcon()
    assert set(user.expected) == {"last_hidden_state"} and set(user.feeds) == {"input_ids", "attention_mask"}
    for c in (against_onnx(m, user.feeds), against_expected(m, user.feeds, user.expected, "falcon_io.npz")):
        assert c.ok and c.max_err < 1e-5 and c.line().startswith("version 0 equals ")


def test_an_import_that_changed_the_numbers_is_never_ok():
    m, user = _falcon()
    name = max(m.weights, key=lambda k: m.weights[k].size)  # what the id() bug did: another constant bound
    m.weights[name] = m.weights[name][::-1].copy()
    for c in (against_onnx(m, user.feeds), against_expected(m, user.feeds, user.expected, "falcon_io.npz")):
        assert not c.ok and "DIFFERS" in c.line() and "no later check can be trusted" in c.line()


def test_run_reads_out_members_as_expected_outputs_and_fails_on_a_difference(tmp_path, capsys):
    code, _, err = run(capsys, "run", FALCON, "-i", FALCON_IO, "-o", tmp_path / "o.npz")
    assert code == 0 and "version 0 equals the expected outputs in falcon_io.npz" in err
    d = dict(np.load(FALCON_IO))
    d["out:last_hidden_state"] = d["out:last_hidden_state"] + 0.5
    bad = tmp_path / "bad.npz"
    np.savez(bad, **d)
    code, _, err = run(capsys, "run", FALCON, "-i", bad, "-o", tmp_path / "o.npz", "-q")
    assert code == 1 and "DIFFERS from the expected outputs in bad.npz: max err 0.5" in err


def test_expect_file_names_an_output_or_is_refused(tmp_path, capsys):
    d = dict(np.load(FALCON_IO))
    inputs, expect = tmp_path / "in.npz", tmp_path / "want.npz"
    np.savez(inputs, **{k: v for k, v in d.items() if not k.startswith("out:")})
    np.savez(expect, last_hidden_state=d["out:last_hidden_state"])
    code, _, err = run(capsys, "run", FALCON, "-i", inputs, "-o", tmp_path / "o.npz", "--expect", expect)
    assert code == 0 and "equals the expected outputs in want.npz" in err
    np.savez(expect, logits=d["out:last_hidden_state"])
    code, _, err = run(capsys, "run", FALCON, "-i", inputs, "-o", tmp_path / "o.npz", "--expect", expect)
    assert code == 2
    one_line_error(err, "run", "out:logits names no output of the model (its outputs: last_hidden_state)")


@pytest.mark.parametrize("command", ["explain", "time"])
def test_explain_and_time_say_whether_version_0_equals_the_onnx_model(capsys, command):
    extra = ["--repeat", "1", "--no-battery", "-i", FALCON_IO] if command == "time" else ["--batch", "2", "--seq", "8"]
    code, out, _ = run(capsys, command, FALCON, *extra)
    assert "version 0 equals the ONNX model (ONNX Runtime" in out
    if command == "time":  # shapes from the inputs (2 x 8), not the default 1 x 16; and the out: member checked
        assert "batch 2, seq 8" in out and "version 0 equals the expected outputs in falcon_io.npz" in out
        assert code == 0


def test_an_expected_output_larger_than_every_output_is_refused_from_its_header(tmp_path):
    """An `out:` array is read to be compared, so its size is bounded first: a 1 GiB header is one line, unread."""
    d = dict(np.load(FALCON_IO))
    p = tmp_path / "huge.npz"
    np.savez(p, **{k: v for k, v in d.items() if not k.startswith("out:")}, **{"out:last_hidden_state": np.zeros(
        (2, 8, 64, 40), np.float32)})
    m = load_onnx(FALCON, batch=2, seq=8)
    with pytest.raises(ValueError, match="out:last_hidden_state has shape .*larger than every output of the graph"):
        load_inputs(p, m.graph)


def test_an_expect_file_is_bounded_from_its_headers_too(tmp_path, capsys):
    d = dict(np.load(FALCON_IO))
    inputs, expect = tmp_path / "in.npz", tmp_path / "want.npz"
    np.savez(inputs, **{k: v for k, v in d.items() if not k.startswith("out:")})
    np.savez(expect, last_hidden_state=np.zeros((2, 8, 64, 40), np.float32))
    code, _, err = run(capsys, "run", FALCON, "-i", inputs, "-o", tmp_path / "o.npz", "--expect", expect)
    assert code == 2
    one_line_error(err, "run", "last_hidden_state has shape [2, 8, 64, 40], larger than every output of the graph")
