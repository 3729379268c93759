"""`session.ort_optimizer`: what ONNX Runtime's graph optimizer makes of a file, counted from the optimized model."""

import importlib.util

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rlxviz.session.ort_optimizer import ort_optimized, transformer_optimized, transformer_optimizer_unavailable


def residual_norm_model(path, second_reader: bool):
    """y = LayerNorm(a + b) over [2, 8, 16] f32; with `second_reader`, the sum is also an output (a pre-LN sum)."""
    h = 16
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(h).astype(np.float32), "gamma"),
             numpy_helper.from_array(rng.standard_normal(h).astype(np.float32), "beta")]
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5)]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, h])]
    if second_reader:
        nodes.append(helper.make_node("Mul", ["s", "s"], ["sq"]))
        outs.append(helper.make_tensor_value_info("sq", TensorProto.FLOAT, [2, 8, h]))
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 8, h]) for n in ("a", "b")]
    model = helper.make_model(helper.make_graph(nodes, "rn", ins, outs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    rng = np.random.default_rng(1)
    return {n: rng.standard_normal((2, 8, h)).astype(np.float32) for n in ("a", "b")}


@pytest.mark.parametrize(("second_reader", "fused"), [(False, 1), (True, 0)])
def test_skip_layer_norm_only_when_the_sum_has_one_reader(tmp_path, second_reader, fused):
    feeds = residual_norm_model(tmp_path / "m.onnx", second_reader)
    r = ort_optimized(tmp_path / "m.onnx", feeds)
    assert r.fused.get("com.microsoft.SkipLayerNormalization", 0) == fused
    assert r.ops_before == ({"Add": 1, "LayerNormalization": 1} | ({"Mul": 1} if second_reader else {}))
    assert r.nodes_before == sum(r.ops_before.values()) and r.nodes_after == sum(r.ops_after.values())
    if fused:
        assert r.node_outputs["com.microsoft.SkipLayerNormalization"] == (1,)
        assert r.nodes_after == r.nodes_before - 1
    assert r.max_err < 1e-5  # ORT's fusion preserves the numbers (to float rounding)


def test_transformer_optimizer_availability_is_what_imports():
    why = transformer_optimizer_unavailable()
    has_sympy = importlib.util.find_spec("sympy") is not None
    if not has_sympy:  # the transformer optimizer's symbolic shape inference needs it
        assert why is not None and "sympy" in why
    if why is not None:  # refused in one line naming why, before anything runs
        with pytest.raises(ImportError, match="cannot run here: .*Error"):
            transformer_optimized("missing.onnx", "gpt2", 4, 64)
    if why is not None:
        assert "\n" not in why and why.split(":")[0].endswith("Error")
