"""IR text and JSON forms: golden printer output, exact round trips, parser errors with line/column."""

import json

import pytest
from hypothesis import given, settings
from strategies import random_graphs, random_transformer_like_graphs

from rlxviz.ir import (
    DType,
    Graph,
    GraphError,
    IRSyntaxError,
    Node,
    Op,
    format_graph,
    from_json,
    lint,
    parse_ir,
    to_json,
)
from rlxviz.ir.printer import format_value


def same(a: Graph, b: Graph) -> None:
    """Structural equality: name, next_id, outputs and every node field, in order."""
    assert (a.name, a.next_id, a.outputs) == (b.name, b.next_id, b.outputs)
    assert list(a) == list(b)
    for x, y in zip(a, b, strict=True):  # Node == compares attrs by value; also pin the Python types
        assert {k: type(v) for k, v in x.attrs.items()} == {k: type(v) for k, v in y.attrs.items()}


def hand_graph() -> Graph:
    """A small graph built from raw Nodes (no Builder), covering every printer feature."""
    f32 = DType.f32
    nodes = [
        Node(0, Op.INPUT, (), (2, 3, 8), f32, {"name": "x"}),
        Node(1, Op.PARAM, (), (8, 8), f32, {"name": "enc.w"}, "enc"),
        Node(2, Op.PARAM, (), (8,), f32, {"name": "enc.b"}, "enc"),
        Node(3, Op.CONST, (), (), f32, {"value": 0.5}),
        Node(4, Op.CONST, (), (2,), DType.i64, {"value": (1, -2)}),
        Node(9, Op.FUSED_MATMUL_BIAS_ACT, (0, 1, 2), (2, 3, 8), f32, {"activation": "gelu_tanh"},
             "encoder.layer.0", "fuse_matmul_bias_act", (5, 6, 7)),
        Node(10, Op.LAYER_NORM, (9, 2, 2), (2, 3, 8), f32, {"eps": 1e-12, "axis": -1}, "odd path/with space"),
        Node(11, Op.MUL, (10, 3), (2, 3, 8), f32, {}, "inf"),
        Node(12, Op.TRANSPOSE, (11,), (2, 8, 3), f32, {"perm": (0, 2, 1)}),
        Node(13, Op.NARROW, (12,), (2, 8, 2), f32, {"axis": -1, "start": 1, "length": 2}, "", "my pass"),
        Node(14, Op.ATTENTION, (0, 0, 0), (2, 3, 8), f32,
             {"num_heads": 2, "head_dim": 4, "mask": "causal", "scale": None}),
        Node(15, Op.RESHAPE, (14,), (6, 8), f32, {"shape": (-1, 8)}),
        Node(16, Op.REDUCE_MEAN, (15,), (6, 1), f32, {"axes": (1,), "keepdims": True}),
        Node(17, Op.CAST, (16,), (6, 1), DType.f16, {"dtype": "f16"}),
        Node(18, Op.GT, (15, 3), (6, 8), DType.bool, {}),
        Node(19, Op.ELEMENTWISE_REGION, (15, 3), (6, 8), f32,
             {"chain": (("mul", "i0", "i1"), ("tanh", "s0"))}, "", "mark_regions", (20,)),
    ]
    return Graph(nodes, (13, 17, 18, 19, 4, 13), "golden", next_id=30)


