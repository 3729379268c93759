"""Issue 39's small faults in the app, without a browser: "Layer to break" clamped to the model's layers, the app's
default sequence length the one the README's first command line uses, the ops-per-version chips wrapping."""

import re
from pathlib import Path

import pytest

from rlxviz import session
from rlxviz.app.controls import VariantControls
from rlxviz.app.derived import INPUT_FIRST
from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState

ROOT = Path(__file__).resolve().parents[1]


def app(**kw) -> AppState:
    kw.setdefault("seq", 8)
    return AppState(runner=Runner(background=False), **kw)


@pytest.mark.parametrize("typed, becomes", [(9, 1), (2, 1), (-3, 0)])
def test_a_layer_past_the_models_is_clamped_to_the_nearest(typed, becomes):
    s = app(preset="bert-tiny")
    vc = VariantControls(state=s)
    s.apply_variant("extra_h1_user")
    vc.layer.value = typed
    assert s.variant_layer == becomes and vc.layer.value == becomes
    assert s.trace is not None and s.model.name == "bert-tiny" and not s.stale
    assert s.message_kind != "danger" and "layers 0..1" in s.message, s.message


@pytest.mark.parametrize("variant", ["extra_h1_user", "tanh_gelu"])
def test_a_smaller_model_takes_its_last_layer_instead_of_failing_to_load(variant):
    """minilm's layer 5 broken, then bert-tiny (2 layers): it loaded as "variant layer 5 out of range 0..1" and the
    panes stayed on minilm; now the variant breaks bert-tiny's last layer, in one pipeline run, and the message
    says so."""
    s = app(preset="minilm")
    vc = VariantControls(state=s)
    s.param.update(variant_layer=5, variant=variant)
    assert s.model.name == "minilm" and s.variant_layer == 5
    runs = []
    # pipeline runs shown (the input graph drawn first while the passes run is no run: `Runs._show_input_first`)
    s.param.watch(lambda e: (e.new is not None and e.new.pipeline == INPUT_FIRST) or runs.append(e.new), "trace")
    s.preset = "bert-tiny"
    assert s.model.name == "bert-tiny" and s.variant == variant and not s.stale, s.message
    assert s.variant_layer == 1 and vc.layer.value == 1 and s.param.variant_layer.bounds == (0, 1)
    assert "layer 5 became 1" in s.message and "out of range" not in s.message and s.message_kind != "danger"
    assert len(runs) == 1
    layers = {r.layer for r in s.trace.rejections}
    assert 1 in layers and 0 not in layers  # the layer broken is the last one


def test_without_a_variant_the_layer_follows_the_model_quietly():
    s = app(preset="minilm")
    s.variant_layer = 5
    runs = []
    # pipeline runs shown (the input graph drawn first while the passes run is no run: `Runs._show_input_first`)
    s.param.watch(lambda e: (e.new is not None and e.new.pipeline == INPUT_FIRST) or runs.append(e.new), "trace")
    s.preset = "bert-tiny"
    assert s.variant_layer == 1 and s.param.variant_layer.bounds == (0, 1) and len(runs) == 1
    # said (newcomer: "clamp only when out of range, and say so"; a quiet change from 1 to 0 misled ②)
    assert "layer 5 became 1" in s.message and s.message_kind == "info" and not s.stale, s.message


def readme_quick_start_seq() -> int:
    """`--seq N` of the README's first `rlxviz explain` command line (its quick start for your own model)."""
    text = (ROOT / "README.md").read_text()
    line = next(ln for ln in text.splitlines() if re.search(r"rlxviz explain \S+\.onnx", ln))
    return int(re.search(r"--seq (\d+)", line).group(1))


def test_the_readme_quick_start_builds_at_the_apps_sequence_length():
    """The README's first command line built the model at seq 128 while the app, every CLI default and the notebooks
    use 16: the same model gave two different first pictures and timings."""
    assert readme_quick_start_seq() == session.DEFAULT_SEQ == AppState.param.seq.default


