"""An `.onnx` file counts against the memory limit before it is parsed (issue 40: a 256 MB doc_string was read
whole, 1,340 MB peak under a 64 MiB budget): its size `FILE_COPIES` times, its text capped like IR text, from a
wire walk that builds no message (`models.onnx.size`). Small-scale: files of a few MiB under a limit of a few MiB."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from clirun import one_line
from clirun import run as cli_run
from onnx import TensorProto, helper, numpy_helper

from rlxviz.models.onnx import OnnxImportError, dims, load_onnx
from rlxviz.models.onnx import size as onnx_size
from rlxviz.models.onnx.size import FREE_BYTES, count_bytes, over_budget
from rlxviz.session import Limits, SessionError, load

MIB = 1 << 20
ZOO = sorted((Path(__file__).parent / "fixtures" / "onnx" / "zoo").glob("*.onnx"))


def relu_model(where: str = "", n: int = 0, weight_rows: int = 0) -> onnx.ModelProto:
    """`y = relu(x) [+ w]` on x f32[rows, 8], valid for onnx.checker, with `n` bytes of text at `where`."""
    rows = max(weight_rows, 1)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, 8])
    nodes = [helper.make_node("Relu", ["x"], ["r" if weight_rows else "y"], name="relu")]
    inits = []
    if weight_rows:
        inits.append(numpy_helper.from_array(np.ones((rows, 8), np.float32), "w"))
        nodes.append(helper.make_node("Add", ["r", "w"], ["y"], name="add"))
    g = helper.make_graph(nodes, "g", [x], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    text = "d" * n
    if where == "model.doc_string":
        m.doc_string = text
    elif where == "model.graph.doc_string":
        m.graph.doc_string = text
    elif where == "model.graph.node.doc_string":
        m.graph.node[0].doc_string = text
    elif where == "model.metadata_props.value":
        m.metadata_props.add(key="note", value=text)
    elif where == "model.graph.input.doc_string":
        m.graph.input[0].doc_string = text
    return m


def save(tmp_path, m: onnx.ModelProto, name: str = "m.onnx"):
    p = tmp_path / name
    onnx.save(m, str(p))
    return p


TEXT_PLACES = ["model.doc_string", "model.graph.doc_string", "model.graph.node.doc_string",
               "model.metadata_props.value", "model.graph.input.doc_string"]


@pytest.mark.parametrize("where", TEXT_PLACES)
def test_a_big_string_is_refused_before_parsing_naming_its_field(where, tmp_path, monkeypatch):
    p = save(tmp_path, relu_model(where, 2 * MIB))
    monkeypatch.setattr(onnx, "load", lambda *a, **k: pytest.fail("parsed a file over the limit"))
    monkeypatch.setattr(dims, "mmap", SimpleNamespace(mmap=lambda *a, **k: pytest.fail("parsed a file over the limit")))
    with pytest.raises(OnnxImportError) as e:
        load_onnx(p, max_bytes=4 * MIB)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{p}: reading this 2.0 MiB file needs about 8.0 MiB")
    assert "over the limit of 4.0 MiB (--max-memory-mb / RLXVIZ_MAX_MEMORY_MB)" in msg
    assert msg.endswith(f"its largest text field is {where} (2.0 MiB)"), msg


@pytest.mark.parametrize("where", TEXT_PLACES[:2])
def test_the_same_file_under_a_limit_that_holds_it_loads(where, tmp_path):
    """Counted, not banned: FILE_COPIES x 2 MiB fits a 16 MiB limit, and the model's numbers are Relu's."""
    p = save(tmp_path, relu_model(where, 2 * MIB))
    m = load_onnx(p, max_bytes=16 * MIB)
    assert m.graph.inputs[0].shape == (1, 8)


def test_weights_count_too(tmp_path, monkeypatch):
    """A file that is mostly tensor data (2 MiB of raw_data) is counted by its size alike; no text field named."""
    p = save(tmp_path, relu_model(weight_rows=65536))
    counted = count_bytes(p)
    assert counted.data >= 2 * MIB and counted.text < 1024
    monkeypatch.setattr(onnx, "load", lambda *a, **k: pytest.fail("parsed a file over the limit"))
    monkeypatch.setattr(dims, "mmap", SimpleNamespace(mmap=lambda *a, **k: pytest.fail("parsed a file over the limit")))
    with pytest.raises(OnnxImportError, match=r"needs about 8\.0 MiB .* over the limit of 4\.0 MiB") as e:
        load_onnx(p, max_bytes=4 * MIB)
    assert "largest text field" not in str(e.value)


def test_small_files_are_read_whatever_the_limit(tmp_path):
    """Below FREE_BYTES the size is not counted (a tiny limit is about tensors: the existing checks say so)."""
    p = save(tmp_path, relu_model("model.doc_string", FREE_BYTES // 2))
    assert over_budget(p, 1024) is None


@pytest.mark.parametrize("where", TEXT_PLACES[1:3])
def test_text_over_its_cap_is_refused_whatever_the_limit(where, tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_size, "MAX_TEXT_BYTES", MIB)  # the 64 MiB cap, at small scale
    p = save(tmp_path, relu_model(where, MIB + MIB // 2))
    with pytest.raises(OnnxImportError) as e:
        load_onnx(p, max_bytes=2 << 30)
    assert "of text (doc strings, names, string attributes), over the limit of 1.0 MiB on an ONNX file's text" \
        in str(e.value) and f"its largest text field is {where} (1.5 MiB)" in str(e.value)


def test_the_session_loader_refuses_with_its_limit(tmp_path):
    p = save(tmp_path, relu_model("model.doc_string", 2 * MIB))
    with pytest.raises(SessionError, match="reading this 2.0 MiB file needs about 8.0 MiB"):
        load(str(p), limits=Limits(4, "test"))


COMMANDS = [("explain",), ("ir",), ("time", "--repeat", "1", "--warmup", "0"), ("render", "-o", "{tmp}/g.svg"),
            ("overlay", "--kind", "error"), ("export", "{tmp}/out.onnx")]


@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
@pytest.mark.parametrize("where", ["model.doc_string", "model.graph.node.doc_string"])
def test_every_subcommand_refuses_in_one_line(command, where, tmp_path, capsys, monkeypatch):
    p = save(tmp_path, relu_model(where, 2 * MIB))
    monkeypatch.setenv("RLXVIZ_MAX_MEMORY_MB", "4")
    monkeypatch.setattr(onnx, "load", lambda *a, **k: pytest.fail("parsed a file over the limit"))
    monkeypatch.setattr(dims, "mmap", SimpleNamespace(mmap=lambda *a, **k: pytest.fail("parsed a file over the limit")))
    code, _, err = cli_run(capsys, command[0], p, *(a.format(tmp=tmp_path) for a in command[1:]))
    line = one_line(err, command[0])
    assert code == 2 and str(p) in line and f"its largest text field is {where}" in line, line


def test_run_with_inputs_refuses_in_one_line(tmp_path, capsys, monkeypatch):
    p = save(tmp_path, relu_model("model.graph.doc_string", 2 * MIB))
    np.savez(tmp_path / "in.npz", x=np.ones((1, 8), np.float32))
    monkeypatch.setenv("RLXVIZ_MAX_MEMORY_MB", "4")
    code, _, err = cli_run(capsys, "run", p, "--inputs", tmp_path / "in.npz", "--output", tmp_path / "out.npz")
    line = one_line(err, "run")
    assert code == 2 and "needs about 8.0 MiB" in line and "model.graph.doc_string" in line, line


@pytest.mark.parametrize("path", ZOO[:12], ids=lambda p: p.name)
def test_real_exports_walk_whole_and_pass(path):
    """The walk reaches each zoo file's end, finds nearly all its bytes as text or tensor data (the rest is tags
    and numbers), and a real export is never refused under a 64 MiB limit."""
    counted = count_bytes(path)
    assert counted.complete and counted.file == path.stat().st_size
    assert 0.9 <= (counted.text + counted.data) / counted.file <= 1.0
    assert over_budget(path, 64 * MIB) is None


def test_the_walk_never_raises_on_damaged_files(tmp_path):
    """Truncated and byte-flipped copies of a real export: the walk ends (complete or not, the parser then gives
    its own verdict) and counts no more bytes than the file has."""
    src = ZOO[0].read_bytes()
    rng = np.random.default_rng(0)
    for k in range(60):
        data = bytearray(src[: int(rng.integers(1, len(src)))] if k % 2 else src)
        for i in rng.integers(0, len(data), size=8):
            data[i] = int(rng.integers(0, 256))
        p = tmp_path / f"m{k}.onnx"
        p.write_bytes(bytes(data))
        counted = count_bytes(p)
        assert counted.file == len(data) and counted.text + counted.data <= len(data)

