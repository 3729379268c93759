"""rlxviz's float32 GEMM kernel (`pack_weights` + `gemm`, rlxviz/kernels/src/gemm.cpp) against a float64 NumPy
reference: odd M / N / K (K not a multiple of the vector width, K over one reduction block, N not a multiple of
a panel, one row), strided and transposed views of x and w, every activation of the epilogue, bias and
residual; threads do not change the numbers; the lowering of fused linears uses it and packs each weight once.

Tolerance: the kernel sums the K products in order with fused multiply-adds, BLAS in its own order; both are
within `K * eps * sum_k |x[m,k] w[k,n]|` of the exact product (Higham, Accuracy and Stability, 3.1). The
bound asserted is that (plus |bias|), times the activation's slope (<= 1.13 for GELU / SiLU) rounded up to 2,
plus the activation formulas' own error (`rlxviz.runtime.fast`: 4.2e-7 absolute for erf) as 1e-6 (1 + |y|).
"""

import numpy as np
import pytest
from scipy import special

from rlxviz import kernels
from rlxviz.ir import Builder, Op
from rlxviz.kernels.mlx_backend import mx
from rlxviz.runtime import run_reference
from rlxviz.runtime.executor import MlxExecutor
from rlxviz.runtime.lowering import LoweringOptions, MlxEmitter

EPS = float(np.finfo(np.float32).eps)
ACTS = {
    "none": lambda v: v,
    "relu": lambda v: np.maximum(v, 0.0),
    "relu2": lambda v: np.maximum(v, 0.0) ** 2,
    "gelu": lambda v: 0.5 * v * (1.0 + special.erf(v / np.sqrt(2.0))),
    "gelu_tanh": lambda v: 0.5 * v * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (v + 0.044715 * v ** 3))),
    "silu": lambda v: v / (1.0 + np.exp(-v)),
}
rng = np.random.default_rng(11)
K_MOD = kernels.load()


def randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def reference(x, w, bias=None, residual=None, act="none"):
    """float64 `act(x @ w + bias) + residual` and the bound its float32 kernel result must meet."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    pre = x64 @ w64 + (0.0 if bias is None else bias.astype(np.float64))
    y = ACTS[act](pre) + (0.0 if residual is None else residual.astype(np.float64))
    k = x.shape[-1]
    mag = np.abs(x64) @ np.abs(w64) + (0.0 if bias is None else np.abs(bias.astype(np.float64)))
    bound = 2.0 * max(k, 1) * EPS * mag + 1e-6 * (1.0 + np.abs(y))
    return y, bound


def check(got, want, bound):
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape
    err = np.abs(got - want)
    assert np.all(err <= bound), f"max err {err.max():.3g}, worst excess {(err - bound).max():.3g}"


def run_gemm(x, w, bias=None, residual=None, act="none"):
    mw = w if isinstance(w, mx.array) else mx.array(w)
    packed = K_MOD.pack_weights(mw)
    return K_MOD.gemm(x if isinstance(x, mx.array) else mx.array(x), packed, mw.shape[1],
                      None if bias is None else mx.array(bias), None if residual is None else mx.array(residual), act)


SHAPES = [(1, 1, 1), (1, 384, 384), (5, 7, 3), (13, 17, 33), (6, 16, 16), (37, 300, 45), (7, 513, 100),
          (130, 1536, 40), (64, 96, 1152), (3, 385, 40)]


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_odd_shapes_with_bias_match_the_reference(m, k, n):
    x, w, b = randn(m, k), randn(k, n), randn(n)
    check(run_gemm(x, w, b), *reference(x, w, b))
    check(run_gemm(x, w), *reference(x, w))


def test_every_row_count_of_a_partial_group_and_rows_cut_from_a_wider_array():
    """M from 1 to two groups and one past: each remainder runs its own micro-kernel (micro_kernel<rows>), and
    x's rows may sit apart (a column slice of a wider array: row stride > K) on the vectorized A packing,
    K = 40 being two 16-column transposes and a tail."""
    mr = K_MOD.gemm_tile()[0]
    k, n = 40, 70  # n: two full panels and a partial one on AVX-512 (32 columns), four and a partial on AVX2
    w, b = randn(k, n), randn(n)
    for m in range(1, 2 * mr + 2):
        wide = randn(m, k + 5)
        check(run_gemm(mx.array(wide)[:, 3:3 + k], w, b, None, "relu"), *reference(wide[:, 3:3 + k], w, b, None,
                                                                                    "relu"))
        x = randn(m, k)
        check(run_gemm(x, w, b), *reference(x, w, b))


@pytest.mark.parametrize("act", sorted(ACTS))
def test_every_activation_and_the_residual_in_the_epilogue(act):
    m, k, n = 29, 70, 37
    x, w, b, r = randn(m, k), randn(k, n) / 8, randn(n), randn(m, n)
    check(run_gemm(x, w, b, None, act), *reference(x, w, b, None, act))
    check(run_gemm(x, w, b, r, act), *reference(x, w, b, r, act))
    check(run_gemm(x, w, None, r, act), *reference(x, w, None, r, act))


def test_a_batch_of_rows_keeps_its_leading_axes():
    x, w, b = randn(3, 11, 40), randn(40, 24), randn(24)
    y = run_gemm(x, w, b, None, "gelu")
    assert tuple(y.shape) == (3, 11, 24)
    check(y, *reference(x, w, b, None, "gelu"))
    v = randn(40)  # one row without a row axis: [K] -> [N]
    check(run_gemm(v, w, b), *reference(v, w, b))


def test_strided_and_transposed_views():
    xt, wt, b = randn(50, 31), randn(45, 50), randn(45)
    x, w = xt.T, wt.T  # x [31, 50] with column stride 31, w [50, 45] with row stride 1
    check(run_gemm(mx.array(xt).T, mx.array(wt).T, b), *reference(x, w, b))
    big = randn(4, 9, 2 * 50)
    sl = mx.array(big)[:, 1::2, ::2]  # leading axes that do not collapse into rows: copied first
    check(run_gemm(sl, w, b, None, "silu"), *reference(big[:, 1::2, ::2], w, b, None, "silu"))
    perm = mx.array(randn(9, 4, 50)).transpose(1, 0, 2)
    check(run_gemm(perm, w, b), *reference(np.array(perm), w, b))
    one = randn(1)  # a bias of size 1 broadcasts over the columns
    check(run_gemm(x, w, one), *reference(x, w, np.broadcast_to(one, (45,))))


def test_threads_do_not_change_the_numbers():
    """Each output's sum runs over the same reduction blocks in the same order whatever the work split."""
    x, w, b = randn(200, 700), randn(700, 300), randn(300)
    before = K_MOD.threads()
    try:
        K_MOD.set_threads(1)
        one = np.array(run_gemm(x, w, b, None, "gelu"))
        K_MOD.set_threads(2)
        two = np.array(run_gemm(x, w, b, None, "gelu"))
    finally:
        K_MOD.set_threads(before)
    assert np.array_equal(one, two)
    check(one, *reference(x, w, b, None, "gelu"))


