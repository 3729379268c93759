"""Variants of each kind of the handed reliability files (issue 25), written here, through the CLI as a user
runs it, under `RLXVIZ_MAX_MEMORY_MB=64`: each is one stderr line, exit 2, naming the file and the node or the
rule, within 10 s (`walltime.within`), and nothing is written.

Kinds: unbounded work at import (other ops than the handed `RegexFullMatch` and `If`: a `Loop` of 10^9 trips,
a string op, a folded `Einsum` and a `OneHot` past their bounds); an attribute outside its op's rule (other ops
than the handed reduce axis); the memory budget of `run` and `explain` on ONNX (a `Where` broadcast, an outer
`MatMul`, an IR outer product); a type the IR cannot hold (an `Unsqueeze` to rank 63, a reshape to rank 40)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from clirun import one_line, run
from onnx import TensorProto, helper, numpy_helper
from walltime import within

BOUND_S = 10


def _i64(name: str, v) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(v, dtype=np.int64), name)


def _model(tmp_path: Path, nodes, inits=(), inputs=(("x", TensorProto.FLOAT, [1, 8]),), opset=17,
           name="m.onnx") -> Path:
    ins = [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    m = helper.make_model(helper.make_graph(nodes, "g", ins, [y], initializer=list(inits)),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8 if opset < 19 else 9
    p = tmp_path / name
    onnx.save(m, p)
    return p


def _refused(capsys, *args, fragments: tuple[str, ...]) -> str:
    with within(BOUND_S, f"rlxviz {' '.join(map(str, args))}"):
        code, out, err = run(capsys, *args)
    assert code == 2, (out, err)
    line = one_line(err, str(args[0]))
    for f in (str(args[1]), *fragments):
        assert f in line, line
    return line


@pytest.fixture(autouse=True)
def _budget(monkeypatch):
    monkeypatch.setenv("RLXVIZ_MAX_MEMORY_MB", "64")


# -------------------------------------------------------------------------- unbounded work at import

def _loop_model(tmp_path: Path) -> Path:
    """y = x + Loop(10^9 trips, v += 1) of constants: a folder that ran it would never return."""
    v_in = helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1])
    i = helper.make_tensor_value_info("i", TensorProto.INT64, [])
    cond_in = helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])
    cond_out = helper.make_tensor_value_info("cond_out", TensorProto.BOOL, [])
    v_out = helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1])
    body = helper.make_graph([helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                              helper.make_node("Add", ["v_in", "one"], ["v_out"])], "body",
                             [i, cond_in, v_in], [cond_out, v_out],
                             initializer=[numpy_helper.from_array(np.ones(1, np.float32), "one")])
    loop = helper.make_node("Loop", ["trips", "cond", "v0"], ["c"], body=body, name="spin")
    inits = [_i64("trips", 10**9), numpy_helper.from_array(np.array(True), "cond"),
             numpy_helper.from_array(np.zeros(1, np.float32), "v0")]
    return _model(tmp_path, [loop, helper.make_node("Add", ["x", "c"], ["y"])], inits)


def _string_model(tmp_path: Path) -> Path:
    """A constant `StringNormalizer` feeding a shape: a string op at import."""
    s = helper.make_tensor("s", TensorProto.STRING, [2], [b"a" * 5000, b"b"])
    nodes = [helper.make_node("StringNormalizer", ["s"], ["n"], case_change_action="UPPER", name="norm"),
             helper.make_node("Shape", ["n"], ["k"]), helper.make_node("Cast", ["k"], ["c"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "c"], ["y"])]
    return _model(tmp_path, nodes, [s], inputs=(("x", TensorProto.FLOAT, [1, 1]),))


def _einsum_model(tmp_path: Path) -> Path:
    """A folded 2000^3 Einsum of constants made by Expand (8e9 multiply-adds, within the memory limit)."""
    a = numpy_helper.from_array(np.ones((1, 1), np.float32), "a")
    nodes = [helper.make_node("Expand", ["a", "s"], ["e"]),
             helper.make_node("Einsum", ["e", "e"], ["m"], equation="ij,jk->ik", name="prod"),
             helper.make_node("ReduceSum", ["m"], ["c"], keepdims=0), helper.make_node("Add", ["x", "c"], ["y"])]
    return _model(tmp_path, nodes, [a, _i64("s", [2000, 2000])], inputs=(("x", TensorProto.FLOAT, [1, 1]),))


def _onehot_model(tmp_path: Path) -> Path:
    """A folded OneHot of depth 2^40: its output alone is past the fold's element bound."""
    nodes = [helper.make_node("OneHot", ["idx", "depth", "vals"], ["h"], name="hot"),
             helper.make_node("ReduceSum", ["h"], ["c"], keepdims=0), helper.make_node("Add", ["x", "c"], ["y"])]
    inits = [_i64("idx", [3]), _i64("depth", 1 << 40), numpy_helper.from_array(np.array([0, 1], np.float32), "vals")]
    return _model(tmp_path, nodes, inits, inputs=(("x", TensorProto.FLOAT, [1, 1]),))


