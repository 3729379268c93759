"""A refusal before any load is no failed load (a newcomer run: /etc/passwd refused, "Still showing small", and the
Why tab then said "Stale: showing the previous model" over a greyed view, and the start strip said "small is not a
BERT encoder", judged on a checkpoint that never loaded). Nothing was loaded, so the panes are as current as before:
no stale mark, and the strip judges ② on the model shown. A load that started and failed still marks them."""

from __future__ import annotations

from pathlib import Path

import pytest
from served import SMALL_IR
from test_app_views import tiny

from rlxviz.app.controls import ModelControls
from rlxviz.app.sources import ALLOWED_DIRS_ENV, SourceError, check_in_roots
from rlxviz.app.start import STEPS_NO_BREAK, StartHere, note_html
from rlxviz.app.state import AppState
from rlxviz.app.whyview import WhyView
from rlxviz.ir import format_graph


def _open(mc: ModelControls, path: str) -> None:
    """The Folder tab's path box and its Load path button."""
    mc.folder.value = path
    mc.folder_btn.clicks += 1


def _unmarked(s: AppState, why: WhyView) -> None:
    assert s.stale == "" and not why.stale.banner.visible, s.stale
    assert all(p.styles.get("opacity", "1") == "1" for p in why.stale.panes)


@pytest.mark.parametrize("typed, said", [("/etc/passwd", "outside the allowed"), ("../out", "outside the allowed"),
                                         ("missing-folder", "no such file or folder"), ("  ", "Type the path")])
def test_a_refused_path_marks_nothing_stale(monkeypatch, tmp_path: Path, typed: str, said: str):
    root = tmp_path / "models"
    root.mkdir()
    (tmp_path / "out").mkdir()
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(root))
    monkeypatch.chdir(root)  # `../out` resolves out of the root, `missing-folder` inside it
    s = tiny(selected_layer=0)
    why, mc = WhyView(state=s), ModelControls(state=s)
    trace = s.trace
    _open(mc, typed)
    assert s.message_kind == "danger" and said in s.message, s.message
    assert s.model.name == "bert-tiny" and s.trace is trace
    _unmarked(s, why)


def test_paths_are_refused_when_no_folder_is_allowed_and_nothing_is_marked(monkeypatch):
    monkeypatch.delenv(ALLOWED_DIRS_ENV, raising=False)
    s = tiny()
    why, mc = WhyView(state=s), ModelControls(state=s)
    _open(mc, "/etc")
    assert "disabled on this server" in s.message, s.message
    _unmarked(s, why)


def test_an_upload_refused_for_size_or_kind_marks_nothing(monkeypatch):
    monkeypatch.setenv("RLXVIZ_MAX_UPLOAD_MB", "0.001")
    s = tiny()
    why = WhyView(state=s)
    s.load_upload({"big.onnx": b"\0" * 4096})
    assert s.message_kind == "danger" and "at most" in s.message, s.message
    _unmarked(s, why)
    s.load_upload({"notes.txt": b"hello"})
    assert s.message_kind == "danger", s.message
    _unmarked(s, why)


def test_a_load_that_started_and_failed_marks_with_its_reason_and_a_refusal_after_it_does_not(
        monkeypatch, tmp_path: Path):
    """IR text that does not parse is a load that failed: marked stale, the banner saying why itself (a newcomer
    dismissed the message and the banner still said "see the message above" over none). A path refused after it
    (the controls now ask for that path, not the IR text) marks nothing, as on a page with no earlier failure: the
    banner said "loading the new one failed" while the message said "Still showing bert-tiny"."""
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(tmp_path))
    s = tiny(selected_layer=0)
    why, mc = WhyView(state=s), ModelControls(state=s)
    s.param.update(ir_text=format_graph(s.model.graph).replace("= add(", "= add(%9999, ", 1), source="ir")
    failed = s.stale
    assert failed.startswith("Stale: showing the previous model (bert-tiny)") and why.stale.banner.visible
    assert "message above" not in failed and "undefined value %9999" in failed, failed
    s.param.update(message="")  # the message's dismiss button
    assert s.stale == failed and "%9999" in why.stale.banner.object
    _open(mc, "/etc/passwd")
    assert "outside the allowed" in s.message and "Still showing bert-tiny" in s.message
    _unmarked(s, why)
    _open(mc, "x.npz")
    assert "Still showing bert-tiny" in s.message
    _unmarked(s, why)


