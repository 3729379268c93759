"""The sidebar views without a browser: what each control does to the state (Panel widgets, no server)."""

import re
from pathlib import Path

import numpy as np

from rlxviz.app.controls import ModelControls, PipelineControls, VariantControls
from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState, scrub_paths
from rlxviz.app.text import md_escape
from rlxviz.ir import format_graph, parse_ir

ROOT = Path(__file__).resolve().parents[1]


def tiny(**kw) -> AppState:
    kw.setdefault("preset", "bert-tiny")
    kw.setdefault("seq", 8)
    return AppState(runner=Runner(background=False), **kw)


def test_up_down_move_the_selected_pass_and_apply_runs_once():
    s = tiny()
    runs = []
    s.param.watch(lambda e: runs.append(e.new), "trace")
    pc = PipelineControls(state=s)
    name = s.passes[2]
    pc.pick.value = 2
    pc.moves[0].clicks += 1  # up
    pc.moves[0].clicks += 1  # up again: still the same pass
    assert pc.order[0] == name and pc.pick.value == 0
    pc.moves[1].clicks += 1  # down
    assert pc.order[1] == name and pc.pick.value == 1
    assert not runs and pc.dirty and "Apply" in pc.pending.object and s.passes[2] == name
    pc.rerun.clicks += 1
    assert len(runs) == 1 and s.passes[1] == name and not pc.dirty and pc.pending.object == ""


def test_unticking_keeps_the_pass_off_where_it_moves():
    s = tiny()
    pc = PipelineControls(state=s)
    pc.enabled.value = [i for i in pc.enabled.value if i != 3]
    pc.pick.value = 3
    pc.moves[0].clicks += 1
    assert pc.off == [2] and pc.enabled.value == [i for i in range(len(pc.order)) if i != 2]
    pc.rerun.clicks += 1
    assert s.disabled == [2] and s.enabled_passes == [p for i, p in enumerate(pc.order) if i != 2]


def test_variants_disabled_for_llama_with_the_reason():
    s = tiny()
    vc = VariantControls(state=s)
    s.apply_variant("extra_h1_user")
    s.preset = "llama-block"
    assert s.variant == "none" and s.model.name == "llama-block" and s.message_kind == "warning"
    assert "not a BERT encoder" in s.message
    off = {n for n, b in vc.buttons.items() if b.disabled}
    # over_threshold too: its size gate is the BERT attention block's, which a decoder never becomes
    assert off == {"output_intermediate", "extra_h1_user", "dead_h1_user", "tanh_gelu", "pre_ln", "swapped_residual",
                   "over_threshold"}
    assert "not a BERT encoder" in vc.why_off.object and "not a BERT" in vc.buttons["pre_ln"].description
    assert "not a BERT" in vc.buttons["over_threshold"].description
    s.apply_variant("pre_ln")  # a click that gets through says why instead of raising
    assert s.variant == "none" and "ValueError" not in s.message
    seq = s.seq
    s.apply_variant("over_threshold")  # refused like the others: seq stays
    assert s.variant == "none" and s.seq == seq and "not a BERT encoder" in s.message


def test_variants_disabled_for_an_uploaded_onnx_export():
    """An uploaded GPT-2 export: every variant is unavailable (over_threshold would raise seq past the export's
    64 positions), with the service's reason."""
    s = tiny()
    vc = VariantControls(state=s)
    s.load_upload({"gpt2.onnx": (ROOT / "tests/fixtures/onnx/gpt2.onnx").read_bytes()})
    assert s.model is not None and "onnx_file" in s.model.meta, s.message
    off = {n for n, b in vc.buttons.items() if b.disabled}
    assert off == set(vc.buttons) - {"none"}
    assert "not ONNX files" in vc.buttons["over_threshold"].description
    seq = s.seq
    s.apply_variant("over_threshold")
    assert s.variant == "none" and s.seq == seq and "not ONNX files" in s.message


