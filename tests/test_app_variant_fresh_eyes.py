"""A newcomer's walk through the teaching variants and the path box (issue: fresh eyes on the app).

- A variant on, then a model it cannot apply to (an `.onnx` by path, an ONNX upload, IR text, a decoder preset): the
  model loads as built, the variant is set to none, and one line says so (the path was refused, "Still showing
  minilm", with no way out named).
- A variant choice never loads another model: "none (as built)" after a failed path goes back to the model shown
  (it loaded the path still in the box).
- Why ② is off is said when it is clicked, once, in one line; not on every load of an ONNX file or IR text, and not
  six times for llama-block.
- A refused path (a pickle, a device, a missing file, a folder without config.json) marks nothing stale.
- "Layer to break" keeps the user's value across models variants do not apply to; clamped (and said) only when past
  the layers of a model they do apply to.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from onnx_tiny import onnx_bytes

from rlxviz.app.controls import VariantControls, one_reason
from rlxviz.app.jobs import Runner
from rlxviz.app.sources import ALLOWED_DIRS_ENV
from rlxviz.app.start import BREAK_LAYER, PASSES_DO, STEPS, STEPS_NO_BREAK, StartHere, note_html
from rlxviz.app.state import AppState

SMALL_IR = """graph small {
  %0 = input {name="x"} : f32[2, 8]
  %1 = tanh(%0) : f32[2, 8]
  return %1
}"""

VARIANT_WORDS = "teaching variants apply"
"""Words of every "variant does not apply" reason (`session.variant_unavailable`)."""


@pytest.fixture
def folder(monkeypatch, tmp_path) -> Path:
    """An allowed folder holding two ONNX files, a pickle, a folder without config.json and a broken .onnx."""
    inside = tmp_path / "models"
    inside.mkdir()
    (inside / "roberta.onnx").write_bytes(onnx_bytes())
    (inside / "other.onnx").write_bytes(onnx_bytes("Tanh"))
    (inside / "broken.onnx").write_bytes(b"not an onnx file")
    (inside / "weights.bin").write_bytes(b"x")
    (inside / "empty").mkdir()
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(inside))
    return inside


def tiny(**kw: object) -> AppState:
    return AppState(runner=Runner(background=False), **{"preset": "bert-tiny", "seq": 8, **kw})


def broken(s: AppState) -> None:
    s.variant_layer = 1
    s.apply_variant("dead_h1_user")
    assert s.variant == "dead_h1_user" and "layer 1 NOT fused" in s.message, s.message


def dropped_once(s: AppState) -> None:
    """The message says, once and in one line, that the variant was set to none."""
    assert s.variant == "none" and s.message.count("set to none (as built)") == 1, s.message
    assert len(s.message.splitlines()) == 1, s.message


@pytest.mark.parametrize("name", ["roberta.onnx", "other.onnx"])
def test_an_onnx_path_with_a_variant_on_loads_as_built_and_says_so(folder, name):
    s = tiny()
    broken(s)
    s.param.update(checkpoint_dir=str(folder / name), source="checkpoint")
    assert s.model.name == name[:-5] and s.model.meta.get("onnx_file"), s.message
    assert not s.stale and "Still showing" not in s.message, s.message
    dropped_once(s)
    assert s.message.startswith(f"Now showing {name[:-5]} (path on the server), was bert-tiny"), s.message
    assert "version 0 equals the ONNX model" in s.message, s.message  # the file's check still follows


def test_an_onnx_upload_and_ir_text_and_a_decoder_drop_the_variant_alike(folder):
    s = tiny()
    broken(s)
    s.load_upload({"gpt.onnx": onnx_bytes("Tanh")})
    assert s.model.name == "gpt" and not s.stale, s.message
    dropped_once(s)
    for fields in ({"ir_text": SMALL_IR, "source": "ir"}, {"source": "preset", "preset": "llama-block"}):
        s.param.update(source="preset", preset="bert-tiny")
        broken(s)
        s.param.update(**fields)
        assert s.model.name in ("small", "llama-block") and not s.stale, s.message
        dropped_once(s)


def test_none_after_a_failed_path_goes_back_to_the_model_shown(folder):
    """A path read and failed leaves bert-tiny shown with the path still in the box: "none (as built)" and any other
    variant act on bert-tiny; neither loads the path."""
    s = tiny()
    broken(s)
    s.param.update(checkpoint_dir=str(folder / "broken.onnx"), source="checkpoint")
    assert s.model.name == "bert-tiny" and s.source == "checkpoint" and s.message_kind == "danger", s.message
    s.apply_variant("none")
    assert s.model.name == "bert-tiny" and s.source == "preset" and s.variant == "none", s.message
    assert not s.stale and s.message_kind != "danger", s.message
    s.param.update(checkpoint_dir=str(folder / "broken.onnx"), source="checkpoint")
    assert s.model.name == "bert-tiny" and s.stale, s.message
    s.apply_variant("pre_ln")
    assert s.model.name == "bert-tiny" and s.source == "preset" and s.variant == "pre_ln" and not s.stale, s.message


ONNX_PATH = "onnx path"
"""Stands for the fields of `folder`'s roberta.onnx in a parametrized list (the folder is a fixture)."""


def _fields(name: str, folder: Path) -> dict[str, object]:
    return {"checkpoint_dir": str(folder / "roberta.onnx"), "source": "checkpoint"} if name == ONNX_PATH else \
        {"ir": {"ir_text": SMALL_IR, "source": "ir"}, "llama": {"source": "preset", "preset": "llama-block"}}[name]


@pytest.mark.parametrize("kinds", [("ir", "llama"), pytest.param((ONNX_PATH, "ir", "llama"),
                                                                 marks=pytest.mark.sweep)])
