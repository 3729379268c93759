"""A newcomer's faults in the app (issue 39's fresh run), without a browser: what the page is sent in one step, the
layout's Bokeh validation, the sidebar's sources, and a batch or sequence length out of range.

- A page step (`step.frozen_step`) sends every model it adds with the values it has when the step ends: after ① then
  ②, the before pane, put back in the step that shows ②'s run and changed later in it, stayed on "before fuse_sdpa".
- The page's layout gives Bokeh no W-1005 (FIXED_SIZING_MODE): "fixed" sizing without a height filled the log.
- Opening the sidebar's Built-in tab does not replace an uploaded model; choosing a built-in model does, and the
  message says what replaced what.
- A batch or sequence length out of range becomes the nearest end of the range, and the message says the range and
  why (the model's position table); it was put back with no word.
"""

from __future__ import annotations

from pathlib import Path

import panel as pn
import pytest
from bokeh.core.validation.check import check_integrity
from bokeh.document import Document
from bokeh.models import Column, Div
from bokeh.protocol import Protocol

from rlxviz.app.controls import ModelControls
from rlxviz.app.jobs import Runner
from rlxviz.app.main import build_app
from rlxviz.app.state import AppState
from rlxviz.app.step import frozen_step

ONNX = Path(__file__).parent / "fixtures" / "onnx"
SMALL_IR = """graph small {
  %0 = input {name="x"} : f32[2, 8]
  %1 = tanh(%0) : f32[2, 8]
  return %1
}"""


def tiny(**kw: object) -> AppState:
    kw.setdefault("preset", "bert-tiny")
    kw.setdefault("seq", 8)
    return AppState(runner=Runner(background=False), **kw)


# ---------------------------------------------------------------- a page step's patches


class Browser:
    """A copy of a server document that takes the server's patches as a connected browser would: each change event
    made into a PATCH-DOC message at once (`ServerConnection.send_patch_document`) and applied to the copy."""

    def __init__(self, doc: Document) -> None:
        self.server = doc
        self.doc = Document.from_json(doc.to_json())
        doc.models.flush_synced()  # what the page was sent whole
        self.protocol = Protocol()
        doc.on_change(self._patch)

    def _patch(self, event: object) -> None:
        self.protocol.create("PATCH-DOC", [event]).apply_to_document(self.doc)

    def text(self, div: Div) -> str:
        return self.doc.get_model_by_id(div.id).text


def _page() -> tuple[Document, Column, Div, Div]:
    doc = Document()
    before, after = Div(text="before fuse_sdpa"), Div(text="after fuse_sdpa")
    row = Column(children=[before, after])
    doc.add_root(row)
    return doc, row, before, after


def test_a_pane_put_back_and_changed_in_one_step_reaches_the_page_as_it_ends():
    """The ② case: the input graph alone (the before pane taken out), then the run shown and stepped on in one step:
    the pane is put back with the first version's title, then given the stepped-to one."""
    doc, row, before, after = _page()
    page = Browser(doc)
    frozen_step(doc, lambda: setattr(row, "children", [after]))()

    def show_and_step() -> None:
        before.text = "before fuse_sdpa"
        row.children = [before, after]
        before.text, after.text = "before fuse_transformer_layer", "after fuse_transformer_layer"

    frozen_step(doc, show_and_step)()
    assert page.text(before) == "before fuse_transformer_layer"
    assert page.text(after) == "after fuse_transformer_layer"


@pytest.mark.parametrize("changes", [1, 3])
def test_a_model_new_in_a_step_reaches_the_page_with_its_last_values(changes):
    doc, row, _, after = _page()
    page = Browser(doc)
    new = Div(text="v0")

    def step() -> None:
        row.children = [*row.children, new]
        for i in range(1, changes + 1):
            new.text = f"v{i}"
        after.text = "after, changed"

    frozen_step(doc, step)()
    assert page.text(new) == f"v{changes}" and page.text(after) == "after, changed"
    new.text = "later"  # attached when the step ended: a later change is sent as usual
    assert page.text(new) == "later"


# ---------------------------------------------------------------- Bokeh's validation of the layout