def test_choosing_ir_text_shows_no_error_until_loaded_and_marks_the_line():
    s = tiny()
    mc = ModelControls(state=s)
    mc.source.value = "ir"
    assert s.source == "preset" and s.message_kind != "danger" and mc.shown == "ir"
    mc.ir_copy.clicks += 1  # "Edit the shown version"
    shown = s.ir_current()
    assert mc.ir.value == shown and len(shown) > 2000
    assert format_graph(parse_ir(mc.ir.value)) == shown  # round-trips
    lines = shown.splitlines()
    lines[5] = lines[5].replace("=", "= =", 1)
    mc.ir.value = "\n".join(lines)
    mc.ir_btn.clicks += 1
    assert s.source == "ir" and s.message_kind == "danger" and s.ir_error[0] == 6
    assert mc.ir.annotations == [{"row": 5, "column": s.ir_error[1] - 1, "text": s.ir_error[2], "type": "error"}]
    assert mc.batch.disabled and mc.seq.disabled and mc.text.disabled and "IR text" in mc.shape_note.object
    mc.ir.value = shown
    mc.ir_btn.clicks += 1
    assert s.message_kind != "danger" and s.ir_error is None and mc.ir.annotations == []


def test_a_long_ir_text_is_not_cut():
    """The old text box stopped at 5,000 characters; the editor takes a whole 6-layer graph."""
    big = tiny(preset="minilm-shaped")
    s = tiny()
    mc = ModelControls(state=s)
    mc.ir.value = format_graph(big.model.graph)
    assert len(mc.ir.value) > 15_000
    mc.ir_btn.clicks += 1
    assert s.message_kind != "danger", s.message
    assert format_graph(s.model.graph) == format_graph(big.model.graph)


def test_messages_do_not_show_server_folders():
    text = "cannot read /tmp/rlxviz-upload-x1/model.safetensors (see /tmp/rlxviz-other/log)"
    out = scrub_paths(text, "/tmp/rlxviz-upload-x1", "/tmp")
    assert out == "cannot read upload/model.safetensors (see <temp>/rlxviz-other/log)"


def test_failed_loads_and_runs_mark_the_panes_stale(monkeypatch):
    """A load or a pipeline run that fails leaves the previous drawing, why-text, timings and IR on screen: each
    is marked stale (a banner naming what it shows, the pane greyed) until a change succeeds. A crashed pass or a
    failed timing is not stale: the panes show the current run."""
    from rlxviz.app.panels import GraphCompare, IRView
    from rlxviz.app.timingview import TimingView
    from rlxviz.app.whyview import WhyView

    s = tiny(selected_layer=0)
    views = [GraphCompare(state=s), WhyView(state=s), TimingView(state=s), IRView(state=s)]
    graph, why = views[0], views[1]

    def marked() -> list[bool]:  # the banner's line, then the whole message folded where the line cuts it
        return [v.stale.banner.visible and v.stale.banner.object.startswith(md_escape(s.stale)) and bool(s.stale)
                and ("<details" in v.stale.banner.object) == bool(s.stale_more) for v in views]

    def greyed() -> list[bool]:
        return [p.styles.get("opacity", "1") == "0.45" for v in views for p in v.stale.panes]

    assert s.stale == "" and marked() == [False] * 4 and not any(greyed())
    good = format_graph(s.model.graph)
    s.param.update(ir_text=good.replace("= add(", "= add(%9999, ", 1), source="ir")  # does not load
    assert s.message_kind == "danger" and s.model.name == "bert-tiny"
    assert s.stale.startswith("Stale: showing the previous model (bert-tiny)") and all(marked()) and all(greyed())
    assert graph.after.svg and "layer 0" in why.text.object  # still drawn: marked, not cleared
    assert s.stale_more == s.message.strip() and "\n" in s.stale_more  # the caret's line, in the box's fold
    s.ir_text = good
    assert s.message_kind != "danger" and s.stale == "" and marked() == [False] * 4 and not any(greyed())

    s.passes = [*s.passes, "no_such_pass"]  # the pipeline fails on the same model
    assert s.message_kind == "danger" and "no_such_pass" in s.message
    assert s.stale.startswith("Stale: showing the previous pipeline run of bert_tiny") and all(marked())
    s.passes = s.passes[:-1]
    assert s.stale == "" and not any(marked())

    monkeypatch.setattr("rlxviz.app.timeproc.time_in_worker", lambda *a, **k: (_ for _ in ()).throw(MemoryError()))
    s.time_all(fresh=True)
    assert s.message.startswith("Timing failed") and s.stale == "" and not any(marked())


