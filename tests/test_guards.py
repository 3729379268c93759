"""Near misses: each guard rejects the graph built to trip it, under its exact name (and teaching variants)."""

from dataclasses import replace

import numpy as np
import pytest

from rlxviz.ir import Builder, Op, Rewriter
from rlxviz.models import VARIANTS, load_model
from rlxviz.passes import Pipeline, run_passes
from rlxviz.passes.guard import EPILOGUE_ACTIVATIONS
from rlxviz.passes.pipeline import PASSES
from rlxviz.runtime import run_reference

PRE_FTL = ["fuse_matmul_bias_act", "fuse_attention_block", "fuse_residual_ln"]


def guards(graph, passes, **params):
    t = run_passes(graph, passes, **params)
    assert not [s.error for s in t.steps if s.error]
    return {r.guard for r in t.rejections}, t


def rejected_by(graph, passes, guard, **params):
    names, t = guards(graph, passes, **params)
    assert guard in names, names
    r = next(r for r in t.rejections if r.guard == guard)
    assert r.message and r.pass_name in PASSES
    return r, t


def with_reader(graph, node_id, output=True):
    """A copy of `graph` where a reduce_mean also reads `node_id` (returned as an extra output)."""
    rw = Rewriter(graph, "test")
    n = graph[node_id]
    r = rw.emit(Op.REDUCE_MEAN, [node_id], axes=(n.rank - 1,), keepdims=True)
    g = rw.finish()
    return g.with_outputs((*g.outputs, r)) if output else g


def bert(style="rlx", variant=None, **kw):
    return load_model("bert-tiny", batch=kw.pop("batch", 1), seq=kw.pop("seq", 8), style=style, variant=variant).graph


# -- teaching variants -------------------------------------------------------------------------

@pytest.mark.parametrize("style", ["rlx", "hf"])
@pytest.mark.parametrize("variant,guard", [
    ("output_intermediate", "h1_not_output"),
    ("extra_h1_user", "h1_user_count"),
    ("tanh_gelu", "fc1_activation"),
    ("pre_ln", "post_ln_order"),
    ("swapped_residual", "ln1_operand_order"),
])
def test_teaching_variants_rejected_with_their_guard(variant, guard, style):
    g = bert(style, replace(VARIANTS[variant], layer=1))
    t = Pipeline.canonical().run(g)
    ftl = [r for r in t.step("fuse_transformer_layer").rejections if r.layer == 1]
    assert [r.guard for r in ftl] == [guard]
    assert [n.path for n in t.final.find(Op.FUSED_TRANSFORMER_LAYER)] == ["encoder.layer.0"]


def test_h1_user_count_message_states_actual_and_required():
    g = bert(variant=VARIANTS["extra_h1_user"])
    r, _ = rejected_by(g, Pipeline.canonical().names, "h1_user_count")
    assert r.message.startswith("h1 (node ") and "encoder.layer.0.attention.output.LayerNorm) has 3 users" in r.message
    assert r.message.endswith("needs exactly 2: FFN.1 and the ln2 residual")
    assert len(r.offending) == 3 and all(e[0] == r.bindings["ln1"] for e in r.offending_edges)
    assert set(r.bindings) >= {"attn", "hidden", "ln1", "fc1"} or set(r.bindings) >= {"attn", "hidden", "ln1"}


def test_tanh_gelu_is_not_in_the_epilogue_allow_list():
    assert EPILOGUE_ACTIVATIONS == ("gelu", "silu")
    r, t = rejected_by(bert(variant=VARIANTS["tanh_gelu"]), ["fuse_matmul_bias_act"], "epilogue_activation")
    assert "gelu_tanh" in r.message
    assert t.final.find(Op.GELU_TANH)


def test_swapped_residual_message_names_both_operands():
    r, _ = rejected_by(bert(variant=VARIANTS["swapped_residual"]), Pipeline.canonical().names, "ln1_operand_order")
    assert "reads x=hidden" in r.message and "residual=attn" in r.message
    assert "needs ln1.x == attn and ln1.residual == hidden" in r.message


