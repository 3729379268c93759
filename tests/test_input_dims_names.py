"""Dims given for an `.onnx` export (`--dim`, the app's Input dims box) that the export's inputs do not name, or that
set the batch or sequence length over the front end's own value (newcomer findings): a typo (`sequence_lenght=16`)
or another model's dims kept in the box was silently ignored, and `sequence_length=5000` loaded at 5000 while the
Sequence length box said 16 and `≤ 512`. Both front ends now refuse an unknown name and say which value won, in the
same words, from one session function (`session.dimroles`)."""

import pickle
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from rlxviz.app.jobs import Runner
from rlxviz.app.sources import ALLOWED_DIRS_ENV
from rlxviz.app.state import AppState
from rlxviz.models.onnx.dims import dim_roles
from rlxviz.session import InputDimsError, load

ROOT = Path(__file__).resolve().parents[1]
DEIT = ROOT / "tests/fixtures/onnx/zoo/deit.optimum.onnx"


def token_export(folder: Path, name: str = "tok") -> Path:
    """A decoder-shaped export: `x [batch_size, sequence_length, 4]` and a cache `past [batch_size, 2,
    past_sequence_length, 4]`, each through a Relu, its dims named as optimum names them."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch_size", "sequence_length", 4])
    past = helper.make_tensor_value_info("past", TensorProto.FLOAT, ["batch_size", 2, "past_sequence_length", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="/a/Relu"),
                               helper.make_node("Relu", ["past"], ["z"], name="/b/Relu")], name, [x, past], [y, z])
    path = folder / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def explain(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlxviz.cli", "explain", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_roles_say_which_dims_set_the_batch_and_the_sequence_length(tmp_path):
    g = onnx.load(token_export(tmp_path)).graph
    assert dim_roles(g.input) == {"batch_size": "batch", "sequence_length": "seq", "past_sequence_length": ""}


def test_the_cli_refuses_a_dim_name_the_inputs_do_not_have(tmp_path):
    model = token_export(tmp_path)
    r = explain(str(model), "--dim", "sequence_lenght=16")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert ("error: --dim sequence_lenght names no dimension of tok.onnx's inputs (its named dims: batch_size, "
            "sequence_length, past_sequence_length; did you mean sequence_length?)") in r.stderr, r.stderr
    r = explain(str(model), "--dim", "heigth=4", "--dim", "batchsize=2")
    assert r.returncode == 2 and ("--dim heigth, batchsize name no dimension of tok.onnx's inputs (its named dims: "
                                  "batch_size, sequence_length, past_sequence_length; did you mean batch_size for "
                                  "batchsize?)") in r.stderr, r.stderr


def test_the_session_error_says_the_same_for_either_front_end_and_pickles(tmp_path):
    model = token_export(tmp_path)
    with pytest.raises(InputDimsError) as e:
        load(str(model), dims={"sequence_lenght": 16})
    assert e.value.kind == "unknown" and e.value.names == ("sequence_lenght",), e.value.__dict__
    assert str(e.value) == e.value.said_as("--dim")
    assert e.value.said_as("Input dims:").startswith("Input dims: sequence_lenght names no dimension of tok.onnx")
    back = pickle.loads(pickle.dumps(e.value))  # as `session.isolated` sends it from its child
    assert type(back) is InputDimsError and back.__dict__ == e.value.__dict__ and str(back) == str(e.value)


def test_the_cli_says_a_dim_overrides_seq_and_batch(tmp_path):
    model = token_export(tmp_path)
    r = explain(str(model), "--seq", "16", "--dim", "sequence_length=40", "--dim", "batch_size=2")
    assert r.returncode == 0, r.stderr
    notes = [ln for ln in r.stderr.splitlines() if "overrides" in ln]
    assert notes == ["note: sequence_length=40 from --dim overrides --seq 16",
                     "note: batch_size=2 from --dim overrides --batch 1"], r.stderr
    r = explain(str(model), "--seq", "40", "--dim", "sequence_length=40", "--dim", "past_sequence_length=4")
    assert r.returncode == 0 and "overrides" not in r.stderr, r.stderr  # the same value, and a dim of no box


def test_a_bound_applies_to_a_dim_that_sets_the_sequence_length(tmp_path):
    model = token_export(tmp_path)
    with pytest.raises(InputDimsError) as e:
        load(str(model), dims={"sequence_length": 600}, bounds={"seq": 512})
    assert (e.value.kind, e.value.box, e.value.most) == ("bound", "seq", 512)
    assert str(e.value) == "--dim sequence_length=600 sets the sequence length, past the most it may be here (512)"
    # a dim of no box (the cache's length) is bounded by the memory limit only, as is any dim without bounds (the CLI)
    m = load(str(model), dims={"sequence_length": 500, "past_sequence_length": 600}, bounds={"seq": 512, "batch": 64})
    assert [n.shape for n in m.graph.inputs] == [(1, 500, 4), (1, 2, 600, 4)]
    assert [n.shape for n in load(str(model), dims={"sequence_length": 600}).graph.inputs][0] == (1, 600, 4)


def app(tmp_path, monkeypatch) -> tuple[AppState, Path]:
    folder = tmp_path / "models"
    folder.mkdir()
    model = token_export(folder)
    monkeypatch.setenv(ALLOWED_DIRS_ENV, f"{folder}:{DEIT.parent}")
    return AppState(runner=Runner(background=False), preset="bert-tiny", seq=8), model


def test_the_app_refuses_an_unknown_name_and_loads_once_the_box_is_cleared(tmp_path, monkeypatch):
    s, model = app(tmp_path, monkeypatch)
    s.param.update(checkpoint_dir=str(model), source="checkpoint", dims="batch_size=4 sequence_lenght=16")
    assert s.message_kind == "danger" and s.model.name == "bert-tiny", s.message
    assert s.message.startswith("Input dims: sequence_lenght names no dimension of tok.onnx's inputs (its named "
                                "dims: batch_size, sequence_length, past_sequence_length; did you mean "
                                "sequence_length?): clear or change the Input dims box."), s.message
    s.dims = ""
    assert s.model.name == "tok" and s.message_kind != "danger", s.message
    assert [n.shape for n in s.model.graph.inputs] == [(1, 8, 4), (1, 2, 8, 4)]


def test_the_app_says_the_box_was_kept_from_the_last_model(tmp_path, monkeypatch):
    s, model = app(tmp_path, monkeypatch)
    s.param.update(checkpoint_dir=str(DEIT), source="checkpoint", dims="num_channels=3 height=32 width=32")
    assert s.model.name == "deit.optimum", s.message
    s.checkpoint_dir = str(model)
    assert s.message_kind == "danger" and s.model.name == "deit.optimum", s.message
    assert ("Input dims: num_channels, height, width name no dimension of tok.onnx's inputs (its named dims: "
            "batch_size, sequence_length, past_sequence_length); the box still holds the dims given for "
            "deit.optimum: clear or change the Input dims box.") in s.message, s.message
    s.dims = " "
    assert s.model.name == "tok", s.message


def test_the_app_says_which_value_won_and_bounds_the_dim_as_its_box(tmp_path, monkeypatch):
    s, model = app(tmp_path, monkeypatch)
    s.param.update(checkpoint_dir=str(model), source="checkpoint", dims="sequence_length=5000 past_sequence_length=4")
    assert s.message_kind == "danger" and s.model.name == "bert-tiny", s.message
    assert s.message.startswith("Input dims: sequence_length=5000 sets the sequence length, past the most it may be "
                                "here (512); it overrides the Sequence length box, which takes at most 512: clear "
                                "or change the Input dims box."), s.message
    s.dims = "sequence_length=40 past_sequence_length=4"
    assert s.model.name == "tok" and s.message_kind == "info", s.message
    assert [n.shape for n in s.model.graph.inputs] == [(1, 40, 4), (1, 2, 4, 4)]
    assert "sequence_length=40 from Input dims overrides Sequence length 8" in s.message, s.message


def test_an_upload_is_named_as_the_user_named_it(tmp_path, monkeypatch):
    s, model = app(tmp_path, monkeypatch)
    s.dims = "sequence_lenght=16"
    s.load_upload({"my-net.onnx": model.read_bytes()})
    assert s.message_kind == "danger" and "no dimension of my-net.onnx's inputs" in s.message, s.message