def test_timing_table_shows_errors_in_scientific_notation():
    """The max_err column keeps its float values (the table sorts it by number) and is shown through a scientific
    formatter, so 2.93e-08 is not rounded to 0.0 nor 1.2e-06 to 0.000001."""
    from bokeh.models.widgets.tables import ScientificFormatter

    from rlxviz.app.timingview import TimingView

    s = tiny()
    view = TimingView(state=s)
    s.timings = [{"version": "input", "ops": 3, "median_ms": 0.5, "min_ms": 0.4, "iqr_ms": 0.1,
                  "first_call_ms": 3.0, "max_err": 2.93e-8, "speedup": 1.0, "verdict": "ok"},
                 {"version": "fused", "ops": 2, "median_ms": 0.4, "min_ms": 0.3, "iqr_ms": 0.1,
                  "first_call_ms": 3.0, "max_err": 1.2e-6, "speedup": 1.25, "verdict": "ok"}]
    col = view.table.value["max_err"]
    assert col.dtype.kind == "f" and list(col) == [2.93e-8, 1.2e-6]
    fmt = view.table.formatters["max_err"]
    assert isinstance(fmt, ScientificFormatter) and 2 <= fmt.precision <= 3
    for x in (2.93e-8, 1.2e-6, 0.5, 3.0):  # the formatter's rule: scientific when |x| <= 10**low or >= 10**high
        assert abs(x) <= 10.0 ** fmt.power_limit_low or abs(x) >= 10.0 ** fmt.power_limit_high


def test_timing_chart_axis_holds_every_whisker_and_label():
    """The chart's x axis spans every whisker (median ± IQR/2), with room after the widest for its speed-up label;
    Bokeh's automatic range covered the bars only, so on bert-tiny whiskers and labels fell outside."""
    from bokeh.models import LabelSet, Whisker

    from rlxviz.app.timingchart import timing_figure

    rows = [{"version": "input", "median_ms": 0.9, "iqr_ms": 0.6, "speedup": 1.0, "max_err": 1e-7},
            {"version": "fused", "median_ms": 0.5, "iqr_ms": 0.05, "speedup": 1.8, "max_err": 2e-7}]
    p = timing_figure(rows).children[0]
    src = next(a for a in p.center if isinstance(a, Whisker)).source.data
    assert max(src["high"]) == 0.9 + 0.3 and any(isinstance(a, LabelSet) for a in p.center)
    assert p.x_range.start <= min(src["low"]) and p.x_range.start <= 0
    assert p.x_range.end is not None and p.x_range.end >= 1.2 * max(src["high"])


def test_an_invalid_ir_text_marks_the_line_of_the_node_it_names():
    """A lint error (it parses, but a declared type does not fit its operands) names its node: the message gives
    the line that defines it, and the editor marks that line, as for a syntax error."""
    s = tiny()
    mc = ModelControls(state=s)
    lines = format_graph(s.model.graph).splitlines()
    k = next(i for i, t in enumerate(lines) if " = gelu(" in t)
    nid = lines[k].split("=")[0].strip()
    lines[k] = lines[k].replace(": f32[1, 8, 256]", ": f32[1, 8, 255]")
    assert "255" in lines[k]
    mc.ir.value = "\n".join(lines)
    mc.ir_btn.clicks += 1
    assert s.source == "ir" and s.message_kind == "danger"
    assert f"line {k + 1}: invalid graph: {nid} (gelu" in s.message, s.message
    assert "declared type f32[1, 8, 255] but operands give f32[1, 8, 256]" in s.message
    line, col, reason = s.ir_error
    assert (line, col) == (k + 1, lines[k].index("%") + 1) and reason.startswith(f"{nid} (gelu")
    assert mc.ir.annotations == [{"row": k, "column": col - 1, "text": reason, "type": "error"}]
    mc.ir.value = "\n".join(lines).replace("f32[1, 8, 255]", "f32[1, 8, 256]")
    mc.ir_btn.clicks += 1
    assert s.message_kind != "danger" and s.ir_error is None and mc.ir.annotations == []


