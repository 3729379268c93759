"""`canonicalize_exported`: the forms exporters write are rewritten by a pass with match and rejection records,
not by the importer while reading. Each rule fires on its form and keeps the numbers (reference and MLX, a fully
masked row included), and refuses with a named guard where the rewrite would change them (a -inf fill under the
NaN guard, a mask fill that is not f32's min). The ONNX importer leaves `x * sigmoid(x)` as it is; the pass makes
it silu, and turning the pass off leaves it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from rlxviz.ir import Builder, Op
from rlxviz.models.onnx import load_onnx
from rlxviz.passes import Pipeline
from rlxviz.runtime import run_reference
from rlxviz.runtime.executor import MlxExecutor
from rlxviz.runtime.lowering import LoweringOptions

F32_MIN = float(np.finfo(np.float32).min)
rng = np.random.default_rng(7)


def _run(g):
    trace = Pipeline(["canonicalize_exported", "dead_code_elimination"]).run(g)
    return trace, trace.final


def _same_numbers(before, after, feeds):
    want = run_reference(before, feeds)
    for got in (run_reference(after, feeds), MlxExecutor(LoweringOptions(fast_math=False)).run(after, feeds)):
        for w, o in zip(want, got, strict=True):
            np.testing.assert_allclose(np.asarray(o), w, rtol=1e-6, atol=1e-6)


def _rules(trace):
    return {m.rule for m in trace.matches}, {(r.rule, r.guard) for r in trace.rejections}


def test_silu_and_rsqrt_forms_become_ops_with_equal_numbers():
    b = Builder("forms")
    x = b.input("x", (2, 8))
    y = b.mul(b.sigmoid(x), x)
    z = b.mul(y, b.div(1.0, b.sqrt(b.add(b.mul(x, x), 1.0))))
    b.output(z)
    g = b.build()
    trace, final = _run(g)
    assert _rules(trace)[0] == {"canonicalize_exported.silu", "canonicalize_exported.rsqrt"}
    ops = {n.op for n in final}
    assert Op.SILU in ops and Op.RSQRT in ops and Op.SIGMOID not in ops and Op.SQRT not in ops
    _same_numbers(g, final, {"x": rng.standard_normal((2, 8)).astype(np.float32) * 4})


def test_a_sigmoid_read_elsewhere_is_not_absorbed():
    b = Builder("shared")
    x = b.input("x", (2, 8))
    s = b.sigmoid(x)
    b.output(b.mul(x, s), s)
    trace, final = _run(b.build())
    assert ("canonicalize_exported.silu", "absorbed_escape") in _rules(trace)[1]
    assert Op.SILU not in {n.op for n in final}


def _scores(b, fill=F32_MIN, zero=0.0, nan_guard=True):
    """softmax(q k^T + where(keep, zero, fill)) [guarded by where(isnan(p), 0, p)] @ v, heads [2, 2, 4, 8]."""
    q, k, v = (b.input(n, (2, 2, 4, 8)) for n in "qkv")
    keep = b.input("keep", (2, 1, 1, 4), "bool")
    s = b.add(b.matmul(q, b.transpose(k, (0, 1, 3, 2))), b.where(keep, zero, fill))
    p = b.softmax(s, -1)
    if nan_guard:
        p = b.where(b.isnan(p), 0.0, p)
    b.output(b.matmul(p, v))
    return b.build()


def _attention_feeds(all_masked_row: bool = True):
    f = {n: rng.standard_normal((2, 2, 4, 8)).astype(np.float32) for n in "qkv"}
    keep = np.ones((2, 1, 1, 4), bool)
    keep[0, ..., 2:] = False
    if all_masked_row:
        keep[1] = False  # every key masked: uniform weights with the f32-min fill, never NaN
    f["keep"] = keep
    return f


def test_the_padding_mask_sum_and_the_sdpa_nan_guard_are_rewritten_exactly():
    g = _scores(Builder("sdpa"))
    trace, final = _run(g)
    assert _rules(trace)[0] == {"canonicalize_exported.where_bias", "canonicalize_exported.nan_guard"}
    ops = [n.op for n in final]
    assert Op.ISNAN not in ops and ops.count(Op.WHERE) == 1
    _same_numbers(g, final, _attention_feeds())


def test_a_minus_inf_fill_keeps_the_nan_guard_and_another_fill_keeps_the_sum():
    g = _scores(Builder("inf"), fill=float("-inf"))
    trace, final = _run(g)
    rejected = _rules(trace)[1]
    assert ("canonicalize_exported.nan_guard", "scores_finite") in rejected
    assert ("canonicalize_exported.where_bias", "bias_fills") in rejected
    assert Op.ISNAN in {n.op for n in final}
    feeds = _attention_feeds()
    out = run_reference(final, feeds)[0]
    assert np.isfinite(out).all() and not out[1].any()  # the fully masked rows are 0, as the guard makes them


@pytest.mark.parametrize("fill", [-1e4, -1e9])
def test_other_mask_fills_are_left_as_a_sum(fill):
    trace, _ = _run(_scores(Builder("fill"), fill=fill, nan_guard=False))
    assert ("canonicalize_exported.where_bias", "bias_fills") in _rules(trace)[1]


def test_the_importer_maps_silu_one_to_one_and_the_pass_records_the_rewrite(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "silu.onnx")
    model = load_onnx(tmp_path / "silu.onnx", batch=1, seq=4)
    assert {n.op for n in model.graph} >= {Op.SIGMOID, Op.MUL}  # version 0 is what the file says
    trace = Pipeline.canonical().run(model.graph)
    assert any(mt.rule == "canonicalize_exported.silu" for mt in trace.matches)
    off = Pipeline.canonical()
    off.disabled.add("canonicalize_exported")
    assert Op.SILU not in {n.op for n in off.run(model.graph).final}


@pytest.mark.parametrize("b, h, s, d, lead", [(2, 4, 5, 8, 2), (1, 3, 7, 4, 2), (3, 2, 1, 6, 1)])
def test_the_sdpa_folded_transpose_is_rewritten_with_equal_numbers(b, h, s, d, lead):
    """torch's sdpa decomposition: K^T written on heads folded into the batch, q and k^T each scaled by sqrt(scale).
    `lead` = how many leading axes the fold merges (2: [B*H, S, d]; 1: only the batch, a no-op fold)."""
    g_b = Builder("sdpa_split")
    q, k = g_b.input("q", (b, h, s, d)), g_b.input("k", (b, h, s, d))
    fold = (b * h, s, d) if lead == 2 else (b, h, s, d)
    kt = g_b.reshape(g_b.transpose(g_b.reshape(k, fold), (0, 2, 1) if lead == 2 else (0, 1, 3, 2)), (b, h, d, s))
    half = float(np.float32(d ** -0.25))
    g_b.output(g_b.softmax(g_b.matmul(g_b.mul(q, half), g_b.mul(kt, half)), -1))
    g = g_b.build()
    trace, final = _run(g)
    matched, _ = _rules(trace)
    assert "canonicalize_exported.folded_transpose" in matched  # lead 1: the batch alone "folds" (a no-op fold)
    (mm,) = [n for n in final if n.op == Op.MATMUL]
    kt_mul = final[mm.inputs[1]]
    assert kt_mul.op == Op.MUL and final[kt_mul.inputs[0]].op == Op.TRANSPOSE
    assert final[kt_mul.inputs[0]].attrs["perm"] == (0, 1, 3, 2)
    feeds = {"q": rng.standard_normal((b, h, s, d)).astype(np.float32) * 3,
             "k": rng.standard_normal((b, h, s, d)).astype(np.float32) * 3}
    _same_numbers(g, final, feeds)


@pytest.mark.parametrize("heads, head_dim", [(4, 8), (2, 6)])
def test_the_sdpa_split_scale_packs_into_one_attention_with_equal_numbers(heads, head_dim):
    """torch's sdpa export: q and k^T each times head_dim**-0.25, K^T folded into the batch. No rule of
    canonicalize_exported joins the scales: fuse_sdpa.hoist_scale moves K's next to its head split and fuse_sdpa
    folds both into the attention's default scale."""
    bsz, seq, hid = 2, 5, heads * head_dim
    g_b = Builder("sdpa_attention")
    x = g_b.input("x", (bsz, seq, hid))

    def split(name):
        p = g_b.matmul(x, g_b.param(f"{name}.weight", (hid, hid)))
        return g_b.transpose(g_b.reshape(p, (bsz, seq, heads, head_dim)), (0, 2, 1, 3))

    q, k, v = split("q"), split("k"), split("v")
    kt = g_b.reshape(g_b.transpose(g_b.reshape(k, (bsz * heads, seq, head_dim)), (0, 2, 1)),
                     (bsz, heads, head_dim, seq))
    c = float(np.float32(head_dim ** -0.25))
    p = g_b.softmax(g_b.matmul(g_b.mul(q, c), g_b.mul(kt, c)), -1)
    g_b.output(g_b.reshape(g_b.transpose(g_b.matmul(p, v), (0, 2, 1, 3)), (bsz, seq, hid)))
    g = g_b.build()
    trace = Pipeline(["canonicalize_exported", "fuse_sdpa", "dead_code_elimination"]).run(g)
    rules = {m.rule for s in trace.steps for m in s.matches}
    assert {"canonicalize_exported.folded_transpose", "fuse_sdpa.hoist_scale", "fuse_sdpa.hf_attention"} <= rules
    (att,) = [n for n in trace.final if n.op == Op.ATTENTION]
    assert att.attrs["scale"] is None  # c * c is 1/sqrt(head_dim): the default
    w = {n.name: (rng.standard_normal(n.shape) * 0.3).astype(np.float32) for n in g.params}
    feeds = {"x": rng.standard_normal((bsz, seq, hid)).astype(np.float32)}
    want = run_reference(g, feeds, w)[0]
    np.testing.assert_allclose(run_reference(trace.final, feeds, w)[0], want, rtol=1e-5, atol=1e-5)
    got = MlxExecutor(LoweringOptions(fast_math=False)).run(trace.final, feeds, w)[0]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)


