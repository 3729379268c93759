"""Issue 40, lint and import errors as kinds: every error path gives one line, exit 2, and names what is wrong.

* Lint's operand-count paths, walked over every op: a node with an operand count its op does not take, alone and
  as the index operand of a gather (whose constant-index check walked into it: `IndexError`, exit 3, for an
  `expand` / `reshape` / `transpose` / `narrow` with no operand), is one line naming the node and the count.
* A node lint refused is never read by a later check: attribute types mutated on the gather's index chain.
* An initializer whose data type is no tensor type (999, UNDEFINED) is named with its code; an unnamed ONNX node is
  named by its output (never `''`); an Expand to a negative dimension computed at import is named (was
  `Expand node '' (opset 17): StopIteration:`), and an error with no message says so.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from clirun import one_line, run
from onnx import TensorProto, helper, numpy_helper

from rlxviz.ir import Graph, format_graph, parse_ir, problems
from rlxviz.ir.dtype import DType
from rlxviz.ir.node import Node
from rlxviz.ir.ops import SPECS, Op

LEAVES = (Op.INPUT, Op.PARAM, Op.CONST)


def _attr_value(a):
    if a.choices:
        return a.choices[0]
    t = a.types[0]
    return {bool: False, int: 0, float: 1.0, str: "x", tuple: ()}.get(t)


def _bad_counts(op: Op) -> list[int]:
    arity = SPECS[op].arity
    if arity is None:
        return [0]
    return [k for k in range(0, max(arity) + 2) if k not in arity]


CASES = [(op, k, place) for op in SPECS if op not in LEAVES for k in _bad_counts(op)
         for place in ("alone", "gather_indices")]


def _graph(op: Op, k: int, place: str) -> Graph:
    dt = DType.i64
    attrs = {key: _attr_value(a) for key, a in SPECS[op].attrs.items() if a.required}
    nodes = [Node(i, Op.INPUT, (), (2, 8), dt, {"name": f"x{i}"}) for i in range(max(k, 1))]
    nodes.append(Node(50, op, tuple(range(k)), (2,) if place == "gather_indices" else (2, 8), dt, attrs))
    if place == "alone":
        return Graph(nodes, (50,))
    nodes.append(Node(51, Op.GATHER, (0, 50), (2, 8), dt, {"axis": 0}))
    return Graph(nodes, (51,))


@pytest.mark.parametrize("op, k, place", CASES, ids=[f"{op.value}-{k}-{place}" for op, k, place in CASES])
def test_an_operand_count_the_op_does_not_take_is_one_line(capsys, tmp_path, op, k, place):
    p = tmp_path / "g.ir"
    p.write_text(format_graph(_graph(op, k, place)))
    code, _, err = run(capsys, "explain", p)
    assert code == 2, err
    line = one_line(err, "explain")
    assert f"%50 ({op.value})" in line, line
    assert (f"{op.value} takes" in line and f"got {k}" in line) or f"{op.value} needs at least 1 operand" in line, line


_INDEX_CHAIN = {  # index-chain ops with a valid operand and an attribute of the wrong type
    Op.NARROW: {"axis": "a", "start": 0, "length": 1},
    Op.NARROW.value + "_start": {"axis": 0, "start": "s", "length": 1},
    Op.TRANSPOSE: {"perm": ("a", "b")},
    Op.RESHAPE: {"shape": "2"},
    Op.EXPAND: {"shape": ("x",)},
    Op.CONCAT: {"axis": "z"},
    Op.CAST: {"dtype": 3},
}


@pytest.mark.parametrize("key", list(_INDEX_CHAIN), ids=str)
def test_a_refused_node_on_a_gathers_index_chain_is_never_read(key):
    op = key if isinstance(key, Op) else Op.NARROW
    attrs = _INDEX_CHAIN[key]
    nodes = [Node(0, Op.INPUT, (), (4, 8), DType.f32, {"name": "t"}),
             Node(1, Op.CONST, (), (2,), DType.i64, {"value": (0, 9)}),
             Node(2, op, (1,), (2,), DType.i64, attrs),
             Node(3, Op.GATHER, (0, 2), (2, 8), DType.f32, {"axis": 0})]
    found = problems(Graph(nodes, (3,)))  # raises nothing
    assert found and found[0][0] == 2, found


def test_the_handed_kind_missing_operand_on_the_index_chain(capsys, tmp_path):
    p = tmp_path / "g.ir"
    p.write_text('graph g {\n  %0 = input {name="x"} : f32[4, 8]\n  %2 = expand {shape=[2]} : i64[2]\n'
                 '  %1 = gather(%0, %2) : f32[2, 8]\n  return %1\n}\n')
    for command in ("explain", "ir", "time", "overlay"):
        code, _, err = run(capsys, command, p)
        assert code == 2, err
        assert "line 3" in (line := one_line(err, command)) and "expand takes 1 operand(s), got 0" in line, line
    assert problems(parse_ir(p.read_text(), verify=False))[0][0] == 2


# ------------------------------------------------------------------------------------------------ ONNX

def _save(tmp_path: Path, nodes, inits=(), inputs=(("x", TensorProto.FLOAT, [1, 8]),), name="m.onnx") -> Path:
    ins = [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    m = helper.make_model(helper.make_graph(nodes, "g", ins, [y], initializer=list(inits)),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    p = tmp_path / name
    onnx.save(m, p)
    return p


def _refused(capsys, p: Path, *args: str) -> str:
    code, _, err = run(capsys, "explain", p, *args)
    assert code == 2, err
    line = one_line(err, "explain")
    assert str(p) in line and "''" not in line and not line.rstrip().endswith(":"), line
    return line


@pytest.mark.parametrize("code, named", [(999, "data type 999 (no ONNX data type)"), (0, "data type UNDEFINED"),
                                         (12345, "data type 12345 (no ONNX data type)")])
def test_an_initializer_of_no_tensor_type_is_named(capsys, tmp_path, code, named):
    w = numpy_helper.from_array(np.ones((1, 8), np.float32), "w")
    w.data_type = code
    p = _save(tmp_path, [helper.make_node("Add", ["x", "w"], ["y"])], [w])
    line = _refused(capsys, p)
    assert f"initializer 'w' has {named}" in line, line


def _expand_to(tmp_path: Path, sign_axis: int) -> Path:
    """x: [batch, 8], bound to batch 1 at import; Expand's shape computed from Shape(x) with one axis negated."""
    consts = [numpy_helper.from_array(np.asarray([8], np.int64), "c8"),
              numpy_helper.from_array(np.asarray([0], np.int64), "st"),
              numpy_helper.from_array(np.asarray([1], np.int64), "en")]
    nodes = [helper.make_node("Shape", ["x"], ["sh"]), helper.make_node("Slice", ["sh", "st", "en"], ["b"]),
             helper.make_node("Neg", ["b"], ["nb"])]
    parts = ["nb", "c8"] if sign_axis == 0 else ["b", "c8"]
    nodes.append(helper.make_node("Concat", parts, ["t0"], axis=0))
    if sign_axis == 1:
        consts.append(numpy_helper.from_array(np.asarray([1, -1], np.int64), "flip"))
        nodes.append(helper.make_node("Mul", ["t0", "flip"], ["t"]))
    else:
        nodes.append(helper.make_node("Identity", ["t0"], ["t"]))
    nodes.append(helper.make_node("Expand", ["x", "t"], ["y"]))
    return _save(tmp_path, nodes, consts, inputs=(("x", TensorProto.FLOAT, ["batch", 8]),))