GOLDEN = '''\
graph golden next_id=30 {
  %0 = input {name="x"} : f32[2, 3, 8]
  %1 = param {name="enc.w"} : f32[8, 8] @enc
  %2 = param {name="enc.b"} : f32[8] @enc
  %3 = const {value=0.5} : f32[]
  %4 = const {value=[1, -2]} : i64[2]
  %9 = FusedMatMulBiasAct(%0, %1, %2) {activation="gelu_tanh"} : f32[2, 3, 8] @encoder.layer.0 \
[fuse_matmul_bias_act <- %5, %6, %7]
  %10 = layer_norm(%9, %2, %2) {eps=1e-12, axis=-1} : f32[2, 3, 8] @"odd path/with space"
  %11 = mul(%10, %3) : f32[2, 3, 8] @"inf"
  %12 = transpose(%11) {perm=[0, 2, 1]} : f32[2, 8, 3]
  %13 = narrow(%12) {axis=-1, start=1, length=2} : f32[2, 8, 2] ["my pass"]
  %14 = attention(%0, %0, %0) {num_heads=2, head_dim=4, mask="causal", scale=none} : f32[2, 3, 8]
  %15 = reshape(%14) {shape=[-1, 8]} : f32[6, 8]
  %16 = reduce_mean(%15) {axes=[1], keepdims=true} : f32[6, 1]
  %17 = cast(%16) {dtype="f16"} : f16[6, 1]
  %18 = gt(%15, %3) : bool[6, 8]
  %19 = ElementwiseRegion(%15, %3) {chain=[["mul", "i0", "i1"], ["tanh", "s0"]]} : f32[6, 8] [mark_regions <- %20]
  return %13, %17, %18, %19, %4, %13
}
'''


def test_golden_text():
    g = lint(hand_graph())
    assert format_graph(g) == GOLDEN


def test_golden_text_parses_back_exactly():
    same(parse_ir(GOLDEN), hand_graph())
    assert format_graph(parse_ir(GOLDEN)) == GOLDEN


def test_next_id_header_only_when_needed():
    g = hand_graph()
    dense = Graph(list(g), g.outputs, "dense")
    assert format_graph(dense).startswith("graph dense {\n")
    assert parse_ir(format_graph(dense)).next_id == 20


@pytest.mark.parametrize("value, text", [
    (1e-12, "1e-12"), (1e-5, "1e-05"), (0.125, "0.125"), (1.0, "1.0"), (-0.0, "-0.0"), (1e16, "1e+16"),
    (3, "3"), (-7, "-7"), (True, "true"), (False, "false"), (None, "none"), ("a\"b\n", '"a\\"b\\n"'),
    ("é", '"\\u00e9"'), ((), "[]"), ((1, (2.5, "x")), '[1, [2.5, "x"]]'), (float("inf"), "inf"),
    (float("-inf"), "-inf"), (float("nan"), "nan"),
])
def test_format_value(value, text):
    assert format_value(value) == text


@pytest.mark.parametrize("name", ["g", "bert.tiny-2/x", "has space", "inf", "nan.x", "-inf", "true", "next_id",
                                  "", "7up", 'q"uote'])
def test_names_and_paths_round_trip(name):
    """Graph names, input names, model paths and pass names that are not plain identifiers are quoted (an empty
    input name is refused by lint: inputs are fed by name)."""
    nodes = [Node(0, Op.INPUT, (), (2,), DType.f32, {"name": name or "x"}),
             Node(1, Op.RELU, (0,), (2,), DType.f32, {}, name, name or "p", (0,))]
    g = Graph(nodes, (1,), name or "x")
    same(parse_ir(format_graph(g)), g)


def test_json_round_trip_hand_graph():
    g = hand_graph()
    text = to_json(g)
    same(from_json(text), g)
    d = json.loads(text)
    assert d["next_id"] == 30 and d["nodes"][5]["pass"] == "fuse_matmul_bias_act"
    assert d["nodes"][5]["absorbed"] == [5, 6, 7]


def test_comments_and_blank_lines_are_ignored():
    text = GOLDEN.replace("  %3 = const", "\n  # a comment\n  // another\n  %3 = const")
    same(parse_ir(text), hand_graph())


@settings(max_examples=60, deadline=None)
@given(random_graphs())
def test_random_graphs_round_trip_text_and_json(case):
    g = case.graph
    text = format_graph(g)
    g2 = parse_ir(text)
    same(g2, g)
    assert format_graph(g2) == text
    g3 = lint(from_json(to_json(g)))
    same(g3, g)


@settings(max_examples=30, deadline=None)
@given(random_transformer_like_graphs())
def test_transformer_like_graphs_round_trip(case):
    g = case.graph
    same(parse_ir(format_graph(g)), g)
    same(lint(from_json(to_json(g, indent=1))), g)


# -- parser errors ------------------------------------------------------------------------------

SMALL = """\
graph t {
  %0 = input {name="x"} : f32[2, 4]
  %1 = relu(%0) : f32[2, 4]
  return %1
}
"""


