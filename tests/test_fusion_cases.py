"""Cases from outside (../shared/cases, copied to tests/data/cases) and two more graphs of each kind.

* 03 pre-scaled Q (CLIP/Whisper): the Q/K pre-scale folds into the attention scale; the block fuses when the
  product is the default 1/sqrt(head_dim), and otherwise `default_scale` names the actual and default scale.
* 08 bias-less K (Whisper): Q/K/V merge with a zero bias slot (exact) and the block fuses.
* 08d/08e/07e/07f/07h (tests/data/diag): Q, K and V all without bias, or the output projection without bias
  (GQA too): the block takes the bare matmul with a zero bias operand (exact: x + 0 == x) and fuses.
* 16b: the parallel block's FC1 without bias: FC1 + GELU fuse into FusedMatMulBiasAct with a zero bias.
* 16 parallel block (GPT-J/PaLM/Phi-2): the merge that would pack FC1 with Q/K/V is refused by the cost
  test (`merge_keeps_fusions`, not profitable); FusedAttentionBlock and FC1's GELU epilogue are both kept.
Every version keeps the unfused numbers.
"""

from pathlib import Path

import numpy as np
import pytest

from rlxviz.ir import Builder, Graph, Op, parse_ir
from rlxviz.passes import Pipeline, missed_fusions
from rlxviz.passes.guard import ILLEGAL, NOT_PROFITABLE, NOT_RECOGNIZED
from rlxviz.runtime import run_reference

CASES = Path(__file__).parent / "data" / "cases"
DIAG = Path(__file__).parent / "data" / "diag"


def case(name: str) -> Graph:
    return parse_ir(next(CASES.glob(f"{name}-*.rlx")).read_text())


def run_and_compare(g: Graph, pipeline: Pipeline | None = None):
    """Run the pipeline; every version's outputs equal the unfused graph's (reference interpreter)."""
    t = (pipeline or Pipeline.canonical()).run(g)
    assert not [s.error for s in t.steps if s.error]
    rng = np.random.default_rng(0)
    feeds = {}
    for n in g.inputs:
        if n.dtype.is_float:
            feeds[n.name] = rng.standard_normal(n.shape).astype(np.float32)
        else:  # a 0/1 keep mask with padding, every row keeps key 0
            m = (rng.random(n.shape) > 0.3).astype(np.int64)
            m[..., 0] = 1
            feeds[n.name] = m
    w = {n.name: (0.2 * rng.standard_normal(n.shape)).astype(np.float32) for n in g.params}
    ref = run_reference(g, feeds, w)
    for label, v in t.versions()[1:]:
        for a, b in zip(ref, run_reference(v, feeds, w), strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5, err_msg=label)
    return t


def attention_layer(bias=("q", "k", "v"), q_scale=None, k_scale=None, after_split=False, score_div="auto",
                    ffn=None, plain=False, cost_width=64):
    """A BERT-style encoder attention (HF padding mask), written as primitives, with optional Q/K pre-scales,
    bias-less projections, a parallel FFN reading the same input (`ffn="gelu"`) and a plain extra projection."""
    b = Builder("attn")
    B, S, H, nh, dh = 2, 4, 16, 2, 8
    x = b.input("hidden", (B, S, H))
    m = b.input("attention_mask", (B, S), "i64")
    ext = b.reshape(b.mul(b.sub(1.0, b.cast(m, "f32")), -10000.0), (B, 1, 1, S))

    def proj(n, width=H):
        t = b.matmul(x, b.param(f"{n}.weight", (H, width)))
        return b.add(t, b.param(f"{n}.bias", (width,))) if n in bias else t

    def heads(t, s):
        if s is not None and not after_split:
            t = b.mul(t, s)
        h = b.transpose(b.reshape(t, (B, S, nh, dh)), (0, 2, 1, 3))
        return b.mul(h, s) if s is not None and after_split else h

    q, k, v = heads(proj("q"), q_scale), heads(proj("k"), k_scale), heads(proj("v"), None)
    s = b.matmul(q, b.transpose(k, (0, 1, 3, 2)))
    if score_div == "auto":  # BERT: scores / sqrt(head_dim), unless Q or K carry a pre-scale
        score_div = None if q_scale or k_scale else dh ** 0.5
    if score_div is not None:
        s = b.div(s, score_div)
    ctx = b.matmul(b.softmax(b.add(s, ext), axis=-1), v)
    out = b.reshape(b.transpose(ctx, (0, 2, 1, 3)), (B, S, H))
    out = b.add(b.matmul(out, b.param("out.weight", (H, H))), b.param("out.bias", (H,)))
    if ffn:
        f = b.unary(ffn, proj("fc1", cost_width))
        out = b.add(out, b.add(b.matmul(f, b.param("fc2.weight", (cost_width, H))), b.param("fc2.bias", (H,))))
    if plain:
        out = b.add(out, b.matmul(x, b.param("side.weight", (H, H))))
    b.output(out)
    return b.build()


