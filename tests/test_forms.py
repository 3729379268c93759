"""Recognizers for decomposed forms (issue 10): LayerNorm, RMSNorm and GELU written as primitives.

Each form: the canonical pipeline rewrites it (numbers equal to the unrewritten graph on random AND adversarial
inputs), or a named guard refuses it with a reason naming the node. Case 13c is one of the LayerNorm graphs.
"""

from pathlib import Path

import numpy as np
import pytest

from rlxviz.ir import Builder, Graph, Op, parse_ir
from rlxviz.passes import Pipeline
from rlxviz.runtime import run_reference

CASES = Path(__file__).parent / "data" / "cases"
rng = np.random.default_rng(13)


def feeds_for(g: Graph, x: np.ndarray) -> tuple[dict, dict]:
    (inp,) = g.inputs
    weights = {p.attrs["name"]: rng.standard_normal(p.shape).astype(p.dtype.numpy) for p in g.params}
    return {inp.attrs["name"]: x.astype(inp.dtype.numpy)}, weights


def adversarial(shape: tuple[int, ...]) -> list[np.ndarray]:
    """Random, constant rows (variance 0), a large offset, tiny values, one outlier, mixed signs of 1e3."""
    n = int(np.prod(shape))
    base = rng.standard_normal(shape).astype(np.float32)
    const = np.full(shape, 3.25, np.float32)
    outlier = base.copy().reshape(-1)
    outlier[::max(1, n // 3)] = 1e4
    return [base, const, base + 1e4, base * 1e-4, outlier.reshape(shape), base * 1e3]


def assert_same_numbers(before: Graph, after: Graph, shape: tuple[int, ...], rtol: float = 2e-5) -> None:
    for x in adversarial(shape):
        feeds, weights = feeds_for(before, x)
        want = run_reference(before, feeds, weights)
        got = run_reference(after, feeds, weights)
        for w, g in zip(want, got, strict=True):
            assert np.array_equal(np.isnan(w), np.isnan(g))
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * max(1.0, float(np.nanmax(np.abs(w)))))


def canonicalized(g: Graph, passes=("canonicalize_norm", "canonicalize_gelu", "dead_code_elimination")):
    trace = Pipeline(list(passes)).run(g)
    assert not any(s.error for s in trace.steps), [s.error for s in trace.steps]
    return trace


def layer_norm_graph(*, shape=(2, 3, 8), keepdims=True, square="mul", root="sqrt", eps_first=False,
                     affine="both", gamma_shape=None, axis=-1, dtype="f32", eps_outside=False) -> Graph:
    """LayerNorm as primitives, in the variants exporters emit."""
    b = Builder("ln_forms")
    x = b.input("x", shape, dtype)
    row = (*shape[:-1], 1) if axis == -1 else (1, *shape[1:])

    def stat(v):
        m = b.reduce_mean(v, [axis], keepdims=keepdims)
        return m if keepdims or keepdims is None else b.reshape(m, row)

    mean = stat(x) if keepdims is not False else b.reshape(b.reduce_mean(x, [axis]), row)
    c = b.sub(x, mean)
    sq = b.mul(c, c) if square == "mul" else b.pow(c, b.const(2.0, dtype))
    var = b.reduce_mean(sq, [axis], keepdims=True) if keepdims else b.reshape(b.reduce_mean(sq, [axis]), row)
    eps = b.const(1e-5, dtype)
    if eps_outside:
        normed = b.div(c, b.add(b.sqrt(var), eps))
    else:
        ve = b.add(eps, var) if eps_first else b.add(var, eps)
        normed = b.div(c, b.sqrt(ve)) if root == "sqrt" else b.mul(b.rsqrt(ve), c)
    out = normed
    h = shape[-1]
    if affine in ("both", "gamma"):
        out = b.mul(b.param("ln.weight", gamma_shape or (h,), dtype), out)
    if affine == "both":
        out = b.add(out, b.param("ln.bias", (h,), dtype))
    b.output(out)
    return b.build()


def mean_no_keepdims_graph() -> Graph:
    """keepdims=false means subtracted directly: [4] broadcasts along the last axis (not a LayerNorm)."""
    b = Builder("ln_keepdims0_trap")
    x = b.input("x", (4, 4))
    c = b.sub(x, b.reduce_mean(x, [-1]))
    var = b.reduce_mean(b.mul(c, c), [-1])
    b.output(b.div(c, b.sqrt(b.add(var, b.const(1e-5)))))
    return b.build()


# -- LayerNorm ------------------------------------------------------------------------------------------

def test_case_13c_decomposed_layer_norm_is_recognized():
    g = parse_ir((CASES / "13c-ln-decomposition-keepdims1.rlx").read_text())
    trace = Pipeline.canonical().run(g)
    ln = [n for n in trace.final if n.op == Op.LAYER_NORM]
    assert len(ln) == 1 and ln[0].attrs["eps"] == pytest.approx(1e-5)
    assert [g[i].attrs.get("name") for i in ln[0].inputs] == ["x", "LayerNorm.weight", "LayerNorm.bias"]
    assert not any(n.op in (Op.REDUCE_MEAN, Op.SQRT, Op.DIV) for n in trace.final)
    assert_same_numbers(g, trace.final, (4, 4))


@pytest.mark.parametrize("variant", [
    dict(),
    dict(keepdims=False, square="pow", root="rsqrt", eps_first=True),
    dict(root="rsqrt", affine="none", shape=(5, 16)),
    dict(square="pow", affine="gamma"),
    dict(keepdims=False, affine="none", shape=(3, 1, 4, 6)),
])
def test_layer_norm_forms_rewrite_with_equal_numbers(variant):
    g = layer_norm_graph(**variant)
    after = canonicalized(g).final
    (ln,) = [n for n in after if n.op == Op.LAYER_NORM]
    assert ln.inputs[0] == g.inputs[0].id
    assert {n.op for n in after.compute_nodes()} == {Op.LAYER_NORM}
    assert_same_numbers(g, after, g.inputs[0].shape)


@pytest.mark.parametrize("graph, guard, fragment", [
    (mean_no_keepdims_graph(), "mean_keepdims", "broadcasts along the last axis"),
    (layer_norm_graph(axis=0, shape=(4, 6)), "normalized_axis_last", "reduces axes [0]"),
    (layer_norm_graph(dtype="f16"), "stats_dtype", "is f16"),
    (layer_norm_graph(gamma_shape=(1, 8), shape=(2, 8)), "gamma_shape", "needs rank 1 [8]"),
    (layer_norm_graph(eps_outside=True), "eps_inside_sqrt", "added after the sqrt"),
])
def test_layer_norm_forms_refused_with_reason(graph, guard, fragment):
    trace = canonicalized(graph)
    assert not any(n.op == Op.LAYER_NORM for n in trace.final)
    (rej,) = [r for r in trace.rejections if r.rule == "canonicalize_norm.layer_norm" and r.headline]
    assert rej.guard == guard and fragment in rej.message
    assert_same_numbers(graph, trace.final, graph.inputs[0].shape)  # refused: untouched


# -- RMSNorm --------------------------------------------------------------------------------------------

def rms_norm_graph(*, square="pow", root="rsqrt", gamma="left", keepdims=True, dtype="f32", gamma_shape=None,
                   axis=-1, shape=(2, 3, 8), beta=False, hf_casts=False) -> Graph:
    b = Builder("rms_forms")
    x = b.input("x", shape, dtype)
    if hf_casts:  # LlamaRMSNorm: hidden_states.to(torch.float32) ... self.weight * hidden_states.to(input_dtype)
        x = b.cast(x, "f32")
    sq = b.pow(x, b.const(2.0, dtype)) if square == "pow" else b.mul(x, x)
    ms = b.reduce_mean(sq, [axis], keepdims=keepdims)
    if not keepdims:
        ms = b.reshape(ms, (*shape[:-1], 1))
    ve = b.add(ms, b.const(1e-6, dtype))
    out = b.mul(x, b.rsqrt(ve)) if root == "rsqrt" else b.div(x, b.sqrt(ve))
    if hf_casts:
        out = b.cast(out, dtype)
    if gamma:
        w = b.param("norm.weight", gamma_shape or (shape[-1],), dtype)
        out = b.mul(w, out) if gamma == "left" else b.mul(out, w)
    if beta:
        out = b.add(out, b.param("norm.bias", (shape[-1],), dtype))
    b.output(out)
    return b.build()


@pytest.mark.parametrize("variant", [
    dict(),                                                  # LLaMA: weight * (x * rsqrt(mean(x^2) + eps))
    dict(square="mul", root="sqrt", gamma=None),
    dict(keepdims=False, gamma="right", beta=True, shape=(6, 32)),
    dict(hf_casts=True),                                     # HF LlamaRMSNorm's casts in an f32 model
])
def test_rms_norm_forms_rewrite_with_equal_numbers(variant):
    g = rms_norm_graph(**variant)
    after = canonicalized(g).final
    (rms,) = [n for n in after if n.op == Op.RMS_NORM]
    assert len(rms.inputs) == (3 if variant.get("beta") else 2)
    assert after[rms.inputs[1]].op == (Op.PARAM if variant.get("gamma", "left") else Op.CONST)
    assert {n.op for n in after.compute_nodes()} - {Op.CAST} == {Op.RMS_NORM}
    assert_same_numbers(g, after, g.inputs[0].shape)


@pytest.mark.parametrize("graph, guard", [
    (rms_norm_graph(dtype="f16"), "stats_dtype"),
    (rms_norm_graph(gamma_shape=(1, 1, 8)), "gamma_shape"),
    (rms_norm_graph(axis=1, shape=(2, 8, 8)), "normalized_axis_last"),
])
def test_rms_norm_forms_refused_with_reason(graph, guard):
    trace = canonicalized(graph)
    assert not any(n.op == Op.RMS_NORM for n in trace.final)
    (rej,) = [r for r in trace.rejections if r.rule == "canonicalize_norm.rms_norm" and r.headline]
    assert rej.guard == guard and rej.subject is not None


def test_layer_norm_chain_is_not_taken_for_an_rms_norm_of_the_centered_value():
    trace = canonicalized(layer_norm_graph(dtype="f16"))
    assert {r.rule for r in trace.rejections} == {"canonicalize_norm.layer_norm"}


def test_intermediate_read_elsewhere_blocks_the_rewrite():
    b = Builder("ln_escape")
    x = b.input("x", (2, 8))
    c = b.sub(x, b.reduce_mean(x, [-1], keepdims=True))
    var = b.reduce_mean(b.mul(c, c), [-1], keepdims=True)
    b.output(b.div(c, b.sqrt(b.add(var, b.const(1e-5)))), var)
    trace = canonicalized(b.build())
    (rej,) = trace.rejections
    assert rej.guard == "absorbed_escape" and "variance" in rej.message


# -- GELU ----------------------------------------------------------------------------------------------

def gelu_graph(kind: str, form: int, k: float | None = None) -> Graph:
    b = Builder(f"gelu_{kind}_{form}")
    x = b.input("x", (4, 16))
    if kind == "erf":
        arg = b.div(x, b.const(1.4142135623730951)) if form == 0 else b.mul(b.const(k or 0.7071067811865476), x)
        t = b.erf(arg)
    else:
        c = b.const(k or 0.044715)
        if form == 0:
            inner = b.add(x, b.mul(c, b.pow(x, b.const(3.0))))
        elif form == 1:
            inner = b.add(b.mul(b.mul(x, b.mul(x, x)), c), x)
        else:
            inner = b.mul(x, b.add(b.const(1.0), b.mul(c, b.mul(x, x))))
        t = b.tanh(b.mul(b.const(0.7978845608028654), inner))
    one = b.add(b.const(1.0), t) if form != 1 else b.add(t, b.const(1.0))
    if form == 0:
        out = b.mul(b.mul(b.const(0.5), x), one)
    elif form == 1:
        out = b.mul(b.mul(x, one), b.const(0.5))
    elif form == 3:
        out = b.div(b.mul(one, x), b.const(2.0))
    else:
        out = b.mul(x, b.mul(one, b.const(0.5)))
    b.output(out)
    return b.build()


@pytest.mark.parametrize("kind, form", [("erf", 0), ("erf", 1), ("erf", 2), ("erf", 3), ("tanh", 0), ("tanh", 1),
                                        ("tanh", 2), ("tanh", 3)])
def test_gelu_forms_rewrite_with_equal_numbers(kind, form):
    g = gelu_graph(kind, form)
    after = canonicalized(g).final
    assert [n.op for n in after.compute_nodes()] == [Op.GELU if kind == "erf" else Op.GELU_TANH]
    assert_same_numbers(g, after, (4, 16))


@pytest.mark.parametrize("kind, k, fragment", [("erf", 0.7, "1/sqrt(2) is 0.7"),
                                               ("tanh", 0.0447, "0.044715 is 0.0447")])
def test_gelu_with_wrong_constant_refused(kind, k, fragment):
    trace = canonicalized(gelu_graph(kind, 2 if kind == "tanh" else 1, k))
    (rej,) = trace.rejections
    assert rej.guard == "gelu_constants" and fragment in rej.message
    assert not any(n.op in (Op.GELU, Op.GELU_TANH) for n in trace.final)


def test_decomposed_gelu_reaches_the_matmul_epilogue():
    b = Builder("ffn")
    x = b.input("x", (2, 4, 8))
    h = b.add(b.matmul(x, b.param("fc1.weight", (8, 16))), b.param("fc1.bias", (16,)))
    g1 = b.mul(b.mul(h, b.const(0.5)), b.add(b.const(1.0), b.erf(b.mul(h, b.const(0.7071067811865476)))))
    b.output(b.matmul(g1, b.param("fc2.weight", (16, 8))))
    g = b.build()
    final = Pipeline.canonical().run(g).final
    fused = [n for n in final if n.op == Op.FUSED_MATMUL_BIAS_ACT]
    assert [n.attrs["activation"] for n in fused] == ["gelu"]
    assert_same_numbers(g, final, (2, 4, 8), rtol=1e-4)


def test_remaining_norm_guards_name_their_subject():
    """var_keepdims, beta_shape and eps_scalar near-misses: the guard and the node it is about."""
    b = Builder("var_keepdims0")
    x = b.input("x", (4, 4))
    c = b.sub(x, b.reduce_mean(x, [-1], keepdims=True))
    var = b.reduce_mean(b.mul(c, c), [-1])  # [4] subtracted unreshaped -> broadcasts along the last axis
    b.output(b.div(c, b.sqrt(b.add(var, b.const(1e-5)))))
    g = b.build()
    (rej,) = canonicalized(g).rejections
    assert (rej.guard, rej.subject) == ("var_keepdims", var)

    b2 = Builder("beta_shape")
    x = b2.input("x", (2, 8))
    m = b2.reduce_mean(x, [-1], keepdims=True)
    c = b2.sub(x, m)
    normed = b2.div(c, b2.sqrt(b2.add(b2.reduce_mean(b2.mul(c, c), [-1], keepdims=True), b2.const(-1.0))))
    beta = b2.param("ln.bias", (1, 8))
    b2.output(b2.add(b2.mul(normed, b2.param("ln.weight", (8,))), beta))
    rej = canonicalized(b2.build()).rejections[0]
    assert rej.guard == "eps_scalar" and "-1.0" in rej.message
    b3 = Builder("beta_shape")
    x = b3.input("x", (2, 8))
    c = b3.sub(x, b3.reduce_mean(x, [-1], keepdims=True))
    normed = b3.mul(c, b3.rsqrt(b3.add(b3.reduce_mean(b3.mul(c, c), [-1], keepdims=True), b3.const(1e-5))))
    beta = b3.param("ln.bias", (1, 8))
    b3.output(b3.add(b3.mul(normed, b3.param("ln.weight", (8,))), beta))
    (rej,) = canonicalized(b3.build()).rejections
    assert (rej.guard, rej.subject) == ("beta_shape", beta) and "needs rank 1 [8]" in rej.message


@pytest.mark.parametrize("graph", [layer_norm_graph(), layer_norm_graph(keepdims=False, root="rsqrt"), rms_norm_graph(),
                                   gelu_graph("erf", 0), gelu_graph("tanh", 1)], ids=lambda g: g.name)
def test_mlx_numbers_equal_before_and_after_the_rewrite(graph):
    """On MLX the recognized op (mx.fast.layer_norm / rms_norm, the GELU kernels) gives the primitives' numbers
    on the adversarial inputs too (at a 1e4 offset both are ~5e-4 from float64; NumPy's f32 mean is ~1.4e-3)."""
    from rlxviz.runtime.executor import MlxExecutor
    from rlxviz.runtime.lowering import LoweringOptions

    ex = MlxExecutor(LoweringOptions(fast_math=False))
    after = canonicalized(graph).final
    for x in adversarial(graph.inputs[0].shape):
        feeds, weights = feeds_for(graph, x)
        want = np.asarray(ex.run(graph, feeds, weights)[0])
        got = np.asarray(ex.run(after, feeds, weights)[0])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


# -- tanh GELU as exporters rearrange it (BLOOM, FastGELU, distributed, divided) ------------------------------

K, C = 0.7978845608028654, 0.044715
TANH_ARGS = {  # the tanh's argument as a function of x: every one is sqrt(2/pi) * (x + 0.044715 x^3)
    "bloom": lambda b, x: b.mul(b.mul(x, 0.79788456), b.add(1.0, b.mul(b.mul(x, C), x))),
    "fast_gelu": lambda b, x: b.mul(b.mul(x, 0.7978845608), b.add(1.0, b.mul(b.mul(C, x), x))),
    "x_first": lambda b, x: b.mul(x, b.mul(K, b.add(b.mul(C, b.mul(x, x)), 1.0))),
    "distributed": lambda b, x: b.add(b.mul(K, x), b.mul(K * C, b.pow(x, 3.0))),
    "cube_chain": lambda b, x: b.mul(b.add(x, b.mul(b.mul(b.mul(x, x), x), C)), K),
    "divided": lambda b, x: b.div(b.add(x, b.mul(C, b.pow(x, 3.0))), 1 / K),
    "square_pow": lambda b, x: b.mul(b.mul(K, x), b.add(b.mul(C, b.pow(x, 2.0)), 1.0)),
}
OUTERS = {
    "x_half_first": lambda b, x, t: b.mul(b.mul(x, 0.5), b.add(1.0, b.tanh(t))),
    "half_last": lambda b, x, t: b.mul(b.mul(b.add(b.tanh(t), 1.0), x), 0.5),
    "halved": lambda b, x, t: b.div(b.mul(x, b.add(1.0, b.tanh(t))), 2.0),
    "sigmoid": lambda b, x, t: b.mul(x, b.sigmoid(b.mul(2.0, t))),  # 0.5 (1 + tanh z) == sigmoid(2 z)
    "sigmoid_x_last": lambda b, x, t: b.mul(b.sigmoid(b.mul(t, 2.0)), x),
}


def tanh_gelu_form(arg: str, outer: str = "x_half_first", k_scale: float = 1.0) -> Graph:
    b = Builder(f"gelu_tanh_{arg}_{outer}")
    x = b.input("x", (4, 64))
    h = b.add(b.mul(x, 1.0), 0.0) if arg == "bloom" else x  # a computed x read by every branch, as exported
    t = TANH_ARGS[arg](b, h)
    b.output(OUTERS[outer](b, h, b.mul(t, k_scale) if k_scale != 1.0 else t))
    return b.build()


def _sweep() -> list[np.ndarray]:
    return [np.linspace(-12, 12, 256, dtype=np.float32).reshape(4, 64), rng.standard_normal((4, 64)).astype(np.float32),
            (rng.standard_normal((4, 64)) * 1e3).astype(np.float32)]


@pytest.mark.parametrize("outer", list(OUTERS))
@pytest.mark.parametrize("arg", list(TANH_ARGS))
def test_tanh_gelu_forms_become_gelu_tanh_within_the_stated_bound(arg, outer):
    """Every rearranged tanh-GELU becomes one gelu_tanh; the numbers move only by rounding: within
    5e-7 * max(1, |y|) of the primitives on the reference and on MLX (the bound docs/passes.md states)."""
    from rlxviz.runtime.executor import MlxExecutor
    from rlxviz.runtime.lowering import LoweringOptions

    g = tanh_gelu_form(arg, outer)
    after = canonicalized(g).final
    assert [n.op for n in after.compute_nodes() if n.op not in (Op.ADD, Op.MUL)] == [Op.GELU_TANH], outer
    assert canonicalized(g).rejections == []
    ex = MlxExecutor(LoweringOptions(fast_math=False))
    for x in _sweep():
        for run in (lambda gr, x=x: run_reference(gr, {"x": x}, {})[0],
                    lambda gr, x=x: np.asarray(ex.run(gr, {"x": x}, {})[0])):
            want, got = run(g), run(after)
            assert np.all(np.abs(got - want) <= 5e-7 * np.maximum(1.0, np.abs(want))), (arg, outer)


@pytest.mark.parametrize("arg, outer, named", [("bloom", "x_half_first", "sqrt(2/pi) is 0.877"),
                                               ("distributed", "x_half_first", "sqrt(2/pi) is 0.877"),
                                               ("bloom", "sigmoid", "2*sqrt(2/pi) is 1.75")])
def test_tanh_gelu_with_a_wrong_coefficient_is_refused_naming_it(arg, outer, named):
    trace = canonicalized(tanh_gelu_form(arg, outer, k_scale=1.1))
    (rej,) = trace.rejections
    assert rej.guard == "gelu_constants" and named in rej.message
    assert not any(n.op == Op.GELU_TANH for n in trace.final)


def test_a_tanh_argument_with_another_power_is_not_a_gelu():
    b = Builder("gelu_tanh_quadratic")
    x = b.input("x", (4, 64))
    t = b.tanh(b.mul(K, b.add(x, b.mul(C, b.mul(x, x)))))  # x + c x^2: not the GELU's cubic
    b.output(b.mul(b.mul(x, 0.5), b.add(1.0, t)))
    trace = canonicalized(b.build())
    assert not trace.rejections and not any(n.op == Op.GELU_TANH for n in trace.final)
