"""The NumPy reference interpreter against independent formulations (loops, textbook formulas), and
every fused op against a hand-written primitive composition."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from strategies import random_graphs, random_transformer_like_graphs, run_case

from rlxviz.ir import Builder, DType, Op, lint
from rlxviz.ir.emitter import normalize_attrs
from rlxviz.ir.fused import DECOMPOSITIONS, expand
from rlxviz.ir.ops import FUSED
from rlxviz.runtime import run_reference

RNG = np.random.default_rng(1234)


def rand(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def close(a: np.ndarray, b: np.ndarray, tol: float = 2e-5) -> None:
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=tol, atol=tol)


def run_one(build, feeds: dict, weights: dict | None = None) -> np.ndarray:
    """Build a graph whose inputs are named like `feeds` (all as inputs), run it, return the single output."""
    b = Builder("t")
    ins = {k: b.input(k, v.shape, DType.from_numpy(v.dtype)) for k, v in feeds.items()}
    ps = {k: b.param(k, v.shape) for k, v in (weights or {}).items()}
    out = build(b, {**ins, **ps})
    b.output(out)
    g = lint(b.build())
    (res,) = run_reference(g, feeds, weights)
    assert res.shape == g[out].shape and res.dtype == g[out].dtype.numpy
    return res


# -- independent formulations (float64, loops where it helps) -------------------------------------

def attn_loop(q, k, v, heads, hd, visible, scale=None, additive=None):
    """SDPA by explicit loops: out[b, i, head] = sum_j softmax_j(q.k * scale [+ add]) v[j] over visible j."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    bsz, sq, _ = q.shape
    sk = k.shape[1]
    scale = 1 / math.sqrt(hd) if scale is None else scale
    out = np.zeros((bsz, sq, heads * hd))
    for b in range(bsz):
        for h in range(heads):
            sl = slice(h * hd, (h + 1) * hd)
            for i in range(sq):
                js = [j for j in range(sk) if visible(b, i, j)]
                s = np.array([q[b, i, sl] @ k[b, j, sl] * scale + (0 if additive is None else additive(b, h, i, j))
                              for j in js])
                w = np.exp(s - s.max())
                w /= w.sum()
                out[b, i, sl] = sum(wj * v[b, j, sl] for wj, j in zip(w, js, strict=True))
    return out


