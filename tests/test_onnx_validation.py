"""ONNX models that break a rule of an op's definition are refused naming the op and the rule, never imported
with another meaning (a reduce axis 40 on a rank-2 tensor became axis 0; a reshape to [-1, -1] became
[128, -1]); constant folding is bounded before it runs (a backtracking regex, control flow, a 6000^3 MatMul);
an input the IR cannot hold is one line naming the input. Each kind with several variants, dims symbolic
(`batch`, `seq`) as exporters write them, so the rule is checked on the shapes bound at import too."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rlxviz.models.onnx import OnnxImportError, load_onnx

REL = Path(__file__).parent / "data" / "reliability"


def _i64(name: str, v) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(v, dtype=np.int64), name)


def _save(tmp_path: Path, nodes, inits=(), shape=("batch", "seq", 8), opset=17, name="m.onnx") -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph(nodes, "g", [x], [y], initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    p = tmp_path / name
    onnx.save(m, p)
    return p


INVALID = {
    "reduce axis attribute past the rank": ([helper.make_node("ReduceMean", ["x"], ["y"], axes=[40])], []),
    "reduce axes input past the rank": ([helper.make_node("ReduceSum", ["x", "a"], ["y"])], [_i64("a", [3])]),
    "reduce axis below -rank": ([helper.make_node("ReduceMax", ["x"], ["y"], axes=[-4])], []),
    "reshape with two -1": ([helper.make_node("Reshape", ["x", "s"], ["y"])], [_i64("s", [-1, -1])]),
    "reshape with -2": ([helper.make_node("Reshape", ["x", "s"], ["y"])], [_i64("s", [-2, 8])]),
    "transpose perm not a permutation": ([helper.make_node("Transpose", ["x"], ["y"], perm=[0, 0, 1])], []),
    "transpose perm past the rank": ([helper.make_node("Transpose", ["x"], ["y"], perm=[0, 1, 3])], []),
    "unsqueeze axis past the rank": ([helper.make_node("Unsqueeze", ["x", "a"], ["y"])], [_i64("a", [9])]),
    "softmax axis past the rank": ([helper.make_node("Softmax", ["x"], ["y"], axis=3)], []),
    "concat axis past the rank": ([helper.make_node("Concat", ["x", "x"], ["y"], axis=5)], []),
    "flatten axis past the rank": ([helper.make_node("Flatten", ["x"], ["y"], axis=7)], []),
    "gather axis past the rank": ([helper.make_node("Gather", ["x", "i"], ["y"], axis=3)], [_i64("i", [0])]),
}


BOUND_INVALID = {
    # valid for some batch/seq, so ONNX's inference cannot refuse the file: refused on the bound shapes
    "reshape whose size differs": ([helper.make_node("Reshape", ["x", "s"], ["y"])], [_i64("s", [3, -1, 5])]),
    "squeeze of an axis that is not 1": ([helper.make_node("Squeeze", ["x", "a"], ["y"])], [_i64("a", [1])]),
    "split sizes that do not add up": ([helper.make_node("Split", ["x", "s"], ["y", "z"], axis=1)],
                                       [_i64("s", [1, 1])]),
}


@pytest.mark.parametrize("case", [*INVALID, *BOUND_INVALID])
def test_a_model_breaking_an_op_rule_is_refused_naming_it(tmp_path, case):
    """Refused by ONNX's strict inference (INVALID) or, where only the bound shapes break the rule (BOUND_INVALID),
    by the op's handler."""
    nodes, inits = {**INVALID, **BOUND_INVALID}[case]
    p = _save(tmp_path, nodes, inits)
    with pytest.raises(OnnxImportError) as e:
        load_onnx(p, batch=2, seq=4)
    msg = str(e.value)
    assert "\n" not in msg and nodes[0].op_type in msg, msg


def test_a_valid_reshape_and_reduce_still_import(tmp_path):
    nodes = [helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("ReduceSum", ["r", "a"], ["y"])]
    p = _save(tmp_path, nodes, [_i64("s", [0, -1]), _i64("a", [-1])])
    m = load_onnx(p, batch=2, seq=4)
    assert m.graph.outputs and m.graph[m.graph.outputs[0]].shape == (2, 1)


def _const_node_model(tmp_path: Path, node, inits) -> Path:
    """y = x + node(constants): the node's inputs are all constant, so the importer would fold it."""
    return _save(tmp_path, [node, helper.make_node("Add", ["x", "c"], ["y"])], inits, shape=(1, 1))


def test_folding_a_huge_matmul_is_refused_before_it_runs(tmp_path):
    a = numpy_helper.from_array(np.zeros((1, 1), np.float32), "a")
    node = helper.make_node("Expand", ["a", "s"], ["e"], name="e")
    mm = helper.make_node("MatMul", ["e", "e"], ["m"], name="mm")
    red = helper.make_node("ReduceSum", ["m"], ["c"], keepdims=0)
    p = _save(tmp_path, [node, mm, red, helper.make_node("Add", ["x", "c"], ["y"])], [a, _i64("s", [3000, 3000])],
              shape=(1, 1))
    t = time.perf_counter()
    with pytest.raises(OnnxImportError, match=r"MatMul node 'mm'.*multiply-adds, over the"):
        load_onnx(p)
    assert time.perf_counter() - t < 10  # the bound is checked before the product runs (27e9 multiply-adds)