@pytest.mark.parametrize("sign_axis, shape", [(0, "[-1, 8]"), (1, "[1, -8]")])
def test_an_expand_to_a_negative_dimension_is_named(capsys, tmp_path, sign_axis, shape):
    line = _refused(capsys, _expand_to(tmp_path, sign_axis), "--batch", "1")
    assert f"Expand's shape {shape} holds the negative dimension" in line, line
    assert "Expand node (unnamed, output 'y')" in line and "StopIteration" not in line, line


def test_an_error_with_no_message_says_so_and_names_the_unnamed_node(capsys, tmp_path, monkeypatch):
    from rlxviz.models.onnx import context

    def silent(*a, **k):
        raise StopIteration

    monkeypatch.setitem(context.HANDLERS, ("", "Relu"), silent)
    line = _refused(capsys, _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])]))
    assert "Relu node (unnamed, output 'y') (opset 17): StopIteration (with no message" in line, line


def test_a_named_node_keeps_its_name(capsys, tmp_path, monkeypatch):
    from rlxviz.models.onnx import context

    def boom(*a, **k):
        raise KeyError("axis")

    monkeypatch.setitem(context.HANDLERS, ("", "Relu"), boom)
    line = _refused(capsys, _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"], name="act")]))
    assert "Relu node 'act' (opset 17): KeyError: 'axis'" in line, line


def _handler_cases() -> list[tuple[str, str, int]]:
    from rlxviz.models.onnx.context import HANDLERS

    return [(domain, op, k) for domain, op in sorted(HANDLERS) for k in (0, 1, 2, 7)]


@pytest.mark.parametrize("domain, op, k", _handler_cases(), ids=lambda v: str(v))
def test_every_import_handler_with_a_wrong_input_count_is_one_named_line(tmp_path, domain, op, k):
    """Each op the importer maps, given 0, 1, 2 or 7 float inputs: imported, or refused in one line that names the
    node and a cause (never `''`, an IndexError, or an empty message). The contrib ops (com.microsoft), which ONNX's
    checker does not know, are checked against ONNX Runtime's schema before their handler reads an input."""
    from rlxviz.models.onnx import OnnxImportError, load_onnx

    ins = [f"x{i}" for i in range(k)]
    vis = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 8]) for n in ins]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    m = helper.make_model(helper.make_graph([helper.make_node(op, ins, ["y"], domain=domain)], "g", vis, [y]),
                          opset_imports=opsets)
    m.ir_version = 8
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    try:
        load_onnx(p)
    except OnnxImportError as e:
        msg = str(e)
        assert len(msg.strip().splitlines()) == 1, msg
        assert "''" not in msg and not msg.rstrip().endswith(":"), msg
        assert "IndexError" not in msg and "StopIteration" not in msg, msg
