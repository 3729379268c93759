"""A layer drawing's title counts the layer's places, and names every gap holding it back (a newcomer run).

gpt-neox's layer 1 drawing (the Why tab's, and the Graph tab's focused one) said `△2 gaps in rlxviz's ops`: the
pass's two places, one in each layer; esm's said `2 gaps in rlxviz's ops: integer_qkv, default_scale` (the two gaps
one place ran into) beside `△2 gaps` (two places), which read as disagreeing. deit (ORT-optimized), held back by a
gap in fuse_matmul_bias_act and another in fuse_attention_block, drew the first pass only and named nothing of the
second.

Decision: the before caption says what it counts and where (`viz.overlay.before_caption`: `before P, in the graph:`
/ `before P, in this layer:`, its `△N` counting places: `△1 place at a gap in rlxviz's ops`), a focused drawing
counting its layer's matches and places (`session.render.layer_caption`); the "why" title names each other gap of the
layer as the Why tab's `rlxviz's ops lack:` line does, saying it is in a later pass (`session.render._gap_title`).
"""

from __future__ import annotations

import functools
import html
import re
from pathlib import Path

import pytest
from test_near_miss_rule import trace_of

from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.passes import Trace, layer_of
from rlxviz.passes.why.places import places
from rlxviz.passes.why.verdict import OP_GAP_GROUP, why_step
from rlxviz.session.loading import layer_indices
from rlxviz.session.render import View, dot, picture
from rlxviz.session.status import layer_status

CASES = Path(__file__).parent / "fixtures" / "onnx" / "cases"
NEOX, ESM, DEIT, GRANITE = (CASES / f"{n}.onnx" for n in ("gpt-neox.legacy-sdpa", "esm.qdyn", "deit.ortopt", "granite"))
GAP_COUNT = re.compile(r"△(\d+) (?:place at a gap|places at gaps) in rlxviz's ops")


@functools.cache
def _trace(path: Path) -> Trace:
    return trace_of(path)


def _gap_places(t: Trace, k: int, layer: int | None) -> int:
    """The places at a gap in rlxviz's ops that step `k` refused, in `layer` (None: the graph)."""
    mine = {r.anchor for r in t.steps[k].rejections if layer is None or r.layer == layer}
    return sum(1 for a in places(t, k).excused_at.get(OP_GAP_GROUP, []) if a in mine)


def _said(title: str) -> int:
    m = GAP_COUNT.search(title)
    return int(m.group(1)) if m else 0


@pytest.mark.parametrize("path", [NEOX, ESM, DEIT, GRANITE], ids=lambda p: p.stem)
def test_a_focused_drawings_caption_counts_its_layers_places_and_says_so(path):
    t = _trace(path)
    counted = 0
    for k, step in enumerate(t.steps):
        _, whole, _ = picture(t, View(k + 1, "full", "before"))
        assert whole.title.startswith(f"before {t.step_name(step)}, in the graph: "), whole.title
        assert _said(whole.title) == _gap_places(t, k, None), whole.title
        for layer in layer_indices(t.input):
            if not any(n.path and f".{layer}" in n.path for n in step.before):
                continue
            _, ov, _ = picture(t, View(k + 1, "full", "before", layer))
            assert ov.title.startswith(f"before {t.step_name(step)}, in this layer: "), ov.title
            assert _said(ov.title) == _gap_places(t, k, layer), (layer, ov.title)
            counted += _said(ov.title)
    assert counted  # each case has places at a gap in some layer


def test_gpt_neox_layer_1_says_its_one_gap_place_not_the_passes_two():
    t = _trace(NEOX)
    k = why_step(t, 1)
    assert _gap_places(t, k, None) == 2 and _gap_places(t, k, 1) == 1
    _, ov, _ = picture(t, View(len(t.steps), "full", "why", 1))
    assert "in this layer: 0 match(es), 0 rejected places, △1 place at a gap in rlxviz's ops" in ov.title, ov.title
    assert "△2" not in ov.title


def test_esms_place_names_its_two_gaps_and_the_caption_counts_one_place():
    t = _trace(ESM)
    title = html.unescape(dot(t, View(len(t.steps), "full", "why", 0)))
    # a trait is said as what it is in the model (`declarations.trait_named`), never `the layer's trait integer_qkv`
    assert ("@ %795: default_scale (2 gaps in rlxviz's ops: its integer-matmul Q/K/V projections (integer_qkv), "
            "default_scale); alone it is not enough: qkv_packed (a gap in rlxviz's ops: FusedAttentionBlock over "
            "integer-matmul Q/K/V projections (dynamic quantization)) fails next; before "
            "fuse_attention_block, in this layer: 0 match(es), 0 rejected places, △1 place at a gap in rlxviz's ops — "
            "layer 0") in title


QWEN3 = Path(__file__).parent / "fixtures" / "onnx" / "zoo" / "qwen3.dynamo-eager.onnx"
LABEL = re.compile(r"△ ([\w.]+): (\w+) \((\d gaps|gap) in rlxviz's ops")


