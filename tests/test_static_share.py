"""Static values (computed from weights alone) are made once per weight set and shared by the graph versions that
hold the same computation (`runtime.static_share`), never shared between different computations or weight sets."""

import numpy as np

from rlxviz.ir import Builder
from rlxviz.runtime import run_reference
from rlxviz.runtime.executor import MlxExecutor

rng = np.random.default_rng(3)


def randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def concat_graph(name: str, axis: int = 1, extra_relu: bool = False, order: tuple[str, str] = ("wq", "wk")):
    """x [2, 3, 4] @ concat(wq, wk) (a weight-only concat: the executor's static part); `extra_relu` makes another
    version of the same static concat (a different per-call part)."""
    b = Builder(name)
    x = b.input("x", (2, 3, 4) if axis == 1 else (2, 3, 8))
    w = b.concat([b.param(order[0], (4, 4)), b.param(order[1], (4, 4))], axis=axis)
    y = b.matmul(x, w)
    b.output(b.relu(y) if extra_relu else y)
    return b.build()


def static_arrays(ex, g, feeds, weights):
    prog, args = ex.bind(g, feeds, weights)
    return args[len(prog.inputs):]


def test_two_versions_with_the_same_weight_concat_share_one_array_and_keep_their_numbers():
    g1, g2 = concat_graph("v1"), concat_graph("v2", extra_relu=True)
    weights = {"wq": randn(4, 4), "wk": randn(4, 4)}
    feeds = {"x": randn(2, 3, 4)}
    ex = MlxExecutor(device="cpu")
    s1, s2 = static_arrays(ex, g1, feeds, weights), static_arrays(ex, g2, feeds, weights)
    assert len(s1) == len(s2) == 1 and s1[0] is s2[0]  # one concat for both versions
    for g in (g1, g2):
        np.testing.assert_allclose(ex.run(g, feeds, weights)[0], run_reference(g, feeds, weights)[0],
                                   rtol=1e-4, atol=1e-5)


def test_different_static_computations_are_not_shared():
    weights = {"wq": randn(4, 4), "wk": randn(4, 4)}
    ex = MlxExecutor(device="cpu")
    a = static_arrays(ex, concat_graph("a"), {"x": randn(2, 3, 4)}, weights)
    b = static_arrays(ex, concat_graph("b", axis=0), {"x": randn(2, 3, 8)}, weights)  # [8, 4]: another axis
    c = static_arrays(ex, concat_graph("c", order=("wk", "wq")), {"x": randn(2, 3, 4)}, weights)  # swapped operands
    assert a[0] is not b[0] and a[0] is not c[0] and tuple(b[0].shape) == (8, 4)
    np.testing.assert_array_equal(np.array(c[0]), np.concatenate([weights["wk"], weights["wq"]], axis=1))


def test_new_weights_recompute_the_shared_value_and_drop_the_old_one():
    g1, g2 = concat_graph("v1"), concat_graph("v2", extra_relu=True)
    feeds = {"x": randn(2, 3, 4)}
    ex = MlxExecutor(device="cpu")
    old = {"wq": randn(4, 4), "wk": randn(4, 4)}
    static_arrays(ex, g1, feeds, old)
    static_arrays(ex, g2, feeds, old)
    new = dict(old, wk=randn(4, 4))
    s1 = static_arrays(ex, g1, feeds, new)
    np.testing.assert_array_equal(np.array(s1[0]), np.concatenate([new["wq"], new["wk"]], axis=1))
    assert static_arrays(ex, g2, feeds, new)[0] is s1[0]
    np.testing.assert_allclose(ex.run(g2, feeds, new)[0], run_reference(g2, feeds, new)[0], rtol=1e-4, atol=1e-5)
    assert len(ex._shared) == 1  # the old weights' concat is not kept
