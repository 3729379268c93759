"""The Why tab's drawing of a layer held back only by gaps in rlxviz's ops (a newcomer run): DeepNorm's layer 0 ("fused
as far as rlxviz's ops go", its one refusal a gap at `fuse_transformer_layer`) was drawn as the final version with no
mark, while the Graph tab's before pane at that pass drew the indigo `△ rule: guard` cluster; so were the dequantize
scale case, esm.qdyn and gpt-neox. esm's `△` label and layer box named one of its two gaps (`default_scale`) where
the headline names both; the Why tab listed 30 ElementwiseRegion ids where `rlxviz explain` says `x30`.

Decision: the "why" side (`session.render._why`) draws the graph before the step `passes.why.verdict.why_step` names:
the pass of the first counted rejection, else, for a `gap_only` layer, the pass of its first gap refusal, with the
before pane's own overlay (that place `△`) and a title naming the gap; a layer fused as expected whose refusals are
only `○` keeps the final version. A place's `△` label and its layer box name every gap it ran into
(`viz.overlay.group_words`). The layer line groups repeated fused ops for every reader (`why.text.fused_list`).
"""

from __future__ import annotations

import functools
import html
import re
from pathlib import Path

import pytest
from clirun import run as cli_run
from test_near_miss_rule import trace_of

from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.passes import Trace
from rlxviz.passes.why.verdict import OP_GAP_GROUP, first_gap, why_step
from rlxviz.session.render import View, dot, picture, svg
from rlxviz.session.status import layer_status
from rlxviz.viz import styles as st
from rlxviz.viz.overlay import group_words

HERE = Path(__file__).parent
DEEPNORM = HERE / "data" / "cases" / "n4-06-deepnorm-residual.rlx"
DEQUANT = HERE / "data" / "cases" / "n4-09-dequant-scale-after-matmul.rlx"
ESM = HERE / "fixtures" / "onnx" / "cases" / "esm.qdyn.onnx"
NEOX = HERE / "fixtures" / "onnx" / "cases" / "gpt-neox.legacy-sdpa.onnx"
CLUSTER = re.compile(r'label="([△✗○] [^"\n]*)')

GAP_ONLY = [(DEEPNORM, 0, "fuse_transformer_layer", "fuse_transformer_layer.bert_post_ln"),
            (DEQUANT, 0, "fuse_matmul_bias_act", "fuse_matmul_bias_act.scale_before_bias"),
            (ESM, 0, "fuse_attention_block", "fuse_attention_block.qkv_attention_out"),
            (NEOX, 1, "fuse_attention_block", "fuse_attention_block.qkv_attention_out")]
"""(file, layer, the pass of its first gap refusal, the refused rule): the newcomer's cases."""


@functools.cache
def _trace(path: Path) -> Trace:
    return trace_of(path)


def _last(t: Trace) -> int:
    return len(t.versions()) - 1


@pytest.mark.parametrize("path, layer, pass_name, rule", GAP_ONLY, ids=lambda x: getattr(x, "stem", None))
def test_a_gap_only_layers_why_drawing_is_before_its_first_gap_drawn_as_one(path, layer, pass_name, rule):
    t = _trace(path)
    v = layer_status(t, layer)
    assert v.gap_only and v.first is None and v.status.startswith("fused as far as"), v.status
    k = why_step(t, layer)
    assert k is not None and t.steps[k].pass_name == pass_name
    g, ov, _ = picture(t, View(_last(t), "full", "why", layer))
    assert g is t.steps[k].before  # not the final version
    why = dot(t, View(_last(t), "full", "why", layer))
    pane = dot(t, View(k + 1, "full", "before"))  # the Graph tab's before pane at that pass
    drawn = CLUSTER.findall(why)
    assert any(x.startswith(f"△ {rule}: ") and "in rlxviz's ops" in x for x in drawn), drawn
    assert set(drawn) <= set(CLUSTER.findall(pane))  # the same marks, the layer's alone
    assert st.OP_GAP_INK in why and "✗" not in why
    gap = first_gap(t, layer, k)
    assert gap is not None and gap.rule == rule
    title = html.unescape(re.search(r'^\tlabel="([^"]*)"', why, re.M).group(1))
    assert title.startswith(f"{v.status}: △ {rule} @ %") and f"before {pass_name}, in this layer: " in title, title
    assert title.endswith(f" — layer {layer}")
    text = html.unescape(svg(t, View(_last(t), "full", "why", layer)))  # the SVG the app's Why tab shows
    assert f"△ {rule}: " in text and f"{v.status}: △ {rule}" in text