def test_bidi_and_control_characters_in_model_text_are_shown_escaped():
    """A right-to-left override in a path (`\\u202e`) would make the page show other text than the model holds:
    every escaping helper of the app shows it, and other control characters, as escapes; line breaks stay."""
    from rlxviz.app.text import html_text, md_code, md_pre

    text = "relu @$$x^2$$ \u202eevil\u202c\x1b[2J\nnext"
    for helper in (md_escape, md_code, md_pre, html_text):
        out = helper(text)
        assert "\u202e" not in out and "\x1b" not in out, (helper.__name__, out)
        assert "\\u202e" in out and "\\x1b" in out and "\n" in out, (helper.__name__, out)


def test_why_tab_answers_for_a_graph_without_layer_paths():
    """IR text whose nodes name no layer: the Why tab gives the whole-graph answer `rlxviz explain` prints (graph
    kind, evidence, each missed fusion with its guard), not "Pick a layer" with nothing to pick."""
    import re

    from rlxviz import session
    from rlxviz.app.whyview import WhyView

    s = tiny()
    why = WhyView(state=s)
    assert why.layer.visible and "### Layer 0" in why.text.object  # bert-tiny has layers: the picker, one picked
    text = re.sub(r' @"[^"]*"| @\S+', "", format_graph(s.model.graph))  # every node path dropped
    s.param.update(ir_text=text, source="ir")
    assert s.layers() == [] and s.message_kind != "danger"
    shown = why.text.object
    assert "Pick a layer" not in shown and not why.layer.visible
    # the drawing: the final graph whole, said so (issue 39: a hidden pane was still shown, blank, in the page)
    assert why.graph.visible and "<svg" in why.graph.svg and why.graph.title.startswith("no layer to draw")
    check = session.check_fusion(s.trace, s.model.name)
    # the add of mismatched shapes (the embeddings' broadcast sum) is not a candidate, no missed fusion: listed
    # with what was left out, in the app as `rlxviz explain` says it
    assert not any("residual_same_shape" in m for m in check.misses), check.misses
    assert any("residual_same_shape [not a candidate]" in x for x in check.left_out), check.left_out
    for line in check.render(verbose=True).splitlines():
        assert md_escape(line).replace("  ", "&nbsp;&nbsp;") in shown, line
    assert "residual\\_same\\_shape" in shown and "post-LN" in shown
    s.param.update(source="preset")  # a model with layers again: the picker is back
    assert why.layer.visible and why.graph.visible and "whole graph" not in why.text.object


def test_panes_are_not_faded_after_a_failed_load_then_a_good_one():
    """IR text that does not load (the panes go stale), then the built-in model again: the panes' opacity is set
    back to 1 (an emptied style dict left the browser's opacity 0.45 in place). (A refused upload no longer goes
    stale: it keeps the model shown and its fields, tests/test_app_start.py; the issue's sequence, a variant then
    gpt2.onnx, loads the ONNX file as built. Nor does a refused path, tests/test_app_refusals.py: this test used
    one, /no/such/folder with folders disabled, to make the panes stale.)"""
    from rlxviz.app.panels import GraphCompare

    s = tiny()
    graph = GraphCompare(state=s)
    s.param.update(ir_text="graph g { nonsense", source="ir")  # a load that starts and fails: it does not parse
    assert s.message_kind == "danger" and s.stale and graph.after.styles["opacity"] == "0.45"
    s.source = "preset"
    assert s.message_kind != "danger" and s.stale == ""
    assert graph.after.styles["opacity"] == "1" and graph.before.styles["opacity"] == "1"


