"""IR coverage for issue 10: abs, isnan, constants of any rank, rms_norm without beta, grouped-query attention
(`num_kv_heads` on attention and FusedAttentionBlock): inference, reference and MLX lowering agree."""

import numpy as np
import pytest

from rlxviz.ir import Builder, DType, Op, lint, parse_ir
from rlxviz.ir.infer import ShapeError
from rlxviz.passes import Pipeline
from rlxviz.runtime import run_reference
from rlxviz.runtime.executor import MlxExecutor
from rlxviz.runtime.lowering import LoweringOptions

rng = np.random.default_rng(10)
EXECUTORS = [MlxExecutor(LoweringOptions(fast_math=False, attention="composed", compile_fused=False)),
             MlxExecutor(LoweringOptions(fast_math=False, attention="sdpa", compile_fused=False))]


def randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def mlx_close(graph, feeds, weights=None, rtol=1e-4, atol=1e-5):
    want = run_reference(graph, feeds, weights)
    for ex in EXECUTORS:
        got = ex.run(graph, feeds, weights or {})
        for w, g in zip(want, got, strict=True):
            np.testing.assert_allclose(np.asarray(g, dtype=np.float64), w.astype(np.float64), rtol=rtol, atol=atol)
    return want


def test_abs_isnan():
    b = Builder("abs_isnan")
    x = b.input("x", (3, 4))
    b.output(b.abs(x), b.isnan(x))
    g = b.build()
    assert g[g.outputs[1]].dtype == DType.bool
    x = randn(3, 4)
    x[0, 1] = np.nan
    got = run_reference(g, {"x": x})
    np.testing.assert_array_equal(got[0], np.abs(x))
    np.testing.assert_array_equal(got[1], np.isnan(x))
    for ex in EXECUTORS:
        out = ex.run(g, {"x": x})
        np.testing.assert_array_equal(np.asarray(out[1]), np.isnan(x))
    with pytest.raises(ShapeError, match="float operand"):
        b2 = Builder("bad")
        b2.isnan(b2.input("i", (2,), "i64"))


def test_const_of_rank_2_and_3_roundtrip_and_run():
    text = """graph c2 {
  %0 = input {name="x"} : f32[2, 3]
  %1 = const {value=[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]} : f32[2, 3]
  %2 = add(%0, %1) : f32[2, 3]
  %3 = const {value=[[[1.0], [2.0]]]} : f32[1, 2, 1]
  %4 = mul(%2, %3) : f32[1, 2, 3]
  return %4
}"""
    g = parse_ir(text)
    x = randn(2, 3)
    want = (x + np.array([[1, 2, 3], [4, 5, 6]], np.float32)) * np.array([[[1], [2]]], np.float32)
    np.testing.assert_allclose(mlx_close(g, {"x": x})[0], want, rtol=1e-6)
    b = Builder("c")
    c = b.const([[1, 2], [3, 4]])
    assert b.lookup(c).shape == (2, 2)
    with pytest.raises(ShapeError, match="ragged"):
        b.const([[1, 2], [3]])


def test_rms_norm_without_beta():
    b = Builder("rms")
    x = b.input("x", (2, 5, 8))
    gam = b.param("g", (8,))
    b.output(b.rms_norm(x, gam, None, 1e-6))
    g = lint(b.build())
    node = g[g.outputs[0]]
    assert node.op == Op.RMS_NORM and len(node.inputs) == 2
    xv, gv = randn(2, 5, 8), randn(8)
    want = xv / np.sqrt(np.mean(xv * xv, -1, keepdims=True) + 1e-6) * gv
    got = mlx_close(g, {"x": xv}, {"g": gv})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ShapeError, match="takes x, gamma, beta"):
        b.emit(Op.LAYER_NORM, [x, gam], eps=1e-5)


