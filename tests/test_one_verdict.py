"""One verdict every view reads (issue 21): for every layer, the drawing's "why" side (`render._why`) shows the
graph before the pass whose rejection `layer_status` names first (the text of the Why tab and of `explain`),
and a layer that fused as expected is drawn as the version asked for, never focused on a rejection that does
not count. The layers view's box verdict is `layer_status`'s too.

Checked on presets, teaching variants, the handed n3 cases and the ONNX fixtures. That every view (`explain`'s
text and `--json`, the Why tab, the drawing, the node panel) reads this one verdict on every file is
`test_verdict_parity`'s check.
"""

from pathlib import Path

import pytest

from rlxviz.ir import parse_ir
from rlxviz.models import VARIANTS, load_model
from rlxviz.passes import Pipeline
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