def _timed(i, label, samples, same_as=None):
    from rlxviz.session import VersionTiming

    if same_as is not None:
        return VersionTiming(i, label, 5, same_as=same_as)
    q1, q3 = np.percentile(samples, [25, 75])
    med = float(np.median(samples))
    return VersionTiming(i, label, 5, median_ms=med, min_ms=min(samples), first_call_ms=1.0, max_abs=1e-7,
                         iqr_ms=float(q3 - q1), speedup=None, samples_ms=tuple(samples))


def test_a_speedup_from_too_few_rounds_is_not_labelled_with_an_interval():
    """Three rounds give a bootstrap interval but no verdict: the bar's label says it is not read and why (it printed
    "5.00× (4.90–5.10)" beside "too few rounds"); at the verdict's count of rounds the interval is back."""
    from rlxviz.app.timingchart import speedup_label
    from rlxviz.session import timing_table
    from rlxviz.session.defaults import MIN_VERDICT_ROUNDS

    for n in (3, MIN_VERDICT_ROUNDS - 1, MIN_VERDICT_ROUNDS):
        base = list(10.0 + np.random.default_rng(n).random(n))
        out = timing_table([_timed(0, "input", base), _timed(1, "after fuse_sdpa", [b / 5 for b in base])])
        label = speedup_label(out[1])
        if n < MIN_VERDICT_ROUNDS:
            assert out[1]["vs_input"].startswith("too few rounds")
            assert label == f"5.00× not read ({n} rounds < {MIN_VERDICT_ROUNDS})", label
        else:
            assert label.startswith("5.00× (") and "not read" not in label, label


def test_timing_rows_say_within_noise_and_chart_factors_are_unique():
    """Paired rounds whose ratio holds 1 read "within noise" against the input and the previous version; others "N.NNx
    faster"; with unchanged passes shown, a label that repeats (dead_code_elimination twice) still gets its own
    chart factor (Bokeh's "duplicate factor" error made the chart vanish); whiskers span p25..p75."""
    from rlxviz.app.timingchart import speedup_label, timing_factor, timing_figure
    from rlxviz.session import paired_verdict, timing_table

    rng = np.random.default_rng(5)
    base = 10.0 + rng.random(24)  # 24 paired rounds: enough for a verdict (session.paired_verdict wants >= 21)
    rows = [_timed(0, "input", list(base)),
            _timed(1, "after dead_code_elimination", list(base * (1 + 0.004 * rng.standard_normal(24)))),  # same
            _timed(2, "after fuse_sdpa", list(base * 0.2)),  # clearly faster
            _timed(3, "after dead_code_elimination", [], same_as=2)]
    for r in rows[1:3]:
        r.speedup = rows[0].median_ms / r.median_ms
    visible = [(r.index, r.label) for r in rows]
    out = AppState._timing_rows(rows, visible)
    assert out == timing_table(rows)  # the app's rows are the session's (one function for every front end)
    # each speed-up is the paired median ratio over the input, inside its 95% bootstrap interval; "within noise"
    # exactly when that interval holds 1 (the notebooks' paired_verdict)
    for r, row in zip(out[1:3], rows[1:3], strict=True):
        v = paired_verdict(rows[0], row)
        assert r["speedup"] == round(v.ratio, 2) and r["ci"] == f"{v.low:.2f}..{v.high:.2f}"
        assert r["ci_low"] <= v.ratio <= r["ci_high"] and (r["vs_input"] == "within noise") == (v.low <= 1 <= v.high)
    assert out[0]["speedup"] == 1.0 and out[0]["ci"] == "" and out[0]["vs_input"] == ""
    assert re.fullmatch(r"0\.2\d× \(0\.\d\d–0\.\d\d\)|[45]\.\d\d× \(\d\.\d\d–\d\.\d\d\)", speedup_label(out[2]))
    # the unchanged version was not timed again: no figure of its own (newcomer run 8 read copied ones as measured)
    assert [r["vs_input"] for r in out] == ["", "within noise", out[2]["vs_input"], ""]
    assert out[3]["same_as"] == 2 and out[3]["speedup"] != out[3]["speedup"] and out[3]["vs_previous"] == ""
    assert re.fullmatch(r"\d+\.\d\dx faster", out[2]["vs_input"])
    assert out[2]["vs_previous"].endswith("faster") and out[1]["vs_previous"] == "within noise"
    assert speedup_label(out[1]).endswith("within noise") and "noise" not in speedup_label(out[2])
    assert (out[0]["p25_ms"], out[0]["p75_ms"]) == tuple(round(float(x), 3) for x in
                                                         np.percentile(rows[0].samples_ms, [25, 75]))
    factors = [timing_factor(r) for r in out]
    assert len(set(factors)) == len(factors) == 4
    p = timing_figure(out).children[0]
    assert sorted(p.y_range.factors) == sorted(factors)
    from bokeh.models import Whisker

    w = next(a for a in p.center if isinstance(a, Whisker)).source.data
    assert list(w["low"])[:3] == [r["p25_ms"] for r in out[:3]] and p.x_range.end >= max(w["high"][:3])