@pytest.mark.parametrize("path", [QWEN3, ESM, NEOX, DEIT], ids=lambda p: p.stem)
def test_a_why_titles_gap_names_the_guard_its_cluster_label_names(path):
    """qwen3's title said `gap in rlxviz's ops: qk_norm` (a layer trait, read as a guard) beside the cluster label
    `qkv_packed (gap in rlxviz's ops)`: the title names the place's failing guard as the label does, and a trait
    as what it is in the model (`declarations.trait_named`), as the text's `rlxviz's ops lack:` line says it."""
    t = _trace(path)
    title = html.unescape(dot(t, View(len(t.steps), "full", "why", 0)))
    labels = LABEL.findall(title)
    assert labels, title
    head = title.split("; ", 1)[0]
    rule, guard, _ = next(x for x in labels if f"△ {x[0]} @ %" in head)
    assert re.search(rf"△ {re.escape(rule)} @ %\d+: {guard} \((\d gaps|gap) in rlxviz's ops", head), head
    for trait in ("qk_norm", "integer_qkv"):
        assert f"rlxviz's ops: {trait}" not in title and f", {trait}" not in title, title


def test_qwen3s_why_title_says_its_gap_is_the_layers_qk_norm_trait():
    t = _trace(QWEN3)
    _, ov, _ = picture(t, View(len(t.steps), "full", "why", 0))
    assert ": △ fuse_attention_block.qkv_attention_out @ %260: qkv_packed (gap in rlxviz's ops: its Q and K " \
           "normalized before the attention (qk_norm)); before fuse_attention_block" in ov.title, ov.title


@pytest.mark.parametrize("layer", [0, 1])
def test_deits_why_title_names_the_later_passes_gap_as_the_why_text_does(layer):
    t = _trace(DEIT)
    v = layer_status(t, layer)
    assert v.gap_only and len(v.gaps) == 2
    first, later = v.gaps
    assert first.rule.startswith("fuse_matmul_bias_act.") and later.rule.startswith("fuse_attention_block.")
    _, ov, _ = picture(t, View(len(t.steps), "full", "why", layer))
    assert ov.title.startswith(f"{v.status}: △ {first.rule} @ %"), ov.title
    assert f"; also △ in fuse_attention_block, a later pass (not drawn): {later}; " in ov.title, ov.title
    assert f"rlxviz's ops lack: {later}" in v.render(verbose=True)  # the Why tab's and `explain -v`'s words
    assert "before fuse_matmul_bias_act, in this layer: " in ov.title


@pytest.mark.parametrize("path", [NEOX, ESM, DEIT, GRANITE], ids=lambda p: p.stem)
def test_every_gap_of_a_gap_only_layer_is_named_on_its_why_drawing(path):
    t = _trace(path)
    for layer in layer_indices(t.input):
        v = layer_status(t, layer)
        if not v.gap_only:
            continue
        _, ov, _ = picture(t, View(len(t.steps), "full", "why", layer))
        drawn = t.steps[why_step(t, layer)].pass_name
        for g in v.gaps:  # the drawn pass's by guard (or trait) as its place's label, others as the Why text words them
            family = g.rule.split(".")[0]
            said = g.by.rsplit(" ", 1)[-1] if family == drawn else f"also △ in {family}, a later pass (not drawn): {g}"
            assert said in ov.title, (layer, g, ov.title)


@pytest.mark.parametrize("path", [NEOX, DEIT], ids=lambda p: p.stem)
def test_a_focused_after_panes_title_counts_the_layers_changes(path):
    t = _trace(path)
    for k, step in enumerate(t.steps):
        _, whole, _ = picture(t, View(k + 1, "full", "after"))
        assert whole.title.startswith(f"after {t.step_name(step)}, in the graph: "), whole.title
        _, ov, _ = picture(t, View(k + 1, "full", "after", 1))
        ops = [i for i in step.removed if step.before[i].path and layer_of(step.before[i].path) == 1
               and step.before[i].op.value not in ("param", "const", "input")]
        assert ov.title.startswith(f"after {t.step_name(step)}, in this layer: "), ov.title
        assert f", {len(ops)} removed" in ov.title, (ov.title, ops)


def test_the_app_why_tab_names_both_of_deits_gaps_in_its_text_and_its_drawing():
    s = AppState(runner=Runner(background=False))
    s.load_upload({DEIT.name: DEIT.read_bytes()})
    s.selected_layer = 0
    why = html.unescape(s.why_layer(0)).replace("\\", "").replace("\xa0", " ")
    drawn = s.caption(side="why")  # the drawing's title, shown above it in HTML (the app's SVG carries none)
    assert drawn == picture(s.trace, View(len(s.trace.steps), "full", "why", 0))[1].title + " — layer 0"
    for g in layer_status(s.trace, 0).gaps:
        assert f"rlxviz's ops lack: {g}" in why
    later = layer_status(s.trace, 0).gaps[1]
    assert f"also △ in fuse_attention_block, a later pass (not drawn): {later}" in drawn
    assert "before fuse_matmul_bias_act, in this layer: " in drawn


def test_a_fused_layers_why_drawing_counts_its_own_changes():
    t = _trace(CASES / "falcon.onnx")
    for layer in layer_indices(t.input):
        assert layer_status(t, layer).status == "fused" and why_step(t, layer) is None
        _, ov, _ = picture(t, View(len(t.steps), "full", "why", layer))
        assert ov.title.startswith(f"after {t.step_names()[-1]}, in this layer: "), ov.title