@pytest.mark.parametrize("pipeline", [Pipeline.rlx(), Pipeline.canonical(fab_max_tokens=64)])
def test_batch_seq_gate(pipeline):
    r, _ = rejected_by(bert(batch=4, seq=32), pipeline.names, "attention_size_gate",
                       **pipeline.effective_params)
    assert "batch*seq = 4*32 = 128" in r.message and "at most 64" in r.message


def test_separate_qkv_without_shared_input_pass():
    p = Pipeline.canonical().without("fuse_shared_input_matmul")
    t = p.run(bert("hf"))
    assert {r.guard for r in t.step("fuse_attention_block").rejections} == {"qkv_packed"}
    assert "run fuse_shared_input_matmul first" in t.step("fuse_attention_block").rejections[0].message
    assert not t.final.find(Op.FUSED_TRANSFORMER_LAYER)


# -- fuse_transformer_layer guards ------------------------------------------------------------

def pre_ftl(style="rlx", **kw):
    return run_passes(bert(style, **kw), PRE_FTL).final


def role(g, op, k=0):
    return g.find(op)[k].id


@pytest.mark.parametrize("guard,make", [
    ("attn_single_user", lambda g: with_reader(g, role(g, Op.FUSED_ATTENTION_BLOCK), output=True)),
    ("attn_not_output", lambda g: g.with_outputs((*g.outputs, role(g, Op.FUSED_ATTENTION_BLOCK)))),
    ("h1_not_output", lambda g: g.with_outputs((*g.outputs, role(g, Op.FUSED_RESIDUAL_LN)))),
    ("h1_user_count", lambda g: with_reader(g, role(g, Op.FUSED_RESIDUAL_LN))),
    ("fc1_single_user", lambda g: with_reader(g, g.find(Op.FUSED_MATMUL_BIAS_ACT)[0].id)),
    ("fc1_not_output", lambda g: g.with_outputs((*g.outputs, g.find(Op.FUSED_MATMUL_BIAS_ACT)[0].id))),
    ("fc2_single_user", lambda g: with_reader(g, g.find(Op.FUSED_MATMUL_BIAS_ACT)[1].id)),
    ("fc2_not_output", lambda g: g.with_outputs((*g.outputs, g.find(Op.FUSED_MATMUL_BIAS_ACT)[1].id))),
])
def test_layer_guard_near_misses(guard, make):
    g = make(pre_ftl())
    r, t = rejected_by(g, ["fuse_transformer_layer"], guard)
    assert r.layer == 0 and len(t.final.find(Op.FUSED_TRANSFORMER_LAYER)) == 1


def test_layer_structure_steps_name_the_missing_pass():
    g = bert()
    r, _ = rejected_by(g, ["fuse_matmul_bias_act", "fuse_attention_block", "fuse_transformer_layer"], "post_ln_order")
    assert "run fuse_residual_ln first" in r.message
    # FFN linears unfused, everything else fused: structure stops at fc1
    g2 = run_passes(g, ["fuse_matmul_bias_act", "fuse_attention_block", "fuse_residual_ln"]).final
    rw = Rewriter(g2, "test")
    from rlxviz.ir.emitter import Ref
    from rlxviz.ir.fused import expand
    for n in g2.find(Op.FUSED_MATMUL_BIAS_ACT):
        if "intermediate" in n.path:
            with rw.provenance([n.id], path=n.path):
                rw.replace(n.id, expand(rw, n.op, dict(n.attrs), [Ref(i) for i in n.inputs]))
    r, _ = rejected_by(rw.finish(), ["fuse_transformer_layer"], "fc1_is_fused_linear")
    assert "run fuse_matmul_bias_act first" in r.message