def ops(t) -> dict[str, int]:
    return t.final.op_counts()


# -- 03: pre-scaled Q ---------------------------------------------------------------------------------

def test_case_03_prescaled_query_fuses_with_the_default_scale():
    t = run_and_compare(case("03"))
    (a,) = t.step("fuse_sdpa").after.find(Op.ATTENTION)
    assert a.attrs["scale"] is None  # 0.25 on Q, no score scale: 1/sqrt(16), the default
    assert ops(t).get("FusedAttentionBlock") == 1
    assert not t.step("fuse_attention_block").rejections


@pytest.mark.parametrize("kw,scale", [
    ({"q_scale": 8 ** -0.5, "after_split": True}, None),           # Q scaled after the head split
    ({"q_scale": 8 ** -0.25, "k_scale": 8 ** -0.25}, None),        # Whisper: both heads by head_dim**-0.25
    ({"q_scale": 0.5, "after_split": True, "score_div": 2.0}, 0.25),  # a non-default product
])
def test_prescale_kind_folds_into_the_attention_scale(kw, scale):
    t = run_and_compare(attention_layer(**kw))
    (a,) = t.step("fuse_sdpa").after.find(Op.ATTENTION)
    assert a.attrs["scale"] == pytest.approx(scale) if scale is not None else a.attrs["scale"] is None
    if scale is None:
        assert ops(t).get("FusedAttentionBlock") == 1
    else:
        (r,) = [r for r in t.step("fuse_attention_block").rejections if r.headline]
        assert r.guard == "default_scale" and r.kind == NOT_RECOGNIZED
        assert "scale=0.25" in r.message and "1/sqrt(8) = 0.353553" in r.message
        assert r.subject == a.id and "scale attribute" in r.fix


@pytest.mark.parametrize("kw, origin, extra", [
    # a wrong pre-scale factor: named with its node and factor, and the default it is not
    ({"q_scale": 0.5}, ["Q pre-scale mul (node {q}) * 0.5"], ", not 1/sqrt(8) = 0.353553"),
    # 1/sqrt(dh) applied twice: on Q and on the scores
    ({"q_scale": 8 ** -0.5, "score_div": 8 ** 0.5},
     ["Q pre-scale mul (node {q}) * 0.353553", "scores' scale div (node {s}) / 2.82843 (factor 0.353553)"],
     ": product 0.125 = (1/sqrt(8))^2 = 1/8: the 1/sqrt(head_dim) scale is applied twice"),
    # K pre-scaled after the head split, and the scores divided too
    ({"k_scale": 0.5, "after_split": True, "score_div": 2.0},
     ["K pre-scale mul (node {k}) * 0.5", "scores' scale div (node {s}) / 2 (factor 0.5)"],
     ": product 0.25, not 1/sqrt(8) = 0.353553"),
])
def test_default_scale_names_where_the_scale_came_from(kw, origin, extra):
    """`default_scale` names the pre-scale / score-scale nodes fuse_sdpa folded into the attention's scale (they
    are gone from the graph the block rule sees), each with its factor, and a doubled 1/sqrt(head_dim)."""
    g = attention_layer(**kw)
    t = Pipeline.canonical().run(g)
    (m,) = t.step("fuse_sdpa").matches
    ids = {"q": m.bindings.get("q_prescale"), "k": m.bindings.get("k_prescale"), "s": m.bindings.get("scale")}
    (r,) = [r for r in t.step("fuse_attention_block").rejections if r.headline]
    assert r.guard == "default_scale"
    want = "; fuse_sdpa folded it from " + ", ".join(o.format(**ids) for o in origin) + extra
    assert want in r.message, r.message
    (miss,) = [x for x in missed_fusions(t) if x.guard == "default_scale"]
    assert want in miss.reason


