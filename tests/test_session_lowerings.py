"""`session.time_lowerings` (one version under several lowerings, paired rounds) and `session.numerics`."""

import numpy as np
import pytest

from rlxviz import session
from rlxviz.ir import Builder
from rlxviz.models import random_weights
from rlxviz.passes import run_passes
from rlxviz.runtime.lowering import LoweringOptions
from rlxviz.session import Lowering, SessionError


def fused_ffn():
    b = Builder("ffn")
    x = b.input("x", (2, 8, 16))
    h = b.gelu(b.linear(x, b.param("w1", (16, 32)), b.param("b1", (32,))))
    b.output(b.layer_norm(b.add(b.linear(h, b.param("w2", (32, 16)), b.param("b2", (16,))), x),
                          b.param("g", (16,)), b.param("bt", (16,))))
    g = run_passes(b.build(), ["fuse_matmul_bias_act", "fuse_residual_ln"]).final
    return g, {"x": np.random.default_rng(0).standard_normal((2, 8, 16)).astype(np.float32)}, random_weights(g, 0)


def test_lowerings_timed_in_paired_rounds_and_read_from_mlx():
    g, feeds, weights = fused_ffn()
    plain = LoweringOptions(kernels=False)
    rows, progs = session.time_lowerings(g, feeds, weights, [Lowering("op by op", plain), Lowering("again", plain),
                                                             Lowering("graph compiled", plain, compile_graph=True)],
                                         warmup=0, repeat=5)
    assert [r.label for r in rows] == ["op by op", "again", "graph compiled"] and [r.index for r in rows] == [0, 1, 2]
    assert all(len(r.samples_ms) == 5 and r.min_ms <= r.median_ms for r in rows)
    assert rows[1].err_unfused == 0.0  # the same lowering twice: the same bits
    assert rows[2].err_unfused < 1e-5  # compiled: the same function, up to rounding
    assert progs[0].compiled < progs[2].compiled  # the whole graph is one more compiled function (MLX's graph)
    v = session.paired_verdict(rows[0], rows[1])
    assert v.rounds == 5 and "too few rounds" in v.words  # a verdict needs 21


def test_time_lowerings_refuses_bad_arguments():
    g, feeds, weights = fused_ffn()
    with pytest.raises(ValueError, match="at least one lowering"):
        session.time_lowerings(g, feeds, weights, [], repeat=3)
    with pytest.raises(SessionError):
        session.time_lowerings(g, feeds, weights, [Lowering("a")], repeat=0)


def test_numerics_measure_fast_erf_and_addmm():
    assert 0 < session.fast_erf_error() < 1e-6  # runtime.fast.erf: ~4e-7 absolute
    f32, bf16 = session.addmm_rounding(dtype="float32"), session.addmm_rounding(dtype="bfloat16")
    assert 0 <= f32.max_diff < 1e-4 and f32.ulps <= 8
    assert bf16.max_diff > f32.max_diff and bf16.ulps <= 8  # bf16 rounds the bias add far more coarsely
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        session.addmm_rounding(dtype="float16")