def test_the_layout_gives_bokeh_no_validation_warning():
    """Every tab drawn once: the page's models pass Bokeh's checks (W-1005 FIXED_SIZING_MODE from the version row's
    checkbox and the drop zone's holder filled the server log at every page)."""
    state = tiny()
    tmpl = build_app(state)
    doc = Document()
    tmpl.server_doc(doc)
    tabs = next(o for o in tmpl.main.objects[0].objects if isinstance(o, pn.Tabs))
    for i in range(len(tabs)):
        tabs.active = i
    issues = check_integrity(list(doc.models))
    assert not issues.warning and not issues.error, [(i.code, i.name, i.extra) for i in issues.warning]
    # the widths the fixed sizing held stay fixed
    hide = next(m for m in doc.models if "rv-hide" in getattr(m, "css_classes", []))
    assert hide.width == 235 and hide.sizing_mode in (None, "fixed")


# ---------------------------------------------------------------- sources


def _uploaded_gpt2() -> tuple[AppState, ModelControls]:
    s = tiny()
    mc = ModelControls(state=s)
    s.load_upload({"gpt2.onnx": (ONNX / "gpt2.onnx").read_bytes()})
    assert s.model.name == "gpt2" and s.source == "upload", s.message
    return s, mc


def test_opening_built_in_keeps_the_upload_and_choosing_one_says_what_it_replaced():
    s, mc = _uploaded_gpt2()
    trace = s.trace
    mc.source.value = "preset"  # the tab only
    assert s.model.name == "gpt2" and s.trace is trace and s.source == "upload"
    assert mc.preset_btn.visible and mc.preset_btn.label == "Show bert-tiny"
    assert mc.preset_note.visible and "gpt2" in mc.preset_note.object
    mc.preset_btn.clicks += 1  # explicit
    assert s.model.name == "bert-tiny" and s.source == "preset"
    assert s.message == "Now showing bert-tiny (built-in), was gpt2 (upload).", s.message
    assert not mc.preset_btn.visible and not mc.preset_note.visible


@pytest.mark.parametrize("choice", ["minilm-shaped", "llama-block"])
def test_a_built_in_model_chosen_in_the_list_replaces_the_upload_and_says_so(choice):
    s, mc = _uploaded_gpt2()
    if choice not in s.param.preset.objects:
        pytest.fail(f"no preset {choice}: {s.param.preset.objects}")
    mc.source.value = "preset"
    mc.preset.value = choice
    assert s.source == "preset" and s.preset == choice and s.model is not None and s.model.name != "gpt2"
    assert s.message.startswith(f"Now showing {s.model.name} (built-in), was gpt2 (upload)."), s.message


def test_ir_text_then_built_in_says_the_switch_and_same_source_changes_stay_quiet():
    s = tiny()
    mc = ModelControls(state=s)
    mc.ir.value = SMALL_IR
    mc.ir_btn.clicks += 1
    assert s.model.name == "small" and s.message == "Now showing small (IR text), was bert-tiny (built-in).", \
        s.message
    mc.source.value = "preset"
    assert s.model.name == "small"
    mc.preset_btn.clicks += 1
    assert s.model.name == "bert-tiny" and "was small (IR text)" in s.message
    s.param.update(message="")
    mc.preset.value = "minilm-shaped"  # built-in to built-in: the list itself says what is shown
    assert s.model.name != "bert-tiny" and s.message == ""


# ---------------------------------------------------------------- batch and sequence length out of range


@pytest.mark.parametrize("name, typed, becomes, words", [
    ("seq", 600, 128, ["2..128", "bert-tiny's position table has 128 rows"]),  # bert-tiny: 128 positions
    ("seq", 1, 2, ["2..128"]),
    ("seq", -4, 2, ["2..128"]),
    ("batch", 65, 64, ["1..64"]),
    ("batch", 0, 1, ["1..64"]),
])
def test_a_shape_out_of_range_is_clamped_and_said(name, typed, becomes, words):
    s = tiny()
    mc = ModelControls(state=s)
    getattr(mc, name).value = typed
    assert getattr(s, name) == becomes and getattr(mc, name).value == becomes
    assert s.trace is not None and not s.stale and s.message_kind == "info", s.message
    label = {"seq": "Sequence length", "batch": "Batch"}[name]
    assert s.message.startswith(f"{label} {typed} is out of range") and f"became {becomes}" in s.message, s.message
    assert all(w in s.message for w in words), s.message
    shape = s.model.graph.inputs[0].shape
    assert shape[0 if name == "batch" else 1] == becomes
    getattr(mc, name).value = 3  # in range: taken, and the note that no longer holds goes
    assert getattr(s, name) == 3 and s.message == ""