def test_default_scale_names_a_pre_scale_a_stage_re_made():
    """Granite (newcomer finding): Q and K^T each scaled by sqrt(0.3) = 0.547723; `fuse_sdpa/hoist_scales` re-makes
    K's mul in front of the transpose, so the match binds a node the user's graph lacks, and the text named Q's
    pre-scale alone beside scale=0.3. Both factors are named (K's by the user's node), with their product."""
    b = Builder("granite_scaled")
    B, S, H, nh, dh = 2, 4, 16, 2, 8
    x = b.input("hidden", (B, S, H))
    ext = b.reshape(b.mul(b.sub(1.0, b.cast(b.input("attention_mask", (B, S), "i64"), "f32")), -10000.0),
                    (B, 1, 1, S))
    q, k, v = (b.transpose(b.reshape(b.add(b.matmul(x, b.param(f"{n}.weight", (H, H))), b.param(f"{n}.bias", (H,))),
                                     (B, S, nh, dh)), (0, 2, 1, 3)) for n in "qkv")
    qs, ks = b.mul(q, 0.3 ** 0.5), b.mul(b.transpose(k, (0, 1, 3, 2)), 0.3 ** 0.5)
    ctx = b.matmul(b.softmax(b.add(b.matmul(qs, ks), ext), axis=-1), v)
    out = b.reshape(b.transpose(ctx, (0, 2, 1, 3)), (B, S, H))
    b.output(b.add(b.matmul(out, b.param("out.weight", (H, H))), b.param("out.bias", (H,))))
    t = Pipeline.canonical().run(b.build())
    (r,) = [r for r in t.step("fuse_attention_block").rejections if r.headline]
    assert r.guard == "default_scale" and "scale=0.3000000" in r.message
    want = (f"; fuse_sdpa folded it from Q pre-scale mul (node {int(qs)}) * 0.547723, K pre-scale mul (node {int(ks)}) "
            f"* 0.547723: product 0.3, not 1/sqrt(8) = 0.353553")
    assert want in r.message, r.message


@pytest.mark.parametrize("name, want", [
    ("03e", "fuse_sdpa folded it from Q pre-scale mul (node 17) * 0.5, not 1/sqrt(16) = 0.25"),
    ("03f", "fuse_sdpa folded it from Q pre-scale mul (node 17) * 0.25, scores' scale div (node 53) / 4 (factor "
            "0.25): product 0.0625 = (1/sqrt(16))^2 = 1/16: the 1/sqrt(head_dim) scale is applied twice"),
])
def test_default_scale_origin_in_explain(capsys, name, want):
    from rlxviz.cli import main
    assert main(["explain", str(next(CASES.glob(f"{name}-*.rlx")))]) == 1
    assert want in capsys.readouterr().out


def test_prescale_read_elsewhere_stays_outside_the_attention():
    b = Builder("pre")
    x = b.input("x", (1, 4, 8))
    q = b.mul(b.matmul(x, b.param("wq", (8, 8))), 0.5)
    k, v = b.matmul(x, b.param("wk", (8, 8))), b.matmul(x, b.param("wv", (8, 8)))

    def heads(t):
        return b.transpose(b.reshape(t, (1, 4, 2, 4)), (0, 2, 1, 3))
    ctx = b.matmul(b.softmax(b.matmul(heads(q), b.transpose(heads(k), (0, 1, 3, 2))), axis=-1), heads(v))
    b.output(b.reshape(b.transpose(ctx, (0, 2, 1, 3)), (1, 4, 8)), b.neg(q))
    t = run_and_compare(b.build(), Pipeline(["fuse_sdpa"]))
    (r,) = t.rejections
    assert r.soft and r.guard == "prescale_single_use" and r.kind == ILLEGAL and "pre-scaled Q" in r.message
    (a,) = t.final.find(Op.ATTENTION)
    assert a.attrs["scale"] == 1.0 and t.final[a.inputs[0]].op == Op.MUL


# -- 08: projections without a bias ---------------------------------------------------------------------

def test_case_08_bias_less_k_merges_with_a_zero_bias_slot():
    t = run_and_compare(case("08"))
    assert ops(t).get("FusedAttentionBlock") == 1
    assert not [r for r in t.rejections if r.guard in ("biases_mergeable", "qkv_packed")]
    merged = t.step("fuse_shared_input_matmul").after
    assert merged.find(Op.EXPAND) and len(merged.find(Op.CONCAT)) == 2  # weights, and biases with the zero slot


@pytest.mark.parametrize("bias", [("q",), ("k", "v")])
def test_bias_less_kind_any_member_gets_a_zero_slot(bias):
    t = run_and_compare(attention_layer(bias=bias))
    assert ops(t).get("FusedAttentionBlock") == 1


