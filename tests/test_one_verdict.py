"""One verdict every view reads (issue 21): for every layer, the drawing's "why" side (`render._why`) shows the
graph before the pass whose rejection `layer_status` names first (the text of the Why tab and of `explain`),
and a layer that fused as expected is drawn as the version asked for, never focused on a rejection that does
not count. The layers view's box verdict is `layer_status`'s too.

Checked on presets, teaching variants, the handed n3 cases and the ONNX fixtures. And for every preset, every
handed case and every ONNX fixture, every view reads the one verdict: `explain --json`, the Why tab (`AppState`,
no browser), the drawing and the node panel (`node_report` of the first rejection's node: the layer's verdict and
that rejection's message and hint as `explain` words them) agree on fused or not, the first rejection and its fix.
"""

import html
import json
from pathlib import Path

import pytest
from clirun import run as cli_run

from rlxviz.app.explain import node_report, report_markdown
from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.ir import parse_ir
from rlxviz.models import PRESETS, VARIANTS, load_model
from rlxviz.passes import Pipeline
from rlxviz.passes.trace import layer_of
from rlxviz.session.loading import load, model_layers
from rlxviz.session.render import View, picture, verdicts
from rlxviz.session.status import layer_status, verdict_pass

ROOT = Path(__file__).parent
CASES = sorted((ROOT / "data" / "cases").glob("n3-*.rlx"))


def _check(trace) -> int:
    """Assert the parity on every layer of `trace`; the number of layers checked."""
    last = len(trace.versions()) - 1
    boxes = verdicts(trace)
    layers = model_layers(trace.input)
    for layer in layers:
        st = layer_status(trace, layer)
        g, _, _ = picture(trace, View(version=last, side="why", focus=layer))
        name = verdict_pass(trace, layer)
        if st.fused:
            assert name is None
            assert g is trace.versions()[last][1], f"layer {layer} fused, but the drawing shows a rejection"
        elif name is not None:
            assert name == st.first.pass_name
            assert g is trace.step(name).before, f"layer {layer}: the drawing is not before {name}"
        assert boxes[layer].fused == st.fused
        assert boxes[layer].guard == (st.first.guard if st.first is not None else "")
    return len(layers)


@pytest.mark.parametrize("preset, variant", [("bert-tiny", None), ("bert-tiny", "tanh_gelu"),
                                             ("bert-tiny", "pre_ln"), ("llama-block", None),
                                             ("minilm-shaped", None)])
def test_presets_one_verdict(preset, variant):
    model = load_model(preset, seq=8, variant=VARIANTS[variant]) if variant else load_model(preset, seq=8)
    assert _check(Pipeline.canonical().run(model.graph)) >= 1


def test_llama_block_layer0_why_drawing_is_not_a_rejection_that_does_not_count():
    """llama-block layer 0 fused as expected (its FusedAttentionBlock refusal is not expected: causal mask);
    the drawing used to focus on that refusal while the text said "fused as expected"."""
    t = Pipeline.canonical().run(load_model("llama-block", seq=8).graph)
    assert layer_status(t, 0).fused and verdict_pass(t, 0) is None
    g, _, _ = picture(t, View(version=len(t.versions()) - 1, side="why", focus=0))
    assert g is t.final


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_handed_cases_one_verdict(path):
    _check(Pipeline.canonical().run(parse_ir(path.read_text())))


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_onnx_fixtures_one_verdict(name):
    model = load(str(ROOT / "fixtures" / "onnx" / f"{name}.onnx"), seq=8)
    assert _check(Pipeline.canonical().run(model.graph)) >= 1


# -- every view reads one verdict: explain --json, the Why tab, the drawing, the node panel ----------------------

HANDED = sorted((ROOT / "data" / "cases").glob("*.rlx"))
ONNX = [ROOT / "fixtures" / "onnx" / f"{n}.onnx" for n in ("bert", "gpt2", "llama", "vit")] + sorted(
    (ROOT / "fixtures" / "onnx" / "cases").glob("*.onnx"))


