"""ONNX's strict shape inference and checker judge a weight-light copy of the model (`validate.light_model`): the
weights (initializers of at least `LIGHT_BYTES`) become graph inputs of their type and shape, so a 434 MB export is
not copied into native code twice. Each case here compares the verdict on the light copy with the verdict on the
whole model (the old way): refusals stay refusals with the same message, accepted models stay accepted."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rlxviz.models.onnx import OnnxImportError, load_onnx
from rlxviz.models.onnx.validate import LIGHT_BYTES, _checker, _strict_inference, light_model, validate

W = (32, 64)  # 8 KiB of float32: over LIGHT_BYTES


def _weight(name: str = "w", shape: tuple[int, ...] = W, dtype: type = np.float32) -> TensorProto:
    return numpy_helper.from_array(np.arange(np.prod(shape), dtype=dtype).reshape(shape), name)


def _model(nodes: list, inits: list[TensorProto], x: tuple[int, ...] = (1, 32), opset: int = 17,
           inputs: list | None = None, ir_version: int | None = None, elem: int = TensorProto.FLOAT) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", elem, list(x)), *(inputs or [])],
                          [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    if ir_version is not None:
        m.ir_version = ir_version
    return m


def _whole(m: onnx.ModelProto) -> str:
    """The verdict as `validate` gave it before the light copy: inference on the model, the checker on a copy."""
    copy = onnx.ModelProto()
    copy.CopyFrom(m)
    return _strict_inference(m) or _checker(copy)


def _light(m: onnx.ModelProto, in_place: bool = False) -> str:
    light = light_model(m, in_place=in_place)
    return _strict_inference(light) or _checker(light)


def _heavy_bytes(m: onnx.ModelProto) -> int:
    return sum(len(t.raw_data) for t in m.graph.initializer)


def _short_raw(t: TensorProto) -> TensorProto:
    t.raw_data = t.raw_data[:16]
    return t


def _reshape_shape() -> TensorProto:
    return numpy_helper.from_array(np.array([1, -1, -1], np.int64), "s")


CASES: dict[str, tuple[Callable[[], onnx.ModelProto], str]] = {
    # accepted
    "matmul_by_a_weight": (lambda: _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_weight()]), ""),
    "half_weight": (lambda: _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_weight(dtype=np.float16)],
                                   elem=TensorProto.FLOAT16), ""),
    "declared_weight_same_type": (lambda: _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], [_weight()],
        inputs=[helper.make_tensor_value_info("w", TensorProto.FLOAT, list(W))]), ""),
    "old_ir_declared": (lambda: _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], [_weight()], opset=9, ir_version=3,
        inputs=[helper.make_tensor_value_info("w", TensorProto.FLOAT, list(W))]), ""),
    # refused by the strict inference
    "weight_of_another_dtype": (lambda: _model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                                               [_weight(dtype=np.float64)]), "rejected by ONNX shape inference"),
    "weight_of_a_wrong_shape": (lambda: _model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                                               [_weight(shape=(48, 64))]), "rejected by ONNX shape inference"),
    "declared_weight_other_shape": (lambda: _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], [_weight()],
        inputs=[helper.make_tensor_value_info("w", TensorProto.FLOAT, [64, 64])]), "rejected by ONNX"),
    "reshape_two_minus_ones": (lambda: _model(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Reshape", ["h", "s"], ["y"])],
        [_weight(), _reshape_shape()]), "rejected by ONNX"),
    # refused by the checker
    "weight_short_raw_data": (lambda: _model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                                             [_short_raw(_weight())]), "rejected by the ONNX checker"),
    "old_ir_undeclared_weight": (lambda: _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_weight()],
                                                opset=9, ir_version=3), "rejected by the ONNX checker"),
    "duplicate_weight_name": (lambda: _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_weight(), _weight()]),
                              "rejected by the ONNX"),
    "weight_named_as_a_node_output": (lambda: _model(
        [helper.make_node("Relu", ["x"], ["w"]), helper.make_node("MatMul", ["x", "w"], ["y"])], [_weight()]),
        "rejected by ONNX shape inference"),
    "unknown_attribute_next_to_a_weight": (lambda: _model(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"], alpha=0.5)],
        [_weight()]), "rejected by the ONNX checker"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_light_copy_gives_the_whole_models_verdict(case):
    make, fragment = CASES[case]
    whole, light = _whole(make()), _light(make())
    assert light == whole == _light(make(), in_place=True), (light, whole)
    assert (fragment in light) if fragment else light == "", light


@pytest.mark.parametrize("case", ["matmul_by_a_weight", "half_weight", "declared_weight_same_type",
                                  "weight_of_another_dtype", "weight_of_a_wrong_shape"])
def test_the_light_copy_holds_no_weight_bytes_and_leaves_the_model_unchanged(case):
    m = CASES[case][0]()
    before = m.SerializeToString()
    light = light_model(m)
    assert m.SerializeToString() == before
    assert _heavy_bytes(m) >= LIGHT_BYTES and _heavy_bytes(light) == 0
    assert "w" in {vi.name for vi in light.graph.input}
    assert light_model(m, in_place=True) is m and _heavy_bytes(m) == 0  # a forked child's own copy: changed
    assert m.SerializeToString() == light.SerializeToString()


def test_shape_constants_and_small_tensors_keep_their_values():
    """A Reshape's shape (int64) and a tensor under LIGHT_BYTES stay initializers: shape inference reads values."""
    big_shape = numpy_helper.from_array(np.full(LIGHT_BYTES // 8 + 1, 1, np.int64), "big_ints")
    small = _weight("b", shape=(32,))
    m = _model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
               [_weight(), _reshape_shape(), big_shape, small])
    kept = {t.name for t in light_model(m).graph.initializer}
    assert kept == {"s", "big_ints", "b"}


def test_validate_refuses_from_the_light_copy_and_import_keeps_the_numbers(tmp_path):
    bad = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_weight(shape=(48, 64))])
    with pytest.raises(OnnxImportError, match="rejected by ONNX shape inference"):
        validate(bad)
    good = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_weight()])
    onnx.save(good, tmp_path / "g.onnx")
    m = load_onnx(tmp_path / "g.onnx", seq=32)
    assert np.array_equal(m.weights[next(iter(m.weights))], numpy_helper.to_array(_weight()))


