"""One verdict every view reads (issue 21): for every layer, the drawing's "why" side (`render._why`) shows the
graph before the pass whose rejection `layer_status` names first (the text of the Why tab and of `explain`),
a layer held back only by gaps in rlxviz's ops (`gap_only`) the graph before the pass of its first gap refusal with
that place drawn `△`, and a layer that fused as expected is drawn as the version asked for, never focused on a
rejection that does not count. The layers view's box verdict is `layer_status`'s too.

Checked on presets, teaching variants, the handed n3 cases and the ONNX fixtures. That every view (`explain`'s
text and `--json`, the Why tab, the drawing, the node panel) reads this one verdict on every file is
`test_verdict_parity`'s check.
"""

from pathlib import Path

import pytest

from rlxviz.ir import parse_ir
from rlxviz.models import VARIANTS, load_model
from rlxviz.passes import Pipeline
from rlxviz.passes.why.verdict import OP_GAP_GROUP, first_gap, why_step
from rlxviz.session.loading import load, model_layers
from rlxviz.session.render import View, dot, picture, verdicts
from rlxviz.session.status import layer_status, verdict_pass
from rlxviz.viz.overlay import place_groups

ROOT = Path(__file__).parent
CASES = sorted((ROOT / "data" / "cases").glob("n3-*.rlx"))


def _check(trace) -> int:
    """Assert the parity on every layer of `trace`; the number of layers checked."""
    last = len(trace.versions()) - 1
    boxes = verdicts(trace)
    layers = model_layers(trace.input)
    for layer in layers:
        st = layer_status(trace, layer)
        g, ov, _ = picture(trace, View(version=last, side="why", focus=layer))
        name = verdict_pass(trace, layer)
        if st.gap_only:  # held back only by rlxviz's ops: before the pass of its first gap refusal, drawn `△`
            k = why_step(trace, layer)
            assert name is None and k is not None and g is trace.steps[k].before
            gap = first_gap(trace, layer, k)
            assert any((gap.rule, a) in ov.gaps for a in gap.at), f"layer {layer}: its gap is not drawn as one"
        elif st.fused:
            assert name is None and why_step(trace, layer) is None
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


def test_llama_block_layer0_why_drawing_is_its_gap_not_a_rejection_that_does_not_count():
    """llama-block layer 0 is fused as far as rlxviz's ops go (its FusedAttentionBlock refusal is a gap: no causal mask
    kind). The drawing used to focus on that refusal as a rejection while the text said "fused as expected", then
    showed the final version with no mark while the text named the gap: it shows the gap's pass, that place `△`,
    never a near-miss's `✗`."""
    t = Pipeline.canonical().run(load_model("llama-block", seq=8).graph)
    st = layer_status(t, 0)
    assert st.fused and st.gap_only and verdict_pass(t, 0) is None
    v = View(version=len(t.versions()) - 1, side="why", focus=0)
    g, _, _ = picture(t, v)
    k = why_step(t, 0)
    assert k is not None and t.steps[k].pass_name == "fuse_attention_block" and g is t.steps[k].before
    text = dot(t, v)
    assert "△ fuse_attention_block.qkv_attention_out: mask_kind_keep (gap in rlxviz's ops)" in text
    assert "✗" not in text


def test_a_layer_fused_as_expected_with_only_faded_refusals_is_drawn_as_the_version_asked_for():
    """n3-01c's layer 0 fused as expected; its one refusal is not expected of its kind (`○`, nothing to fix): the
    drawing is the version asked for, never focused on that refusal."""
    t = Pipeline.canonical().run(parse_ir((ROOT / "data" / "cases" / "n3-01c-rope-op-control.rlx").read_text()))
    st = layer_status(t, 0)
    assert st.fused and not st.gap_only and st.not_expected and why_step(t, 0) is None
    faded = [g for k, s in enumerate(t.steps) if s.rejections for g in place_groups(t, s).values()]
    assert faded and OP_GAP_GROUP not in faded  # the layer's refusals are all `○`
    v = View(version=len(t.versions()) - 1, side="why", focus=0)
    g, _, _ = picture(t, v)
    assert g is t.final and "△" not in dot(t, v) and "○" not in dot(t, v)


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_handed_cases_one_verdict(path):
    _check(Pipeline.canonical().run(parse_ir(path.read_text())))


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_onnx_fixtures_one_verdict(name):
    model = load(str(ROOT / "fixtures" / "onnx" / f"{name}.onnx"), seq=8)
    assert _check(Pipeline.canonical().run(model.graph)) >= 1