def test_bad_operands_are_one_clear_error():
    w = mx.array(randn(8, 20))
    packed = K_MOD.pack_weights(w)
    with pytest.raises(ValueError, match=r"\[rlxviz.gemm\] packed must be pack_weights"):
        K_MOD.gemm(mx.array(randn(3, 9)), packed, 20, None, None, "none")
    with pytest.raises(ValueError, match=r"\[rlxviz.gemm\] unknown activation"):
        K_MOD.gemm(mx.array(randn(3, 8)), packed, 20, None, None, "erf")
    with pytest.raises(ValueError, match=r"\[rlxviz.gemm\] residual"):
        K_MOD.gemm(mx.array(randn(3, 8)), packed, 20, None, mx.array(randn(3, 19)), "none")
    with pytest.raises(ValueError, match=r"\[rlxviz.pack_weights\]"):
        K_MOD.pack_weights(mx.array(randn(2, 3, 4)))


# -- the lowering ---------------------------------------------------------------------------------------------
def linear_graph(act, m=2, s=9, k=40, n=72):
    g = Builder(f"mba_{act}")
    x, w, b = g.input("x", (m, s, k)), g.input("w", (k, n)), g.input("b", (n,))
    g.output(g.emit(Op.FUSED_MATMUL_BIAS_ACT, [x, w, b], **({} if act == "none" else {"activation": act})))
    return g.build(), {"x": randn(m, s, k), "w": randn(k, n) / 4, "b": randn(n)}


def test_a_compiled_graph_reads_its_packed_weights_as_constants():
    """`MlxExecutor(compile_graph=True)` traces the walk over the inputs only, with the packed weights made and
    evaluated before the trace: each call's MLX program has the GEMM and no `RlxvizPackWeights` (traced as
    arguments, the weights were packed again on every call: 13-16 ms vs 9.4 for MiniLM B=1)."""
    import io

    g = Builder("mba_params")
    x = g.input("x", (2, 9, 40))
    g.output(g.emit(Op.FUSED_MATMUL_BIAS_ACT, [x, g.param("w", (40, 72)), g.param("b", (72,))], activation="gelu"))
    graph = g.build()
    feeds, weights = {"x": randn(2, 9, 40)}, {"w": randn(40, 72) / 4, "b": randn(72)}
    ex = MlxExecutor(LoweringOptions(kernels=True, gemm=True), compile_graph=True, device="cpu")
    check(ex.run(graph, feeds, weights)[0], *reference(feeds["x"], weights["w"], weights["b"], None, "gelu"))
    prog, args = ex.bind(graph, feeds, weights)
    buf = io.StringIO()
    mx.export_to_dot(buf, *prog.fn(*args))
    assert "RlxvizGemm" in buf.getvalue() and "RlxvizPackWeights" not in buf.getvalue()
    x2 = randn(2, 9, 40)  # the same trace on new inputs
    check(ex.run(graph, {"x": x2}, weights)[0], *reference(x2, weights["w"], weights["b"], None, "gelu"))