def test_the_strip_judges_break_on_the_ir_model_shown_after_a_refused_path(monkeypatch, tmp_path: Path):
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(tmp_path))
    s = tiny()
    start, mc = StartHere(state=s, show_why=lambda: None), ModelControls(state=s)
    mc.ir.value = SMALL_IR
    mc.ir_btn.clicks += 1
    before = start.note.object
    assert s.model.name == "small" and start.brk.disabled and before == note_html([(STEPS_NO_BREAK, False)]), before
    for typed in ("/etc/passwd", str(tmp_path / "missing")):
        _open(mc, typed)
        assert s.source == "checkpoint" and s.message_kind == "danger" and "Still showing small" in s.message
        assert start.brk.disabled and start.note.object == before, start.note.object
        assert "not a BERT encoder" not in start.note.object and not s.stale


def test_check_in_roots_says_outside_before_existence(tmp_path: Path):
    root = (tmp_path / "root")
    root.mkdir()
    (root / "m.onnx").write_bytes(b"x")
    check_in_roots(str(root / "m.onnx"), [root])  # inside, there: no refusal
    with pytest.raises(SourceError, match="outside the allowed model folders"):
        check_in_roots(str(tmp_path / "nothing-here"), [root])  # outside: said so, existence not revealed
    with pytest.raises(SourceError, match="outside the allowed"):
        check_in_roots(str(root / ".." / "root-sibling"), [root])
    with pytest.raises(SourceError, match="no such file or folder"):
        check_in_roots(str(root / "gone.onnx"), [root])


@pytest.mark.parametrize("files", [{"notes.json": b"{}"}, {"notes.txt": b"hello"},
                                   {"config.json": b"{}", "extra.json": b"{}"}])
def test_a_refused_upload_names_both_ways_to_upload_and_the_model_still_shown(files):
    """Newcomer run: "Upload exactly two files: the checkpoint's config.json and model.safetensors (got:
    notes.json)." left out the single .onnx file the chooser's hint offers, and did not say which model stays."""
    s = tiny()
    s.load_upload(files)
    assert s.message_kind == "danger" and ".onnx file" in s.message and "config.json" in s.message, s.message
    assert s.message.endswith("Still showing bert-tiny.") or "Still showing bert-tiny, as before" in s.message, \
        s.message
    assert s.model.name == "bert-tiny"


@pytest.mark.parametrize("typed, said", [("notes.md", "neither a checkpoint folder, an .onnx file nor an IR text file"),
                                         ("data.zip", "neither a checkpoint folder, an .onnx file nor an IR text file"),
                                         ("empty", "a folder without config.json"),
                                         ("exports", "(it holds m.onnx: type that file's path)")])
def test_a_path_that_is_neither_a_checkpoint_folder_nor_an_onnx_file_names_both(monkeypatch, tmp_path: Path,
                                                                                  typed: str, said: str):
    """Issue 39: the path box's refusals spoke of a checkpoint folder only ("not a folder; give the folder holding
    config.json and model.safetensors"), though an .onnx file under the allowed folders opens too. A file of another
    kind, or a folder without config.json, is refused before any load, naming both; nothing is marked stale."""
    root = tmp_path / "models"
    (root / "empty").mkdir(parents=True)
    (root / "exports").mkdir()
    (root / "exports" / "m.onnx").write_bytes(b"")
    (root / "notes.md").write_text("hello")
    (root / "data.zip").write_bytes(b"PK")
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(root))
    s = tiny(selected_layer=0)
    why, mc = WhyView(state=s), ModelControls(state=s)
    trace = s.trace
    _open(mc, str(root / typed))
    assert s.message_kind == "danger" and said in s.message, s.message
    assert "checkpoint folder" in s.message and ".onnx file" in s.message and str(root) in s.message, s.message
    assert "IR text file (.ir, .rlx, .txt)" in s.message, s.message  # newcomer run 38: the box opens those too
    assert s.message.endswith("Still showing bert-tiny.") and s.model.name == "bert-tiny" and s.trace is trace
    _unmarked(s, why)