def test_esms_gap_place_names_both_gaps_on_its_cluster_its_box_and_the_why_title():
    t = _trace(ESM)
    k = next(k for k, s in enumerate(t.steps) if s.pass_name == "fuse_attention_block")
    both = "2 gaps in rlxviz's ops: its integer-matmul Q/K/V projections (integer_qkv), default_scale"  # the trait
    pane = html.unescape(dot(t, View(k + 1, "full", "before")))
    assert f"△ fuse_attention_block.qkv_attention_out: default_scale ({both})" in pane
    boxes = html.unescape(dot(t, View(k + 1, "layers", "before")))
    # each layer's tooltip; its label wraps the words (newcomer run 18: the pass that found them named, apart from
    # what the graph holds `at this version:`)
    assert boxes.count(f"; fuse_attention_block: △ {both}") == 2
    why = html.unescape(dot(t, View(_last(t), "full", "why", 0)))
    # the guard first, as the cluster label says it; then the caveat `explain -v`'s check finds (the scale fix alone)
    assert (f"△ fuse_attention_block.qkv_attention_out @ %795: default_scale ({both}); alone it is not enough: "
            "qkv_packed (a gap in rlxviz's ops: FusedAttentionBlock over integer-matmul Q/K/V projections (dynamic "
            "quantization)) fails next; before fuse_attention_block") in why
    assert len(layer_status(t, 0).op_gaps) == 2  # the two the headline and `explain` name


def test_deepnorms_two_gap_guards_are_both_named():
    t = _trace(DEEPNORM)
    k = why_step(t, 0)
    pane = html.unescape(dot(t, View(k + 1, "full", "before")))
    assert ("△ fuse_transformer_layer.bert_post_ln: ln1_residual_scaled (gap in rlxviz's ops: ln1_residual_scaled, "
            "ln2_residual_scaled)") in pane


def test_group_words_counts_gaps_by_form_and_names_each():
    group = OP_GAP_GROUP
    assert group_words(group, ()) == group and group_words(group, (("F", "g"),)) == group
    assert group_words(group, (("F", "g1"), ("F", "g2"))) == f"{group}: g1, g2"
    assert group_words(group, (("F", "t"), ("G", "g"))) == "2 gaps in rlxviz's ops: t, g"
    assert group_words(st.OP_GAP, (("F", "t"), ("G", "g"))) == "△ 2 gaps in rlxviz's ops: t, g"


def test_the_why_tab_reads_explains_grouped_line_and_draws_the_gap(capsys):
    code, out, err = cli_run(capsys, "explain", DEEPNORM)
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("layer 0: "))
    assert "FusedMatMulBiasAct %" in line and "FusedAttentionBlock %" in line  # what the final version holds
    s = AppState(runner=Runner(background=False), source="ir", ir_text=DEEPNORM.read_text())
    s.selected_layer = s.layers()[0]
    why = html.unescape(s.why_layer(s.layers()[0])).replace("\\", "")
    assert why.startswith("### Layer 0\n") and line in [x.rstrip() for x in why.splitlines()], why
    drawn = html.unescape(s.svg_why())
    assert "△ fuse_transformer_layer.bert_post_ln: ln1_residual_scaled" in drawn
    assert s.why_graph_drawn() is s.trace.steps[why_step(s.trace, s.layers()[0])].before
