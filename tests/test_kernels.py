"""rlxviz's CPU kernels (rlxviz.kernels): built here, each kernel against the NumPy reference (odd sizes,
seq 1, several key tiles, grouped-query heads, every mask form, fully masked rows, strided views), the
lowering that uses them, and the fallback when there is no toolchain, the build fails or RLXVIZ_KERNELS=0."""

import os
import stat

import numpy as np
import pytest
from clirun import run as cli_run
from scipy import special

from rlxviz import kernels
from rlxviz.ir import Builder, DType, Op
from rlxviz.kernels.build import build_kernels
from rlxviz.kernels.mlx_backend import mx
from rlxviz.runtime import run_reference
from rlxviz.runtime.executor import MlxExecutor
from rlxviz.runtime.lowering import LoweringOptions
from rlxviz.runtime.precision import TABLE

TOL = TABLE[DType.f32, "cpu"][1]  # fused vs unfused on one backend, f32: what a kernel may differ by
KERNELS = MlxExecutor(LoweringOptions(kernels=True))
MLX_ONLY = MlxExecutor(LoweringOptions(kernels=False))
rng = np.random.default_rng(7)
LOW = float(np.finfo(np.float32).min)


def randn(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def close(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    assert np.array_equal(np.isnan(got), np.isnan(want)), "NaN where the reference has none (or the reverse)"
    ok = ~np.isnan(want)
    err = np.abs(got[ok] - want[ok])
    assert np.all(err <= TOL.atol + TOL.rtol * np.abs(want[ok])), f"max err {err.max():.3g} > {TOL}"


def test_kernels_are_built_on_this_machine():
    """CI runs on a machine with a compiler and cmake: the built path is the one exercised."""
    st = kernels.status()
    assert st.available, str(st)
    assert st.isa in ("avx512", "avx2", "neon", "baseline") and st.threads >= 1
    assert str(st).startswith("rlxviz CPU kernels: ") and st.path and os.path.exists(st.path)


# -- attention ----------------------------------------------------------------------------------------------
def attention_graph(b, sq, sk, h, d, kind, kv=None, mask_shape=None, fill=None, scale=None):
    kv = kv or h
    g = Builder("attention")
    ins = [g.input("q", (b, sq, h * d)), g.input("k", (b, sk, kv * d)), g.input("v", (b, sk, kv * d))]
    if kind != "none":
        if kind == "keep":
            ins.append(g.input("mask", (b, sk)))
        elif kind == "additive":
            ins.append(g.input("mask", mask_shape))
    attrs = {"num_heads": h, "head_dim": d, "mask": kind, "scale": scale, "mask_fill": fill,
             "num_kv_heads": None if kv == h else kv}
    g.output(g.emit(Op.ATTENTION, ins, **attrs))
    return g.build()


CASES = {  # b, sq, sk, heads, head_dim, kind, kv heads, additive mask shape
    "minilm-like": (2, 16, 16, 3, 32, "keep", None, None),
    "odd-head-dim": (2, 9, 11, 2, 7, "keep", None, None),
    "head-dim-33": (1, 5, 19, 2, 33, "none", None, None),
    "head-dim-1": (2, 4, 4, 3, 1, "keep", None, None),
    "seq-1": (3, 1, 1, 2, 8, "keep", None, None),
    "one-key": (2, 6, 1, 2, 8, "none", None, None),
    "three-key-tiles": (1, 37, 300, 2, 16, "keep", None, None),
    "gqa": (2, 7, 7, 4, 8, "keep", 2, None),
    "gqa-one-kv-head": (1, 5, 9, 6, 4, "causal", 1, None),
    "causal-square": (2, 13, 13, 2, 8, "causal", None, None),
    "causal-q<kv": (1, 3, 20, 2, 8, "causal", None, None),
    "causal-q>kv": (1, 20, 3, 2, 8, "causal", None, None),
    "additive-[B,1,Sq,Sk]": (2, 6, 9, 2, 8, "additive", None, (2, 1, 6, 9)),
    "additive-[1,H,Sq,Sk]": (2, 6, 9, 2, 8, "additive", None, (1, 2, 6, 9)),
    "additive-[Sq,Sk]": (2, 6, 9, 2, 8, "additive", None, (6, 9)),
}


def attention_feeds(b, sq, sk, h, d, kind, kv, mask_shape):
    kv = kv or h
    feeds = {"q": randn(b, sq, h * d), "k": randn(b, sk, kv * d), "v": randn(b, sk, kv * d)}
    if kind == "keep":
        m = (rng.random((b, sk)) < 0.7).astype(np.float32)
        m[0, :] = 0  # a fully masked row
        m[-1, :] = 1
        feeds["mask"] = m
    elif kind == "additive":
        feeds["mask"] = np.where(rng.random(mask_shape) < 0.3, -1e4, randn(*mask_shape)).astype(np.float32)
    return feeds


@pytest.mark.parametrize("case", list(CASES))
def test_attention_kernel_matches_reference(case):
    b, sq, sk, h, d, kind, kv, mask_shape = CASES[case]
    g = attention_graph(b, sq, sk, h, d, kind, kv, mask_shape)
    feeds = attention_feeds(b, sq, sk, h, d, kind, kv, mask_shape)
    KERNELS.emitter.kernels_ran.clear()
    close(KERNELS.run(g, feeds)[0], run_reference(g, feeds)[0])
    assert KERNELS.emitter.kernels_ran == {"attention"}


@pytest.mark.parametrize("fill", [-10000.0, LOW])
def test_attention_kernel_hf_mask_fill_and_fully_masked_rows(fill):
    """HF's `(1 - mask) * fill` form: an all-zero mask row is a constant shift (the reference's numbers), and a
    fully masked row of the binary form is the uniform average of V, as in the reference."""
    b, s, h, d = 3, 10, 2, 8
    feeds = attention_feeds(b, s, s, h, d, "keep", None, None)
    feeds["mask"][1, :] = 0
    for f in (fill, None):
        g = attention_graph(b, s, s, h, d, "keep", fill=f, scale=0.3)
        out, want = KERNELS.run(g, feeds)[0], run_reference(g, feeds)[0]
        close(out, want)
    uniform = feeds["v"].reshape(b, s, h, d).mean(axis=1).reshape(b, 1, h * d)
    np.testing.assert_allclose(out[0], np.broadcast_to(uniform[0], (s, h * d)), rtol=1e-5, atol=1e-6)


def test_attention_kernel_rows_of_minus_inf_are_nan_like_the_reference():
    b, sq, sk, h, d = 1, 4, 5, 2, 4
    mask = randn(b, 1, sq, sk)
    mask[0, 0, 2, :] = -np.inf
    g = attention_graph(b, sq, sk, h, d, "additive", mask_shape=mask.shape)
    feeds = {"q": randn(b, sq, h * d), "k": randn(b, sk, h * d), "v": randn(b, sk, h * d), "mask": mask}
    want = run_reference(g, feeds)[0]
    assert np.isnan(want[0, 2]).all() and not np.isnan(np.delete(want[0], 2, axis=0)).any()
    close(KERNELS.run(g, feeds)[0], want)


def test_attention_kernel_on_strided_views_and_one_thread_is_the_same():
    """Q, K, V as views of one packed QKV (what FusedAttentionBlock hands it) and a transposed bias; one thread
    gives the same bits as all of them (work items are independent)."""
    k = kernels.load()
    b, s, h, d = 2, 21, 3, 12
    qkv = mx.array(randn(b, s, 3 * h * d))
    q, kk, v = qkv[..., : h * d], qkv[..., h * d: 2 * h * d], qkv[..., 2 * h * d:]
    bias = mx.array(randn(b, h, s, s)).transpose(0, 1, 3, 2)
    out = np.array(k.attention(q, kk, v, bias, h, h, d, 0.25))
    qn, kn, vn = (np.array(x).reshape(b, s, h, d).transpose(0, 2, 1, 3) for x in (q, kk, v))
    p = special.softmax(qn @ kn.transpose(0, 1, 3, 2) * 0.25 + np.array(bias), axis=-1)
    close(out, (p @ vn).transpose(0, 2, 1, 3).reshape(b, s, h * d))
    n = k.threads()
    try:
        k.set_threads(1)
        one = np.array(k.attention(q, kk, v, bias, h, h, d, 0.25))
    finally:
        k.set_threads(n)
    assert np.array_equal(one, out)


def test_attention_kernel_refuses_what_it_cannot_run():
    k = kernels.load()
    q = mx.zeros((1, 3, 8))
    with pytest.raises(ValueError, match="heads"):
        k.attention(q, q, q, None, 3, 2, 4, 1.0)
    with pytest.raises(ValueError, match="float32"):
        k.attention(q.astype(mx.float16), q.astype(mx.float16), q.astype(mx.float16), None, 2, 2, 4, 1.0)


# -- bias + activation, softmax ---------------------------------------------------------------------------------
ACTS = {
    "gelu": lambda z: 0.5 * z * (1 + special.erf(z / np.sqrt(2))),
    "gelu_tanh": lambda z: 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3))),
    "silu": lambda z: z * special.expit(z),
    "relu": lambda z: np.maximum(z, 0),
    "relu2": lambda z: np.maximum(z, 0) ** 2,
    "none": lambda z: z,
}


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 5, 33), (4, 1537)], ids=str)
def test_bias_act_kernel_matches_reference(act, shape):
    k = kernels.load()
    x, b = randn(*shape, scale=4), randn(shape[-1])
    x.flat[0] = np.nan
    want = ACTS[act](x.astype(np.float64) + b)
    close(k.bias_act(mx.array(x), mx.array(b), act), want)
    close(k.bias_act(mx.array(x), None, act), ACTS[act](x.astype(np.float64)))
    close(k.bias_act(mx.array(x), mx.array(b[:1]), act), ACTS[act](x.astype(np.float64) + b[0]))