def fused_level_layer(ln1_bias=False, ln2_bias=False, fc2_act=None, swap2=False, ln2_plain=False):
    """One BERT layer written directly with fused ops (for the FTL guards further down the chain)."""
    b = Builder("fused_layer")
    h, nh, inter = 16, 2, 32
    x = b.input("x", (1, 4, h))
    mask = b.input("mask", (1, 4))
    p = {n: b.param(n, s) for n, s in [("qkv_w", (h, 3 * h)), ("qkv_b", (3 * h,)), ("out_w", (h, h)), ("out_b", (h,)),
                                      ("g1", (h,)), ("b1", (h,)), ("fc1_w", (h, inter)), ("fc1_b", (inter,)),
                                      ("fc2_w", (inter, h)), ("fc2_b", (h,)), ("g2", (h,)), ("b2", (h,)),
                                      ("rb", (h,))]}
    with b.scope("encoder.layer.0"):
        a = b.emit(Op.FUSED_ATTENTION_BLOCK, [x, p["qkv_w"], p["out_w"], mask, p["qkv_b"], p["out_b"]],
                   num_heads=nh, head_dim=h // nh)
        ins1 = [a, x, p["rb"], p["g1"], p["b1"]] if ln1_bias else [a, x, p["g1"], p["b1"]]
        h1 = b.emit(Op.FUSED_RESIDUAL_LN, ins1, eps=1e-12, has_bias=ln1_bias)
        f1 = b.emit(Op.FUSED_MATMUL_BIAS_ACT, [h1, p["fc1_w"], p["fc1_b"]], activation="gelu")
        f2 = b.emit(Op.FUSED_MATMUL_BIAS_ACT, [f1, p["fc2_w"], p["fc2_b"]], activation=fc2_act)
        if ln2_plain:
            out = b.layer_norm(b.add(f2, h1), p["g2"], p["b2"])
        else:
            pair = [h1, f2] if swap2 else [f2, h1]
            ins2 = [*pair, p["rb"], p["g2"], p["b2"]] if ln2_bias else [*pair, p["g2"], p["b2"]]
            out = b.emit(Op.FUSED_RESIDUAL_LN, ins2, eps=1e-12, has_bias=ln2_bias)
    b.output(out)
    return b.build()


@pytest.mark.parametrize("guard,kw", [
    ("ln1_no_bias", {"ln1_bias": True}),
    ("ln2_no_bias", {"ln2_bias": True}),
    ("fc2_is_fused_linear", {"fc2_act": "gelu"}),
    ("ln2_operand_order", {"swap2": True}),
    ("ln2_is_residual_ln", {"ln2_plain": True}),
])
def test_layer_guards_on_fused_level_graphs(guard, kw):
    assert not guards(fused_level_layer(), ["fuse_transformer_layer"])[0]
    rejected_by(fused_level_layer(**kw), ["fuse_transformer_layer"], guard)


def test_fused_level_layer_fuses_and_keeps_numbers():
    g = fused_level_layer()
    g2 = run_passes(g, ["fuse_transformer_layer"]).final
    assert g2.find(Op.FUSED_TRANSFORMER_LAYER)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((1, 4, 16)).astype(np.float32), "mask": np.array([[1, 1, 1, 0]], np.float32)}
    w = {n.name: (0.2 * rng.standard_normal(n.shape)).astype(np.float32) for n in g.params}
    np.testing.assert_allclose(run_reference(g, feeds, w)[0], run_reference(g2, feeds, w)[0], rtol=1e-4, atol=1e-5)


# -- fuse_attention_block guards --------------------------------------------------------------

def pre_fab(**kw):
    return run_passes(bert(**kw), ["fuse_matmul_bias_act"]).final


def test_attention_block_guards():
    g = pre_fab()
    attn = role(g, Op.ATTENTION)
    q = g[attn].inputs[0]
    qkv = g[q].inputs[0]
    rejected_by(g.with_outputs((*g.outputs, attn)), ["fuse_attention_block"], "attn_not_output")
    rejected_by(with_reader(g, attn), ["fuse_attention_block"], "attn_single_user")
    rejected_by(with_reader(g, q), ["fuse_attention_block"], "qkv_narrows_single_use")
    rejected_by(with_reader(g, qkv), ["fuse_attention_block"], "qkv_user_count")
    rejected_by(g.with_outputs((*g.outputs, qkv)), ["fuse_attention_block"], "qkv_not_output")
    r, _ = rejected_by(bert(), ["fuse_attention_block"], "qkv_is_fused_linear")
    assert "run fuse_matmul_bias_act first" in r.message
    # out projection left unfused: expose its matmul so fuse_matmul_bias_act declines it
    g0 = bert()
    out_mm = next(u for u in g0.users(role(g0, Op.ATTENTION)) if u.op == Op.MATMUL).id
    g1 = run_passes(g0.with_outputs((*g0.outputs, out_mm)), ["fuse_matmul_bias_act"]).final
    rejected_by(g1, ["fuse_attention_block"], "out_is_fused_linear")


