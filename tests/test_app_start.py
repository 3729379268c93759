"""The "start here" strip (three clicks: step, break a layer, ask why) and the model drop zone, without a browser."""

from pathlib import Path

import pytest
from served import SMALL_IR
from test_app_views import tiny

from rlxviz.app.controls import ModelControls
from rlxviz.app.sources import DROP_TAKES
from rlxviz.app.start import BREAK_VARIANT, STEPS, STEPS_NO_BREAK, StartHere, note_html

FIX = Path(__file__).parent / "fixtures/onnx"


def test_three_clicks_step_break_and_ask_why():
    s = tiny()
    opened = []
    start = StartHere(state=s, show_why=lambda: opened.append(True))
    assert s.version == 0 and not start.brk.disabled
    start.step.clicks += 1
    assert s.version == 1 and s.version_labels[1] in start.note.object.replace("\\", "")
    text = start.note.object.split(">", 1)[1]  # each text says the next click first: a cut keeps it
    assert text.startswith("<b>Next: ① again, then ②."), text
    start.brk.clicks += 1
    assert s.variant == BREAK_VARIANT and s.variant_layer == 1
    assert "layer 1 NOT fused" in s.message and "guard" in s.message, s.message
    assert start.note.object.split(">", 1)[1].startswith("<b>Next: ③."), start.note.object
    refused = s.layer_status(1).first  # the panes show the pass that refused the layer, its rejection marked
    # the reader is dead: no verdict that the layer must stay unfused; dead-code elimination first lets it fuse, and
    # the refusal's compiler fix says so (not a multi-output op)
    said = start.note.object + s.message
    assert "stay unfused" not in said and "Removing it (dead_code_elimination) lets it fuse." in said, said
    assert refused.fix.startswith("dead_code_elimination before fuse_transformer_layer: reduce_mean (node "), refused
    assert s.version_labels[s.version] == f"after {refused.pass_name}", (s.version_labels[s.version], refused)
    start.why.clicks += 1
    assert opened == [True] and s.selected_layer == 1
    assert start.note.object.split(">", 1)[1].startswith("<b>Next: the Why tab"), start.note.object
    start.show_on(False)  # another tab than Graph and Why
    assert not start.strip.visible
    start.show_on(True)
    assert start.strip.visible
    assert not start.back.visible
    start.hide.clicks += 1
    start.show_on(True)
    assert not start.strip.visible and start.back.visible  # dismissed, with a way back in the header
    start.show_on(False)  # on another tab, brought back: it shows when its tabs do
    start.back.clicks += 1
    assert not start.strip.visible and not start.back.visible
    start.show_on(True)
    assert start.strip.visible
    start.hide.clicks += 1
    start.back.clicks += 1  # back on Graph or Why: at once
    assert start.strip.visible and not start.back.visible


def test_break_is_off_for_a_model_without_variants():
    s = tiny(preset="llama-block")
    start = StartHere(state=s, show_why=lambda: None)
    # why ② is off is said when it is clicked, not on every load (newcomer: it was said unasked)
    assert start.brk.disabled and start.note.object == note_html([(STEPS_NO_BREAK, False)]), start.note.object
    start.break_layer()
    assert s.variant == "none" and "not a BERT encoder" in start.note.object


def test_a_dropped_onnx_file_loads_and_half_a_checkpoint_waits():
    s = tiny()
    holder = ModelControls(state=s).make_dropper()
    first = holder[0]
    first.value = {"config.json": '{"model_type": "bert"}'}  # text files arrive decoded
    assert s.source == "preset" and "now drop the checkpoint's model.safetensors" in s.message
    s.apply_variant(BREAK_VARIANT)  # the start strip's second click, then one's own model: it loads as built
    assert holder[0] is not first and not holder[0].value  # the zone is emptied once its files are taken
    holder[0].value = {"gpt2.onnx": (FIX / "gpt2.onnx").read_bytes()}
    assert s.source == "upload" and s.model.meta.get("onnx_file") and s.trace is not None
    assert s.variant == "none" and s.message_kind != "danger" and not s.stale, s.message
    assert not holder[0].value
    s.message = ""
    holder[0].value = {"gpt2.onnx": (FIX / "gpt2.onnx").read_bytes()}  # the same file again: it loads again
    assert "equals the ONNX model" in s.message and s.model.meta.get("onnx_file"), s.message
    holder[0].value = {"my-net.onnx": b"not an onnx file"}  # a broken file: its error names it, gpt2 stays
    assert "my-net.onnx" in s.message and s.message_kind == "danger" and not s.stale, s.message  # gpt2 kept
    holder[0].value = {"gpt2.onnx": (FIX / "gpt2.onnx").read_bytes()}  # the good file again: read and checked again
    assert "equals the ONNX model" in s.message and not s.stale, s.message  # (the broken file's error stayed up)


