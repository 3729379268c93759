"""A refused upload changes nothing (newcomer report): a truncated .onnx dropped on the drop zone marked the panes
"Stale" although the model shown stayed. The upload set the fields asking for it (source, variant none, the
over-threshold variant's raised sequence length put back), the load failed, and the fields were put back after: the
panes and the sequence box saw a model asked for that never came (with the over-threshold variant, the box and the
state passed 8 and 65 to each other until Python's recursion limit). A file whose protobuf layout is no ONNX model's
(`sources.onnx_layout_error`: truncated, not protobuf, no graph) is now refused before any field changes."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_app_views import tiny

from rlxviz.app.controls import ModelControls
from rlxviz.app.sources import SourceError, check_upload, onnx_layout_error
from rlxviz.app.whyview import WhyView


def _data() -> bytes:
    return (Path(__file__).parent / "fixtures" / "onnx" / "zoo" / "deit.ortopt.onnx").read_bytes()


def _drop(mc: ModelControls, files: dict[str, bytes]) -> None:
    mc._on_drop(type("Dropped", (), {"new": files})())


@pytest.mark.parametrize("variant", ["none", "over_threshold"])
def test_a_truncated_onnx_dropped_changes_nothing_and_marks_nothing(variant: str):
    s = tiny(selected_layer=0, variant=variant)
    why, mc = WhyView(state=s), ModelControls(state=s)
    model, trace, key = s.model, s.trace, s.model_key()
    changed: list[str] = []
    s.param.watch(lambda *es: changed.extend(e.name for e in es), ["source", "upload_id", "variant", "seq", "stale",
                                                                     "trace"])
    data = _data()
    _drop(mc, {"deit.onnx": data[: len(data) // 3]})
    assert changed == [] and s.model is model and s.trace is trace and s.model_key() == key, changed
    assert s.message_kind == "danger" and "deit.onnx: not a readable ONNX model" in s.message, s.message
    assert "truncated?" in s.message and f"Still showing {model.name}" in s.message, s.message
    assert s.stale == "" and not why.stale.banner.visible
    assert all(p.styles.get("opacity", "1") == "1" for p in why.stale.panes)


def test_the_layout_check_passes_whole_files_and_names_what_is_wrong():
    data = _data()
    assert onnx_layout_error(data) == ""
    assert "ends inside field 7 (graph)" in onnx_layout_error(data[:5000])
    assert onnx_layout_error(b"") == "it holds no graph"
    assert "starts no protobuf field" in onnx_layout_error(b"not an onnx file")
    with pytest.raises(SourceError, match=r"^my-net\.onnx: not a readable ONNX model \(ends inside"):
        check_upload({"my-net.onnx": data[:-3]})
    assert check_upload({"my-net.onnx": data}) == {"model.onnx": data}


def test_a_load_that_fails_after_the_layout_check_leaves_the_raised_sequence_and_its_box():
    """A file the layout check passes whose load fails (no opset: the loader refuses it) still sets the fields and
    puts them back: with the over-threshold variant the sequence box got an event of the lowered value after the
    state's raised one was back, and box and state passed 8 and 65 to each other until RecursionError. The box now
    takes the state's value itself."""
    import onnx

    m = onnx.load_from_string(_data())
    del m.opset_import[:]
    s = tiny(selected_layer=0, variant="over_threshold")
    mc = ModelControls(state=s)
    model, seq = s.model, s.seq
    _drop(mc, {"no-opset.onnx": m.SerializeToString()})
    assert s.message_kind == "danger" and f"Still showing {model.name}" in s.message, s.message
    assert s.model is model and s.variant == "over_threshold" and s.seq == seq == mc.seq.value > 8
    assert s.stale == ""


@pytest.mark.parametrize("command", ["explain", "render", "ir"])
def test_the_cli_says_what_the_app_says_for_a_truncated_file(tmp_path, capsys, command):
    """The app said `ends inside field 7 (graph): the file has 20,000 bytes, the field needs ...; truncated?` where
    the CLI said only `not a readable ONNX model (DecodeError: ... Wire format was corrupt)`: both now read the
    file's layout with `models.onnx.layout.onnx_layout_error`, one line, exit 2."""
    from clirun import one_line_error, run

    cut = _data()[:20000]
    path = tmp_path / "deit.onnx"
    path.write_bytes(cut)
    with pytest.raises(SourceError) as app:
        check_upload({"deit.onnx": cut})
    why = str(app.value).partition("(")[2].rpartition(")")[0]
    assert why.startswith("ends inside field 7 (graph): the file has 20,000 bytes"), why
    extra = ["-o", tmp_path / "a.svg"] if command == "render" else []
    code, _, err = run(capsys, command, path, *extra)
    assert code == 2, err
    one_line_error(err, command, f"{path}: not a readable ONNX model ({why})")
    assert "DecodeError" not in err
