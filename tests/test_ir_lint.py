"""The verifier: every check in `rlxviz/ir/lint.py` fails on a hand-broken graph and names the node."""

import pytest

from rlxviz.ir import DType, Graph, GraphError, Node, Op, lint, parse_ir, problems

F32 = DType.f32


def base_nodes() -> list[Node]:
    return [
        Node(0, Op.INPUT, (), (2, 4), F32, {"name": "x"}),
        Node(1, Op.PARAM, (), (4, 3), F32, {"name": "w"}),
        Node(2, Op.CONST, (), (), F32, {"value": 0.5}),
        Node(3, Op.MATMUL, (0, 1), (2, 3), F32, {}, "enc.fc"),
        Node(4, Op.MUL, (3, 2), (2, 3), F32, {}, "enc.fc"),
        Node(5, Op.NARROW, (4,), (2, 2), F32, {"axis": 1, "start": 1, "length": 2}),
    ]


def graph(nodes: list[Node], outputs: tuple[int, ...] = (5,)) -> Graph:
    return Graph(nodes, outputs, "t")


def with_node(node: Node, nodes: list[Node] | None = None) -> list[Node]:
    nodes = base_nodes() if nodes is None else nodes
    return [node if n.id == node.id else n for n in nodes]


def lint_error(g: Graph, nid: int | None, *fragments: str) -> GraphError:
    """`lint` fails; the first problem is at `nid`, the header names `%nid (op`, the message has `fragments`."""
    with pytest.raises(GraphError) as e:
        lint(g, "unit")
    msg = str(e.value)
    assert e.value.node_id == nid, msg
    assert msg.startswith("lint after unit: graph 't': ")
    if nid is not None:
        assert f"%{nid} ({g[nid].op.value}" in msg, msg
        assert "  >> " in msg  # the IR window marks the node
    for f in fragments:
        assert f in msg, msg
    return e.value


def test_valid_base_graph():
    g = graph(base_nodes())
    assert lint(g) is g and problems(g) == []


def test_dangling_operand():
    lint_error(graph(with_node(Node(4, Op.MUL, (3, 99), (2, 3), F32))), 4, "uses %99, which does not exist")


def test_cycle():
    nodes = with_node(Node(3, Op.MATMUL, (0, 5), (2, 3), F32))
    e = lint_error(graph(nodes), 3, "cycle: %3 -> %5 -> %4 -> %3")
    assert "%3 (matmul): cycle" in str(e) and "  >> %3 = matmul(%0, %5)" in str(e)


def test_self_loop_is_a_cycle():
    lint_error(graph(with_node(Node(4, Op.MUL, (4, 2), (2, 3), F32))), 4, "cycle: %4 -> %4")


def test_out_of_order_use():
    nodes = base_nodes()
    nodes[3], nodes[4] = nodes[4], nodes[3]  # mul before the matmul it reads
    lint_error(graph(nodes), 4, "uses %3, which is defined after it")


def test_duplicate_node_id_rejected_by_graph():
    nodes = [*base_nodes(), Node(5, Op.RELU, (4,), (2, 3), F32)]
    with pytest.raises(GraphError, match="duplicate node id %5") as e:
        graph(nodes)
    assert e.value.node_id == 5


def test_missing_output_and_no_outputs():
    lint_error(graph(base_nodes(), (5, 42)), None, "output %42 does not exist")
    lint_error(graph(base_nodes(), ()), None, "graph has no outputs")


def test_duplicate_outputs_are_allowed_and_counted():
    """Returning one value twice is legal (a model may expose the same tensor under two names)."""
    g = lint(graph(base_nodes(), (5, 5, 3)))
    assert g.use_count(5) == 2 and g.use_count(3) == 2