def test_a_dropped_file_the_zone_does_not_take_is_said_and_the_model_stays():
    """Issue 39: a .txt, a pickled .pt, a .zip, an .npz or an .onnx file's external data dropped on the zone did
    nothing at all. One line now says what was received, where that kind goes, and what the zone takes; the model
    shown stays (same model, same run, not stale), and the zone is emptied for the next drop."""
    s = tiny()
    holder = ModelControls(state=s).make_dropper()
    model, trace = s.model, s.trace
    for name, data, where in [("notes.txt", "graph g {", "IR editor tab"), ("weights.pt", b"\x80\x04", "never opened"),
                              ("model.zip", b"PK\x03\x04", "not a model file"), ("inputs.npz", b"PK", "Timing tab"),
                              ("model.onnx.data", b"\0" * 8, "path"), ("<b>x</b>.bin", b"\x80", "never opened")]:
        holder[0].value = {name: data}
        assert s.message.startswith(f"Dropped {name}: not taken (") and where in s.message, s.message
        assert DROP_TAKES in s.message and f"Still showing {model.name}." in s.message, s.message
        assert "\n" not in s.message and s.message_kind == "warning"
        assert s.model is model and s.trace is trace and s.source == "preset" and not s.stale
        assert not holder[0].value
    holder[0].value = {"m.onnx": b"\x08\x07", "m.onnx.data": b"\0" * 8}  # external data never comes along
    assert s.message.startswith("Dropped m.onnx with its external data m.onnx.data: "), s.message
    assert "path box" in s.message and s.message.endswith(f"Still showing {model.name}.") and s.model is model
    assert s.source == "preset" and not s.stale
    holder[0].value = {"model.safetensors": b"\0"}  # half a checkpoint alone: it waits for its config.json
    assert "Dropped model.safetensors: now drop the checkpoint's config.json too." == s.message
    holder[0].value = {"readme.md": "hi"}  # with half a checkpoint held: both said, the half still held
    assert "Dropped readme.md: not taken" in s.message and "now drop the checkpoint's config.json" in s.message
    assert s.model is model and s.source == "preset"


def test_the_line_follows_the_model_and_fits_one_line():
    """After ① and a new model the line names the new model and version (it kept the old ones); it is one line with
    the whole text as its tooltip, names escaped."""
    s = tiny(preset="llama-block")
    start = StartHere(state=s, show_why=lambda: None)
    start.step.clicks += 1
    s.preset = "bert-tiny"
    label, number = s.version_labels[s.version], s.version_index()  # numbered as the version list numbers it
    assert f"Showing <b>{label}</b> (version {number}) of <b>{s.model.name}</b>" in start.note.object, start.note.object
    assert note_html([("<b>x</b>", True)]).count("<b>") == 1  # a name is text, not markup
    start.brk.clicks += 1
    start.why.clicks += 1
    s.preset = "minilm-shaped"  # the lines of ② and ③ belonged to the last model: the three steps again
    assert 'title="Three clicks' in start.note.object and "rv-note-line" in start.note.object


def _load_ir(mc: ModelControls, text: str) -> None:
    """The IR editor's text and its Load IR button."""
    mc.ir.value = text
    mc.ir_btn.clicks += 1