def test_downloads_are_named_after_the_model_and_version():
    from rlxviz.app.panels import IRView
    from rlxviz.app.text import download_name

    s = tiny()
    view = IRView(state=s)
    names = [b.filename for b in view.downloads]
    assert names == ["bert-tiny.input.ir.txt", "bert-tiny.input.dot", "bert-tiny.input.svg", "bert-tiny.trace.json"]
    s.step_to("after fuse_transformer_layer")
    assert [b.filename for b in view.downloads][:3] == [f"bert-tiny.after-fuse_transformer_layer.{e}"
                                                        for e in ("ir.txt", "dot", "svg")]
    # the model's name is data from its file: no path, quote or control character reaches the file name
    assert download_name("../../etc/pass wd\"\x1b", "after fuse_sdpa", "svg") == "etc-pass-wd.after-fuse_sdpa.svg"
    assert download_name("...", None, "trace.json") == "model.trace.json"


def test_panes_sync_the_selected_node_by_identity():
    """A node selected in one pane is marked in the other: itself where the pass kept it, else what it became (the
    fused node whose absorbed ids name it) or what it was made from; the node panel says which."""
    from rlxviz.app.panels import GraphCompare, NodeInspector

    s = tiny()
    graph, inspector = GraphCompare(state=s), NodeInspector(state=s)
    s.step_to("after fuse_attention_block")
    prev, cur = s.previous_graph, s.current_graph
    fused = next(n for n in cur if n.pass_name == "fuse_attention_block")
    gone = next(int(i) for i in fused.absorbed if int(i) not in cur)
    s.selected_node = gone  # clicked in the before pane: the after pane marks the fused node
    assert graph.before.selected == gone and graph.after.related == [fused.id] and graph.before.related == []
    assert "became" in inspector.pane.object and f"%{fused.id}" in inspector.pane.object
    s.selected_node = fused.id  # clicked in the after pane: the before pane marks what it absorbed
    assert sorted(graph.before.related) == sorted(int(i) for i in fused.absorbed if int(i) in prev)
    assert gone in graph.before.related and "made by" in inspector.pane.object
    # said once (newcomer run 4 read "made by fuse_attention_block from ..." and "created by ..., replacing ...")
    assert "created by" not in inspector.pane.object
    kept = next(n.id for n in cur if n.id in prev)
    s.selected_node = kept
    assert graph.before.related == graph.after.related == [] and graph.after.selected == kept
    assert "became" not in inspector.pane.object and "made by" not in inspector.pane.object


def test_one_version_numbering_in_the_list_and_the_timing_chart():
    """With unchanged passes hidden, a version has one number in the version list and on the timing chart: its
    place in the whole trace (the list counted the shown versions, the chart the trace's)."""
    from rlxviz.app.panels import VersionStepper
    from rlxviz.app.timingchart import timing_factor

    s = tiny()
    assert s.hide_unchanged
    vis = s._visible(s.trace)
    assert any(i != k for k, (i, _) in enumerate(vis)), vis  # a hidden pass: the two numberings differ
    rows = [_timed(i, lbl, [1.0 + 0.01 * j for j in range(21)]) for i, (lbl, _) in enumerate(s.trace.versions())]
    chart = [timing_factor(r) for r in AppState._timing_rows(rows, vis)]
    listed = [name.rsplit(" (", 1)[0] for name in VersionStepper(state=s)._options()]
    assert listed == chart, (listed, chart)