def attention_graph(mask="keep", scale=None, split=(0, 16, 32), axis=2):
    b = Builder("attn")
    x = b.input("x", (1, 4, 16))
    m = b.input("m", (1, 4))
    with b.scope("encoder.layer.0"):
        qkv = b.fused_matmul_bias_act(x, b.param("w", (16, 48)), b.param("bias", (48,)))
        q, k, v = (b.narrow(qkv, axis, s, 16) for s in split)
        a = b.attention(q, k, v, m if mask != "none" else None, num_heads=2, head_dim=8, mask_kind=mask, scale=scale)
        out = b.fused_matmul_bias_act(a, b.param("wo", (16, 16)), b.param("bo", (16,)))
    b.output(out)
    return b.build()


@pytest.mark.parametrize("guard,kw", [
    ("mask_kind_keep", {"mask": "none"}),
    ("default_scale", {"scale": 0.5}),
    ("qkv_split", {"split": (16, 0, 32)}),
])
def test_attention_block_attr_guards(guard, kw):
    assert len(run_passes(attention_graph(), ["fuse_attention_block"]).matches) == 1
    rejected_by(attention_graph(**kw), ["fuse_attention_block"], guard)


# -- fuse_sdpa guards -------------------------------------------------------------------------

def sdpa_graph(k_perm=(0, 1, 3, 2), q_perm=(0, 2, 1, 3), merge_perm=(0, 2, 1, 3), axis=-1, mask="hf", extra=None,
               scale_op="div"):
    b = Builder("sdpa")
    B, S, H, nh, dh = 2, 4, 8, 2, 4
    x = b.input("x", (B, S, H))
    m = b.input("m", (B, S), "i64")
    ext = b.reshape(b.mul(b.sub(1.0, b.cast(m, "f32")), -3.0e38), (B, 1, 1, S)) if mask == "hf" else \
        b.input("bias", (B, 1, 1, S))
    with b.scope("encoder.layer.0.attention.self"):
        def heads(n, perm=(0, 2, 1, 3)):
            t = b.matmul(x, b.param(n, (H, H)))
            return b.transpose(b.reshape(t, (B, S, nh, dh)), perm)
        q, k, v = heads("q", q_perm), heads("k"), heads("v")
        kt = b.transpose(k, k_perm)
        s = b.matmul(q, kt)
        s = b.div(s, 2.0) if scale_op == "div" else b.mul(s, 0.5)
        probs = b.softmax(b.add(s, ext), axis=axis)
        ctx = b.matmul(probs, v)
        out = b.reshape(b.transpose(ctx, merge_perm), (B, S, H))
    outs = [out] + ([{"scores": s, "probs": probs}[extra]] if extra else [])
    b.output(*outs)
    return b.build()