def _counting_parses(monkeypatch) -> list[str]:
    """The files parsed from now on, by either road: `onnx.load`, or `dims.parse_onnx`'s memory map of the file."""
    import mmap
    import types

    from rlxviz.models.onnx import dims

    seen: list[str] = []
    real = onnx.load

    def load(f, *a, **k):  # noqa: ANN001, ANN002, ANN003 - onnx.load's own signature
        seen.append(str(f))
        return real(f, *a, **k)

    def mapped(fileno: int, *a, **k):  # noqa: ANN002, ANN003 - mmap.mmap's own signature
        seen.append(os.readlink(f"/proc/self/fd/{fileno}"))
        return mmap.mmap(fileno, *a, **k)

    monkeypatch.setattr(onnx, "load", load)
    monkeypatch.setattr(dims, "mmap", types.SimpleNamespace(mmap=mapped, ACCESS_READ=mmap.ACCESS_READ))
    return seen


@pytest.mark.parametrize("dims", [None, {"n": 3}])
def test_session_load_parses_an_onnx_file_once_and_keeps_its_numbers(tmp_path, monkeypatch, dims):
    """The input shapes and the import read one parse of the file (a 434 MB export was parsed twice)."""
    from rlxviz.session import load

    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [_weight()])
    p = tmp_path / f"once{len(dims or {})}.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
    seen = _counting_parses(monkeypatch)
    m = load(str(p), batch=2, dims=dims)
    assert seen == [str(p)]
    assert [n.type.shape for n in m.graph.inputs] == [((dims or {}).get("n", 2), 32)]
    assert np.array_equal(next(iter(m.weights.values())), numpy_helper.to_array(_weight()))
    assert load(str(p), batch=2, dims=dims) is m and seen == [str(p)]  # cached: not parsed again