@pytest.mark.parametrize("node, fragment", [
    (Node(4, Op.MUL, (3,), (2, 3), F32), "mul takes 2 operand(s), got 1"),
    (Node(4, Op.MUL, (3, 2, 2), (2, 3), F32), "mul takes 2 operand(s), got 3"),
    (Node(4, Op.CONCAT, (), (2, 3), F32, {"axis": 0}), "concat needs at least 1 operand, got 0"),
    (Node(2, Op.CONST, (0,), (), F32, {"value": 0.5}), "const takes 0 operand(s), got 1"),
])
def test_arity(node, fragment):
    lint_error(graph(with_node(node)), node.id, fragment)


@pytest.mark.parametrize("attrs, fragment", [
    ({"axis": 1, "start": 1, "length": 2, "size": 3}, "unknown attribute 'size' for narrow"),
    ({"axis": 1, "start": 1}, "missing attribute 'length'"),
    ({"axis": 1, "start": 1.0, "length": 2}, "attribute start=1.0 must be int"),
    ({"axis": 1, "start": True, "length": 2}, "attribute start=True must be int"),
    ({"axis": "1", "start": 1, "length": 2}, "attribute axis='1' must be int"),
])
def test_attribute_schema(attrs, fragment):
    lint_error(graph(with_node(Node(5, Op.NARROW, (4,), (2, 2), F32, attrs))), 5, fragment)


def test_unknown_attribute_on_attrless_op():
    lint_error(graph(with_node(Node(4, Op.MUL, (3, 2), (2, 3), F32, {"alpha": 1}))), 4,
               "unknown attribute 'alpha' for mul (allowed: none)")


def test_bool_is_not_a_float():
    nodes = [Node(0, Op.INPUT, (), (2, 4), F32, {"name": "x"}),
             Node(1, Op.PARAM, (), (4,), F32, {"name": "g"}),
             Node(2, Op.LAYER_NORM, (0, 1, 1), (2, 4), F32, {"eps": True, "axis": -1})]
    lint_error(Graph(nodes, (2,), "t"), 2, "attribute eps=True must be int/float")


def test_tuple_items_are_typed():
    nodes = [*base_nodes(), Node(6, Op.RESHAPE, (5,), (4,), F32, {"shape": (4.0,)})]
    lint_error(graph(nodes, (6,)), 6, "attribute shape=(4.0,) must hold int values, got 4.0")
    nodes[-1] = Node(6, Op.REDUCE_SUM, (5,), (2,), F32, {"axes": (True,), "keepdims": False})
    lint_error(graph(nodes, (6,)), 6, "must hold int values, got True")


@pytest.mark.parametrize("op, attrs, fragment", [
    (Op.ATTENTION, {"num_heads": 1, "head_dim": 4, "mask": "padding", "scale": None},
     "attribute mask='padding' must be one of ['none', 'causal', 'keep', 'additive']"),
    (Op.FUSED_MATMUL_BIAS_ACT, {"activation": "exp"}, "attribute activation='exp' must be one of"),
    (Op.ATTENTION, {"num_heads": 1, "head_dim": 4, "mask": "none", "scale": "big"},
     "attribute scale='big' must be int/float/none"),
])
def test_bad_choice(op, attrs, fragment):
    nodes = [Node(0, Op.INPUT, (), (1, 2, 4), F32, {"name": "x"}),
             Node(1, Op.PARAM, (), (4, 4), F32, {"name": "w"}),
             Node(2, Op.PARAM, (), (4,), F32, {"name": "b"})]
    ins = (0, 1, 2) if op == Op.FUSED_MATMUL_BIAS_ACT else (0, 0, 0)
    nodes.append(Node(3, op, ins, (1, 2, 4), F32, attrs))
    lint_error(Graph(nodes, (3,), "t"), 3, fragment)


def test_duplicate_input_and_param_names():
    nodes = [*base_nodes(), Node(6, Op.INPUT, (), (2,), F32, {"name": "x"})]
    lint_error(graph(nodes), 6, "input name 'x' already used by %0")
    nodes[-1] = Node(6, Op.PARAM, (), (2,), F32, {"name": "w"})
    lint_error(graph(nodes), 6, "param name 'w' already used by %1")
    nodes[-1] = Node(6, Op.PARAM, (), (2,), F32, {"name": "x"})  # inputs and params are separate namespaces
    lint(graph(nodes))