@pytest.mark.parametrize("node,inits", [
    (helper.make_node("Bernoulli", ["p"], ["c"]), [numpy_helper.from_array(np.full((1, 1), 0.5, np.float32), "p")]),
    (helper.make_node("RandomUniform", [], ["c"], shape=[1, 1]), []),
])
def test_a_constant_op_outside_the_fold_allow_list_is_never_evaluated(tmp_path, node, inits):
    p = _const_node_model(tmp_path, node, inits)
    with pytest.raises(OnnxImportError) as e:
        load_onnx(p)
    assert node.op_type in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["onnx_regex_redos_11s.onnx", "onnx_if_branch_1p5gib_under_64mib.onnx",
                                  "onnx_silent_reduce_axes_oob.onnx", "onnx_input_rank64_exit3.onnx"])
def test_the_handed_hostile_onnx_files_are_one_line_within_seconds(name):
    t = time.perf_counter()
    with pytest.raises(OnnxImportError) as e:
        load_onnx(REL / name, max_bytes=64 << 20)
    assert time.perf_counter() - t < 10 and "\n" not in str(e.value)


def _external_model(tmp_path: Path, entries: dict[str, str], data: bytes) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])
    w = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2, 2], data_location=TensorProto.EXTERNAL)
    for k, v in {"location": "w.bin", **entries}.items():
        w.external_data.add(key=k, value=v)
    (tmp_path / "w.bin").write_bytes(data)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], initializer=[w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "m.onnx")
    return tmp_path / "m.onnx"


def test_external_data_is_read_only_within_the_declared_size(tmp_path):
    vals = np.arange(4, dtype=np.float32)
    big = vals.tobytes() + b"\xff" * (1 << 20)  # a 16-byte tensor in a 1 MiB file: no length given
    m = load_onnx(_external_model(tmp_path, {"offset": "0"}, big))
    np.testing.assert_array_equal(next(iter(m.weights.values())), vals.reshape(2, 2))


@pytest.mark.parametrize("entries,data,fragment", [
    ({"length": "64"}, b"\x00" * 64, "declares 64 bytes of external data; its dims [2, 2] need 16"),
    ({"offset": "8"}, b"\x00" * 16, "needs bytes 8..24 of 'w.bin', which holds 16"),
    ({"offset": "x"}, b"\x00" * 16, "unreadable external data entry"),
])
def test_external_data_that_does_not_fit_its_declaration_is_refused(tmp_path, entries, data, fragment):
    with pytest.raises(OnnxImportError) as e:
        load_onnx(_external_model(tmp_path, entries, data))
    assert fragment in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("value", ["[" * 5000 + "]" * 5000, repr(["x" * 50] * 20_000), "{1: 2}", "not python"])
def test_hostile_name_scope_metadata_is_bounded_and_ignored(value):
    from rlxviz.models.onnx import node_path

    n = helper.make_node("Relu", ["x"], ["y"], name="/enc/layer.0/Relu")
    n.metadata_props.add(key="pkg.torch.onnx.name_scopes", value=value)
    assert node_path(n) == "enc.layer.0"  # the legacy node name still gives the path


def test_an_import_stops_at_its_wall_time_bound(tmp_path, monkeypatch):
    import rlxviz.models.onnx.driver as imp

    names = ["x", *[f"r{k}" for k in range(49)], "y"]
    nodes = [helper.make_node("Relu", [names[k]], [names[k + 1]]) for k in range(50)]
    p = _save(tmp_path, nodes)
    monkeypatch.setattr(imp, "MAX_IMPORT_SECONDS", 0.0)
    with pytest.raises(OnnxImportError,  # the limit counts CPU time (issue 37): 0 s of either clock is past it
                       match=r"the import has taken over 0 s of (CPU|wall) time.*; stopped here \(a graph of 50 "
                             r"nodes\)"):
        load_onnx(p, batch=2, seq=4)


def test_a_file_that_crashes_onnx_shape_inference_is_refused_not_a_crash(tmp_path):
    """GatherND with batch_dims -5 segfaults onnx's native shape inference (found by tests/test_fuzz_onnx.py with
    RLXVIZ_FUZZ_N=500); it runs in a forked child, so the file is refused in one line and this process goes on."""
    node = helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=-5)
    p = _save(tmp_path, [node], [_i64("i", [[0, 1], [1, 2]])])
    # the crash is undefined behaviour: a SIGSEGV, or under load a MemoryError first (seen in CI on the IR twin of
    # this test); either way the file is refused in one line and this process goes on
    with pytest.raises(OnnxImportError, match=r"ONNX's shape inference (crashed on this file \(SIGSEGV\)|failed on "
                                              r"this file)|rejected by ONNX shape inference"):
        load_onnx(p)
    assert load_onnx(_save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], name="ok.onnx"), batch=2, seq=4)