def diag(name: str) -> Graph:
    return parse_ir(next(DIAG.glob(f"{name}-*.rlx")).read_text())


def _zero(g: Graph, i: int) -> bool:
    """`expand(const 0.0, [N])`: a zero bias."""
    n = g[i]
    return n.op == Op.EXPAND and g[n.inputs[0]].op == Op.CONST and float(g[n.inputs[0]].attrs["value"]) == 0.0


@pytest.mark.parametrize("name,zero", [
    ("08d", ("qkv_b",)),           # Q, K and V all without bias: the merged matmul is the bare QKV
    ("08e", ("out_b",)),           # output projection without bias
    ("07e", ("qkv_b", "out_b")),   # GQA, packed QKV and output projection both bias-less, keep mask
    ("07f", ("qkv_b", "out_b")),   # GQA, separate bias-less projections, keep mask
    ("07h", ("out_b",)),           # GQA, biased packed QKV, bias-less output projection
])
def test_bias_less_projections_fuse_the_block_with_zero_biases(name, zero):
    from rlxviz.ir.ops import unpack
    t = run_and_compare(diag(name))
    (fab,) = t.final.find(Op.FUSED_ATTENTION_BLOCK)
    roles = unpack(Op.FUSED_ATTENTION_BLOCK, fab.attrs, fab.inputs)
    assert {r for r in ("qkv_b", "out_b") if _zero(t.final, roles[r])} == set(zero)
    assert not [m for m in missed_fusions(t) if m.pattern.startswith("fuse_attention_block")]
    assert not t.final.find(Op.ATTENTION) and not t.final.find(Op.MATMUL)


def test_bias_less_out_projection_whose_bias_add_was_not_fused_is_refused_naming_it():
    """A bare output matmul that has a bias add fuse_matmul_bias_act declined is not taken as bias-less."""
    g = attention_layer()
    out_mm = next(n.id for n in g.find(Op.MATMUL) if g[n.inputs[1]].name == "out.weight")
    t = run_and_compare(g.with_outputs((*g.outputs, out_mm)))
    assert not t.final.find(Op.FUSED_ATTENTION_BLOCK)
    (r,) = [r for r in t.step("fuse_attention_block").rejections if r.headline]
    assert r.guard == "out_bias_absorbed" and r.subject == out_mm and "is a graph output" in r.message


def test_case_16b_bias_less_fc1_fuses_with_its_gelu_and_a_zero_bias():
    t = run_and_compare(diag("16b"))
    assert ops(t).get("FusedAttentionBlock") == 1 and not t.final.find(Op.GELU)
    (fc1,) = [n for n in t.final.find(Op.FUSED_MATMUL_BIAS_ACT) if n.attrs["activation"] == "gelu"]
    assert t.final[fc1.inputs[1]].name == "fc1.weight" and _zero(t.final, fc1.inputs[2])
    (r,) = t.step("fuse_shared_input_matmul").rejections
    assert r.guard == "merge_keeps_fusions" and "its gelu epilogue (gelu node 46)" in r.message
    assert not [m for m in missed_fusions(t) if not m.pattern.startswith("fuse_transformer_layer")]


def test_zero_bias_epilogue_leaves_a_gate_alone():
    """gelu(x @ w) fuses with a zero bias; a GLU gate gelu(x @ w_g) * (x @ w_u) is left to the GLU rules."""
    b = Builder("bare")
    x = b.input("x", (2, 4, 8))
    b.output(b.gelu(b.matmul(x, b.param("fc1.weight", (8, 16)))))
    t = run_and_compare(b.build())
    (f,) = t.final.find(Op.FUSED_MATMUL_BIAS_ACT)
    assert f.attrs["activation"] == "gelu" and _zero(t.final, f.inputs[2])
    b = Builder("geglu")
    x = b.input("x", (2, 4, 8))
    b.output(b.mul(b.gelu(b.matmul(x, b.param("wg", (8, 16)))), b.matmul(x, b.param("wu", (8, 16)))))
    t = run_and_compare(b.build())
    assert not t.final.find(Op.FUSED_MATMUL_BIAS_ACT)