@pytest.mark.parametrize("compiled", [False, True])
def test_new_weights_replace_the_old_ones_packed_copies(compiled):
    """Weight set after weight set on one executor: the packed layouts of replaced weights are dropped with
    them (`MlxExecutor.static_values` -> `MlxEmitter.drop_packed`), so one packed copy stays, not one per set;
    each set's result is its own."""
    g = Builder("mba_sets")
    x = g.input("x", (3, 40))
    g.output(g.emit(Op.FUSED_MATMUL_BIAS_ACT, [x, g.param("w", (40, 72)), g.param("b", (72,))], activation="relu"))
    graph, feeds = g.build(), {"x": randn(3, 40)}
    ex = MlxExecutor(LoweringOptions(kernels=True, gemm=True), compile_graph=compiled, device="cpu")
    for _ in range(6):
        weights = {"w": randn(40, 72), "b": randn(72)}
        check(ex.run(graph, feeds, weights)[0], *reference(feeds["x"], weights["w"], weights["b"], None, "relu"))
    assert len(ex.emitter.packed_weights()) == 1


def test_program_primitives_after_a_trace_whose_weight_was_an_input():
    """A compiled program whose GEMM weight is a traced input leaves a placeholder-derived packed weight in the
    emitter's cache; `mlx_primitives` on that executor evaluates only the packed weights its own call made, so it
    still reads the next program (weights as params) instead of failing to evaluate the placeholder."""
    from rlxviz.session.program import mlx_primitives

    ex = MlxExecutor(LoweringOptions(kernels=True, gemm=True), compile_graph=True, device="cpu")
    graph, feeds = linear_graph("gelu")  # w is an input: traced
    check(ex.run(graph, feeds)[0], *reference(feeds["x"], feeds["w"], feeds["b"], None, "gelu"))
    g = Builder("mba_params2")
    x = g.input("x", (2, 9, 40))
    g.output(g.emit(Op.FUSED_MATMUL_BIAS_ACT, [x, g.param("w", (40, 72)), g.param("b", (72,))]))
    counts = mlx_primitives(g.build(), {"x": randn(2, 9, 40)}, {"w": randn(40, 72), "b": randn(72)},
                            executor=ex, bytes=False).counts()
    assert counts.get("RlxvizGemm") == 1 and "RlxvizPackWeights" not in counts


POOL_STRESS = """
import hashlib, numpy as np
from rlxviz import kernels
from rlxviz.kernels.mlx_backend import mx
k = kernels.load()
k.set_threads(4)  # more workers than this machine may have cores: spinning ones must still let others run
rng = np.random.default_rng(5)
x, w, b = (mx.array(rng.standard_normal(s).astype(np.float32)) for s in ((37, 70), (70, 90), (90,)))
q, kk, v = (mx.array(rng.standard_normal((1, 19, 24)).astype(np.float32)) for _ in range(3))
p = k.pack_weights(w)
h = hashlib.sha256()
for i in range(300):  # back-to-back jobs, each smaller than a wake-up: the spin and the blocking path both run
    y = k.gemm(x * (1 + i % 3), p, 90, b, None, "gelu")
    a = k.attention(q, kk, v, None, 3, 3, 8, 0.35)
    mx.eval(y, a)
    h.update(np.array(y).tobytes()); h.update(np.array(a).tobytes())
print(h.hexdigest())
"""


def test_the_pool_gives_the_same_numbers_whether_its_waits_spin_or_block():
    """rlxviz/kernels/src/pool.h: workers and the caller poll for RLXVIZ_POOL_SPIN_US (default 50 us) before
    blocking. With no spin (every wait blocks), a value that is not an integer (no spin either), the default,
    and the longest spin allowed (100 ms: the waits between back-to-back jobs never block), 4 workers on this
    machine's cores run 600 jobs to the same bits and none hangs."""
    import os
    import subprocess
    import sys

    digests = set()
    for spin in ("0", "50us", "", "99999999999999999999"):  # the last one is clamped to 100000
        env = {**os.environ, "RLXVIZ_POOL_SPIN_US": spin}
        out = subprocess.run([sys.executable, "-c", POOL_STRESS], env=env, capture_output=True, text=True,
                             timeout=120, check=True)
        digests.add(out.stdout.strip().splitlines()[-1])
    assert len(digests) == 1