def test_a_refused_ir_load_leaves_break_on_for_the_model_shown():
    """IR text that does not parse leaves bert-tiny shown: ② stays on and breaks bert-tiny's layer (it was left
    disabled, judged on the IR text that never loaded), and the line does not say variants are off."""
    s = tiny()
    start = StartHere(state=s, show_why=lambda: None)
    mc = ModelControls(state=s)
    _load_ir(mc, "graph g { nonsense")
    assert s.source == "ir" and s.message_kind == "danger" and s.model.name == "bert-tiny"
    assert not start.brk.disabled and "IR text" not in start.note.object, start.note.object
    assert s.shown_source() == ("preset", {"preset": "bert-tiny"})
    s.busy = True  # while a job runs, a load may be on its way: the user's new choice is not undone
    assert s.shown_source() is None
    s.busy = False
    start.brk.clicks += 1
    assert s.source == "preset" and s.preset == "bert-tiny" and s.variant == BREAK_VARIANT
    assert "layer 1 NOT fused" in s.message, s.message


def test_break_follows_each_load_after_a_refusal():
    """A valid IR load turns ② off (its model is IR text); a refused one after it keeps it off (the model shown is
    still IR); a valid Built-in load turns it on again, and the line is the three steps again."""
    s = tiny()
    start = StartHere(state=s, show_why=lambda: None)
    mc = ModelControls(state=s)
    _load_ir(mc, SMALL_IR)
    assert s.message_kind != "danger" and start.brk.disabled and start.note.object == note_html([(STEPS_NO_BREAK,
                                                                                                     False)])
    _load_ir(mc, SMALL_IR.replace("tanh(%0)", "tanh(%77)"))
    assert s.message_kind == "danger" and start.brk.disabled
    mc.source.value = "preset"  # the tab alone changes nothing (issue 39: it replaced the model shown unasked)
    assert s.source == "ir" and start.brk.disabled
    mc.preset_btn.clicks += 1  # "Show bert-tiny"
    assert s.source == "preset" and s.model.name == "bert-tiny" and not start.brk.disabled
    assert start.note.object == note_html([(STEPS, False)])


def test_ir_refused_by_its_check_leaves_break_on_too():
    """IR text that parses but names a node it never defines (refused by the check, not the parser): the same."""
    s = tiny()
    start = StartHere(state=s, show_why=lambda: None)
    mc = ModelControls(state=s)
    _load_ir(mc, SMALL_IR.replace("tanh(%0)", "tanh(%77)"))
    assert s.source == "ir" and s.message_kind == "danger" and s.model.name == "bert-tiny", s.message
    assert not start.brk.disabled
    start.break_layer()
    assert s.source == "preset" and s.variant == BREAK_VARIANT and "layer 1 NOT fused" in s.message, s.message


def test_a_long_message_opens_folded_to_one_line_and_unfolds():
    """The banner (`StatusBar`): a long or many-line message opens folded (`rv-clamp`) with "more"; "more" shows it
    whole, dropped over the rows below (`rv-over`: the graph keeps its room), and "less" folds it again; a new message
    folds again; a short one is whole with no "more", in the page's flow."""
    from rlxviz.app.statusbar import LONG_MESSAGE, StatusBar

    s = tiny()
    bar = StatusBar(state=s)
    s.apply_variant(BREAK_VARIANT)  # the teaching variant's notice: three lines at 1280 px
    assert len(s.message) > LONG_MESSAGE
    assert "rv-clamp" in bar.alert.css_classes and bar.more.visible and bar.more.label == "more ▾"
    bar.more.clicks += 1
    assert "rv-clamp" not in bar.alert.css_classes and "rv-over" in bar.alert.css_classes
    assert bar.more.label == "less ▴"
    bar.more.clicks += 1
    assert "rv-clamp" in bar.alert.css_classes and "rv-over" not in bar.alert.css_classes
    bar.more.clicks += 1
    s.message = "line one\nline two"  # short but on two lines: folded too
    assert "rv-clamp" in bar.alert.css_classes and bar.more.visible
    s.message = "Loaded."
    assert bar.alert.css_classes == ["rv-message"] and not bar.more.visible and bar.close.visible
    s.message = ""
    assert not bar.more.visible and not bar.close.visible and not bar.alert.visible


