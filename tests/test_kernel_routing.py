"""Kernel routing and the packed-weight cache, out of the MLX emitter (`runtime.kernel_routing`,
`runtime.packing`): the emitter asks the routing which pieces run on rlxviz's CPU kernels, and the routing's
`PackedWeights` packs each weight array once. Same kernels chosen as the emitter's own names say."""

from __future__ import annotations

import numpy as np
import pytest

from rlxviz import kernels
from rlxviz.ir.ops import KERNEL_ACTIVATIONS
from rlxviz.kernels.mlx_backend import mx
from rlxviz.runtime.kernel_routing import KERNEL_ACTS, KernelRouting
from rlxviz.runtime.lowering import LoweringOptions, MlxEmitter
from rlxviz.runtime.packing import PackedWeights

rng = np.random.default_rng(5)


def _arr(*shape: int, dtype=mx.float32) -> mx.array:
    return mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


def test_without_kernels_nothing_is_routed():
    for r in (KernelRouting(None, True), MlxEmitter(LoweringOptions(kernels=False)).routing,
              MlxEmitter(LoweringOptions(kernels=True, gemm=True), "gpu").routing):
        x, w, b = _arr(4, 8), _arr(8, 6), _arr(6)
        assert r.module is None and r.isa is None
        assert not r.gemm_applies(x, w, b, "gelu") and not r.bias_act_applies(x, w, b, "gelu")
        assert not r.residual_norm_applies(x, x, None, b, None) and not r.attention_applies(x, x, x)
        with pytest.raises(RuntimeError, match="no kernels loaded"):
            r.packed.get(w)


def test_the_kernel_activations_are_the_specs():
    assert KERNEL_ACTS == {a.value for a in KERNEL_ACTIVATIONS}


@pytest.fixture(scope="module")
def module():
    k = kernels.load()
    if k is None:
        pytest.skip(f"rlxviz CPU kernels not built here: {kernels.status()}")
    return k


@pytest.mark.parametrize("gemm, isa, rows, want", [(True, "avx2", 4096, True), (False, "avx512", 1, False),
                                                   ("auto", "avx512", 512, True), ("auto", "avx512", 513, False),
                                                   ("auto", "avx2", 8, False)])
def test_gemm_is_routed_as_the_option_and_the_isa_say(module, gemm, isa, rows, want):
    r = KernelRouting(module, gemm)
    r.isa = isa
    x, w = _arr(rows, 8), _arr(8, 6)
    assert r.gemm_wanted(x) is want
    assert r.gemm_applies(x, w, _arr(6), "silu") is want
    assert not r.gemm_applies(x, w, _arr(6), "sigmoid")  # an activation the epilogue does not compute
    assert not r.gemm_applies(x.astype(mx.float16), w.astype(mx.float16), None, None)  # float32 only
    assert not r.gemm_applies(x, w, _arr(5), None)  # a bias of the wrong size


def test_the_emitter_reads_and_writes_its_routing(module):
    e = MlxEmitter(LoweringOptions(kernels=True, gemm="auto"), "cpu")
    assert e.cpu_kernels is e.routing.module is module and e.kernels_ran is e.routing.ran
    e.kernels_isa = "avx2"
    assert e.routing.isa == "avx2" and not e.gemm_wanted(_arr(2, 8))
    e.kernels_isa = "avx512"
    assert e.gemm_wanted(_arr(2, 8))
    x, w, b = _arr(3, 8), _arr(8, 6), _arr(6)
    y = e.linear_act(x, w, b, "relu2")
    assert e.kernels_ran == {"gemm+bias+relu2"} and len(e.packing) == 1
    want = np.maximum(np.asarray(x) @ np.asarray(w) + np.asarray(b), 0) ** 2
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-5)


def test_bias_act_and_residual_norm_kernels_are_recorded(module):
    r = KernelRouting(module, False)
    x, w, b = _arr(3, 8), _arr(8, 6), _arr(6)
    assert not r.gemm_applies(x, w, b, "gelu") and r.bias_act_applies(x, w, b, "gelu")
    y = r.bias_act(x, w, b, "relu")
    np.testing.assert_allclose(np.asarray(y), np.maximum(np.asarray(x) @ np.asarray(w) + np.asarray(b), 0),
                               rtol=1e-5, atol=1e-5)
    h, g = _arr(3, 6), _arr(6)
    assert r.residual_norm_applies(h, h, None, g, None) and not r.residual_norm_applies(h, _arr(2, 6), None, g, None)
    r.residual_norm(h, h, None, g, b, 1e-5, "layer_norm")
    assert r.ran == {"bias+relu", "residual+layer_norm"}


def test_each_weight_array_is_packed_once_and_dropped_on_request():
    calls: list[int] = []

    def pack(w: mx.array) -> mx.array:
        calls.append(id(w))
        return w * 2

    p = PackedWeights(pack)
    w1, w2 = _arr(4, 3), _arr(4, 3)
    (out, made) = p.with_evaluated(lambda: p.get(w1) + p.get(w2) + p.get(w1))
    assert made and len(calls) == 2 and len(p) == 2
    np.testing.assert_allclose(np.asarray(out), np.asarray(w1) * 4 + np.asarray(w2) * 2, rtol=1e-6)
    again, made = p.with_evaluated(lambda: p.get(w1))
    assert again is p.arrays()[0] and not made and len(calls) == 2  # nothing new packed
    p.drop([w1])
    assert len(p) == 1 and p.get(w2) is p.arrays()[0] and len(calls) == 2
    p.clear()
    assert len(p) == 0
