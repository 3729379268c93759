"""The inspector names each ONNX node's domain beside its name and op type (issue 39: what Netron and Model
Explorer show, to find the node there). The domain is read off the importer's table (`explain.onnx_domain`); these
tests hold it against each node's domain in the file itself."""

from pathlib import Path

import onnx
import pytest

from rlxviz import session
from rlxviz.app.explain import node_report, report_markdown
from rlxviz.app.onnxorigin import DEFAULT_DOMAIN, onnx_domain
from rlxviz.app.text import md_code

FIX = Path(__file__).parent / "fixtures" / "onnx"


@pytest.mark.parametrize("name", ["bert.onnx", "ortopt/bert.ortopt.onnx", "ortopt/falcon.ortopt.onnx",
                                  "ortopt/gemma.ortopt.onnx"])
def test_each_imported_node_gets_its_files_domain(name):
    """Every node the import kept: the domain shown is the file's (one of the two shown only for an op type the
    importer reads in both domains)."""
    path = FIX / name
    m = session.load(str(path), 1, 8)
    in_file = {n.name: n.domain or DEFAULT_DOMAIN for n in onnx.load(str(path), load_external_data=False).graph.node}
    contrib = 0
    for op, node_name, _ in m.meta["onnx_nodes"].values():
        shown = onnx_domain(op).split(" or ")
        assert in_file[node_name] in shown, (node_name, op, in_file[node_name], shown)
        if len(shown) == 1:
            assert shown == [in_file[node_name]]
        contrib += in_file[node_name] != DEFAULT_DOMAIN
    assert contrib or name == "bert.onnx"  # the ORT-optimized exports hold com.microsoft nodes


def test_the_inspector_text_names_the_domain():
    path = FIX / "ortopt/bert.ortopt.onnx"
    m = session.load(str(path), 1, 8)
    onnx_nodes = m.meta["onnx_nodes"]
    for op in ("Attention", "MatMul"):
        nid = next(i for i, (o, _, _) in onnx_nodes.items() if o == op)
        text = report_markdown(node_report(m.graph, nid, None, None, onnx_nodes))
        want = "com.microsoft" if op == "Attention" else "ai.onnx"
        assert f"{md_code(onnx_nodes[nid][1])} ({op}), domain {md_code(want)}" in text, text


def test_an_op_type_read_in_both_domains_names_both():
    assert onnx_domain("Gelu") == "ai.onnx or com.microsoft"
    assert onnx_domain("SkipLayerNormalization") == "com.microsoft" and onnx_domain("Softmax") == "ai.onnx"


def test_the_file_says_the_domain_of_an_op_type_read_in_both():
    """ORT's optimizer writes Gelu in com.microsoft; ONNX 20 has its own Gelu: the file's domain is shown, not both."""
    path = FIX / "ortopt/bert.ortopt.onnx"
    m = session.load(str(path), 1, 8)
    onnx_nodes, domains = m.meta["onnx_nodes"], m.meta["onnx_domains"]
    in_file = {n.name: n.domain or DEFAULT_DOMAIN for n in onnx.load(str(path), load_external_data=False).graph.node}
    assert domains == {k: v for k, v in in_file.items() if k}
    shown = 0
    for nid, (op, name, _) in onnx_nodes.items():
        text = report_markdown(node_report(m.graph, nid, None, None, onnx_nodes, domains))
        if name:
            assert f"{md_code(name)} ({op}), domain {md_code(in_file[name])}" in text, text
            assert " or " not in text.split("domain", 1)[1].split("\n", 1)[0]
            shown += 1
    assert shown