def test_a_long_sequence_on_a_512_position_model_and_with_a_variant():
    s = tiny(preset="minilm-shaped")
    mc = ModelControls(state=s)
    lo, hi, why = s.shape_range("seq")
    assert (lo, hi) == (2, 512) and "512 rows" in why, why
    s.apply_variant("extra_h1_user")
    mc.seq.value = 9000
    assert s.seq == 512 and "9000 is out of range 2..512" in s.message and "Teaching variant" in s.message, s.message
    mc.seq.value = None  # an emptied box is put back
    assert mc.seq.value == 512 and s.seq == 512


def test_the_shape_boxes_say_the_most_they_take_by_the_box(tmp_path, monkeypatch):
    """Newcomer run: 100000000 in Sequence length showed 512, and the load's error spoke of seq 512 with no word of
    the bound by the box. The app's bound stays (graphs are built, drawn and timed on a shared server), and each box's
    label says the most it takes for the model shown: the position table of a model with one, else the app's."""
    import shutil

    from rlxviz.app.sources import ALLOWED_DIRS_ENV

    s = tiny()
    mc = ModelControls(state=s)
    assert mc.seq.text.label == "Sequence length (≤ 128)" and mc.batch.text.label == "Batch (≤ 64)"  # bert-tiny: 128
    shutil.copy(Path(__file__).parent / "fixtures/onnx/gpt2.onnx", tmp_path / "gpt2.onnx")  # 64 positions, no config
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(tmp_path))
    s.param.update(checkpoint_dir=str(tmp_path / "gpt2.onnx"), source="checkpoint")
    assert s.model.name == "gpt2" and mc.seq.text.label == "Sequence length (≤ 512)", s.message
    mc.seq.text.value = "100000000"
    assert mc.seq.value == 512 and mc.seq.text.label == "Sequence length (≤ 512)"
    assert "Sequence length 100000000 is out of range 2..512" in s.message, s.message
    assert "seq 512 is over the 64 positions" in s.stale, s.stale  # the export's own limit, with the box's 512 said
    s.preset = "minilm-shaped"
    assert mc.seq.text.label == "Sequence length (≤ 512)"


def test_number_boxes_leave_the_range_to_the_server_which_says_it():
    """A browser number box with a start or end puts a value past it back itself, and the server never hears of it
    (typed 0 or 600 came back as 16 with no word): the boxes whose range the server clamps and says have neither."""
    from rlxviz.app.controls import PipelineControls, VariantControls

    s = tiny()
    mc, vc, pc = ModelControls(state=s), VariantControls(state=s), PipelineControls(state=s)
    for box in (mc.batch, mc.seq, vc.layer, pc.threshold):  # text read on the server: no range, no filter
        assert isinstance(box.text, pn.widgets.TextInput) and not hasattr(box.text, "start"), box.name
    pc.threshold.value = 0
    assert s.threshold == 1 and pc.threshold.value == 1 and "Attention gate 0 is out of range" in s.message
    pc.threshold.value = None  # empty: the pipeline's default
    assert s.threshold is None


# ---------------------------------------------------------------- smaller things a newcomer met


def test_no_lone_dismiss_and_the_strip_points_at_the_banner_where_it_is():
    """A page that opens on a finished run (no job ran, so the status bar was never updated) showed "dismiss" with
    no message; after ② the strip said "the banner above", which lies below it."""
    from rlxviz.app.start import StartHere
    from rlxviz.app.statusbar import StatusBar

    s = tiny()
    s.param.update(message="")
    bar = StatusBar(state=s)
    assert not bar.close.visible and not bar.alert.visible
    s.message = "something to dismiss"
    assert bar.close.visible
    start = StartHere(state=s, show_why=lambda: None)
    start.break_layer()
    assert "banner below" in start.note.object and "above" not in start.note.object


def test_a_switch_sentence_does_not_stay_over_the_next_model_of_the_same_source():
    """Newcomer run: after "Now showing bert-tiny (built-in), was small (IR text).", choosing minilm-shaped in the
    list drew it while the message still said "Now showing bert-tiny". Built-in to built-in stays quiet (the list says
    what is shown), and the earlier switch's sentence goes."""
    s = tiny()
    mc = ModelControls(state=s)
    mc.ir.value = SMALL_IR
    mc.ir_btn.clicks += 1
    mc.source.value = "preset"
    mc.preset_btn.clicks += 1
    assert s.model.name == "bert-tiny" and s.message.startswith("Now showing bert-tiny (built-in), was small")
    mc.preset.value = "minilm-shaped"
    assert s.model.name == "minilm-shaped" and "Now showing bert-tiny" not in s.message, s.message