def ln_ref(x, g, b, eps):
    x = np.asarray(x, np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def rms_ref(x, g, b, eps):
    x = np.asarray(x, np.float64)
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * g + b


def rope_ref(x, cos, sin, hd, n_rot):
    """NeoX rotary by loops: pair (i, i + n_rot/2) of each head rotated by the position's angle i."""
    x = np.asarray(x, np.float64)
    out = x.copy()
    bsz, s, width = x.shape
    half = n_rot // 2
    for b in range(bsz):
        for p in range(s):
            for h in range(width // hd):
                o = h * hd
                for i in range(half):
                    x1, x2 = x[b, p, o + i], x[b, p, o + i + half]
                    out[b, p, o + i] = x1 * cos[p, i] - x2 * sin[p, i]
                    out[b, p, o + i + half] = x2 * cos[p, i] + x1 * sin[p, i]
    return out


ACT = {
    None: lambda x: x,
    "gelu": lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x / (1 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, 0),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "tanh": np.tanh,
}


# -- primitives ---------------------------------------------------------------------------------

@pytest.mark.parametrize("act", [a for a in ACT if a is not None])
def test_activations(act):
    x = rand(3, 5, scale=3)
    close(run_one(lambda b, v: b.unary(act, v["x"]), {"x": x}), ACT[act](x.astype(np.float64)))


@pytest.mark.parametrize("op, fn", [
    ("exp", np.exp), ("log", np.log), ("sqrt", np.sqrt), ("rsqrt", lambda x: 1 / np.sqrt(x)), ("neg", np.negative),
    ("erf", np.vectorize(math.erf)),
])
def test_unary_math(op, fn):
    x = np.abs(rand(4, 3)) + 0.1
    close(run_one(lambda b, v: b.unary(op, v["x"]), {"x": x}), fn(x.astype(np.float64)))


def test_binary_broadcast_and_scalars():
    x, y = rand(2, 1, 4), rand(3, 1)
    close(run_one(lambda b, v: b.sub(b.mul(v["x"], v["y"]), 2.0), {"x": x, "y": y}), x * y - 2.0)
    close(run_one(lambda b, v: b.div(1.0, b.add(b.pow(v["x"], 2.0), 1)), {"x": x}), 1 / (x.astype(np.float64)**2 + 1))
    close(run_one(lambda b, v: b.maximum(v["x"], b.minimum(v["y"], 0.0)), {"x": x, "y": y}),
          np.maximum(x, np.minimum(y, 0)))


def test_compare_where_cast():
    x = rand(3, 4)
    res = run_one(lambda b, v: b.where(b.gt(v["x"], 0.0), v["x"], b.mul(v["x"], 0.1)), {"x": x})
    close(res, np.where(x > 0, x, 0.1 * x))
    res = run_one(lambda b, v: b.cast(b.le(v["x"], 0.0), "f32"), {"x": x})
    assert res.dtype == np.float32 and np.array_equal(res, (x <= 0).astype(np.float32))


def test_int_division_keeps_the_ir_dtype():
    """NumPy turns i64 / i64 into f64; the interpreter casts back to the node's dtype (i64)."""
    x = np.array([7, -7, 9], np.int64)
    res = run_one(lambda b, v: b.emit(Op.DIV, (v["x"], b.const(2, DType.i64))), {"x": x})
    assert res.dtype == np.int64 and list(res) == [3, -3, 4]


def test_softmax_and_reductions():
    x = rand(2, 3, 4, scale=3)
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    close(run_one(lambda b, v: b.softmax(v["x"], 1), {"x": x}), e / e.sum(1, keepdims=True))
    close(run_one(lambda b, v: b.reduce_sum(v["x"], (0, 2)), {"x": x}), x.astype(np.float64).sum((0, 2)))
    close(run_one(lambda b, v: b.reduce_mean(v["x"], (-1,), keepdims=True), {"x": x}), x.mean(-1, keepdims=True))
    close(run_one(lambda b, v: b.reduce_max(v["x"], (1,)), {"x": x}), x.max(1))


def test_layer_norm_and_rms_norm_with_beta():
    x, g, beta = rand(2, 3, 8, scale=2), rand(8), rand(8)
    close(run_one(lambda b, v: b.layer_norm(v["x"], v["g"], v["beta"], 1e-5), {"x": x}, {"g": g, "beta": beta}),
          ln_ref(x, g, beta, 1e-5))
    close(run_one(lambda b, v: b.rms_norm(v["x"], v["g"], v["beta"], 1e-6), {"x": x}, {"g": g, "beta": beta}),
          rms_ref(x, g, beta, 1e-6))
    # eps matters: a constant row normalises to beta (LN), eps keeps it finite
    c = np.full((1, 8), 3.0, np.float32)
    close(run_one(lambda b, v: b.layer_norm(v["x"], v["g"], v["beta"], 1e-12), {"x": c}, {"g": g, "beta": beta}),
          beta[None])


def test_movement_ops():
    x = rand(2, 3, 4)
    close(run_one(lambda b, v: b.reshape(v["x"], (-1, 4)), {"x": x}), x.reshape(6, 4))
    close(run_one(lambda b, v: b.transpose(v["x"], (2, 0, 1)), {"x": x}), x.transpose(2, 0, 1))
    close(run_one(lambda b, v: b.narrow(v["x"], -1, 1, 2), {"x": x}), x[..., 1:3])
    close(run_one(lambda b, v: b.concat([v["x"], b.narrow(v["x"], 1, 0, 1)], 1), {"x": x}),
          np.concatenate([x, x[:, :1]], 1))
    close(run_one(lambda b, v: b.expand(b.narrow(v["x"], 0, 0, 1), (3, 3, 4)), {"x": x}), np.repeat(x[:1], 3, 0))
    table, idx = rand(5, 3), np.array([[4, 0], [2, 2]], np.int64)
    close(run_one(lambda b, v: b.gather(v["t"], v["i"]), {"t": table, "i": idx}), table[idx])


# -- attention ----------------------------------------------------------------------------------

def _attn(kind, q, k, v, mask=None, heads=2, hd=4, scale=None):
    feeds = {"q": q, "k": k, "v": v, **({"m": mask} if mask is not None else {})}
    return run_one(lambda b, x: b.attention(x["q"], x["k"], x["v"], x.get("m"), num_heads=heads, head_dim=hd,
                                            mask_kind=kind, scale=scale), feeds)


def test_attention_keep_mask_with_padding():
    q, k, v = rand(2, 3, 8), rand(2, 5, 8), rand(2, 5, 8)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.float32)
    expected = attn_loop(q, k, v, 2, 4, lambda b, i, j: mask[b, j] > 0.5)
    close(_attn("keep", q, k, v, mask), expected)
    # padded keys do not matter at all
    k2, v2 = k.copy(), v.copy()
    k2[0, 3:], v2[0, 3:] = 100.0, -100.0
    close(_attn("keep", q, k2, v2, mask)[0], expected[0])


def test_attention_fully_masked_row_averages_values():
    """Documented corner: a row with no visible key gets uniform weights (the mean of v)."""
    q, k, v = rand(1, 2, 4), rand(1, 3, 4), rand(1, 3, 4)
    res = _attn("keep", q, k, v, np.zeros((1, 3), np.float32), heads=1, hd=4)
    close(res, np.broadcast_to(v.mean(1, keepdims=True), (1, 2, 4)))


@pytest.mark.parametrize("sq, sk", [(2, 5), (1, 4), (4, 4)])
def test_attention_causal_is_bottom_right_aligned(sq, sk):
    q, k, v = rand(2, sq, 8), rand(2, sk, 8), rand(2, sk, 8)
    expected = attn_loop(q, k, v, 2, 4, lambda b, i, j: j <= i + (sk - sq))
    close(_attn("causal", q, k, v), expected)
    if sq == 1:  # a single decode step sees every key
        close(expected, attn_loop(q, k, v, 2, 4, lambda b, i, j: True))


def test_attention_additive_none_and_scale():
    q, k, v = rand(2, 3, 8), rand(2, 4, 8), rand(2, 4, 8)
    bias = rand(2, 1, 3, 4)
    close(_attn("additive", q, k, v, bias),
          attn_loop(q, k, v, 2, 4, lambda b, i, j: True, additive=lambda b, h, i, j: bias[b, 0, i, j]))
    close(_attn("none", q, k, v, scale=0.3), attn_loop(q, k, v, 2, 4, lambda b, i, j: True, scale=0.3))
    close(_attn("none", q, k, v, heads=1, hd=8), attn_loop(q, k, v, 1, 8, lambda b, i, j: True))


def _rope_tables(max_pos, half, base=10000.0):
    ang = np.arange(max_pos)[:, None] * base ** (-np.arange(half)[None, :] / half)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@pytest.mark.parametrize("hd, n_rot", [(4, 4), (8, 4), (8, 8)])
def test_rope_matches_direct_formula(hd, n_rot):
    x = rand(2, 3, 2 * hd)
    cos, sin = _rope_tables(6, n_rot // 2 + 1)  # tables may be longer and wider than needed
    res = run_one(lambda b, v: b.rope(v["x"], v["cos"], v["sin"], hd, n_rot), {"x": x}, {"cos": cos, "sin": sin})
    close(res, rope_ref(x, cos, sin, hd, n_rot))
    # rotation preserves the norm of each rotated pair
    assert np.allclose(np.linalg.norm(res, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)


# -- fused ops vs hand-written compositions -----------------------------------------------------

def _fused(op, attrs, arrays):
    """Run one fused node on `arrays` (first is an input, the rest params)."""
    names = [f"a{i}" for i in range(len(arrays))]
    feeds = {names[0]: arrays[0]}
    weights = dict(zip(names[1:], arrays[1:], strict=True))
    return run_one(lambda b, v: b.emit(op, [v[n] for n in names], **attrs), feeds, weights)


@pytest.mark.parametrize("act", list(ACT))
@pytest.mark.parametrize("bias_shape", [(6,), (1,), ()])
def test_fused_matmul_bias_act(act, bias_shape):
    x, w, bias = rand(2, 3, 4), rand(4, 6), rand(*bias_shape)
    res = _fused(Op.FUSED_MATMUL_BIAS_ACT, {"activation": act}, [x, w, bias])
    close(res, ACT[act](x.astype(np.float64) @ w + bias))


@pytest.mark.parametrize("op, ref", [(Op.FUSED_RESIDUAL_LN, ln_ref), (Op.FUSED_RESIDUAL_RMS_NORM, rms_ref)])
@pytest.mark.parametrize("has_bias", [False, True])
def test_fused_residual_norms(op, ref, has_bias):
    x, r, bias, g, beta = rand(2, 3, 8), rand(2, 3, 8), rand(8), rand(8), rand(8)
    arrays = [x, r, bias, g, beta] if has_bias else [x, r, g, beta]
    res = _fused(op, {"eps": 1e-5, "has_bias": has_bias}, arrays)
    close(res, ref(x.astype(np.float64) + r + (bias if has_bias else 0), g, beta, 1e-5))


@pytest.mark.parametrize("gate_first", [False, True])
def test_fused_swiglu(gate_first):
    x = rand(2, 3, 8)
    lo, hi = x[..., :4].astype(np.float64), x[..., 4:].astype(np.float64)
    up, gate = (hi, lo) if gate_first else (lo, hi)
    close(_fused(Op.FUSED_SWIGLU, {"gate_first": gate_first}, [x]), ACT["silu"](gate) * up)


def _attention_block_ref(hidden, qkv_w, out_w, mask, heads, hd, qkv_b=None, out_b=None, rope=None):
    qkv = hidden.astype(np.float64) @ qkv_w + (0 if qkv_b is None else qkv_b)
    w = heads * hd
    q, k, v = qkv[..., :w], qkv[..., w:2 * w], qkv[..., 2 * w:]
    if rope is not None:
        q, k = rope_ref(q, *rope, hd, hd), rope_ref(k, *rope, hd, hd)
    att = attn_loop(q, k, v, heads, hd, lambda b, i, j: mask[b, j] > 0.5)
    return att @ out_w + (0 if out_b is None else out_b)


@pytest.mark.parametrize("has_bias", [True, False])
@pytest.mark.parametrize("has_rope", [False, True])
def test_fused_attention_block(has_bias, has_rope):
    heads, hd, hidden = 2, 4, 6
    h, qkv_w, out_w = rand(2, 3, hidden), rand(hidden, 3 * heads * hd, scale=0.5), rand(heads * hd, 5)
    mask = np.array([[1, 1, 0], [1, 1, 1]], np.float32)
    qkv_b, out_b = rand(3 * heads * hd), rand(5)
    tables = _rope_tables(4, hd // 2)
    arrays = [h, qkv_w, out_w, mask] + ([qkv_b, out_b] if has_bias else []) + (list(tables) if has_rope else [])
    res = _fused(Op.FUSED_ATTENTION_BLOCK, {"num_heads": heads, "head_dim": hd, "has_bias": has_bias,
                                            "has_rope": has_rope}, arrays)
    close(res, _attention_block_ref(h, qkv_w, out_w, mask, heads, hd, qkv_b if has_bias else None,
                                    out_b if has_bias else None, tables if has_rope else None))


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh", "relu"])
def test_fused_transformer_layer(act):
    heads, hd, inter = 2, 2, 8
    hid = heads * hd
    hidden = rand(2, 3, hid)
    qkv_w, qkv_b, out_w, out_b = rand(hid, 3 * hid), rand(3 * hid), rand(hid, hid), rand(hid)
    ln1_g, ln1_b, fc1_w, fc1_b = rand(hid), rand(hid), rand(hid, inter), rand(inter)
    fc2_w, fc2_b, ln2_g, ln2_b = rand(inter, hid), rand(hid), rand(hid), rand(hid)
    mask = np.array([[1, 1, 1], [1, 0, 0]], np.float32)
    arrays = [hidden, qkv_w, qkv_b, out_w, out_b, ln1_g, ln1_b, fc1_w, fc1_b, fc2_w, fc2_b, ln2_g, ln2_b, mask]
    res = _fused(Op.FUSED_TRANSFORMER_LAYER, {"num_heads": heads, "head_dim": hd, "intermediate_size": inter,
                                              "eps1": 1e-5, "eps2": 1e-6, "activation": act}, arrays)
    att = _attention_block_ref(hidden, qkv_w, out_w, mask, heads, hd, qkv_b, out_b)
    h1 = ln_ref(att + hidden, ln1_g, ln1_b, 1e-5)
    ffn = ACT[act](h1 @ fc1_w + fc1_b) @ fc2_w + fc2_b
    close(res, ln_ref(ffn + h1, ln2_g, ln2_b, 1e-6), tol=5e-5)


def test_elementwise_region():
    x, y = rand(2, 3), rand(3)
    chain = (("mul", "i0", "i1"), ("gelu_tanh", "s0"), ("add", "s1", "i0"), ("gt", "s2", "i1"),
             ("where", "s3", "s2", "i1"), ("cast:f16", "s4"))
    res = _fused(Op.ELEMENTWISE_REGION, {"chain": chain}, [x, y])
    s2 = ACT["gelu_tanh"](x.astype(np.float64) * y) + x
    assert res.dtype == np.float16
    close(res, np.where(s2 > y, s2, y).astype(np.float16), tol=2e-3)


FUSED_EXAMPLES = {
    Op.FUSED_MATMUL_BIAS_ACT: ({"activation": "gelu"}, [(2, 3, 4), (4, 5), (5,)]),
    Op.FUSED_RESIDUAL_LN: ({"eps": 1e-5, "has_bias": True}, [(2, 4), (2, 4), (4,), (4,), (4,)]),
    Op.FUSED_RESIDUAL_RMS_NORM: ({"eps": 1e-5}, [(2, 4), (2, 4), (4,), (4,)]),
    Op.FUSED_SWIGLU: ({"gate_first": True}, [(2, 3, 8)]),
    Op.FUSED_ATTENTION_BLOCK: ({"num_heads": 2, "head_dim": 2, "has_rope": True},
                               [(2, 3, 4), (4, 12), (4, 4), (2, 3), (12,), (4,), (3, 1), (3, 1)]),
    Op.FUSED_TRANSFORMER_LAYER: ({"num_heads": 1, "head_dim": 4, "intermediate_size": 6, "eps1": 1e-5, "eps2": 1e-5,
                                  "activation": "silu"},
                                 [(1, 2, 4), (4, 12), (12,), (4, 4), (4,), (4,), (4,), (4, 6), (6,), (6, 4), (4,),
                                  (4,), (4,), (1, 2)]),
    Op.ELEMENTWISE_REGION: ({"chain": (("sub", "i0", "i1"), ("exp", "s0"))}, [(2, 3), (1, 3)]),
}


def test_every_fused_op_has_a_decomposition_and_an_example():
    assert set(DECOMPOSITIONS) == set(FUSED) == set(FUSED_EXAMPLES)


@pytest.mark.parametrize("op", sorted(FUSED_EXAMPLES, key=str))
def test_expanding_with_a_builder_gives_a_valid_primitive_graph_with_equal_numbers(op):
    """The `unfuse` path: `expand` with a Builder emits lint-clean primitives computing the same values."""
    attrs, shapes = FUSED_EXAMPLES[op]
    arrays = [rand(*s) for s in shapes]
    if op in (Op.FUSED_ATTENTION_BLOCK, Op.FUSED_TRANSFORMER_LAYER):  # binary keep mask with one padded key
        mi = 3 if op == Op.FUSED_ATTENTION_BLOCK else 13
        arrays[mi] = np.ones(shapes[mi], np.float32)
        arrays[mi][..., -1] = 0
    weights = {f"w{k}": a for k, a in enumerate(arrays)}
    graphs = []
    for fused in (True, False):
        b = Builder(str(op))
        ins = [b.param(f"w{k}", a.shape) for k, a in enumerate(arrays)]
        out = b.emit(op, ins, **attrs) if fused else expand(b, op, normalize_attrs(op, attrs), ins)
        b.output(out)
        graphs.append(lint(b.build()))
    fused_g, prim_g = graphs
    assert not any(n.op in FUSED for n in prim_g) and len(prim_g) > len(fused_g)
    (a,), (c,) = run_reference(fused_g, {}, weights), run_reference(prim_g, {}, weights)
    close(a, c, tol=1e-6)


# -- interpreter behaviour ----------------------------------------------------------------------

def test_missing_and_misshaped_bindings():
    b = Builder()
    x = b.input("x", (2, 3))
    w = b.param("w", (3, 2))
    b.output(b.matmul(x, w))
    g = b.build()
    with pytest.raises(KeyError, match=r"no value for input 'x' \(%0, expected f32\[2, 3\]\)"):
        run_reference(g, {}, {"w": rand(3, 2)})
    with pytest.raises(KeyError, match=r"no value for param 'w'"):
        run_reference(g, {"x": rand(2, 3)})
    with pytest.raises(ValueError, match=r"param 'w': expected shape \[3, 2\], got \[2, 3\]"):
        run_reference(g, {"x": rand(2, 3)}, {"w": rand(2, 3)})


def test_outputs_may_repeat_and_include_intermediates_and_leaves():
    b = Builder()
    x = b.input("x", (2, 3))
    t = b.tanh(x)
    y = b.mul(t, t)
    b.output(y, t, y, x)
    x_val = rand(2, 3)
    y1, t1, y2, x1 = run_reference(b.build(), {"x": x_val})
    close(t1, np.tanh(x_val))
    close(y1, np.tanh(x_val) ** 2)
    assert y1 is y2 and np.array_equal(x1, x_val)


def test_numpy_scalar_attributes_are_normalised():
    b = Builder()
    x = b.input("x", (2, 4))
    y = b.narrow(x, np.int64(1), np.int32(1), np.int64(2))
    c = b.const(np.float32(0.5))
    b.output(b.mul(y, c))
    g = lint(b.build())
    assert type(g[y].attrs["start"]) is int and type(g[c].attrs["value"]) is float
    x_val = rand(2, 4)
    close(run_reference(g, {"x": x_val})[0], x_val[:, 1:3] * 0.5)


@settings(max_examples=40, deadline=None)
@given(random_graphs())
def test_random_graphs_run_finite_with_declared_types(case):
    for o, res in zip(case.graph.outputs, run_case(case), strict=True):
        n = case.graph[o]
        assert res.shape == n.shape and res.dtype == n.dtype.numpy
        assert np.all(np.isfinite(res))


@settings(max_examples=25, deadline=None)
@given(random_transformer_like_graphs())
def test_transformer_like_graphs_run_finite(case):
    g = case.graph
    assert g.find(Op.ATTENTION) and g.find(Op.LAYER_NORM) + g.find(Op.RMS_NORM)
    for res in run_case(case):
        assert np.all(np.isfinite(res))

