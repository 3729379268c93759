"""A Q- or K-side constant scale anywhere on the operand's path to the scores (issue 21): after K's transpose,
between the head reshape and the head transpose, on Q and K together (Whisper's head_dim**-0.25) is moved next to
the head split (`scale_path.hoist_scales`, bit-exact) and folded into the attention's scale, so the layer fuses as
the control does; a scale read elsewhere or a per-channel one is left alone and named."""

import numpy as np
import pytest
from test_unwritten_forms import equal_numbers, ops, random_feeds

from rlxviz.ir import parse_ir
from rlxviz.ir.printer import format_graph
from rlxviz.models.bert import BertConfig, build_bert
from rlxviz.passes import Pipeline
from rlxviz.passes.rules.scale_path import RULE, hoist_scales
from rlxviz.runtime import run_reference

AT = "@encoder.layer.0.attention.self"
SCORES = (f"  %38 = matmul(%24, %37) : f32[2, 2, 8, 8] {AT}\n  %39 = const {{value=4.0}} : f32[] {AT}\n"
          f"  %40 = div(%38, %39) : f32[2, 2, 8, 8] {AT}\n")


def _bert() -> str:
    g = build_bert(BertConfig(vocab_size=50, hidden=32, heads=2, intermediate=64, layers=1, max_position=16),
                   batch=2, seq=8, style="hf")
    src = format_graph(g)
    assert SCORES in src
    return src


VARIANTS = {
    # q @ (k^T * 0.25), scores unscaled
    "k_after_transpose": lambda s: s.replace(SCORES, f"  %39 = const {{value=0.25}} : f32[] {AT}\n"
                                                     f"  %38 = mul(%37, %39) : f32[2, 2, 16, 8] {AT}\n"
                                                     f"  %40 = matmul(%24, %38) : f32[2, 2, 8, 8] {AT}\n"),
    # K's [B, S, h, d] view divided by 2 before the head transpose, the scores by 2
    "k_between_reshape_and_transpose": lambda s: s.replace(
        f"  %30 = transpose(%29) {{perm=[0, 2, 1, 3]}} : f32[2, 2, 8, 16] {AT}.key\n",
        f"  %100 = const {{value=2.0}} : f32[] {AT}.key\n  %101 = div(%29, %100) : f32[2, 8, 2, 16] {AT}.key\n"
        f"  %30 = transpose(%101) {{perm=[0, 2, 1, 3]}} : f32[2, 2, 8, 16] {AT}.key\n").replace(
        SCORES, SCORES.replace("{value=4.0}", "{value=2.0}")),
    # Whisper: Q's heads and K^T each times head_dim**-0.25 = 0.5, scores unscaled
    "q_and_k_quarter_power": lambda s: s.replace(SCORES, f"  %39 = const {{value=0.5}} : f32[] {AT}\n"
                                                         f"  %102 = mul(%24, %39) : f32[2, 2, 8, 16] {AT}\n"
                                                         f"  %38 = mul(%39, %37) : f32[2, 2, 16, 8] {AT}\n"
                                                         f"  %40 = matmul(%102, %38) : f32[2, 2, 8, 8] {AT}\n"),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_a_scale_on_the_k_path_folds_into_the_attention_scale(name):
    src = VARIANTS[name](_bert())
    assert src != _bert()
    g = parse_ir(src)
    t = equal_numbers(g)
    assert any(m.rule == RULE for s in t.steps for m in s.matches)
    assert ops(t.final).get("FusedTransformerLayer") == 1, ops(t.final)  # default scale: the block applies


@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_hoist_is_bit_exact(name):
    g = parse_ir(VARIANTS[name](_bert()))
    h, matches = hoist_scales(g)
    assert matches and len(h) == len(g)
    rng = np.random.default_rng(3)
    feeds = random_feeds(g, rng)
    w = {n.name: (0.3 * rng.standard_normal(n.shape)).astype(n.dtype.numpy) for n in g.params}
    for a, b in zip(run_reference(g, feeds, w), run_reference(h, feeds, w), strict=True):
        assert np.array_equal(a, b)


def test_a_scale_read_elsewhere_is_left_and_named():
    src = VARIANTS["k_after_transpose"](_bert()).replace("  return %", "  return %38, %")
    g = parse_ir(src)
    assert hoist_scales(g)[1] == []
    t = Pipeline.canonical().run(g)
    (r,) = [r for r in t.rejections if r.pass_name == "fuse_sdpa" and r.headline]
    assert r.guard == "scores_form" and "mul (node 38" in r.message


def test_a_per_channel_k_scale_is_not_a_scalar_scale():
    src = _bert().replace(SCORES, f'  %39 = param {{name="k_gain"}} : f32[8] {AT}\n'
                                  f"  %38 = mul(%37, %39) : f32[2, 2, 16, 8] {AT}\n"
                                  f"  %40 = matmul(%24, %38) : f32[2, 2, 8, 8] {AT}\n")
    g = parse_ir(src)
    assert hoist_scales(g)[1] == []
    equal_numbers(g)


def test_a_k_scale_after_the_gqa_expansion_folds_too():
    """Case 07 (GQA from one fused QKV) with half of its 0.25 score scale moved onto K's repeat_kv expansion."""
    from pathlib import Path

    src = (Path(__file__).parent / "data" / "cases" / "07-gqa-fused-qkv.rlx").read_text()
    new = src.replace("  %12 = reshape(%11)", "  %40 = const {value=0.5} : f32[]\n"
                      "  %41 = mul(%11, %40) : f32[2, 2, 2, 8, 16]\n  %12 = reshape(%41)").replace(
        "%20 = const {value=0.25}", "%20 = const {value=0.5}")
    assert new.count("0.5}") == 2
    control = equal_numbers(parse_ir(src))
    t = equal_numbers(parse_ir(new))
    assert any(m.rule == RULE for s in t.steps for m in s.matches)
    assert ops(t.final) == ops(control.final)
    (a,) = [n for n in t.final if n.op.value == "attention"]
    assert a.attrs["scale"] is None and a.attrs["num_kv_heads"] == 2  # 0.5 * 0.5 = 1/sqrt(16): the default