def test_why_break_is_off_is_said_when_clicked_and_not_after_the_next_load(folder, kinds):
    s = tiny()
    start, vc = StartHere(state=s, show_why=lambda: None), VariantControls(state=s)
    for fields in (_fields(k, folder) for k in kinds):
        s.param.update(**fields)
        assert start.brk.disabled and start.note.object == note_html([(STEPS_NO_BREAK, False)]), start.note.object
        assert VARIANT_WORDS not in s.message and "do not apply" not in s.message, s.message
        start.break_layer()  # a click: now it says why, in one line
        assert "BERT" in start.note.object and len(start.note.object.splitlines()) == 1, start.note.object
        assert vc.why_off.object.count("*") == 2, vc.why_off.object  # one line in the sidebar, not one per variant
    s.param.update(source="preset", preset="bert-tiny")
    assert not start.brk.disabled and start.note.object == note_html([(STEPS, False)]), start.note.object
    assert vc.why_off.object == "" and VARIANT_WORDS not in s.message, s.message
    s.param.update(checkpoint_dir=str(folder / "other.onnx"), source="checkpoint")  # another model, not clicked
    assert start.note.object == note_html([(STEPS_NO_BREAK, False)]), start.note.object


def test_one_reason_drops_the_variant_names():
    reasons = {n: f"gpt is not a BERT encoder: teaching variants ({n} too) change a BERT layer" for n in "abc"}
    assert one_reason({**reasons, "none": ""}) == "gpt is not a BERT encoder: teaching variants change a BERT layer"
    assert one_reason({"a": "", "none": ""}) == ""
    assert one_reason({"a": "x.", "b": "y."}) == "x. y."  # two reasons that differ are both said


def test_a_refused_path_marks_nothing_stale(folder):
    """A path refused before anything is read (a pickle, a device, missing, a folder without config.json) leaves the
    panes as they were: not greyed. (A pickle and a device were refused by the loader, after the load began, and the
    shown model's panes and timing charts went pale.)"""
    s = tiny()
    s.param.update(checkpoint_dir=str(folder / "roberta.onnx"), source="checkpoint")
    assert s.model.name == "roberta" and not s.stale
    fifo = folder / "pipe"
    os.mkfifo(fifo)
    for name in ("weights.bin", "pipe", "missing.onnx", "empty", "weights.bin"):
        s.param.update(checkpoint_dir=str(folder / name))
        assert s.model.name == "roberta" and not s.stale, (name, s.stale)
        assert s.message_kind == "danger" and s.message.endswith("Still showing roberta."), (name, s.message)
        assert len(s.message.splitlines()) == 1, s.message


@pytest.mark.parametrize("kinds", [("ir",), pytest.param(("ir", ONNX_PATH, "llama"), marks=pytest.mark.sweep)])
def test_layer_to_break_survives_models_variants_do_not_apply_to(folder, kinds):
    s = tiny(preset="minilm")
    StartHere(state=s, show_why=lambda: None)
    assert s.variant_layer == BREAK_LAYER == 1
    s.variant_layer = 3
    for fields in (_fields(k, folder) for k in kinds):
        s.param.update(**fields)
        assert s.variant_layer == 3, fields
        s.param.update(source="preset", preset="minilm")
        assert s.variant_layer == 3 and s.model.name == "minilm", fields
    s.apply_variant("dead_h1_user")
    assert "layer 3 NOT fused" in s.message, s.message


def test_layer_to_break_past_a_smaller_bert_is_clamped_and_said(folder):
    s = tiny(preset="minilm")
    s.variant_layer = 5
    s.preset = "bert-tiny"  # two layers: 5 is out of range, with or without a variant on
    assert s.variant_layer == 1 and "layer 5 became 1" in s.message, s.message
    s.preset = "minilm"
    s.variant_layer = 4
    s.apply_variant("dead_h1_user")
    s.preset = "bert-tiny"
    assert s.variant_layer == 1 and "layer 4 became 1" in s.message and "layer 1 NOT fused" in s.message, s.message


def test_the_strip_says_what_a_pass_may_do_to_the_graph():
    """Not "shrink pass by pass": `fuse_shared_input_matmul` grows the graph (one matmul and its slices)."""
    assert "shrink pass by pass" not in STEPS and PASSES_DO in STEPS and PASSES_DO in STEPS_NO_BREAK
    s = tiny()
    grew = [st.pass_name for st in s.trace.steps if len(st.after) > len(st.before)]
    shrank = [st.pass_name for st in s.trace.steps if len(st.after) < len(st.before)]
    assert shrank and len(shrank) >= len(grew), (shrank, grew)  # "most shrink it"
    if grew:
        assert "more, smaller nodes" in PASSES_DO


def test_the_folded_strip_keeps_a_way_to_the_drop_zone():
    """After ① the strip folds to one row and its drop zone hides (for the graph's height); a "drop .onnx" button in
    that row brings the zone back, as the README's "drop your own .onnx on the strip's drop zone" promises."""
    import panel as pn

    s = tiny()
    zone = pn.Column(pn.pane.Markdown("zone"))
    start = StartHere(state=s, show_why=lambda: None, dropper=zone)
    assert zone.visible and not start.drop_btn.visible and start.drop_btn in start.strip.objects
    start.step.clicks += 1
    assert start.folded and not zone.visible and start.drop_btn.visible
    assert start.drop_btn.height <= 34 and "drop .onnx" in start.drop_btn.label  # within the folded row's height
    start.drop_btn.clicks += 1
    assert zone.visible and not start.drop_btn.visible
    start.brk.clicks += 1  # folding again (idempotent) leaves the zone the user asked for
    assert zone.visible