@pytest.mark.parametrize("make,fragments", [
    (_loop_model, ("Loop (spin)",)), (_string_model, ("StringNormalizer (norm)",)),
    (_einsum_model, ("Einsum node 'prod'", "multiply-adds")), (_onehot_model, ("OneHot node 'hot'", "4.0 TiB")),
], ids=["loop-1e9-trips", "string-op", "einsum-2000^3", "onehot-depth-2^40"])
def test_unbounded_work_at_import_is_refused_before_it_runs(tmp_path, capsys, make, fragments):
    _refused(capsys, "explain", make(tmp_path), fragments=fragments)


# -------------------------------------------------------------------------- an attribute outside its op's rule

@pytest.mark.parametrize("node,inits", [
    (helper.make_node("ArgMax", ["x"], ["a"], axis=9, name="am"), []),
    (helper.make_node("CumSum", ["x", "ax"], ["a"], name="cs"), [_i64("ax", 7)]),
    (helper.make_node("LayerNormalization", ["x", "g"], ["a"], axis=5, name="ln"),
     [numpy_helper.from_array(np.ones(8, np.float32), "g")]),
    (helper.make_node("Hardmax", ["x"], ["a"], axis=-4, name="hm"), []),
], ids=["argmax-axis-9", "cumsum-axis-7", "layernorm-axis-5", "hardmax-axis--4"])
def test_an_attribute_outside_its_rule_is_refused_naming_the_op(tmp_path, capsys, node, inits):
    tail = [helper.make_node("Cast", ["a"], ["y"], to=TensorProto.FLOAT)]
    p = _model(tmp_path, [node, *tail], inits, inputs=(("x", TensorProto.FLOAT, ["batch", 8]),))
    _refused(capsys, "explain", p, fragments=(node.op_type,))


# -------------------------------------------------------------------------- the memory budget of run and explain

def test_run_of_a_where_broadcast_is_refused_before_running(tmp_path, capsys):
    n = 12000
    nodes = [helper.make_node("Greater", ["a", "b"], ["g"]), helper.make_node("Where", ["g", "a", "b"], ["y"])]
    p = _model(tmp_path, nodes, inputs=(("a", TensorProto.FLOAT, [n, 1]), ("b", TensorProto.FLOAT, [1, n])))
    np.savez(tmp_path / "in.npz", a=np.ones((n, 1), np.float32), b=np.zeros((1, n), np.float32))
    out = tmp_path / "out.npz"
    _refused(capsys, "run", p, "--inputs", tmp_path / "in.npz", "-o", out, fragments=("over the limit of 64.0 MiB",))
    assert not out.exists()


def test_explain_of_an_outer_matmul_is_refused_by_the_budget(tmp_path, capsys):
    n = 9000
    p = _model(tmp_path, [helper.make_node("MatMul", ["a", "b"], ["y"])],
               inputs=(("a", TensorProto.FLOAT, [n, 1]), ("b", TensorProto.FLOAT, [1, n])))
    _refused(capsys, "explain", p, fragments=("over the limit of 64.0 MiB",))


def test_explain_of_an_ir_outer_product_is_refused_by_the_budget(tmp_path, capsys):
    p = tmp_path / "outer.ir"
    p.write_text('graph outer {\n  %0 = input {name="a"} : f32[20000, 1]\n  %1 = input {name="b"} : f32[1, 20000]\n'
                 "  %2 = matmul(%0, %1) : f32[20000, 20000]\n  %3 = reduce_sum(%2) {axes=[0, 1], keepdims=false} : "
                 "f32[]\n  return %3\n}\n")
    _refused(capsys, "explain", p, fragments=("a run needs 1.5 GiB", "over the limit of 64.0 MiB"))


# -------------------------------------------------------------------------- a type the IR cannot hold

def test_an_unsqueeze_to_rank_63_is_one_line(tmp_path, capsys):
    nodes = [helper.make_node("Unsqueeze", ["x", "ax"], ["u"], name="up"),
             helper.make_node("ReduceSum", ["u"], ["y"], keepdims=0)]
    p = _model(tmp_path, nodes, [_i64("ax", list(range(61)))], inputs=(("x", TensorProto.FLOAT, [2, 3]),))
    _refused(capsys, "explain", p, fragments=("rank 63",))


def test_a_reshape_to_rank_40_is_one_line(tmp_path, capsys):
    nodes = [helper.make_node("Reshape", ["x", "s"], ["r"], name="deep"),
             helper.make_node("ReduceSum", ["r"], ["y"], keepdims=0)]
    p = _model(tmp_path, nodes, [_i64("s", [1] * 38 + [2, 3])], inputs=(("x", TensorProto.FLOAT, [2, 3]),))
    _refused(capsys, "explain", p, fragments=("rank 40",))
