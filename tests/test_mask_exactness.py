"""`fuse_sdpa` keeps Hugging Face's additive mask exact: every version equals the unfused graph for
every mask, an all-zero row included (case 05 and other inputs of the same kind)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlxviz.ir import Op, parse_ir
from rlxviz.passes import Pipeline
from rlxviz.runtime import run_reference

CASE05 = Path(__file__).parent / "data" / "cases" / "05-fully-masked-row.rlx"
MASK05 = np.array([[1, 1, 1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0]], np.int64)


def _weights(graph, seed=0):
    rng = np.random.default_rng(seed)
    return {n.attrs["name"]: (rng.standard_normal(n.shape) / np.sqrt(n.shape[0])).astype(np.float32)
            for n in graph if n.op == Op.PARAM}


def _case(fill="-10000.0", dtype="f32", swap_mul=False):
    text = CASE05.read_text().replace("{value=-10000.0}", "{value=" + fill + "}")
    if swap_mul:
        text = text.replace("mul(%4, %5)", "mul(%5, %4)")
    text = text.replace("f32[", dtype + "[").replace('dtype="f32"', f'dtype="{dtype}"')
    return parse_ir(text)


def _feeds(graph, mask, seed=1):
    rng = np.random.default_rng(seed)
    return {"hidden": rng.standard_normal(graph.inputs[0].shape).astype(np.float32), "attention_mask": mask}


def _versions(graph):
    return Pipeline.canonical().run(graph).versions()


def test_case05_every_version_equals_unfused_with_an_all_zero_row():
    g = _case()
    versions = _versions(g)
    ops = {n.op for n in versions[-1][1]}
    assert Op.FUSED_ATTENTION_BLOCK in ops  # the rewrite still happens
    fused = next(n for n in dict(versions)["after fuse_sdpa"] if n.op == Op.ATTENTION)
    assert fused.attrs["mask"] == "keep" and fused.attrs["mask_fill"] == -10000.0
    feeds, w = _feeds(g, MASK05), _weights(g)
    ref = run_reference(g, feeds, w)[0]
    # the all-zero row attends normally in the unfused graph: it equals the same row with an all-one mask
    ones = run_reference(g, _feeds(g, np.ones_like(MASK05)), w)[0]
    np.testing.assert_allclose(ref[1], ones[1], atol=2e-3)
    assert np.abs(ref[1] - ref[1].mean(0)).max() > 1e-2  # not the uniform (mean of v) answer
    for label, v in versions:
        np.testing.assert_allclose(run_reference(v, feeds, w)[0], ref, rtol=0, atol=1e-6, err_msg=label)


MASKS = {
    "all_zero_row": MASK05,
    "left_padding": np.array([[0, 0, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1, 1]]),
    "holes": np.array([[1, 0, 1, 0, 1, 1, 0, 1], [1, 1, 0, 0, 0, 0, 1, 1]]),
    "single_token": np.array([[1, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 1]]),
    "all_zero": np.zeros((2, 8)),
    "not_binary": np.array([[2, 1, 1, 1, 0, 0, 3, 1], [1, -1, 1, 1, 1, 1, 1, 1]]),
}


@pytest.mark.parametrize("fill", ["-10000.0", "-1000000000.0", "-3.4028234663852886e+38"])
@pytest.mark.parametrize("mask", sorted(MASKS))
def test_fused_attention_equals_unfused_for_every_mask_and_fill(fill, mask):
    g = _case(fill, swap_mul=fill == "-1000000000.0")
    feeds, w = _feeds(g, MASKS[mask].astype(np.int64)), _weights(g)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = run_reference(g, feeds, w)[0]
        for label, v in _versions(g)[1:]:
            got = run_reference(v, feeds, w)[0]
            np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6, err_msg=f"{label}, mask {mask}, fill {fill}")


def test_f16_graph_fill_is_computed_in_the_masks_dtype():
    g = _case(dtype="f16")
    feeds, w = _feeds(g, MASK05), _weights(g)
    ref = run_reference(g, feeds, w)[0]
    versions = _versions(g)
    assert any(n.op == Op.FUSED_ATTENTION_BLOCK for n in versions[-1][1])
    for label, v in versions[1:]:
        np.testing.assert_allclose(run_reference(v, feeds, w)[0].astype(np.float32), ref.astype(np.float32),
                                   atol=2e-3, err_msg=label)


def test_mlx_fused_versions_equal_unfused_on_case05():
    from rlxviz.runtime import run_mlx

    g = _case()
    feeds, w = _feeds(g, MASK05), _weights(g)
    unfused = run_mlx(g, feeds, w)[0]
    np.testing.assert_allclose(unfused, run_reference(g, feeds, w)[0], atol=1e-5)
    for label, v in _versions(g)[1:]:
        np.testing.assert_allclose(run_mlx(v, feeds, w)[0], unfused, atol=1e-5, err_msg=label)


def test_bool_scale_constant_is_read_as_its_dtype_holds_it():
    """A `bool` scale constant (true, i.e. 1): the fused attention scales by 1.0, not by the literal.
    (A bool const written 4.0 is refused by the linter.)"""
    text = CASE05.read_text().replace("%16 = const {value=4.0} : f32[]", "%16 = const {value=true} : bool[]")
    g = parse_ir(text)
    feeds, w = _feeds(g, MASK05), _weights(g)
    ref = run_reference(g, feeds, w)[0]
    versions = _versions(g)
    att = next(n for n in dict(versions)["after fuse_sdpa"] if n.op == Op.ATTENTION)
    assert att.attrs["scale"] == 1.0
    for label, v in versions[1:]:
        np.testing.assert_allclose(run_reference(v, feeds, w)[0], ref, atol=1e-6, err_msg=label)


def test_zero_scale_is_refused_with_a_named_guard():
    text = CASE05.read_text().replace("%16 = const {value=4.0} : f32[]", "%16 = const {value=0.0} : f32[]")
    trace = Pipeline(["fuse_sdpa"]).run(parse_ir(text))
    assert not any(n.op == Op.ATTENTION for n in trace.versions()[-1][1])
    assert any(r.guard == "scale_finite" for r in trace.step("fuse_sdpa").rejections)


def _transformers_order(graph):
    """bert-tiny with its extended mask written as transformers writes it: `(1 - cast(m[:, None, None, :])) * min`
    (the unsqueeze first), instead of `reshape((1 - cast(m)) * min)`."""
    from rlxviz.ir import Rewriter
    from rlxviz.passes.pipeline import run_pass

    ext = next(n for n in graph if n.op == Op.RESHAPE and n.path == "mask")
    mul = graph[ext.inputs[0]]
    fill = next(graph[i] for i in mul.inputs if graph[i].op == Op.CONST)
    mask_i = next(n for n in graph.inputs if n.attrs["name"] == "attention_mask")
    rw = Rewriter(graph, "test")
    with rw.provenance([ext.id], path="mask"):
        r = rw.reshape(mask_i.id, ext.shape)
        new = rw.mul(rw.sub(1.0, rw.cast(r, "f32")), fill.attrs["value"])
    rw.replace(ext.id, new)
    return run_pass(rw.finish(), "dead_code_elimination")


@pytest.mark.parametrize("row", ["padded", "all_zero"])
def test_transformers_mask_order_is_a_keep_mask_and_keeps_the_numbers(row):
    from rlxviz.models import load_model
    from rlxviz.runtime.executor import MlxExecutor

    m = load_model("bert-tiny", batch=2, seq=8, style="hf")
    g = _transformers_order(m.graph)
    trace = Pipeline.canonical().run(g)
    assert trace.final.op_counts().get("FusedTransformerLayer") == 2
    mask = np.ones((2, 8), np.int64)
    mask[1, 5:] = 0
    if row == "all_zero":
        mask[0] = 0
    feeds = {"input_ids": np.arange(16, dtype=np.int64).reshape(2, 8) % 30, "attention_mask": mask}
    want = run_reference(g, feeds, m.weights)[0]
    np.testing.assert_allclose(run_reference(trace.final, feeds, m.weights)[0], want, atol=1e-5)
    np.testing.assert_allclose(np.asarray(MlxExecutor().run(trace.final, feeds, m.weights)[0]), want, atol=1e-4)