@pytest.mark.parametrize("node, fragment", [
    (Node(2, Op.CONST, (), (1,), F32, {"value": 0.5}), "const payload has shape [] but the node declares [1]"),
    (Node(2, Op.CONST, (), (), F32, {"value": (0.5, 1.0)}), "const payload has shape [2] but the node declares []"),
    (Node(2, Op.CONST, (), (1,), F32, {"value": ("a",)}), "must hold int/float/bool/tuple values"),
    (Node(2, Op.CONST, (), (1, 1), F32, {"value": (("a",),)}), "const payload is ragged or holds a non-number"),
    (Node(2, Op.CONST, (), (2, 2), F32, {"value": ((1, 2), (3,))}), "const payload is ragged"),
    (Node(2, Op.CONST, (), (2, 2), F32, {"value": ((1, 2), (3, 4), (5, 6))}),
     "const payload has shape [3, 2] but the node declares [2, 2]"),
    (Node(2, Op.CONST, (), (), F32, {"value": "a"}), "attribute value='a' must be int/float/bool/tuple"),
])
def test_const_payload(node, fragment):
    lint_error(graph(with_node(node)), 2, fragment)


def test_declared_shape_mismatch():
    lint_error(graph(with_node(Node(4, Op.MUL, (3, 2), (2, 4), F32))), 4,
               "declared type f32[2, 4] but operands give f32[2, 3]")


def test_declared_dtype_mismatch():
    lint_error(graph(with_node(Node(4, Op.MUL, (3, 2), (2, 3), DType.f16))), 4,
               "declared type f16[2, 3] but operands give f32[2, 3]")


def test_bad_declared_dims():
    lint_error(graph(with_node(Node(0, Op.INPUT, (), (2, -4), F32, {"name": "x"}))), 0,
               "non-negative int dims")


def test_shape_error_names_node_and_path():
    e = lint_error(graph(with_node(Node(3, Op.MATMUL, (1, 0), (4, 4), F32, {}, "enc.fc"))), 3,
                   "%3 (matmul @enc.fc): [matmul] contraction mismatch")
    assert "  >> %3 = matmul(%1, %0)" in str(e)


def test_malformed_attr_values_give_messages_not_crashes():
    """Attribute values of the right container type but nonsense content still yield a GraphError."""
    nodes = [*base_nodes(), Node(6, Op.ELEMENTWISE_REGION, (5,), (2, 2), F32, {"chain": (("add",),)})]
    lint_error(graph(nodes, (6,)), 6, "chain op add takes (2,) operand(s), got 0")
    nodes[-1] = Node(6, Op.ELEMENTWISE_REGION, (5,), (2, 2), F32, {"chain": ((1, "i0"),)})
    lint_error(graph(nodes, (6,)), 6, "chain step must be a tuple of strings")
    nodes[-1] = Node(6, Op.ELEMENTWISE_REGION, (5,), (2, 2), F32, {"chain": ()})
    lint_error(graph(nodes, (6,)), 6, "empty chain")


def test_more_problems_are_counted():
    nodes = with_node(Node(4, Op.MUL, (3, 2), (2, 9), F32))
    nodes = with_node(Node(5, Op.NARROW, (4,), (2, 2), F32, {"axis": 1, "start": 1}), nodes)
    e = lint_error(graph(nodes), 4)
    assert str(e).endswith("(+1 more problem(s))")
    assert [nid for nid, _ in problems(graph(nodes))] == [4, 5]


def test_parse_ir_runs_the_verifier():
    text = "graph t {\n  %0 = input {name=\"x\"} : f32[2]\n  %1 = relu(%0, %0) : f32[2]\n  return %1\n}\n"
    with pytest.raises(GraphError, match=r"%1 \(relu\): relu takes 1 operand\(s\), got 2"):
        parse_ir(text)
