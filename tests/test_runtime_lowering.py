"""MLX lowering of every op vs the NumPy reference; BLAS record; fast-math error bounds; executor."""

import warnings

import numpy as np
import pytest
from scipy import special

from rlxviz.ir import Builder, Op, format_node
from rlxviz.ir.fused import DECOMPOSITIONS
from rlxviz.ir.ops import FUSED, LEAF
from rlxviz.kernels.blas import active_blas
from rlxviz.kernels.mlx_backend import mx
from rlxviz.runtime import run_reference
from rlxviz.runtime.executor import MlxExecutor
from rlxviz.runtime.lowering import LOWERINGS, OVERRIDES, LoweringError, LoweringOptions
from rlxviz.runtime.timing import equivalence, time_version

RTOL, ATOL = 1e-4, 1e-5
FAST = MlxExecutor(LoweringOptions(fast_math=True, attention="composed", kernels=False))
OPTION_SETS = {  # MLX's own lowerings (kernels=False), then rlxviz's CPU kernels (the CPU default)
    "fast-composed": FAST,
    "plain-sdpa": MlxExecutor(LoweringOptions(fast_math=False, attention="sdpa", compile_fused=False, kernels=False)),
    "fast-sdpa-graphcompile": MlxExecutor(LoweringOptions(fast_math=True, attention="sdpa", kernels=False),
                                          compile_graph=True),
    "rlxviz-kernels": MlxExecutor(LoweringOptions(kernels=True)),
    "rlxviz-kernels-graphcompile": MlxExecutor(LoweringOptions(kernels=True), compile_graph=True),
}
rng = np.random.default_rng(0)