def _repeat_kv_attention(q, k, v, heads, kv, d):
    """Plain NumPy GQA: repeat each kv head heads//kv times (HF repeat_kv), then MHA."""
    bsz, s, _ = q.shape
    qh = q.reshape(bsz, s, heads, d).transpose(0, 2, 1, 3)
    kh = np.repeat(k.reshape(bsz, s, kv, d).transpose(0, 2, 1, 3), heads // kv, axis=1)
    vh = np.repeat(v.reshape(bsz, s, kv, d).transpose(0, 2, 1, 3), heads // kv, axis=1)
    sc = qh @ kh.transpose(0, 1, 3, 2) / np.sqrt(d)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ vh).transpose(0, 2, 1, 3).reshape(bsz, s, heads * d)


@pytest.mark.parametrize("heads, kv", [(4, 2), (6, 1), (4, 4)])
def test_gqa_attention_reference_and_mlx(heads, kv):
    d, s = 8, 5
    b = Builder("gqa")
    q = b.input("q", (2, s, heads * d))
    k = b.input("k", (2, s, kv * d))
    v = b.input("v", (2, s, kv * d))
    b.output(b.attention(q, k, v, num_heads=heads, head_dim=d, num_kv_heads=kv))
    g = lint(b.build())
    feeds = {"q": randn(2, s, heads * d), "k": randn(2, s, kv * d), "v": randn(2, s, kv * d)}
    got = mlx_close(g, feeds)[0]
    np.testing.assert_allclose(got, _repeat_kv_attention(feeds["q"], feeds["k"], feeds["v"], heads, kv, d),
                               rtol=1e-4, atol=1e-5)


def test_gqa_attention_rejects_non_divisor():
    b = Builder("gqa")
    q, k = b.input("q", (1, 2, 24)), b.input("k", (1, 2, 16))
    with pytest.raises(ShapeError, match="num_kv_heads 2 must divide num_heads 3"):
        b.attention(q, k, k, num_heads=3, head_dim=8, num_kv_heads=2)


def test_gqa_fused_attention_block_matches_unfused():
    heads, kv, d, s, hid = 4, 2, 4, 6, 16
    b = Builder("fab_gqa")
    x = b.input("x", (2, s, hid))
    m = b.input("mask", (2, s))
    qkv_w, qkv_b = b.param("qkv_w", (hid, (heads + 2 * kv) * d)), b.param("qkv_b", ((heads + 2 * kv) * d,))
    out_w, out_b = b.param("out_w", (heads * d, hid)), b.param("out_b", (hid,))
    b.output(b.emit(Op.FUSED_ATTENTION_BLOCK, [x, qkv_w, out_w, m, qkv_b, out_b], num_heads=heads, head_dim=d,
                    num_kv_heads=kv))
    g = lint(b.build())
    feeds = {"x": randn(2, s, hid), "mask": np.ones((2, s), np.float32)}
    feeds["mask"][1, -2:] = 0
    weights = {"qkv_w": randn(hid, (heads + 2 * kv) * d), "qkv_b": randn((heads + 2 * kv) * d),
               "out_w": randn(heads * d, hid), "out_b": randn(hid)}
    fused = mlx_close(g, feeds, weights)[0]
    unfused = Pipeline(["unfuse"]).run(g).final
    assert not any(n.op == Op.FUSED_ATTENTION_BLOCK for n in unfused)
    att = next(n for n in unfused if n.op == Op.ATTENTION)
    assert att.attrs["num_kv_heads"] == kv
    np.testing.assert_allclose(run_reference(unfused, feeds, weights)[0], fused, rtol=1e-5, atol=1e-6)
    w = weights
    qkv = feeds["x"] @ w["qkv_w"] + w["qkv_b"]
    qq, kk, vv = qkv[..., :heads * d], qkv[..., heads * d:(heads + kv) * d], qkv[..., (heads + kv) * d:]
    pad = feeds["mask"] < 0.5
    bsz = 2
    qh = qq.reshape(bsz, s, heads, d).transpose(0, 2, 1, 3)
    kh = np.repeat(kk.reshape(bsz, s, kv, d).transpose(0, 2, 1, 3), heads // kv, axis=1)
    vh = np.repeat(vv.reshape(bsz, s, kv, d).transpose(0, 2, 1, 3), heads // kv, axis=1)
    sc = qh @ kh.transpose(0, 1, 3, 2) / np.sqrt(d)
    sc = np.where(pad[:, None, None, :], -np.inf, sc)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = (p @ vh).transpose(0, 2, 1, 3).reshape(bsz, s, heads * d) @ w["out_w"] + w["out_b"]
    np.testing.assert_allclose(fused, want, rtol=1e-4, atol=1e-5)


def test_beta_less_rms_norm_fuses_with_its_residual():
    b = Builder("post_rms")
    x, r = b.input("x", (2, 3, 8)), b.input("r", (2, 3, 8))
    b.output(b.rms_norm(b.add(x, r), b.param("g", (8,)), None, 1e-6))
    g = b.build()
    final = Pipeline.canonical().run(g).final
    (f,) = [n for n in final if n.op == Op.FUSED_RESIDUAL_RMS_NORM]
    assert final[f.inputs[3]].op == Op.CONST and final[f.inputs[3]].shape == (8,)
    feeds, w = {"x": randn(2, 3, 8), "r": randn(2, 3, 8)}, {"g": randn(8)}
    np.testing.assert_allclose(mlx_close(final, feeds, w)[0], run_reference(g, feeds, w)[0], rtol=1e-5, atol=1e-6)