def test_the_ops_per_version_chips_wrap():
    """The chip row ran off the right edge (one line, `white-space: nowrap`): it wraps inside the pane now."""
    from rlxviz.app.panels import VersionStepper

    s = app(preset="bert-tiny")
    html = VersionStepper(state=s)._counts()
    row = re.match(r"<div style='([^']*)'", html).group(1)
    assert "nowrap" not in row and "flex-wrap:wrap" in row.replace(" ", "")
    assert html.count("rv-chip") == len(s.version_rows())


def test_the_inspector_names_the_onnx_node_a_node_came_from():
    """A model read from ONNX: the inspector gives each node's ONNX node name and op type (what Netron and Model
    Explorer show, to find it there), and for a node a pass made, the ONNX nodes it absorbed; a preset has none."""
    from rlxviz.app.explain import node_report, report_markdown
    from rlxviz.app.text import md_code
    from rlxviz.passes import Pipeline

    m = session.load(str(ROOT / "tests/fixtures/onnx/bert.onnx"), 1, 8)
    onnx = m.meta["onnx_nodes"]
    trace = Pipeline.canonical().run(m.graph)
    gather = next(n for n in m.graph.compute_nodes() if n.id in onnx and onnx[n.id][0] == "Gather")
    text = report_markdown(node_report(m.graph, gather.id, trace, m.weights, onnx))
    assert "**ONNX node**" in text and f"{md_code(onnx[gather.id][1])} (Gather)" in text, text
    g = next(g for label, g in trace.versions() if "fuse_residual_ln" in label)
    fused = next(n for n in g.compute_nodes() if n.pass_name == "fuse_residual_ln")
    text = report_markdown(node_report(g, fused.id, trace, m.weights, onnx))
    names = {onnx[i][1] for i in fused.absorbed if i in onnx}
    assert names and "**absorbed ONNX nodes**" in text and all(md_code(nm) in text for nm in names), text
    tiny = session.load("bert-tiny", 1, 8)
    n = tiny.graph.compute_nodes()[0]
    assert "ONNX node" not in report_markdown(node_report(tiny.graph, n.id, None, None, tiny.meta.get("onnx_nodes")))


def test_the_inspector_view_passes_the_models_onnx_names(monkeypatch):
    """The drawer's text is `report_markdown` of the report with the model's `onnx_nodes` (the wiring)."""
    from rlxviz.app import panels

    seen = {}
    real = panels.node_report
    monkeypatch.setattr(panels, "node_report", lambda *a, **k: seen.setdefault("args", a) and real(*a, **k))
    s = app(preset="bert-tiny")
    s.model.meta["onnx_nodes"] = {n.id: ("Op", f"onnx_{n.id}", "") for n in s.model.graph.compute_nodes()}
    view = panels.NodeInspector(state=s)
    s.version = 0
    s.selected_node = s.current_graph.compute_nodes()[1].id
    from rlxviz.app.text import md_code

    assert seen["args"][4] == s.model.meta["onnx_nodes"] and md_code(f"onnx_{s.selected_node}") in view._text()


@pytest.mark.parametrize("click", ["step", "brk", "why"])
def test_the_start_strip_folds_to_one_row_once_a_step_is_used(click):
    """The strip's title and drop zone (91 px at 1280x800, the drop zone's height) give their room to the graph once
    any of its steps is used; the buttons and the line stay (the line says the next click); the sidebar's Upload
    remains for one's own model."""
    import panel as pn

    from rlxviz.app.start import StartHere

    s = app(preset="bert-tiny")
    zone = pn.pane.Markdown("drop here")
    start = StartHere(state=s, show_why=lambda: None, dropper=zone)
    assert start.title.visible and zone.visible and not start.folded
    getattr(start, click).clicks += 1
    assert start.folded and not start.title.visible and not zone.visible
    assert all(b.visible for b in (start.step, start.brk, start.why, start.note)) and start.strip.visible
