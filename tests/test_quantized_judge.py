"""Who judges a quantized graph's versions (`runtime.precision.judge_of`): version 0 in its own dtype, not the float64
oracle, for a graph whose numbers pass through a quantization step (QuantizeLinear, DynamicQuantizeLinear feeding
MatMulInteger). Was: `rlxviz time` on granite.qdq exited 1, the float64 oracle rounding a value on a rounding boundary
to the neighbouring integer (2.7 away) while every version equalled the unfused graph.

The graphs are built here with a value on a rounding boundary: x = 0.35 (float32) over scale 0.1 (float32) is 3.5
exactly in float32 (rounds to 4, ties to even) and 3.4999999 in float64 (rounds to 3). Each test checks first that the
float64 oracle does land a step away (so the case is real), then the verdicts; the wrong rewrites (a scale folded
across the quantize step, the quantizer dropped, a weight's scale moved) must still be flagged.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from rlxviz.ir import DType
from rlxviz.models.onnx import load_onnx
from rlxviz.passes import Pipeline
from rlxviz.runtime import run_oracle, run_reference
from rlxviz.runtime.battery import InputSet
from rlxviz.runtime.compare import check_versions, judge
from rlxviz.runtime.precision import Judge, judge_of, precision_policy, rounding_steps
from rlxviz.session.exactness import Disagreement, ExactnessCheck

S = np.float32(0.1)
"""The quantization scale."""
X = np.asarray([[0.35, -0.2, 1.0, 0.05], [0.75, 0.3, -0.6, 0.45]], np.float32)
"""Inputs with values on rounding boundaries: 0.35 / 0.1, 0.75 / 0.1 and 0.45 / 0.1 are ties in float32 only."""
W = np.asarray([[1.0, -2.0, 0.5], [0.25, 1.5, -1.0], [2.0, 0.0, 1.0], [-0.5, 1.0, 3.0]], np.float32)
B = np.asarray([0.1, -0.2, 0.3], np.float32)


def _save(tmp_path: Path, name: str, nodes: list, inits: list, x_shape: list[int]) -> Path:
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _qdq_linear(tmp_path: Path, name: str = "qdq", q_scale: float = S, dq_scale: float = S,
                quantize: bool = True) -> Path:
    """y = DequantizeLinear(QuantizeLinear(x, q_scale, 0), dq_scale, 0) @ W + B (x f32 [2, 4], u8 with zero point 0
    ... int8 here, so negative values keep their sign). `q_scale != dq_scale`: a scale folded across the quantize
    step; `quantize=False`: the quantizer dropped (y = x @ W + B)."""
    inits = [numpy_helper.from_array(np.asarray(q_scale, np.float32), "qs"),
             numpy_helper.from_array(np.asarray(dq_scale, np.float32), "ds"),
             numpy_helper.from_array(np.asarray(0, np.int8), "zp"),
             numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "qs", "zp"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "ds", "zp"], ["xd"])] if quantize else []
    nodes += [helper.make_node("MatMul", ["xd" if quantize else "x", "w"], ["mm"]),
              helper.make_node("Add", ["mm", "b"], ["y"])]
    return _save(tmp_path, name, nodes, inits, [2, 4])


def _dynamic_linear(tmp_path: Path, name: str = "qdyn", w_scale: float = 0.5) -> Path:
    """quantize_dynamic's form: (q, s, z) = DynamicQuantizeLinear(x); y = float(MatMulInteger(q, Wq, z)) * (s *
    w_scale). x = [0, 25.5, 0.35, ...] makes s = 25.5 / 255 = 0.1 and 0.35 / 0.1 a float32-only tie."""
    wq = np.asarray([[1, -2, 3], [4, 0, -1], [2, 2, -3], [-1, 5, 1]], np.int8)
    inits = [numpy_helper.from_array(wq, "wq"), numpy_helper.from_array(np.asarray(w_scale, np.float32), "ws")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
             helper.make_node("MatMulInteger", ["q", "wq", "z"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["s", "ws"], ["scale"]),
             helper.make_node("Mul", ["accf", "scale"], ["y"])]
    return _save(tmp_path, name, nodes, inits, [2, 4])


X_DYN = np.asarray([[0.0, 25.5, 0.35, 1.2], [0.75, 3.3, 0.45, 2.0]], np.float32)


def _graph(path: Path):
    m = load_onnx(path, input_shapes={"x": (2, 4)})
    return m.graph, dict(m.weights)


def _versions(g):
    """Version 0 and every version the canonical pipeline changed."""
    trace = Pipeline.canonical().run(g)
    vs = trace.versions()
    return [vs[0]] + [vs[i + 1] for i, s in enumerate(trace.steps) if s.changed]


def _sets(x: np.ndarray) -> list[InputSet]:
    return [InputSet("user", "values on rounding boundaries", {"x": x})]


def _a_step_apart_in_float64(g, w, x: np.ndarray, step: float) -> None:
    """The case is real: the float64 oracle lands at least one quantization step (`step`, in y's units) from the
    graph's own float32 numbers, far past the oracle tolerance."""
    f32 = run_reference(g, {"x": x}, w)[0]
    f64 = run_oracle(g, {"x": x}, w)[0]
    assert np.abs(f32.astype(np.float64) - f64).max() >= step * 0.99, (f32, f64)
    pol = precision_policy(g, "cpu")
    assert judge([f32], [f64], [f32], pol).status != "ok"  # the float64 oracle would say NO to version 0


def test_a_qdq_graph_on_a_rounding_boundary_is_judged_against_version_0(tmp_path):
    g, w = _graph(_qdq_linear(tmp_path))
    _a_step_apart_in_float64(g, w, X, step=float(S) * 0.25)  # one step of x times W's smallest weight
    pol = precision_policy(g, "cpu")
    assert not pol.judge.oracle and pol.judge.steps == 1
    assert ("quantized graph: versions judged against version 0 in f32; the float64 oracle does not apply "
            "(rounding boundaries") in pol.describe()
    versions = _versions(g)
    assert len(versions) > 1  # the pipeline changed the graph: fused versions are judged too
    for run in (None, lambda gr, f, wt: run_reference(gr, f, wt)):  # MLX (what `time` runs) and the reference
        verdicts = check_versions(versions, _sets(X), w, pol, run)
        assert [v.status for v in verdicts] == ["ok"] * len(versions), [v.note for v in verdicts]
        assert all(not c.oracle for v in verdicts for c in v.checks)


def test_a_scale_folded_across_the_quantize_step_is_still_flagged(tmp_path):
    """A wrong rewrite: QuantizeLinear's scale halved and DequantizeLinear's kept (the 1/2 folded across the
    quantize step): other integers, other numbers. Same graph shape, so the quantization-flip probe reads the same
    nodes, and must not excuse it."""
    g, w = _graph(_qdq_linear(tmp_path))
    bad, _ = _graph(_qdq_linear(tmp_path, "folded", q_scale=float(S) / 2))
    v = check_versions([("input", g), ("after fold_scale", bad)], _sets(X), w, precision_policy(g, "cpu"))[1]
    assert v.status == "fusion" and v.changed_by == "fold_scale", v.note
    assert "changed the numbers" in v.note and "quantization step:" not in v.note


def test_a_dropped_quantizer_is_still_flagged(tmp_path):
    """A wrong rewrite: DequantizeLinear(QuantizeLinear(x)) -> x moves y by up to half a step times |W|."""
    g, w = _graph(_qdq_linear(tmp_path))
    bad, _ = _graph(_qdq_linear(tmp_path, "dropped", quantize=False))
    assert judge_of(bad).oracle  # no quantization step left in it; version 0's judge is what counts
    v = check_versions([("input", g), ("after drop_qdq", bad)], _sets(X), w, precision_policy(g, "cpu"))[1]
    assert v.status == "fusion" and v.changed_by == "drop_qdq", v.note


def test_a_rounding_level_change_is_not_ok_either(tmp_path):
    """Strict: version 0 judges with the same-dtype tolerance only; a version 1e-3 away (within the float64 oracle's
    rtol 1e-3 of a non-quantized f32 graph) is not ok."""
    g, w = _graph(_qdq_linear(tmp_path))
    pol = precision_policy(g, "cpu")
    y0 = run_reference(g, {"x": X}, w)[0]
    c = judge([y0 * np.float32(1 + 1e-3)], [y0], [y0], pol, "user", by_oracle=False)
    assert c.status == "fusion" and c.changed and not c.oracle


def test_a_dynamic_quant_graph_on_a_rounding_boundary_is_judged_against_version_0(tmp_path):
    g, w = _graph(_dynamic_linear(tmp_path))
    assert len(rounding_steps(g)) >= 1 and {DType.u8} <= {n.dtype for n in rounding_steps(g)}
    _a_step_apart_in_float64(g, w, X_DYN, step=0.1 * 0.5)  # a step of q times the smallest |Wq| (1) and w_scale
    pol = precision_policy(g, "cpu")
    assert not pol.judge.oracle
    versions = _versions(g)
    verdicts = check_versions(versions, _sets(X_DYN), w, pol)
    assert [v.status for v in verdicts] == ["ok"] * len(versions), [v.note for v in verdicts]
    # a wrong rewrite of the weight's scale (0.5 -> 0.55: a dequantize scale changed) is flagged
    bad, _ = _graph(_dynamic_linear(tmp_path, "wrong_scale", w_scale=0.55))
    v = check_versions([("input", g), ("after fold_weight_scale", bad)], _sets(X_DYN), w, pol)[1]
    assert v.status == "fusion" and v.changed_by == "fold_weight_scale", v.note


def test_a_mask_cast_to_uint8_is_no_quantization_step(tmp_path):
    """A 0/1 float cast to u8 (no rounding up its chain) leaves the float64 oracle the judge."""
    nodes = [helper.make_node("Greater", ["x", "zero"], ["pos"]),
             helper.make_node("Cast", ["pos"], ["posf"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["posf"], ["posu"], to=TensorProto.UINT8),
             helper.make_node("Cast", ["posu"], ["keep"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["x", "keep"], ["y"])]
    g, _ = _graph(_save(tmp_path, "mask", nodes, [numpy_helper.from_array(np.asarray(0, np.float32), "zero")],
                        [2, 4]))
    assert not rounding_steps(g) and judge_of(g).oracle
    pol = precision_policy(g, "cpu")
    assert pol.judge.oracle and "oracle: the unfused graph in float64" in pol.describe()


def test_time_on_a_qdq_file_with_boundary_values_exits_0_and_says_who_judges(tmp_path, capsys):
    from clirun import run

    path = _qdq_linear(tmp_path)
    np.savez(tmp_path / "in.npz", x=X)
    code, out, err = run(capsys, "time", path, "--inputs", tmp_path / "in.npz", "--repeat", "1", "--warmup", "0")
    assert code == 0, out + err
    assert "quantized graph: versions judged against version 0 in f32; the float64 oracle does not apply" in out
    assert "NO:" not in out and "vs input" in out


def test_explain_never_says_equal_for_a_version_that_differs_by_a_step():
    """`ExactnessCheck.line`: a version that differs from the unfused graph where no pass is blamed (a quantization
    step moved by rounding) is named with `time`'s reason, never counted among versions that "equal" it."""
    pol = precision_policy(DType.f32, "cpu")
    why = "differs from the unfused graph on holes (8.3e-03) by a quantization step: ..."
    c = ExactnessCheck(("random",), ("after fuse_sdpa",), pol, (Disagreement("after fuse_sdpa", "holes", 8.3e-3, None,
                                                                              why),))
    assert c.ok and "equal the unfused graph" not in c.line()
    assert c.line().startswith("numbers: after fuse_sdpa differs from the unfused graph on holes") and why in c.line()
    assert c.to_dict()["changed"][0]["why"] == why


def test_explain_fails_a_pass_stated_exact_whose_version_moves_a_step():
    """A pass whose decisions say "(exact)" and whose version is the first to differ, by a difference `time` judges
    not ok (a quantization step moved by its rounding): the check fails (explain exits 1) and its line says the
    numbers differ from that version on, never that the versions are equal."""
    pol = replace(precision_policy(DType.f32, "cpu"), judge=Judge(3, "%5 cast u8[2, 8, 32]"))  # a quantized graph's
    why = "differs from the unfused graph on random (8.3e-03) by a quantization step: ..."
    moved = Disagreement("after fuse_sdpa", "random", 8.3e-3, None, why, "precision", "after fuse_sdpa/rope_heads")
    later = Disagreement("after fuse_residual_ln", "random", 8.3e-3, None, why, "precision",
                         "after fuse_sdpa/rope_heads")
    c = ExactnessCheck(("random",), ("after fuse_sdpa", "after fuse_residual_ln"), pol, (moved, later),
                       claimed=("fuse_sdpa",))
    assert not c.ok and c.refuted == (moved, later)
    assert c.line().startswith("numbers: after fuse_sdpa DIFFERS from the unfused graph on random")
    assert "fuse_sdpa states its rewrites exact, but " + why in c.line()
    # the same difference starting at a pass that states nothing: reported, not failed
    quiet = ExactnessCheck(c.inputs, c.checked, pol, (moved, later), claimed=("canonicalize_gelu",))
    assert quiet.ok and not quiet.refuted and "equal the unfused graph" not in quiet.line()
    # a graph the float64 oracle judges: such a difference is the dtype's (told by the line), not a failed claim
    oracle = ExactnessCheck(c.inputs, c.checked, precision_policy(DType.f32, "cpu"), (moved, later),
                            claimed=("fuse_sdpa",))
    assert oracle.ok and not oracle.refuted and "equal the unfused graph" not in oracle.line()


def test_the_error_overlay_of_a_quantized_graph_is_against_version_0_in_its_dtype(tmp_path):
    """`session.overlays`' error figures take the same judge as `time`: on the boundary inputs version 0's nodes are
    0 away from themselves (the float64 oracle put the dequantized value a step away), and the unit says so."""
    from rlxviz.session.overlays import node_figures

    g, w = _graph(_qdq_linear(tmp_path))
    trace = Pipeline.canonical().run(g)
    figs = node_figures(trace, 0, "error", {"x": X}, w)
    assert figs.values and max(figs.values.values()) == 0.0, figs.render(g)
    assert "version 0 on MLX in f32: a quantized graph" in figs.unit
    last = node_figures(trace, len(trace.versions()) - 1, "error", {"x": X}, w)
    assert last.values and max(last.values.values()) <= 1e-5, last.render()


def _per_channel_linear(tmp_path: Path, name: str, scales: np.ndarray) -> Path:
    """y = DequantizeLinear(QuantizeLinear(x, scales, 0, axis=1), scales, 0, axis=1) @ W + B: one scale per input
    column (the per-axis form of `onnxruntime.quantization`'s per-channel QDQ)."""
    inits = [numpy_helper.from_array(np.asarray(scales, np.float32), "qs"),
             numpy_helper.from_array(np.zeros(4, np.int8), "zp"),
             numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "qs", "zp"], ["q"], axis=1),
             helper.make_node("DequantizeLinear", ["q", "qs", "zp"], ["xd"], axis=1),
             helper.make_node("MatMul", ["xd", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["y"])]
    return _save(tmp_path, name, nodes, inits, [2, 4])


def test_a_per_channel_qdq_graph_is_judged_against_version_0_and_merged_scales_are_flagged(tmp_path):
    """Per-axis scales [0.1, 0.3, 0.2, 0.1]: columns 0 and 3 hold float32-only ties (0.35, 0.45 over 0.1). Every
    version is ok against version 0; a wrong rewrite that merges the per-channel scales into one per-tensor scale
    (0.1, the per-tensor graph with W and B alike) is flagged."""
    scales = np.asarray([0.1, 0.3, 0.2, 0.1], np.float32)
    g, w = _graph(_per_channel_linear(tmp_path, "per_channel", scales))
    _a_step_apart_in_float64(g, w, X, step=float(S) * 0.25)
    pol = precision_policy(g, "cpu")
    assert not pol.judge.oracle
    versions = _versions(g)
    verdicts = check_versions(versions, _sets(X), w, pol)
    assert [v.status for v in verdicts] == ["ok"] * len(versions), [v.note for v in verdicts]
    merged, mw = _graph(_qdq_linear(tmp_path, "merged"))  # one per-tensor scale, 0.1: a constant of the graph
    v = check_versions([("input", g), ("after merge_scales", merged)], _sets(X), {**w, **mw}, pol)[1]
    assert v.status == "fusion" and v.changed_by == "merge_scales", v.note


def test_explain_on_a_qdq_file_with_boundary_values_finds_no_changed_numbers(tmp_path, capsys):
    """`explain`'s numeric check takes the same judge: on the boundary inputs, with --verbose, its numbers line says
    the versions equal the unfused graph, and it exits 0."""
    from clirun import run

    path = _qdq_linear(tmp_path)
    np.savez(tmp_path / "in.npz", x=X)
    code, out, err = run(capsys, "explain", path, "--inputs", tmp_path / "in.npz", "--json")
    import json

    doc = json.loads(out)
    assert code in (0, 1) and "Traceback" not in err  # 1: a layer not fused as expected (a bare linear graph)
    check = doc["numeric_check"]
    assert check is None or (check["ok"] and not check["changed"]), check