def test_bias_act_kernel_on_a_transposed_view():
    k = kernels.load()
    x, b = randn(17, 9), randn(17)
    close(k.bias_act(mx.array(x).T, mx.array(b), "gelu"), ACTS["gelu"](x.T.astype(np.float64) + b))
    with pytest.raises(ValueError, match="activation"):
        k.bias_act(mx.array(x), None, "swish")


@pytest.mark.parametrize("n", [1, 5, 128, 301])
def test_softmax_kernel_matches_reference(n):
    k = kernels.load()
    x = randn(6, n, scale=5)
    x[1] = LOW  # a fully masked row: uniform
    x[2, 0] = np.nan  # NaN row, as scipy's
    want = special.softmax(x.astype(np.float64), axis=-1)
    want[2] = np.nan
    close(k.softmax(mx.array(x)), want)
    y = randn(n, 4)
    close(k.softmax(mx.array(y).T), special.softmax(y.T.astype(np.float64), axis=-1))


@pytest.mark.parametrize("op", [Op.FUSED_RESIDUAL_LN, Op.FUSED_RESIDUAL_RMS_NORM], ids=str)
@pytest.mark.parametrize("has_bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 3, 7), (2, 5, 384), (3, 1, 1537)], ids=str)
def test_residual_norm_kernel_matches_reference(op, has_bias, shape):
    n = shape[-1]
    shapes = [shape, shape] + ([(n,)] if has_bias else []) + [(n,), (n,)]
    g = Builder("residual_norm")
    ins = [g.input(f"x{i}", s) for i, s in enumerate(shapes)]
    g.output(g.emit(op, ins, eps=1e-5, has_bias=has_bias))
    g = g.build()
    feeds = {f"x{i}": randn(*s, scale=3) + 1 for i, s in enumerate(shapes)}
    KERNELS.emitter.kernels_ran.clear()
    close(KERNELS.run(g, feeds)[0], run_reference(g, feeds)[0])
    kind = "layer_norm" if op == Op.FUSED_RESIDUAL_LN else "rms_norm"
    assert KERNELS.emitter.kernels_ran == {f"residual+{kind}"}


def test_residual_norm_kernel_on_views_and_without_beta():
    k = kernels.load()
    x, r, gamma = randn(9, 5), randn(5, 9), randn(9)
    s = x.T.astype(np.float64) + r
    y = np.array(k.residual_norm(mx.array(x).T, mx.array(r), None, mx.array(gamma), None, 1e-6, True))
    close(y, s / np.sqrt(np.mean(s * s, -1, keepdims=True) + 1e-6) * gamma)
    with pytest.raises(ValueError, match="one shape"):
        k.residual_norm(mx.array(x), mx.array(r), None, mx.array(gamma), None, 1e-6, False)


# -- the lowering that uses them --------------------------------------------------------------------------------
def ftl_feeds(b=2, s=6, h=2, d=8, inter=32):
    hid = h * d
    shapes = [(b, s, hid), (hid, 3 * hid), (3 * hid,), (hid, hid), (hid,), (hid,), (hid,),
              (hid, inter), (inter,), (inter, hid), (hid,), (hid,), (hid,), (b, s)]
    feeds = {f"x{i}": randn(*sh, scale=0.3) for i, sh in enumerate(shapes)}
    feeds["x13"] = np.ones((b, s), np.float32)
    feeds["x13"][1, 3:] = 0
    g = Builder("ftl")
    ins = [g.input(f"x{i}", sh) for i, sh in enumerate(shapes)]
    g.output(g.emit(Op.FUSED_TRANSFORMER_LAYER, ins, num_heads=h, head_dim=d, intermediate_size=inter,
                    eps1=1e-12, eps2=1e-12, activation="gelu"))
    return g.build(), feeds


def test_fused_layer_runs_the_kernels_and_its_unfused_form_only_attention():
    """FusedTransformerLayer: attention, the GEMM (QKV and output projection with their bias, FFN with bias +
    GELU in its store; `gemm=True`) and residual+LayerNorm kernels; with `gemm=False` MLX's matmul and the
    bias+GELU kernel.
    Unfused (the `unfuse` pass: primitives plus the ATTENTION node, fuse_sdpa's op) only the attention kernel:
    matmul, add, GELU and LayerNorm stay MLX's. Off: none."""
    from rlxviz.passes import PASSES

    fused, feeds = ftl_feeds()
    want = run_reference(fused, feeds)[0]
    unfused = PASSES["unfuse"].fn(fused, {}).graph
    assert Op.FUSED_TRANSFORMER_LAYER not in {n.op for n in unfused}
    for graph, options, ran in ((fused, {"gemm": True}, {"attention", "gemm+bias", "gemm+bias+gelu",
                                                          "residual+layer_norm"}),
                                (fused, {"gemm": False}, {"attention", "bias+gelu", "residual+layer_norm"}),
                                (unfused, {}, {"attention"}),
                                (fused, {"kernels": False}, set())):
        ex = MlxExecutor(LoweringOptions(**options))
        close(ex.run(graph, feeds)[0], want)
        assert ex.emitter.kernels_ran == ran, (graph.name, options)
    assert MlxExecutor(LoweringOptions(kernels=False)).emitter.cpu_kernels is None


def test_kernels_never_lower_on_the_gpu_or_in_f16():
    assert LoweringOptions().for_device("gpu").kernels is False
    fused, feeds = ftl_feeds()
    layer = fused.compute_nodes()[0]
    g = Builder("ftl16")  # the same layer in f16: the kernels take float32 only, so MLX's lowering runs
    ins = [g.input(n.name, n.shape, "f16") for n in fused.inputs]
    g.output(g.emit(Op.FUSED_TRANSFORMER_LAYER, ins, **layer.attrs))
    ex = MlxExecutor(LoweringOptions(kernels=True))
    out = ex.run(g.build(), {k: v.astype(np.float16) for k, v in feeds.items()})[0]
    assert np.isfinite(out).all()
    assert ex.emitter.kernels_ran == set()


# -- the fallback -------------------------------------------------------------------------------------------------
def test_no_toolchain_is_one_reason_and_no_module(tmp_path):
    st, module = build_kernels(root=tmp_path, path=str(tmp_path / "empty"), quiet=True)
    assert module is None and not st.available and st.reason == "no cmake on PATH"
    assert "not available (no cmake on PATH)" in str(st) and "composed lowering" in str(st)


def test_env_switch_turns_them_off(monkeypatch, tmp_path):
    monkeypatch.setenv("RLXVIZ_KERNELS", "0")
    st, module = build_kernels(root=tmp_path, quiet=True)
    assert module is None and st.state == "off" and "off (RLXVIZ_KERNELS=0)" in str(st)
    assert not any(tmp_path.iterdir())  # nothing built, nothing cached


def _tool(folder, name, body):
    p = folder / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)