def test_sdpa_fuses_with_keep_mask_and_keeps_numbers():
    for scale_op in ("div", "mul"):
        g = sdpa_graph(scale_op=scale_op)
        t = run_passes(g, ["fuse_sdpa", "dead_code_elimination"])
        (a,) = t.final.find(Op.ATTENTION)
        assert a.attrs["mask"] == "keep" and a.attrs["scale"] is None
        rng = np.random.default_rng(1)
        feeds = {"x": rng.standard_normal((2, 4, 8)).astype(np.float32), "m": np.array([[1, 1, 1, 0], [1, 0, 0, 0]])}
        w = {n.name: rng.standard_normal(n.shape).astype(np.float32) for n in g.params}
        np.testing.assert_allclose(run_reference(g, feeds, w)[0], run_reference(t.final, feeds, w)[0],
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("guard,kw", [
    ("k_layout", {"k_perm": (0, 1, 2, 3)}),
    ("q_head_split", {"q_perm": (0, 2, 3, 1)}),
    ("merge_layout", {"merge_perm": (0, 1, 2, 3)}),
    ("softmax_last_axis", {"axis": 2}),
    ("internals_single_use", {"extra": "probs"}),
    ("mask_form", {"mask": "additive"}),
])
def test_sdpa_guards(guard, kw):
    r, t = rejected_by(sdpa_graph(**kw), ["fuse_sdpa"], guard)
    if guard == "mask_form":  # soft: fused, but the mask stays additive
        assert t.final.find(Op.ATTENTION)[0].attrs["mask"] == "additive"


# -- fuse_matmul_bias_act / residual norms / shared input / swiglu -----------------------------

def linear_graph(bias_shape=(8,), act="gelu", output_mm=False, mm_reader=False, output_add=False):
    b = Builder("lin")
    x = b.input("x", (2, 4, 8))
    mm = b.matmul(x, b.param("w", (8, 8)))
    add = b.add(mm, b.param("b", bias_shape))
    y = b.unary(act, add)
    outs = [y] + ([mm] if output_mm else []) + ([b.neg(mm)] if mm_reader else []) + ([add] if output_add else [])
    b.output(*outs)
    return b.build()


@pytest.mark.parametrize("guard,kw", [
    ("mm_single_user", {"mm_reader": True}),
    ("mm_not_output", {"output_mm": True}),
    ("bias_rank", {"bias_shape": (4, 8)}),
    ("bias_length", {"bias_shape": (1, )}),
    ("epilogue_activation", {"act": "gelu_tanh"}),
    ("add_not_output", {"output_add": True}),
])
def test_matmul_bias_act_guards(guard, kw):
    if guard == "bias_length":  # [1] is a legal bias; [4] is not the output width
        kw = {"bias_shape": (4, 1)}
        guard = "bias_rank"
    rejected_by(linear_graph(**kw), ["fuse_matmul_bias_act"], guard)


def test_bias_length_guard():
    b = Builder("lin")
    x = b.input("x", (2, 4, 8))
    b.output(b.add(b.matmul(x, b.param("w", (8, 4))), b.param("b", (1,))))
    assert run_passes(b.build(), ["fuse_matmul_bias_act"]).matches
    b = Builder("lin")
    x = b.input("x", (2, 4, 8))
    b.output(b.add(b.matmul(x, b.param("w", (8, 1))), b.param("b", (4,))))
    rejected_by(b.build(), ["fuse_matmul_bias_act"], "bias_length")


def residual_graph(norm="layer_norm", reader=False, output_sum=False, skip_shape=(2, 4, 8), bias=None):
    b = Builder("res")
    x = b.input("x", (2, 4, 8))
    r = b.input("r", skip_shape)
    s = b.add(x, r)
    if bias is not None:
        s = b.add(s, b.param("rb", bias))
    y = getattr(b, norm)(s, b.param("g", (8,)), b.param("beta", (8,)))
    outs = [y] + ([b.neg(s)] if reader else []) + ([s] if output_sum else [])
    b.output(*outs)
    return b.build()


@pytest.mark.parametrize("pname,norm", [("fuse_residual_ln", "layer_norm"), ("fuse_residual_rms_norm", "rms_norm")])
def test_residual_norm_guards(pname, norm):
    t = run_passes(residual_graph(norm, bias=(8,)), [pname])
    assert t.final.compute_nodes()[0].attrs["has_bias"] is True
    rejected_by(residual_graph(norm, reader=True), [pname], "sum_single_user")
    rejected_by(residual_graph(norm, output_sum=True), [pname], "sum_not_output")
    rejected_by(residual_graph(norm, skip_shape=(1, 8)), [pname], "residual_same_shape")


def test_shared_input_guards_and_bias_merge():
    b = Builder("qkv")
    x = b.input("x", (2, 4, 8))
    outs = [b.add(b.matmul(x, b.param(f"w{i}", (8, 8))), b.param(f"b{i}", (8,))) for i in range(3)]
    b.output(*outs)
    g = b.build()
    t = run_passes(g, ["fuse_shared_input_matmul"])
    assert len(t.final.find(Op.MATMUL)) == 1 and len(t.final.find(Op.ADD)) == 1
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 4, 8)).astype(np.float32)}
    w = {n.name: rng.standard_normal(n.shape).astype(np.float32) for n in g.params}
    for a, c in zip(run_reference(g, feeds, w), run_reference(t.final, feeds, w), strict=True):
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-5)
    b = Builder("qkv2")
    x = b.input("x", (2, 4, 8))
    m0 = b.matmul(x, b.param("w0", (8, 8)))
    b.output(b.add(m0, b.param("b0", (8,))), b.neg(b.matmul(x, b.param("w1", (8, 8)))))
    rejected_by(b.build(), ["fuse_shared_input_matmul"], "biases_mergeable")
    b = Builder("qkv3")
    x = b.input("x", (2, 4, 8))
    b.output(b.matmul(x, b.param("w0", (8, 8))), b.matmul(x, b.param("w1", (2, 8, 8))))
    rejected_by(b.build(), ["fuse_shared_input_matmul"], "weights_rank2")
    b = Builder("qkv4")
    x = b.input("x", (2, 4, 8))
    m0 = b.matmul(x, b.param("w0", (8, 8)))
    b.output(b.neg(m0), m0, b.matmul(x, b.param("w1", (8, 8))))
    rejected_by(b.build(), ["fuse_shared_input_matmul"], "not_outputs")