def _err(text: str) -> IRSyntaxError:
    with pytest.raises(IRSyntaxError) as e:
        parse_ir(text)
    return e.value


@pytest.mark.parametrize("old, new, line, col, msg", [
    ("relu(%0)", "reluu(%0)", 3, 8, "unknown op 'reluu'"),
    ("f32[2, 4]\n  return", "f33[2, 4]\n  return", 3, 19, "unknown dtype 'f33'"),
    ("relu(%0) : f32[2, 4]", "relu(%0) : f32[2, -4]", 3, 26, "dimension must be a non-negative integer"),
    ("relu(%0) : f32[2, 4]", "relu(%0) : f32[2, 4.0]", 3, 26, "dimension must be a non-negative integer"),
    ("relu(%0)", "relu(%7)", 3, 13, "undefined value %7"),
    ("return %1", "return %8", 4, 10, "undefined value %8"),
    ("%1 = relu", "%0 = relu", 3, 3, "%0 is defined twice"),
    ("relu(%0) :", "relu(%0) ? :", 3, 17, "unexpected character '?'"),
    ("relu(%0) : f32[2, 4]", "relu(%0) : f32[2, 4] extra", 3, 29, "unexpected 'extra' at end of line"),
    ("relu(%0) : f32[2, 4]", "relu(%0) : f32[2, 4] @p [pass] 3", 3, 39, "unexpected '3' at end of line"),
    ('{name="x"}', '{name="x" : f32', 2, 24, "expected ',' or '}'"),
    ('{name="x"}', '{name=}', 2, 20, "expected a value"),
    ("relu(%0)", "relu(%0", 3, 16, "expected ',' or ')'"),
    ("relu(%0) : f32[2, 4]", "relu(%0) f32[2, 4]", 3, 17, "expected ':'"),
    ("graph t {", "graph t", 1, 8, "expected '{'"),
    ("graph t {", "grph t {", 1, 1, "expected 'graph NAME {'"),
    ("}\n", "}\n%5 = relu(%1) : f32[2, 4]\n", 6, 1, "text after the closing '}'"),
])
def test_parse_errors_have_line_and_column(old, new, line, col, msg):
    assert old in SMALL
    e = _err(SMALL.replace(old, new, 1))
    assert (e.line, e.col) == (line, col), str(e)
    assert msg in e.reason
    # the message quotes the line with a caret under the column
    text_line = SMALL.replace(old, new, 1).splitlines()[line - 1]
    assert f"line {line}, column {col}" in str(e) and text_line in str(e)
    assert str(e).endswith(" " * (col - 1) + "^")


def test_missing_closing_brace():
    e = _err(SMALL.replace("}\n", ""))
    assert (e.line, e.col) == (4, 12) and "missing closing '}'" in e.reason


def test_empty_text():
    e = _err("  \n# nothing\n")
    assert e.line == 1 and "empty IR text" in e.reason


def test_duplicate_attribute():
    e = _err(SMALL.replace('{name="x"}', '{name="x", name="y"}'))
    assert (e.line, e.col) == (2, 25) and "duplicate attribute 'name'" in e.reason


def test_bad_next_id():
    e = _err(SMALL.replace("graph t {", "graph t next_id=1.5 {"))
    assert (e.line, e.col) == (1, 17) and "next_id must be a non-negative integer" in e.reason


def test_parse_verifies_unless_told_not_to():
    bad = SMALL.replace("relu(%0) : f32[2, 4]", "relu(%0) : f32[2, 5]")
    with pytest.raises(GraphError, match=r"%1 \(relu\).*declared type f32\[2, 5\]"):
        parse_ir(bad)
    assert parse_ir(bad, verify=False)[1].shape == (2, 5)


def test_json_errors_name_the_node():
    d = json.loads(to_json(parse_ir(SMALL)))
    d["nodes"][1]["op"] = "nope"
    with pytest.raises(GraphError, match=r"node #1: ValueError"):
        from_json(json.dumps(d))
    d["nodes"][1]["op"] = "relu"
    del d["nodes"][1]["dtype"]
    with pytest.raises(GraphError, match=r"node #1: KeyError"):
        from_json(json.dumps(d))
