"""An IR text file typed in the path box (newcomer run 38: `/work/shared/cases/n4-03-chunked-attn-llama4.rlx` was
refused as "neither a checkpoint folder nor an .onnx file", though `rlxviz explain` takes the same path). The box
opens it under the allowed folders as the CLI reads it (`session.load`), and the app shows what pasting its text
shows; outside the folders, or over the IR text limit (checked on its size, before it is read), it is refused,
nothing marked stale."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from inapp import in_this_process
from test_app_refusals import _open, _unmarked
from test_app_views import tiny

from rlxviz.app.controls import ModelControls
from rlxviz.app.sources import ALLOWED_DIRS_ENV, MAX_IR_CHARS
from rlxviz.app.whyview import WhyView
from rlxviz.ir import format_graph
from rlxviz.session import loading

CASE = Path(__file__).parent / "data" / "cases" / "n4-03-chunked-attn-llama4.rlx"


def _notes(s) -> list[str]:
    return [r.message for r in s.trace.rejections]


def test_an_ir_file_by_path_shows_what_its_pasted_text_shows(monkeypatch):
    in_this_process(monkeypatch)
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(CASE.parent))
    by_path = tiny()
    mc = ModelControls(state=by_path)
    _open(mc, str(CASE))
    assert by_path.message_kind == "info" and by_path.model.name == "chunked_attention_llama4", by_path.message
    assert by_path.model.meta["ir_file"] == str(CASE.resolve())  # read by the CLI's loader
    pasted = tiny()
    pc = ModelControls(state=pasted)
    pasted.param.update(ir_text=CASE.read_text(), source="ir")
    for w in ("batch", "seq", "dims", "text", "style"):  # shapes are the file's own, as the pasted text's
        assert getattr(mc, w).disabled and getattr(pc, w).disabled, w
    assert mc.shape_note.object == pc.shape_note.object != ""
    assert format_graph(by_path.model.graph) == format_graph(pasted.model.graph)
    assert format_graph(by_path.trace.final) == format_graph(pasted.trace.final)
    assert by_path.verdict() == pasted.verdict()
    assert _notes(by_path) == _notes(pasted) and any("additive padding mask" in m for m in _notes(by_path))


def test_an_ir_file_outside_the_allowed_folders_is_refused(monkeypatch, tmp_path: Path):
    in_this_process(monkeypatch)
    (tmp_path / "models").mkdir()
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(tmp_path / "models"))
    s = tiny(selected_layer=0)
    why, mc = WhyView(state=s), ModelControls(state=s)
    trace = s.trace
    _open(mc, str(CASE))
    assert s.message_kind == "danger" and "outside the allowed model folders" in s.message, s.message
    assert s.model.name == "bert-tiny" and s.trace is trace
    _unmarked(s, why)


def test_an_ir_file_over_the_limit_is_refused_before_it_is_read(monkeypatch, tmp_path: Path):
    in_this_process(monkeypatch)
    big = tmp_path / "big.rlx"
    with big.open("wb") as f:  # sparse: MAX_IR_CHARS + 1 bytes on no disk
        os.truncate(f.fileno(), MAX_IR_CHARS + 1)
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(tmp_path))
    read = []
    monkeypatch.setattr(loading, "load_ir_file", lambda *a, **k: read.append(a))
    s = tiny(selected_layer=0)
    why, mc = WhyView(state=s), ModelControls(state=s)
    _open(mc, str(big))
    assert s.message_kind == "danger" and f"{MAX_IR_CHARS + 1} bytes of IR text" in s.message, s.message
    assert f"the limit is {MAX_IR_CHARS}" in s.message and "\n" not in s.message
    assert not read and s.model.name == "bert-tiny"
    _unmarked(s, why)


@pytest.mark.parametrize("name", ["notes.txt", "graph.ir"])
def test_a_file_of_an_ir_suffix_that_is_not_ir_fails_as_the_cli_says(monkeypatch, tmp_path: Path, name: str):
    """Read as IR text, as `rlxviz explain notes.txt` reads it: the syntax error in one line, naming the file."""
    in_this_process(monkeypatch)
    (tmp_path / name).write_text("hello")
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(tmp_path))
    s = tiny()
    _open(ModelControls(state=s), str(tmp_path / name))
    assert s.message_kind == "danger" and f"{name}:1:1" in s.message and s.model.name == "bert-tiny", s.message


def test_a_teaching_variant_is_dropped_for_an_ir_file_by_path(monkeypatch):
    """As for pasted IR text: the variant does not apply to an IR file (its shapes are its own); the file loads as
    written, the variant set to none and said, never built into a checkpoint load."""
    in_this_process(monkeypatch)
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(CASE.parent))
    s = tiny(variant="pre_ln")
    _open(ModelControls(state=s), str(CASE))
    assert s.variant == "none" and s.model.name == "chunked_attention_llama4", s.message
    assert s.variant_unavailable("pre_ln") and "not IR files" in s.variant_unavailable("pre_ln")
    with pytest.raises(loading.SessionError, match="not IR files"):
        loading.load(str(CASE), variant="pre_ln", allowed_roots=[CASE.parent])