@pytest.mark.parametrize("act", sorted(ACTS))
def test_fused_matmul_bias_act_lowers_to_the_gemm(act):
    graph, feeds = linear_graph(act)
    want, bound = reference(feeds["x"], feeds["w"], feeds["b"], None, act)
    np.testing.assert_allclose(run_reference(graph, feeds)[0], want, atol=1e-5, rtol=1e-5)
    ex = MlxExecutor(LoweringOptions(kernels=True, gemm=True), device="cpu")
    check(ex.run(graph, feeds)[0], want, bound)
    assert ex.emitter.kernels_ran == {"gemm+bias" + ("" if act == "none" else f"+{act}")}
    off = MlxExecutor(LoweringOptions(kernels=True, gemm=False), device="cpu")
    check(off.run(graph, feeds)[0], want, bound)
    assert not any(k.startswith("gemm") for k in off.emitter.kernels_ran)


def test_the_gemm_is_auto_on_the_cpu_and_never_on_the_gpu():
    """CPU default "auto" (lowering.DEVICE_LOWERING): rlxviz's GEMM where the kernels target AVX-512 and the
    layer has at most GEMM_AUTO_MAX_ROWS rows, OpenBLAS above that and on other ISAs; True / False force it."""
    from rlxviz.runtime.lowering import GEMM_AUTO_MAX_ROWS

    assert LoweringOptions().for_device("cpu").gemm == "auto"
    assert LoweringOptions().for_device("gpu").gemm is False
    assert MlxEmitter(LoweringOptions(kernels=True, gemm=True), "gpu").cpu_kernels is None  # CPU code only
    for bad in ("yes", 1, 0.0):  # only the bools and "auto" (1 == True, but it is not a choice)
        with pytest.raises(ValueError, match="gemm must be"):
            LoweringOptions(gemm=bad).for_device("cpu")
    graph, feeds = linear_graph("gelu")  # x [2, 9, 40]: 18 rows
    for isa, ran in (("avx512", {"gemm+bias+gelu"}), ("avx2", {"bias+gelu"})):
        ex = MlxExecutor(LoweringOptions(kernels=True), device="cpu")
        ex.emitter.kernels_isa = isa
        check(ex.run(graph, feeds)[0], *reference(feeds["x"], feeds["w"], feeds["b"], None, "gelu"))
        assert ex.emitter.kernels_ran == ran, isa
    e = MlxEmitter(LoweringOptions(kernels=True), "cpu")
    e.kernels_isa = "avx512"
    at, over = mx.zeros((2, GEMM_AUTO_MAX_ROWS // 2, 8)), mx.zeros((GEMM_AUTO_MAX_ROWS + 1, 8))
    assert e.gemm_wanted(at) and not e.gemm_wanted(over)
    for forced in (True, False):
        f = MlxEmitter(LoweringOptions(kernels=True, gemm=forced), "cpu")
        f.kernels_isa = "avx2"
        assert f.gemm_wanted(over) is forced and f.gemm_wanted(at) is forced


def test_each_weight_is_packed_once_per_executor():
    graph, feeds = linear_graph("gelu")
    weights_as_params = Builder("mba_params")
    x = weights_as_params.input("x", (2, 9, 40))
    w, b = weights_as_params.param("w", (40, 72)), weights_as_params.param("b", (72,))
    weights_as_params.output(weights_as_params.emit(Op.FUSED_MATMUL_BIAS_ACT, [x, w, b], activation="gelu"))
    g = weights_as_params.build()
    ex = MlxExecutor(LoweringOptions(kernels=True, gemm=True), device="cpu")
    first = ex.run(g, {"x": feeds["x"]}, {"w": feeds["w"], "b": feeds["b"]})[0]
    assert len(ex.emitter._packed) == 1
    (w_mx, packed), = ex.emitter._packed._items.values()
    again = ex.run(g, {"x": feeds["x"] * 2}, {"w": feeds["w"], "b": feeds["b"]})[0]
    assert len(ex.emitter._packed) == 1 and ex.emitter._packed.get(w_mx) is packed
    check(first, *reference(feeds["x"], feeds["w"], feeds["b"], None, "gelu"))
    check(again, *reference(feeds["x"] * 2, feeds["w"], feeds["b"], None, "gelu"))
    ex.clear()
    assert len(ex.emitter._packed) == 0