def test_other_reshape_chains_are_not_records():
    g_b = Builder("head_split")
    x = g_b.input("x", (2, 4, 8))
    g_b.output(g_b.reshape(g_b.transpose(g_b.reshape(x, (2, 4, 2, 4)), (0, 2, 1, 3)), (2, 2, 16)))  # a head split
    trace, _ = _run(g_b.build())
    assert not any(r.rule == "canonicalize_exported.folded_transpose" for r in trace.rejections)
    assert "canonicalize_exported.folded_transpose" not in _rules(trace)[0]


def test_a_position_bias_then_the_padding_mask_become_one_additive_term_with_equal_numbers():
    """T5: (q k^T + bias) + where(keep, 0, f32 min) -> q k^T + (bias + where(...)); a fully masked row included."""
    g_b = Builder("t5_scores")
    q, k = g_b.input("q", (2, 2, 5, 8)), g_b.input("k", (2, 2, 5, 8))
    keep = g_b.input("keep", (2, 1, 1, 5), "bool")
    s = g_b.add(g_b.matmul(q, g_b.transpose(k, (0, 1, 3, 2))), g_b.input("bias", (1, 2, 5, 5)))
    g_b.output(g_b.softmax(g_b.add(s, g_b.where(keep, 0.0, F32_MIN)), -1))
    g = g_b.build()
    trace, final = _run(g)
    matched, _ = _rules(trace)
    assert "canonicalize_exported.bias_then_mask" in matched and "canonicalize_exported.where_bias" not in matched
    (sm,) = [n for n in final if n.op == Op.SOFTMAX]
    top = final[sm.inputs[0]]
    assert top.op == Op.ADD and Op.MATMUL in {final[i].op for i in top.inputs}
    mask = rng.random((2, 1, 1, 5)) > 0.4
    mask[0] = False
    feeds = {"q": rng.standard_normal((2, 2, 5, 8)).astype(np.float32) * 3,
             "k": rng.standard_normal((2, 2, 5, 8)).astype(np.float32) * 3,
             "bias": rng.standard_normal((1, 2, 5, 5)).astype(np.float32) * 5, "keep": mask}
    _same_numbers(g, final, feeds)


@pytest.mark.parametrize("test_op, const", [("eq", False), ("ne", True)])
def test_an_inverted_where_mask_is_swapped_with_equal_numbers(test_op, const):
    """torch's scores.masked_fill(~mask, min): where(eq(m, false), min, s) -> where(m, s, min)."""
    g_b = Builder("inverted_where")
    s = g_b.input("s", (2, 2, 4, 4))
    m = g_b.input("m", (2, 1, 4, 4), "bool")
    test = g_b.eq(m, g_b.const(const, "bool")) if test_op == "eq" else g_b.ne(m, g_b.const(const, "bool"))
    g_b.output(g_b.softmax(g_b.where(test, F32_MIN, s), -1))
    g = g_b.build()
    trace, final = _run(g)
    assert "canonicalize_exported.inverted_where" in _rules(trace)[0]
    (w,) = [n for n in final if n.op == Op.WHERE]
    assert final[w.inputs[0]].op == Op.INPUT and final[w.inputs[1]].op == Op.INPUT
    mask = rng.random((2, 1, 4, 4)) > 0.5
    mask[0, 0, 0] = False  # a fully masked row
    _same_numbers(g, final, {"s": rng.standard_normal((2, 2, 4, 4)).astype(np.float32), "m": mask})