def _plain(markdown: str) -> str:
    """Rendered-Markdown text of the app's panes, near enough to compare names and messages: escapes undone."""
    return html.unescape(markdown).replace("\\", "").replace("&nbsp;", " ")


def _all_views(s: AppState, cli_args: list, capsys) -> int:
    """For every layer: the session's verdict (`layer_status`) is what `explain --json` says, what the Why tab says,
    what the drawing shows and what the node panel says for the first rejection's node. The layers checked."""
    code, out, err = cli_run(capsys, "explain", *cli_args, "--json")
    assert "Traceback" not in err
    by_layer = {d["layer"]: d for d in json.loads(out)["layers"]}
    trace = s.advised_trace()  # the run as every view words it (a fix checked by its what-if says so)
    last = len(trace.versions()) - 1
    for layer in s.layers():
        st = layer_status(trace, layer)
        j = by_layer[layer]
        first = (st.first.rule, st.first.guard, st.first.fix) if st.first else None
        jf = j["first"]
        assert j["fused"] == (st.fused and not st.gap_only) and j["nothing_to_change"] == st.fused
        assert j["gap_only"] == st.gap_only and ((jf["rule"], jf["guard"], jf["compiler_fix"]) if jf else None) == first
        why = _plain(s.why_layer(layer))
        assert ("NOT fused" in why) == (not st.fused), why
        legal_only = st.fused and bool(st.illegal)  # issue 38: a product illegal for the layer is not expected
        assert (f"layer {layer}: fused as far as legal" in why) == legal_only, why
        assert (j["status"] == "fused as far as legal") == legal_only and len(j["illegal"]) == len(st.illegal)
        g, _, _ = picture(trace, View(version=last, side="why", focus=layer))
        if st.first is None:
            assert verdict_pass(trace, layer) is None or not st.fused
            node = next(n.id for n in g if layer_of(n.path) == layer)
        else:
            assert f"first rejection: {st.first.rule}" in why and f"guard {st.first.guard} " in why
            assert (st.first.fix in why) if st.first.fix else True
            assert verdict_pass(trace, layer) == st.first.pass_name and g is trace.step(st.first.pass_name).before
            node = st.first.nodes[0] if st.first.nodes else st.first.subject
        rep = node_report(g, node, trace)
        v = rep["verdict"]
        assert v is not None and v["layer"] == layer, (layer, node, g[node].path)
        assert v["fused"] == st.fused and (v["rule"], v["guard"], v["fix"]) == (first or ("", "", ""))
        if st.first is not None:
            said = [d for d in rep["decisions"] if d["rule"] == st.first.rule and d["guard"] == st.first.guard]
            assert said and said[0]["message"] == st.first.message and said[0]["hint"] == st.first.hint
            text = _plain(report_markdown(rep))
            assert f"layer {layer}: NOT fused" in text and st.first.guard in text
        elif legal_only:
            assert f"layer {layer}: fused as far as legal" in _plain(report_markdown(rep))
    return len(s.layers())


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_view_reads_one_verdict_presets(capsys, name):
    s = AppState(runner=Runner(background=False), preset=name, seq=8)
    assert _all_views(s, [name, "--seq", 8], capsys) >= 1


@pytest.mark.parametrize("path", HANDED, ids=[p.stem for p in HANDED])
def test_every_view_reads_one_verdict_handed_cases(capsys, path):
    s = AppState(runner=Runner(background=False), source="ir", ir_text=path.read_text())
    assert s.message_kind != "danger", s.message
    _all_views(s, [path], capsys)


@pytest.mark.parametrize("path", ONNX, ids=[p.stem for p in ONNX])
def test_every_view_reads_one_verdict_onnx_fixtures(capsys, path):
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    s.load_upload({path.name: path.read_bytes()})
    assert s.message_kind != "danger", s.message
    assert _all_views(s, [path], capsys) >= 1