def randn(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def one_op(op, shapes, attrs=None, dtypes=None):
    """A graph with inputs x0..xn of `shapes` and one `op` node as output."""
    b = Builder(op.value)
    ins = [b.input(f"x{i}", s, (dtypes or {}).get(i, "f32")) for i, s in enumerate(shapes)]
    b.output(b.emit(op, ins, **(attrs or {})))
    return b.build()


def check(graph, feeds, weights=None, executors=None):
    ref = run_reference(graph, feeds, weights)
    for name, ex in (executors or {"fast": FAST}).items():
        diffs = equivalence(graph, feeds, weights, executor=ex, reference_outputs=ref)
        for d in diffs:
            assert d.ok, f"{graph.name} [{name}]: output {d.index} max_abs={d.max_abs:.3g} max_rel={d.max_rel:.3g}"


def test_blas_record_present_and_optimized():
    rec = active_blas()
    assert rec is not None and rec.name
    assert rec.optimized, f"MLX runs on its bundled reference BLAS: {rec.note}"
    assert rec.path and ".so" in rec.path


def test_every_op_has_a_lowering_and_fused_ops_only_their_decomposition():
    """Primitives have an MLX kernel; fused ops have none of their own: they run `ir.fused.expand`,
    except the documented overrides (each tested against the decomposition below)."""
    missing = [op.value for op in Op if op not in LEAF and op not in LOWERINGS and op not in DECOMPOSITIONS]
    assert missing == []
    assert not FUSED & set(LOWERINGS), "a fused op's math must live in ir/fused.py"
    assert FUSED <= set(DECOMPOSITIONS)
    assert set(OVERRIDES) <= FUSED and all(o.doc for o in OVERRIDES.values())


def test_missing_lowering_names_op_and_ir_line(monkeypatch):
    g = one_op(Op.RELU, [(2, 3)])
    node = g[g.outputs[0]]
    monkeypatch.delitem(LOWERINGS, Op.RELU)
    with pytest.raises(LoweringError) as e:
        MlxExecutor().run(g, {"x0": randn(2, 3)})
    assert "'relu'" in str(e.value) and format_node(node) in str(e.value)


BINARY = [Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAX, Op.MIN, Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE]


@pytest.mark.parametrize("op", BINARY, ids=str)
def test_binary_broadcast(op):
    g = one_op(op, [(2, 3, 4), (4,)])
    a, b = randn(2, 3, 4), randn(4)
    if op in (Op.EQ, Op.NE, Op.LE, Op.GE):
        a[0, 0] = b
    check(g, {"x0": a, "x1": b})


def test_pow_where_cast_matmul():
    check(one_op(Op.POW, [(3, 4), ()]), {"x0": np.abs(randn(3, 4)) + 0.1, "x1": np.float32(1.7)})
    check(one_op(Op.WHERE, [(3, 4), (3, 4), (4,)], dtypes={0: "bool"}),
          {"x0": randn(3, 4) > 0, "x1": randn(3, 4), "x2": randn(4)})
    check(one_op(Op.CAST, [(3, 4)], {"dtype": "i32"}), {"x0": randn(3, 4, scale=5)})
    check(one_op(Op.MATMUL, [(2, 5, 8), (8, 3)]), {"x0": randn(2, 5, 8), "x1": randn(8, 3)})
    check(one_op(Op.MATMUL, [(2, 4, 5, 8), (2, 4, 8, 3)]), {"x0": randn(2, 4, 5, 8), "x1": randn(2, 4, 8, 3)})


UNARY = [Op.GELU, Op.GELU_TANH, Op.SILU, Op.RELU, Op.SIGMOID, Op.TANH, Op.EXP, Op.LOG, Op.SQRT, Op.RSQRT,
         Op.NEG, Op.ERF]


@pytest.mark.parametrize("op", UNARY, ids=str)
def test_unary(op):
    x = randn(4, 300, scale=4.0)
    if op in (Op.LOG, Op.SQRT, Op.RSQRT):
        x = np.abs(x) + 0.05
    check(one_op(op, [x.shape]), {"x0": x}, executors=OPTION_SETS)


@pytest.mark.parametrize("op", [Op.REDUCE_SUM, Op.REDUCE_MEAN, Op.REDUCE_MAX], ids=str)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(op, keepdims):
    check(one_op(op, [(2, 3, 5)], {"axes": (0, 2), "keepdims": keepdims}), {"x0": randn(2, 3, 5)})


@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax(axis):
    x = randn(2, 6, 7, scale=5)
    x[0, :, 3:] = np.finfo(np.float32).min  # masked scores
    check(one_op(Op.SOFTMAX, [x.shape], {"axis": axis}), {"x0": x}, executors=OPTION_SETS)


@pytest.mark.parametrize("op", [Op.LAYER_NORM, Op.RMS_NORM], ids=str)
@pytest.mark.parametrize("axis", [-1, 2])
def test_norms(op, axis):
    x = randn(2, 8, 8) + 3
    check(one_op(op, [(2, 8, 8), (8,), (8,)], {"eps": 1e-6, "axis": axis}),
          {"x0": x, "x1": randn(8) + 1, "x2": randn(8)})


def test_movement():
    x = randn(2, 3, 4)
    check(one_op(Op.RESHAPE, [(2, 3, 4)], {"shape": (6, 4)}), {"x0": x})
    check(one_op(Op.TRANSPOSE, [(2, 3, 4)], {"perm": (2, 0, 1)}), {"x0": x})
    check(one_op(Op.NARROW, [(2, 3, 4)], {"axis": 2, "start": 1, "length": 2}), {"x0": x})
    check(one_op(Op.NARROW, [(2, 3, 4)], {"axis": -2, "start": 1, "length": 2}), {"x0": x})
    check(one_op(Op.CONCAT, [(2, 3, 4), (2, 1, 4)], {"axis": 1}), {"x0": x, "x1": randn(2, 1, 4)})
    check(one_op(Op.EXPAND, [(1, 3, 1)], {"shape": (2, 3, 4)}), {"x0": randn(1, 3, 1)})
    check(one_op(Op.GATHER, [(10, 4), (2, 3)], dtypes={1: "i64"}),
          {"x0": randn(10, 4), "x1": rng.integers(0, 10, (2, 3))})


def keep_mask(b, s, valid):
    m = np.zeros((b, s), np.float32)
    for i, n in enumerate(valid):
        m[i, :n] = 1
    return m


ATTN_CASES = {
    "none": (4, 4, None, None),
    "keep-padded": (5, 5, "keep", None),
    "keep-scale": (5, 5, "keep", 0.37),
    "causal-square": (6, 6, "causal", None),
    "causal-q<kv": (3, 7, "causal", None),
    "causal-q>kv": (7, 4, "causal", None),
    "additive": (4, 6, "additive", None),
}


@pytest.mark.parametrize("case", list(ATTN_CASES), ids=str)
def test_attention(case):
    sq, sk, kind, scale = ATTN_CASES[case]
    b, h, d = 3, 2, 8
    shapes = [(b, sq, h * d), (b, sk, h * d), (b, sk, h * d)]
    feeds = {"x0": randn(*shapes[0]), "x1": randn(*shapes[1]), "x2": randn(*shapes[2])}
    if kind == "keep":
        shapes.append((b, sk))
        feeds["x3"] = keep_mask(b, sk, [sk, 2, 1])
    elif kind == "additive":
        shapes.append((b, 1, sq, sk))
        feeds["x3"] = np.where(rng.random((b, 1, sq, sk)) < 0.3, -1e4, randn(b, 1, sq, sk)).astype(np.float32)
    attrs = {"num_heads": h, "head_dim": d, "mask": kind or "none", "scale": scale}
    check(one_op(Op.ATTENTION, shapes, attrs), feeds, executors=OPTION_SETS)


def test_keep_mask_actually_masks():
    """A padded key must not change the result (RLX's raw-mask bug would let it leak)."""
    b, s, h, d = 2, 5, 2, 4
    g = one_op(Op.ATTENTION, [(b, s, h * d)] * 3 + [(b, s)], {"num_heads": h, "head_dim": d, "mask": "keep"})
    feeds = {"x0": randn(b, s, h * d), "x1": randn(b, s, h * d), "x2": randn(b, s, h * d),
             "x3": keep_mask(b, s, [3, 3])}
    for ex in OPTION_SETS.values():
        out1 = ex.run(g, feeds)[0]
        feeds2 = dict(feeds, x2=feeds["x2"].copy())
        feeds2["x2"][:, 3:] = 1e3
        np.testing.assert_allclose(ex.run(g, feeds2)[0], out1, rtol=1e-5, atol=1e-5)


def test_rope():
    b, s, h, d = 2, 5, 2, 8
    cos, sin = randn(16, 4), randn(16, 4)
    for n_rot in (8, 4):
        g = one_op(Op.ROPE, [(b, s, h * d), (16, 4), (16, 4)], {"head_dim": d, "n_rot": n_rot})
        check(g, {"x0": randn(b, s, h * d), "x1": cos, "x2": sin})


# -- fused ops --------------------------------------------------------------------------------------
@pytest.mark.parametrize("act", [None, "gelu", "gelu_tanh", "silu", "relu", "sigmoid", "tanh"])
def test_fused_matmul_bias_act(act):
    g = one_op(Op.FUSED_MATMUL_BIAS_ACT, [(2, 5, 16), (16, 24), (24,)], {"activation": act})
    check(g, {"x0": randn(2, 5, 16), "x1": randn(16, 24, scale=0.5), "x2": randn(24)}, executors=OPTION_SETS)


@pytest.mark.parametrize("op", [Op.FUSED_RESIDUAL_LN, Op.FUSED_RESIDUAL_RMS_NORM], ids=str)
@pytest.mark.parametrize("has_bias", [False, True])
def test_fused_residual_norms(op, has_bias):
    shapes = [(2, 4, 16), (2, 4, 16)] + ([(16,)] if has_bias else []) + [(16,), (16,)]
    feeds = {f"x{i}": randn(*s) for i, s in enumerate(shapes)}
    check(one_op(op, shapes, {"eps": 1e-5, "has_bias": has_bias}), feeds)


@pytest.mark.parametrize("gate_first", [False, True])
def test_fused_swiglu(gate_first):
    check(one_op(Op.FUSED_SWIGLU, [(2, 3, 12)], {"gate_first": gate_first}), {"x0": randn(2, 3, 12, scale=3)})


@pytest.mark.parametrize("has_bias,has_rope", [(True, False), (False, False), (True, True)])
def test_fused_attention_block(has_bias, has_rope):
    b, s, h, d = 3, 6, 2, 8
    hid = h * d
    shapes = [(b, s, hid), (hid, 3 * hid), (hid, hid), (b, s)]
    if has_bias:
        shapes += [(3 * hid,), (hid,)]
    if has_rope:
        shapes += [(s, d // 2), (s, d // 2)]
    feeds = {f"x{i}": randn(*sh, scale=0.5) for i, sh in enumerate(shapes)}
    feeds["x3"] = keep_mask(b, s, [6, 4, 1])
    attrs = {"num_heads": h, "head_dim": d, "has_bias": has_bias, "has_rope": has_rope}
    check(one_op(Op.FUSED_ATTENTION_BLOCK, shapes, attrs), feeds, executors=OPTION_SETS)


def ftl_graph(act, b=2, s=6, h=2, d=8, inter=32):
    hid = h * d
    shapes = [(b, s, hid), (hid, 3 * hid), (3 * hid,), (hid, hid), (hid,), (hid,), (hid,),
              (hid, inter), (inter,), (inter, hid), (hid,), (hid,), (hid,), (b, s)]
    attrs = {"num_heads": h, "head_dim": d, "intermediate_size": inter, "eps1": 1e-12, "eps2": 1e-12,
             "activation": act}
    feeds = {f"x{i}": randn(*sh, scale=0.3) for i, sh in enumerate(shapes)}
    feeds["x5"] += 1
    feeds["x11"] += 1
    feeds["x13"] = keep_mask(b, s, [s, 3][:b])
    return one_op(Op.FUSED_TRANSFORMER_LAYER, shapes, attrs), feeds


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh"])
def test_fused_transformer_layer(act):
    g, feeds = ftl_graph(act)
    check(g, feeds, executors=OPTION_SETS)


def test_elementwise_region():
    chain = (("mul", "i0", "i1"), ("add", "s0", "i2"), ("gelu", "s1"), ("tanh", "s2"), ("sub", "s3", "i0"),
             ("cast:f16", "s4"), ("cast:f32", "s5"))
    g = one_op(Op.ELEMENTWISE_REGION, [(2, 3, 8), (8,), ()], {"chain": chain})
    feeds = {"x0": randn(2, 3, 8), "x1": randn(8), "x2": np.float32(0.5)}
    ref = run_reference(g, feeds)[0]
    for ex in OPTION_SETS.values():
        np.testing.assert_allclose(ex.run(g, feeds)[0], ref, rtol=2e-3, atol=2e-3)  # f16 round trip
    chain32 = chain[:5]
    check(one_op(Op.ELEMENTWISE_REGION, [(2, 3, 8), (8,), ()], {"chain": chain32}), feeds, executors=OPTION_SETS)


# -- fast formulations ---------------------------------------------------------------------------------
def test_fast_math_error_bounds():
    from rlxviz.runtime import fast

    x = np.linspace(-20, 20, 200_001).astype(np.float32)
    xd, xm = x.astype(np.float64), mx.array(x)

    def err(fn, ref):
        return float(np.abs(np.array(fn(xm)).astype(np.float64) - ref).max())

    assert err(fast.erf, special.erf(xd)) < 5e-7
    assert err(fast.tanh, np.tanh(xd)) < 5e-7
    assert err(fast.gelu, 0.5 * xd * (1 + special.erf(xd / np.sqrt(2)))) < 2e-6
    xe = np.linspace(-87, 88, 200_001).astype(np.float32)
    e = np.array(fast.exp(mx.array(xe))).astype(np.float64)
    assert float((np.abs(e - np.exp(xe.astype(np.float64))) / np.exp(xe.astype(np.float64))).max()) < 3e-7


def test_fast_exp_rounding_survives_compile_and_ties():
    """`fast.exp` rounds `x log2 e` by adding and subtracting 1.5 * 2^23: compiled (the CPU lowering's
    `mx.compile`d kernel) it gives the same bits as eager (nothing folds the add/subtract away), and at
    exact ties `x log2 e = n + 1/2` (where round-to-even and floor(v + 0.5) pick different k) the result
    stays within the stated error."""
    from rlxviz.runtime import fast

    ties = (np.arange(-125, 127) + 0.5) / np.log2(np.e)
    x = np.concatenate([np.linspace(-87, 88, 100_001), ties, np.nextafter(ties, 0)]).astype(np.float32)
    x = x[(x > -87.3) & (x < 88.3)]
    eager = np.array(fast.exp(mx.array(x)))
    compiled = np.array(mx.compile(fast.exp)(mx.array(x)))
    np.testing.assert_array_equal(compiled, eager)
    want = np.exp(x.astype(np.float64))
    assert float((np.abs(compiled - want) / want).max()) < 3e-7



def test_fast_exp_nonpositive_is_exp_where_it_applies():
    """`exp_nonpositive` (the softmax's exp, without the upper clamp) gives `exp`'s bits for every x <= 0,
    the clamped tail below -87.33 and -inf included; NaN stays NaN."""
    from rlxviz.runtime import fast

    x = np.concatenate([np.linspace(-120, 0, 200_001), [-np.inf, -0.0]]).astype(np.float32)
    np.testing.assert_array_equal(np.array(fast.exp_nonpositive(mx.array(x))), np.array(fast.exp(mx.array(x))))
    assert np.isnan(np.array(fast.exp_nonpositive(mx.array([np.nan], dtype=mx.float32)))).all()

# -- executor and timing ----------------------------------------------------------------------------------
def mlp_graph():
    b = Builder("mlp")
    x = b.input("x", (2, 4, 8))
    h = b.gelu(b.linear(x, b.param("w1", (8, 16)), b.param("b1", (16,))))
    y = b.linear(h, b.param("w2", (16, 8)), b.param("b2", (8,)))
    b.output(b.layer_norm(b.add(y, x), b.param("g", (8,)), b.param("beta", (8,))), h)
    return b.build()


def test_executor_caches_programs_and_weights_and_whole_graph_compile():
    g = mlp_graph()
    weights = {"w1": randn(8, 16), "b1": randn(16), "w2": randn(16, 8), "b2": randn(8), "g": randn(8), "beta": randn(8)}
    feeds = {"x": randn(2, 4, 8)}
    ex = MlxExecutor(compile_graph=True)
    out = ex.run(g, feeds, weights)
    assert ex.program(g) is ex.program(g)
    w1 = ex.weight("w1", weights["w1"])
    ex.run(g, feeds, weights)
    assert ex.weight("w1", weights["w1"]) is w1
    ref = run_reference(g, feeds, weights)
    for o, r in zip(out, ref, strict=True):
        np.testing.assert_allclose(o, r, rtol=RTOL, atol=ATOL)
    with pytest.raises(KeyError, match="w2"):
        ex.run(g, feeds, {k: v for k, v in weights.items() if k != "w2"})
    rows = ex.profile(g, feeds, weights, repeat=1)
    assert [r["op"] for r in rows] == [n.op.value for n in g.compute_nodes()]


def test_time_version_reports_first_call_and_stats():
    g = mlp_graph()
    weights = {"w1": randn(8, 16), "b1": randn(16), "w2": randn(16, 8), "b2": randn(8), "g": randn(8), "beta": randn(8)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = time_version(g, {"x": randn(2, 4, 8)}, weights, warmup=1, repeat=5, executor=MlxExecutor())
    assert t.first_call_ms > 0 and t.min_ms <= t.median_ms and t.iqr_ms >= 0 and len(t.samples_ms) == 5


def test_weight_only_nodes_are_computed_once():
    b = Builder("qkv")
    x = b.input("x", (2, 3, 4))
    w = b.concat([b.param("wq", (4, 4)), b.param("wk", (4, 4))], axis=1)
    b.output(b.matmul(x, w))
    g = b.build()
    weights = {"wq": randn(4, 4), "wk": randn(4, 4)}
    ex = MlxExecutor()
    out = ex.run(g, {"x": randn(2, 3, 4)}, weights)
    prog = ex.program(g)
    assert prog.n_static == 1 and prog.inputs == ["x"]
    _, args1 = ex.bind(g, {"x": randn(2, 3, 4)}, weights)
    _, args2 = ex.bind(g, {"x": randn(2, 3, 4)}, weights)
    assert args1[1] is args2[1]  # the concatenated weight is cached
    assert out[0].shape == (2, 3, 8)
    new = dict(weights, wk=randn(4, 4))
    feeds = {"x": randn(2, 3, 4)}
    np.testing.assert_allclose(ex.run(g, feeds, new)[0], run_reference(g, feeds, new)[0], rtol=RTOL, atol=ATOL)


# -- overrides: each one against the plain decomposition ------------------------------------------------------
def test_linear_override_matches_emitter_linear():
    """`MlxEmitter.linear` without rlxviz's GEMM (one mx.addmm) vs `Emitter.linear` (matmul, then add) on the
    same arrays; with the GEMM (another summation order than BLAS's) within K * eps * sum |x w| of float64."""
    from rlxviz.ir import Emitter
    from rlxviz.runtime.lowering import EMITTER_OVERRIDES, MlxEmitter

    e = MlxEmitter(LoweringOptions(gemm=False), "cpu")
    x, w, b = mx.array(randn(3, 7, 16)), mx.array(randn(16, 24)), mx.array(randn(24))
    fast_path = np.array(e.linear(x, w, b))
    plain = np.array(Emitter.linear(e, x, w, b))
    np.testing.assert_allclose(fast_path, plain, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.array(e.linear(x, w)), np.array(Emitter.linear(e, x, w)), rtol=0, atol=0)
    assert "addmm" in EMITTER_OVERRIDES["linear"] and "RlxvizGemm" in EMITTER_OVERRIDES["linear"]
    g = MlxEmitter(LoweringOptions(kernels=True, gemm=True), "cpu")
    assert g.cpu_kernels is not None  # the kernels build wherever the tests run (tests/test_kernels.py)
    x64, w64, b64 = (np.array(a, np.float64) for a in (x, w, b))
    bound = 16 * np.finfo(np.float32).eps * (np.abs(x64) @ np.abs(w64) + np.abs(b64))
    assert np.all(np.abs(np.array(g.linear(x, w, b)) - (x64 @ w64 + b64)) <= bound)
    assert np.all(np.abs(plain - (x64 @ w64 + b64)) <= bound)
    assert g.kernels_ran == {"gemm+bias"}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_linear_override_rounds_like_the_unfused_graph_in_low_precision(dtype):
    """In f16/bf16 mx.addmm rounds once (bias added to the f32 accumulator), matmul-then-add twice: one ulp
    apart in ~1/4 of the elements, which fuse_matmul_bias_act turned into 0.86 vs unfused after an f16
    -10000 mask. A fused linear in low precision must give the unfused graph's numbers exactly."""
    from rlxviz.ir import Emitter
    from rlxviz.runtime.lowering import MlxEmitter

    e = MlxEmitter(LoweringOptions(), "cpu")
    dt = getattr(mx, dtype)
    x, w, b = (mx.array(a).astype(dt) for a in (randn(3, 7, 64), randn(64, 48) * 0.1, randn(48)))
    fused = np.array(e.linear(x, w, b).astype(mx.float32))
    plain = np.array(Emitter.linear(e, x, w, b).astype(mx.float32))
    np.testing.assert_array_equal(fused, plain)


def test_compiled_layer_override_matches_decomposition():
    g, feeds = ftl_graph("gelu")
    on = MlxExecutor(LoweringOptions(compile_layers=True, cpu_streams=1), device="cpu")
    off = MlxExecutor(LoweringOptions(compile_layers=False, cpu_streams=1), device="cpu")
    assert OVERRIDES[Op.FUSED_TRANSFORMER_LAYER].applies(on.options)
    assert not OVERRIDES[Op.FUSED_TRANSFORMER_LAYER].applies(off.options)
    np.testing.assert_allclose(on.run(g, feeds)[0], off.run(g, feeds)[0], rtol=1e-5, atol=1e-5)


def test_compiled_region_override_matches_inline_decomposition():
    chain = (("mul", "i0", "i1"), ("add", "s0", "i2"), ("gelu", "s1"), ("sub", "s2", "i0"))
    g = one_op(Op.ELEMENTWISE_REGION, [(2, 3, 8), (8,), ()], {"chain": chain})
    feeds = {"x0": randn(2, 3, 8), "x1": randn(8), "x2": np.float32(0.5)}
    compiled = MlxExecutor(LoweringOptions(regions="compiled"), device="cpu")
    inline = MlxExecutor(LoweringOptions(regions="inline"), device="cpu")
    assert OVERRIDES[Op.ELEMENTWISE_REGION].applies(compiled.options)
    assert not OVERRIDES[Op.ELEMENTWISE_REGION].applies(inline.options)
    np.testing.assert_allclose(compiled.run(g, feeds)[0], inline.run(g, feeds)[0], rtol=1e-6, atol=1e-6)
    check(g, feeds, executors={"inline": inline})


def test_region_with_unlowerable_step_is_named(monkeypatch):
    chain = (("relu", "i0"),)
    g = one_op(Op.ELEMENTWISE_REGION, [(2, 3)], {"chain": chain})
    monkeypatch.delitem(LOWERINGS, Op.RELU)
    with pytest.raises(LoweringError, match="relu"):
        MlxExecutor(LoweringOptions(regions="compiled"), device="cpu").run(g, {"x0": randn(2, 3)})


def test_operands_unpacked_by_role_name():
    """The one declaration of operand order (`ops.operand_roles`) round-trips through pack/unpack and
    rejects a wrong operand count with a message naming the roles."""
    from rlxviz.ir.ops import operand_roles, pack, unpack

    attrs = {"has_bias": True, "has_rope": True}
    roles = operand_roles(Op.FUSED_ATTENTION_BLOCK, attrs, 8)
    assert roles[:4] == ("hidden", "qkv_w", "out_w", "mask") and roles[-2:] == ("rope_cos", "rope_sin")
    by_role = unpack(Op.FUSED_ATTENTION_BLOCK, attrs, list(range(8)))
    assert pack(Op.FUSED_ATTENTION_BLOCK, attrs, by_role) == list(range(8))
    with pytest.raises(ValueError, match="rope_sin"):
        unpack(Op.FUSED_ATTENTION_BLOCK, attrs, list(range(6)))
    ftl = unpack(Op.FUSED_TRANSFORMER_LAYER, {}, list(range(14)))
    assert ftl["mask"] == 13 and ftl["ln1_g"] == 5
    with pytest.raises(KeyError, match="mask"):
        pack(Op.FUSED_TRANSFORMER_LAYER, {}, {k: v for k, v in ftl.items() if k != "mask"})
