"""Nodes the IR has no op for, run on the host: `rlxviz explain` convbert.qdq.onnx said "4 node(s) the IR has no op
for ran on the host (ONNX Runtime): %626 Conv 'node_Conv_364', ..." while the app's banner, Why tab and node panel
never said so (a newcomer comparing the two). The app now says the line of the one function the CLI prints
(`session.describe_host`) in its load banner and above the Why tab's verdict, and the node panel of such a node
says where it runs (`session.host_words`); the model's text (node names) is escaped, never markup."""

from __future__ import annotations

import re
from pathlib import Path

import onnx
from clirun import run
from onnx import TensorProto, helper

from rlxviz import session
from rlxviz.app.jobs import Runner
from rlxviz.app.sources import ALLOWED_DIRS_ENV
from rlxviz.app.state import AppState
from rlxviz.app.text import md_escape
from rlxviz.app.wording import md_lines
from rlxviz.ir import Op
from rlxviz.session import isolated

CONVBERT = Path(__file__).resolve().parent / "fixtures" / "onnx" / "zoo" / "convbert.qdq.onnx"
HOST_LINE = "node(s) the IR has no op for ran on the host"


def _inline(fn, *args, timeout_s=None, wall_s=None, max_bytes=None, what="", job=None, **kwargs):
    """`isolated.run_isolated` without its child process (the same call, here)."""
    return fn(*args, **kwargs)


def _explain_host_line(capsys, path: Path, *extra) -> str:
    code, out, err = run(capsys, "explain", path, *extra)
    assert code in (0, 1), err
    (line,) = [ln for ln in out.splitlines() if HOST_LINE in ln]
    return line


def _loaded(path: Path, monkeypatch, **kw) -> AppState:
    monkeypatch.setattr(isolated, "run_isolated", _inline)
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(path.parent))
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8, **kw)
    s.param.update(checkpoint_dir=str(path), source="checkpoint")
    assert s.model is not None and s.model.meta.get("onnx_file"), s.message
    return s


def _host_panel(s: AppState, node: int) -> str:
    """The node panel's text of `node` (clicked in the shown version)."""
    from rlxviz.app.panels import NodeInspector

    s.selected_node = node
    return NodeInspector(state=s)._text()


def test_convbert_s_host_convs_are_said_in_the_banner_the_why_tab_and_the_node_panel(capsys, monkeypatch):
    said = _explain_host_line(capsys, CONVBERT)
    assert said.startswith("4 node(s)") and "%626 Conv 'node_Conv_364'" in said, said
    s = _loaded(CONVBERT, monkeypatch)
    assert s.host_note() == said == session.describe_host(s.model.graph)  # one function, one answer
    assert said in s.message, s.message  # the load's banner, after the version-0 line, as `explain` orders them
    assert s.message.index("version 0 equals") < s.message.index(said) < s.message.index("quantized: ")
    why = s.why_layer(s.layers()[0])
    assert md_lines(said) in why and why.index(md_lines(said)) < why.index("quantized: "), why
    host = [n for n in s.model.graph if n.op == Op.ONNX_OP]
    assert [n.id for n in host] == [626, 781, 2422, 2577]
    words = session.host_words(host[0])
    assert words == "This node runs on the host (ONNX Runtime), outside MLX: the IR has no op for Conv"
    assert f"**{md_escape(words)}**" in _host_panel(s, 626)
    other = next(n.id for n in s.current_graph if n.op != Op.ONNX_OP and n.op not in (Op.INPUT, Op.PARAM))
    assert session.host_words(s.current_graph[other]) is None and "runs on the host" not in _host_panel(s, other)


def _hardmax(tmp_path: Path, name: str) -> Path:
    """x -> Relu -> Hardmax (no IR op: one `onnx_op`, named `name`) -> + x."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Hardmax", ["r"], ["h"], axis=-1, name=name),
             helper.make_node("Add", ["h", "x"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    p = tmp_path / "hardmax.onnx"
    onnx.save(m, p)
    return p


def test_a_host_node_s_name_is_data_in_the_why_tab_of_a_graph_without_layers(tmp_path, capsys, monkeypatch):
    p = _hardmax(tmp_path, "hm_*<img src=x onerror=alert(1)>*")
    said = _explain_host_line(capsys, p, "--batch", 2, "--seq", 3)
    s = _loaded(p, monkeypatch, batch=2)
    assert said in s.message and s.host_note() == said
    why = s.why_graph()
    assert md_lines(said) in why and "hm\\_\\*\\<img" in why and not re.search(r"(?<!\\)<img", why), why


def test_a_model_without_host_nodes_says_nothing_of_them():
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    assert s.host_note() == "" and "The model:" not in s.why_layer(0) and HOST_LINE not in s.message
