"""The layers drawing says a gap in rlxviz's ops as what it is, as the chips' △ and the verdict do.

Two newcomer reports after the gaps were counted apart: n3-04b's QK-norm layer, "held back by rlxviz's ops: no fused
op" in `explain`, was still filled in the fused green; and granite's layers, drawn before fuse_attention_block (an
earlier version: not yet in their final form) where their only refusals are the gap (the caption's "△2 gaps in
rlxviz's ops"), were framed in the grey dotted "○ not near-miss" that reads "nothing to fix".

Decision: a box whose every refusal at this version is no near-miss and some is at a gap (`Overlay.gaps`, read from
`places.place_standings`, the chips' own reading) and a settled box of a layer held back by rlxviz's ops with no fused
op (`Verdict.held_back`, from `LayerVerdict.op_gaps` / `has_fused_op`) are drawn as `styles.OP_GAP`: their own fill
and solid ink, never the fused green, the rejection's red or the faded grey.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np
import pytest
from test_near_miss_rule import trace_of

from rlxviz import session
from rlxviz.passes import Trace
from rlxviz.session import OpenRequest, open_model, open_pipeline, open_trace
from rlxviz.session.render import View, settled_verdicts, svg, verdicts
from rlxviz.viz.layers import layer_groups, layers_to_dot
from rlxviz.viz.overlay import Overlay
from rlxviz.viz.styles import NOT_NEAR_MISS, OP_GAP, OP_GAP_INK, REJECT, STATUS_COLORS, meaningful_colors

HERE = Path(__file__).parent
QK_NORM = HERE / "data" / "cases" / "n3-04b-qk-norm-full-width.rlx"
GRANITE = HERE / "fixtures" / "onnx" / "cases" / "granite.onnx"
NEOX = HERE / "fixtures" / "onnx" / "cases" / "gpt-neox.legacy-sdpa.onnx"
BERT = HERE / "fixtures" / "onnx" / "bert.onnx"
FUSED_INK = "#1b5e20"
"""The fused green's ink: a fused box's frame and words (`viz.layers`, `viz.box_words`)."""


@functools.cache
def qk_norm() -> Trace:
    """n3-04b's canonical run."""
    return session.run_pipeline(session.load_ir_text(QK_NORM.read_text()).graph, session.build_pipeline())


@functools.cache
def granite() -> Trace:
    """granite's canonical run with the shapes of its `_io.npz`, as `explain --inputs` opens it."""
    with np.load(GRANITE.with_name(GRANITE.stem + "_io.npz")) as z:
        shapes = {k: z[k].shape for k in z.files if not k.startswith("out:")}
    req = OpenRequest(source=str(GRANITE), input_shapes=shapes)
    return open_trace(open_model(req).graph, req, open_pipeline(req))


def box(dot: str, key: str) -> str:
    """The DOT line of the box `key`."""
    return next(ln for ln in dot.splitlines() if ln.strip().startswith(f"{key} "))


def test_a_layer_held_back_by_rlxvizs_ops_is_not_drawn_green():
    trace = qk_norm()
    final = trace.steps[-1].after
    vs = settled_verdicts(trace, final)
    assert vs[0].held_back and vs[0].settled and vs[0].word == "held back by rlxviz's ops"
    (g,) = [g for g in layer_groups(final, None, vs).values() if g.layer == 0]
    assert g.tone == OP_GAP
    line = box(layers_to_dot(final, verdicts=vs), "layer0")
    assert STATUS_COLORS[OP_GAP] in line and OP_GAP_INK in line, line
    assert STATUS_COLORS["fused"] not in line and "#1b5e20" not in line and REJECT not in line, line
    assert "held back by rlxviz&#x27;s ops" in line or "held back by rlxviz's ops" in line, line


def test_a_fused_layer_keeps_its_green():
    """bert's layers are fused as expected (one FusedTransformerLayer each): green box, green words, no gap's ink."""
    trace = trace_of(BERT)
    final = trace.steps[-1].after
    vs = settled_verdicts(trace, final)
    assert vs and all(v.word == "fused" and not v.at_gap for v in vs.values()), vs
    line = box(layers_to_dot(final, verdicts=vs), "layer0")
    assert STATUS_COLORS["fused"] in line and FUSED_INK in line, line
    assert STATUS_COLORS[OP_GAP] not in line and OP_GAP_INK not in line, line


@functools.cache
def _neox_svg(version: int) -> str:
    return svg(trace_of(NEOX), View(version, "layers"))