def test_biases_not_mergeable_names_the_projection():
    b = Builder("qkv")
    x = b.input("x", (2, 4, 8))
    m0 = b.matmul(x, b.param("q.weight", (8, 8)))
    b.output(b.add(m0, b.param("q.bias", (8,))), b.neg(m0), b.neg(b.matmul(x, b.param("k.weight", (8, 8)))))
    t = run_and_compare(b.build(), Pipeline(["fuse_shared_input_matmul"]))
    (r,) = t.rejections
    assert r.guard == "biases_mergeable" and r.soft and r.subject == m0
    assert "matmul with q.weight (node" in r.message and "has 2 users" in r.message


# -- 16: parallel block -----------------------------------------------------------------------------

def test_case_16_parallel_block_keeps_the_attention_block_and_the_gelu_epilogue():
    t = run_and_compare(case("16"))
    assert ops(t).get("FusedAttentionBlock") == 1
    fused = t.final.find(Op.FUSED_MATMUL_BIAS_ACT)
    assert sorted(str(n.attrs["activation"]) for n in fused) == ["None", "gelu"]  # FC2, FC1 with its epilogue
    assert not t.final.find(Op.FUSED_TRANSFORMER_LAYER) and not t.final.find(Op.FUSED_RESIDUAL_LN)
    (r,) = [r for r in t.step("fuse_shared_input_matmul").rejections]
    assert r.guard == "merge_keeps_fusions" and r.kind == NOT_PROFITABLE and r.soft
    assert r.subject == 44 and "matmul with fc1.weight (node 44)" in r.message
    assert "its gelu epilogue (gelu node 46)" in r.message and "448 wide instead of 192" in r.message
    assert "merged: matmul with q.weight (node 17), matmul with k.weight (node 21), matmul with v.weight" in r.message


def test_case_16_without_the_cost_test_the_split_names_the_merged_projection():
    t = run_and_compare(case("16"), Pipeline.canonical(merge_cost_test=False))
    (r,) = [r for r in t.step("fuse_attention_block").rejections if r.headline]
    assert r.guard == "qkv_split"
    assert "448 wide, not 64+2*64 = 192" in r.message and "start 192, len 256" in r.message
    assert "merged into it" in r.message


def test_parallel_kind_a_plain_projection_is_not_packed_with_qkv():
    t = run_and_compare(attention_layer(plain=True))
    assert ops(t).get("FusedAttentionBlock") == 1
    (r,) = t.step("fuse_shared_input_matmul").rejections
    assert r.guard == "merge_keeps_fusions" and "side.weight" in r.message and "the attention block" in r.message
    assert "epilogue" not in r.message.split("merged:")[0]


def test_parallel_kind_without_attention_the_epilogue_member_stays_out():
    b = Builder("mlp")
    x = b.input("x", (2, 4, 8))

    def lin(n, act=None):
        y = b.add(b.matmul(x, b.param(f"{n}.weight", (8, 8))), b.param(f"{n}.bias", (8,)))
        return b.unary(act, y) if act else y
    b.output(b.add(b.add(lin("fc1", "silu"), lin("a")), lin("b")))
    t = run_and_compare(b.build(), Pipeline.canonical())
    (r,) = t.step("fuse_shared_input_matmul").rejections
    assert r.soft and "its silu epilogue" in r.message
    assert [n.attrs["activation"] for n in t.final.find(Op.FUSED_MATMUL_BIAS_ACT)].count("silu") == 1
    # two epilogue members and nothing else: nothing to merge (a hard rejection)
    b = Builder("mlp2")
    x = b.input("x", (2, 4, 8))
    b.output(b.add(lin("fc1", "gelu"), lin("fc2", "silu")))
    t = run_and_compare(b.build(), Pipeline.canonical())
    (r,) = t.step("fuse_shared_input_matmul").rejections
    assert not r.soft and r.headline and "fewer than 2 matmuls would be left" in r.message
    assert {m.guard for m in missed_fusions(t)} == set()  # both linears fused with their epilogues


def test_run_first_advice_says_what_the_earlier_pass_decided():
    """The block's "run fuse_shared_input_matmul first" is replaced by that pass's own reason when it ran."""
    g = attention_layer()
    k_mm = next(n for n in g.find(Op.MATMUL) if g[n.inputs[1]].name == "k.weight")
    from test_guards import with_reader
    t = run_and_compare(with_reader(g, k_mm.id))
    (m,) = [m for m in missed_fusions(t) if m.pattern.startswith("fuse_attention_block")]
    assert m.guard == "qkv_packed" and "run fuse_shared_input_matmul first" not in m.reason
    assert "fuse_shared_input_matmul ran before and said no here: biases_mergeable" in m.reason
    assert f"matmul with k.weight (node {k_mm.id}) has 2 users" in m.reason