def _unknown_op_onnx() -> bytes:
    """A well-formed ONNX model the importer refuses: one node of an op no domain defines."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["y"], domain="no.such.domain")], "g", [x], [y])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("no.such.domain", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    return model.SerializeToString()


REFUSED_UPLOADS = {
    "not protobuf": {"my-net.onnx": b"not an onnx file"},
    "an op nobody defines": {"odd.onnx": _unknown_op_onnx()},
    "a checkpoint whose weights are not safetensors": {"config.json": b'{"model_type": "bert"}',
                                                       "model.safetensors": b"\x00" * 64},
}


@pytest.mark.parametrize("files", REFUSED_UPLOADS.values(), ids=REFUSED_UPLOADS.keys())
def test_a_refused_upload_keeps_the_broken_layer_shown(files):
    """After ② (layer 1 broken), an upload that is not a model is refused and changes nothing else: bert-tiny with
    its broken layer stays shown and asked for (not stale), ② and a re-run act on it; the message names the file
    and says which model is still shown. (The upload switched the source and dropped the variant first: ② was lost
    and the panes went stale.)"""
    s = tiny()
    start = StartHere(state=s, show_why=lambda: None)
    mc = ModelControls(state=s)
    start.brk.clicks += 1
    trace, key = s.trace, s.model_key()
    mc.upload.filename, mc.upload.value = list(files), list(files.values())
    assert s.message_kind == "danger" and "Still showing bert-tiny" in s.message, s.message
    assert any(name in s.message for name in files), s.message
    assert (s.source, s.preset, s.variant, s.variant_layer) == ("preset", "bert-tiny", BREAK_VARIANT, 1)
    assert s.trace is trace and s.model_key() == key and not s.stale and s.shown_source() is None
    assert not start.brk.disabled and start.note.object.split(">", 1)[1].startswith("<b>Next: ③."), start.note.object
    s.variant_layer = 0  # the kept state re-runs: the broken layer moves, bert-tiny again
    assert s.model.name == "bert-tiny" and "layer 0 NOT fused" in s.message, s.message


def test_an_upload_over_the_limit_keeps_the_model_and_says_where_to_put_it(monkeypatch):
    """A dropped file over the upload limit: refused before anything is read, the broken layer stays shown, and the
    message says where the file goes instead (the allowed folder, typed in the path box)."""
    monkeypatch.setenv("RLXVIZ_MAX_UPLOAD_MB", "0.25")
    monkeypatch.setenv("RLXVIZ_ALLOWED_DIRS", str(FIX.resolve()))  # outside the temp folder, which messages hide
    s = tiny()
    start = StartHere(state=s, show_why=lambda: None)
    holder = ModelControls(state=s).make_dropper()
    start.brk.clicks += 1
    trace = s.trace
    holder[0].value = {"big.onnx": (FIX / "gpt2.onnx").read_bytes()}
    assert "this server accepts at most 0 MB" in s.message and str(FIX.resolve()) in s.message, s.message
    assert "path box" in s.message and s.message_kind == "danger"
    assert (s.source, s.variant, s.trace) == ("preset", BREAK_VARIANT, trace) and not s.stale
    assert not start.brk.disabled


def test_a_refused_upload_after_an_upload_keeps_the_first():
    """gpt2.onnx shown, then a broken file: gpt2 stays shown and asked for; a new sequence length re-reads gpt2
    from its kept files (the broken one's were not kept)."""
    s = tiny()
    holder = ModelControls(state=s).make_dropper()
    holder[0].value = {"gpt2.onnx": (FIX / "gpt2.onnx").read_bytes()}
    shown, gpt2 = s.model, s.upload_id
    holder[0].value = {"broken.onnx": b"\x08\x07garbage"}
    assert "broken.onnx" in s.message and f"Still showing {shown.name}" in s.message, s.message
    assert s.source == "upload" and s.upload_id == gpt2 and s.model is shown and not s.stale
    s.seq = 6
    assert s.model is not shown and s.model.name == shown.name and s.message_kind != "danger", s.message