def test_a_failed_build_falls_back_and_is_remembered(tmp_path):
    """A cmake that fails: the status names the failure and the log; the second process does not retry."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir, "cmake", f'echo configure >> "{tmp_path}/calls"; echo "CMake Error: no" >&2; exit 1')
    _tool(bin_dir, "c++", "echo 'fake c++ 1.0'")
    _tool(bin_dir, "ninja", "exit 0")
    st, module = build_kernels(root=tmp_path / "cache", path=str(bin_dir), quiet=True)
    assert module is None and st.state == "unavailable" and st.reason.startswith("build failed: cmake exited 1")
    assert st.reason.endswith("to retry")
    log = st.reason.split("(log ")[1].split(")")[0]
    assert "CMake Error: no" in open(log).read()
    again, _ = build_kernels(root=tmp_path / "cache", path=str(bin_dir), quiet=True)
    assert again.reason == st.reason
    assert (tmp_path / "calls").read_text().count("configure") == 1


def test_time_header_says_which_kernels_ran_and_when_they_are_off(capsys, monkeypatch):
    code, out, err = cli_run(capsys, "time", "bert-tiny", "--seq", "8", "--repeat", "1", "--warmup", "0")
    assert code == 0, err
    assert "rlxviz CPU kernels: " in out and "ran attention" in out
    off = (kernels.KernelStatus("off", "RLXVIZ_KERNELS=0"), None)
    monkeypatch.setattr(kernels, "_LOADED", off)
    code, out, err = cli_run(capsys, "time", "bert-tiny", "--seq", "8", "--repeat", "1", "--warmup", "0")
    assert code == 0, err
    assert "rlxviz CPU kernels: off (RLXVIZ_KERNELS=0); fused ops run MLX's composed lowering" in out