@pytest.mark.parametrize("path", [NEOX, GRANITE], ids=lambda p: p.stem)
def test_a_layer_fused_as_far_as_rlxvizs_ops_go_is_drawn_as_the_gap_not_green(path):
    """Issue 39: gpt-neox's boxes said `fused as far as rlxviz's ops and patterns go` (granite's `... ops go`) in the
    fused green, on a green box once settled: the words say a gap, so box and words take the gap's colours."""
    trace = trace_of(path)
    vs = verdicts(trace)
    assert vs and all(v.at_gap and v.fused and not v.held_back for v in vs.values()), vs
    assert all(v.word.startswith("fused as far as rlxviz's ops") for v in vs.values()), vs
    final = trace.steps[-1].after
    line = box(layers_to_dot(final, verdicts=settled_verdicts(trace, final)), "layer0")
    assert f'fillcolor="{STATUS_COLORS[OP_GAP]}"' in line and f'color="{OP_GAP_INK}"' in line, line
    assert STATUS_COLORS["fused"] not in line and FUSED_INK not in line, line
    first = box(layers_to_dot(trace.input, verdicts=settled_verdicts(trace, trace.input)), "layer0")
    assert f'<FONT COLOR="{OP_GAP_INK}"><B>final: fused as far as rlxviz' in first, first
    assert FUSED_INK not in first and STATUS_COLORS["fused"] not in first, first


@pytest.mark.parametrize("version", [0, -1], ids=["input", "final"])
def test_gpt_neox_svg_draws_its_layer_boxes_in_the_gaps_colours(version):
    """The rendered picture, as the app shows it: no green anywhere in a layer box of gpt-neox (its every layer is
    `fused as far as rlxviz's ops go`: a reader rlxviz made blocks it), the words in the gap's ink."""
    trace = trace_of(NEOX)
    v = len(trace.versions()) - 1 if version < 0 else version
    picture = _neox_svg(v)
    groups = re.findall(r'<g id="(layer\d+)" class="node">(.*?)</g>', picture, re.S)
    assert len(groups) >= 2, picture[:2000]
    for key, body in groups:
        assert "fused as far as rlxviz&#39;s ops go" in body, (key, body)
        assert FUSED_INK not in body.lower() and STATUS_COLORS["fused"] not in body.lower(), (key, body)
        assert re.search(rf'<text[^>]*fill="{OP_GAP_INK}"[^>]*>(final: )?fused as far as', body), (key, body)
        if version < 0:
            assert f'fill="{STATUS_COLORS[OP_GAP]}"' in body and f'stroke="{OP_GAP_INK}"' in body, (key, body)


def test_a_box_before_its_final_form_whose_only_refusals_are_gaps_is_drawn_as_the_gap():
    trace = granite()
    s = next(s for s in trace.steps if s.pass_name == "fuse_attention_block")
    ov = Overlay.before(s).worded_by(trace, s)
    assert "△2 places at gaps in rlxviz's ops" in ov.title and "○" not in ov.title, ov.title
    assert ov.gaps and ov.gaps <= ov.excused
    vs = settled_verdicts(trace, s.before)
    assert not any(v.settled for v in vs.values())  # an earlier version: the box says what happened so far
    dot = layers_to_dot(s.before, ov, verdicts=vs)
    for key in ("layer0", "layer1"):
        line = box(dot, key)
        assert OP_GAP in line and OP_GAP_INK in line and STATUS_COLORS[OP_GAP] in line, line
        assert NOT_NEAR_MISS not in line and "dotted" not in line and "dashed" not in line, line


def test_a_box_whose_refusals_are_only_not_near_misses_stays_grey_and_dotted():
    trace = granite()
    s = next(s for s in trace.steps if s.pass_name == "fuse_transformer_layer")
    ov = Overlay.before(s).worded_by(trace, s)
    assert not ov.gaps and ov.excused
    line = box(layers_to_dot(s.before, ov, verdicts=settled_verdicts(trace, s.before)), "layer0")
    assert NOT_NEAR_MISS in line and "dotted" in line and OP_GAP not in line, line


def test_the_gap_fill_is_a_colour_of_its_own():
    colours = meaningful_colors()
    assert colours[f"status {OP_GAP}"] == STATUS_COLORS[OP_GAP]
    assert STATUS_COLORS[OP_GAP] not in {c for k, c in colours.items() if k != f"status {OP_GAP}"}


def test_the_verdicts_say_held_back_only_of_a_layer_with_no_fused_op():
    for trace in (qk_norm(), granite()):
        for v in verdicts(trace).values():
            assert v.held_back == (v.none_made == "no fused op" and v.word.startswith("held back")), v
