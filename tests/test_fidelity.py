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
from rlxviz.session.fidelity import against_expected, against_onnx, import_checks

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


GRANITE, ROBERTA_IO = CASES / "granite.onnx", CASES / "roberta_io.npz"


def test_another_models_outputs_are_not_blamed_on_the_import(capsys):
    """granite.onnx with roberta_io.npz (another model's outputs): ONNX Runtime on the file equals version 0 on those
    inputs, so the import did not change the numbers; the line said it did. It says the expected outputs do not match
    what the file computes now, in `explain` and in the app's check on an inputs file (`onnx_check`, the Timing
    tab's), and the exit code still says something differs."""
    from rlxviz.session.fidelity import onnx_check

    code, out, _ = run(capsys, "explain", GRANITE, "--inputs", ROBERTA_IO)
    lines = [ln for ln in out.splitlines() if ln.startswith("version 0")]
    assert lines[0].startswith("version 0 equals the ONNX model (ONNX Runtime"), lines
    said = lines[1]
    assert said.startswith("version 0 DIFFERS from the expected outputs in roberta_io.npz: max err "), said
    assert ("equals version 0 on these inputs, so the import did not change the numbers: the expected outputs do not "
            "match what the file computes (are they this model's outputs?)") in said, said
    assert "the import changed the numbers" not in out and code == 1
    with np.load(ROBERTA_IO) as z:
        shapes = {k: z[k].shape for k in z.files if not k.startswith("out:")}
    m = load_onnx(GRANITE, input_shapes=shapes)
    line, ok = onnx_check(m, load_inputs(ROBERTA_IO, m.graph))
    assert not ok and line == f"On the arrays of roberta_io.npz: {lines[0]}; {said}", line


def test_expected_outputs_are_blamed_on_the_import_only_when_the_file_disagrees_too():
    """A version 0 that differs from its ONNX file (a weight reversed, as the id() bug bound another constant) still
    blames the import on the expected-outputs line too; with no run of the file to compare (`with_onnx` off), the
    line says the two differ and blames neither."""
    m, user = _falcon()
    name = max(m.weights, key=lambda k: m.weights[k].size)
    m.weights[name] = m.weights[name][::-1].copy()
    file, expected = import_checks(m, user.feeds, user.expected, "falcon_io.npz")
    assert not file.ok and not expected.ok and expected.file_agrees is False
    for c in (file, expected):
        assert "the import changed the numbers, so no later check can be trusted" in c.line(), c.line()
    assert "did not change" not in expected.line()
    (alone,) = import_checks(m, user.feeds, user.expected, "falcon_io.npz", with_onnx=False)
    assert not alone.ok and alone.file_agrees is None
    assert "which of the two is wrong is not known" in alone.line() and "import changed" not in alone.line()