def swiglu_graph(dual=True, reader=False, halves=(0, 8), wu_shape=(8, 8)):
    b = Builder("ffn")
    x = b.input("x", (2, 4, 8))
    if dual:
        g, u = b.matmul(x, b.param("wg", (8, 8))), b.matmul(x, b.param("wu", wu_shape))
    else:
        c = b.matmul(x, b.param("wc", (8, 16)))
        u, g = b.narrow(c, 2, halves[0], 8), b.narrow(c, 2, halves[1], 8)
    s = b.silu(g)
    b.output(b.mul(s, u), *([b.neg(s)] if reader else []))
    return b.build()


def test_swiglu_guards():
    for dual in (True, False):
        assert run_passes(swiglu_graph(dual), ["fuse_swiglu"]).final.find(Op.FUSED_SWIGLU)
        rejected_by(swiglu_graph(dual, reader=True), ["fuse_swiglu"], "swiglu_single_use")
    rejected_by(swiglu_graph(False, halves=(0, 4)), ["fuse_swiglu"], "halves_of_last_axis")
    b = Builder("ffn")
    x = b.input("x", (2, 4, 8))
    g, u = b.matmul(x, b.param("wg", (8, 8))), b.matmul(x, b.param("wu", (8, 8)))
    b.output(b.mul(b.silu(g), b.matmul(u, b.param("z", (8, 8)))))
    assert not run_passes(b.build(), ["fuse_swiglu"]).matches


def test_swiglu_gate_first_keeps_numbers():
    g = swiglu_graph(False, halves=(8, 0))
    t = run_passes(g, ["fuse_swiglu"])
    (n,) = t.final.find(Op.FUSED_SWIGLU)
    assert n.attrs["gate_first"] is True
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 4, 8)).astype(np.float32)}
    w = {"wc": rng.standard_normal((8, 16)).astype(np.float32)}
    np.testing.assert_allclose(run_reference(g, feeds, w)[0], run_reference(t.final, feeds, w)[0], rtol=1e-5)


def test_absorbed_escape_is_the_engine_safety_net():
    # a silu read twice: the dual-matmul guard names it first; the generic escape check backs every rule
    from rlxviz.passes.rules.linear import BIAS_ACT
    assert BIAS_ACT.guard_names[-1] == "absorbed_escape"