def test_ir_diff_selects_number_versions_as_the_version_list():
    """The IR & diff tab's Left/Right lists give each version the version list's number (they counted the shown
    versions, so 'version 4' named two graphs on one page when passes were hidden), also after the filter changes."""
    from rlxviz.app.panels import IRView, VersionStepper

    s = tiny()
    stepper, view = VersionStepper(state=s), IRView(state=s)
    assert s.hide_unchanged and any(i != k for k, (i, _) in enumerate(s._visible(s.trace)))  # numberings differ
    for hide in (True, False):
        s.hide_unchanged = hide
        listed = [name.rsplit(" (", 1)[0] for name in stepper._options()]
        assert list(view.left.options) == list(view.right.options) == listed, (hide, listed, view.left.options)


def test_why_tab_opens_on_a_layer_after_an_upload():
    """After a model loads, the Why tab answers for a layer at once: the first that did not fuse as expected, else
    the first (an uploaded gpt2.onnx opened on "Pick a layer" with nothing picked); a layer the user picks is kept
    across runs of that model."""
    from rlxviz.app.whyview import WhyView

    s = tiny()
    view = WhyView(state=s)
    assert s.selected_layer == 0 and "Layer 0" in view.text.object  # bert-tiny: every layer fused
    s.load_upload({"gpt2.onnx": (ROOT / "tests/fixtures/onnx/gpt2.onnx").read_bytes()})
    assert s.trace is not None and s.layers(), s.message
    want = next((i for i in s.layers() if not s.layer_status(i).fused), s.layers()[0])
    assert s.selected_layer == want and f"Layer {want}" in view.text.object and "Pick a layer" not in view.text.object
    s.source = "preset"  # bert-tiny again, then layer 1 broken: the new run opens on the layer that did not fuse
    s.param.update(variant_layer=1, variant="extra_h1_user")
    assert s.selected_layer == 1, s.selected_layer
    view.layer.value = 0  # the user's pick: kept when the run changes
    s.param.update(variant="none")
    assert s.selected_layer == 0 and "Layer 0" in view.text.object


def test_an_allowed_folder_under_the_temp_folder_is_named_as_is():
    """The newcomer's run and CI's clone under /tmp: the path box's folder read `<temp>/newcomer/tests/...`, which a
    user cannot type back; only rlxviz's own temp folders are hidden."""
    text = "put it under /tmp/newcomer/models on the server (the copy was /tmp/rlxviz-upload-1-x/model.onnx)"
    out = scrub_paths(text, "", "/tmp")
    assert out == "put it under /tmp/newcomer/models on the server (the copy was <temp>/rlxviz-upload-1-x/model.onnx)"


def test_a_match_row_says_fused_into_only_for_a_fused_op():
    """Matches & rejections: a rewrite whose product is a plain op (canonicalize_exported's add on an export) reads
    "rewritten as add %N", a fusion "fused into FusedX %N" (a newcomer read "fused into add %64")."""
    from rlxviz.app.explain import decision_rows
    from rlxviz.ir.ops import FUSED
    from rlxviz.models.onnx import load_onnx
    from rlxviz.passes import Pipeline

    trace = Pipeline.canonical().run(load_onnx(ROOT / "tests/fixtures/onnx/gpt2.onnx", seq=16).graph)
    rows = [r for r in decision_rows(trace) if r["kind"] == "fused" and r["message"] != "rewritten"]
    fused = {f.value for f in FUSED}
    ops = {r["message"].split()[2] for r in rows}
    assert ops & fused and ops - fused, ops  # both kinds of product on this export
    for r in rows:
        assert r["message"].startswith("fused into " if r["message"].split()[2] in fused else "rewritten as "), r
