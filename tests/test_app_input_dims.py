"""An `.onnx` export with a symbolic dim that batch and sequence length do not bind (a vision model's `height`,
`width`): the CLI names the inputs file beside the model that would bind it (`--inputs`), and the app, which has no
`--dim` flag, binds it with the sidebar's Input dims box and says so in its message (newcomer run 26: beit.optimum's
bare `explain` stopped at "cannot bind dimension 2 (height)" with the npz beside it; the app said `--dim`)."""

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from rlxviz.app.jobs import Runner
from rlxviz.app.sources import ALLOWED_DIRS_ENV, SourceError, parse_dims
from rlxviz.app.state import AppState
from rlxviz.app.statusbar import _md_text
from rlxviz.app.text import md_escape
from rlxviz.session import SessionError
from rlxviz.session.inputs import inputs_beside

ROOT = Path(__file__).resolve().parents[1]
BEIT = ROOT / "tests/fixtures/onnx/zoo/beit.optimum.onnx"


def vision_export(folder: Path, name: str = "conv") -> Path:
    """A pixel model `[batch, 3, height, width] -> relu(x * 2)`, its spatial dims symbolic, as optimum exports
    image models."""
    x = helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, "height", "width"])
    y = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 3, "height", "width"])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph([helper.make_node("Mul", ["pixel_values", "two"], ["m"], name="/scale/Mul"),
                               helper.make_node("Relu", ["m"], ["out"], name="/act/Relu")],
                              name, [x], [y], [two])
    path = folder / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def explain(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlxviz.cli", "explain", str(path)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


@pytest.mark.parametrize("beside", ["{stem}_io.npz", "{stem}.npz"])
def test_the_cli_names_the_inputs_file_beside_the_model(tmp_path, beside):
    model = vision_export(tmp_path)
    npz = tmp_path / beside.format(stem="conv")
    np.savez(npz, pixel_values=np.ones((1, 3, 4, 5), np.float32))
    r = explain(model)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "cannot bind dimensions 2 (height), 3 (width)" in r.stderr, r.stderr
    # the dims its array's shape gives, read from the npz's header (newcomer run: asked for one dim at a time), first
    assert (f"error: {model}: --dim height=4 --dim width=5 (from the shapes in {npz.name} beside the file), or "
            f"--inputs {npz}; input 'pixel_values'") in r.stderr, r.stderr


def test_no_file_beside_or_one_without_the_input_names_none(tmp_path):
    model = vision_export(tmp_path)
    assert inputs_beside(model, "pixel_values") is None
    np.savez(tmp_path / "conv_io.npz", input_ids=np.zeros((1, 4), np.int64))  # another input's array
    (tmp_path / "conv.npz").write_bytes(b"not a zip")  # unreadable: no hint, no error
    assert inputs_beside(model, "pixel_values") is None
    r = explain(model)
    assert r.returncode == 2 and "beside the file" not in r.stderr and "--dim height=N" in r.stderr, r.stderr


def test_beit_optimum_names_its_npz():
    r = explain(BEIT)
    assert r.returncode == 2 and "(from the shapes in beit.optimum.npz beside the file), or --inputs " in r.stderr, \
        r.stderr


def test_parse_dims_reads_pairs_and_refuses_in_app_words():
    assert parse_dims("height=224, width=160") == (("height", 224), ("width", 160))
    assert parse_dims("  ") == ()
    for bad in ("height", "height=x", "height=0", "=4"):
        with pytest.raises(SourceError, match="Input dims: .* is not NAME=N"):
            parse_dims(bad)


def test_the_app_asks_for_the_dims_box_then_loads_with_it(tmp_path, monkeypatch):
    folder = tmp_path / "models"
    folder.mkdir()
    model = vision_export(folder)
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(folder))
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    shown = s.model.name
    s.param.update(checkpoint_dir=str(model), source="checkpoint")
    assert s.message_kind == "danger" and "Traceback" not in s.message, s.message
    assert f"{model}: set height=N width=N in the sidebar's Input dims box; input 'pixel_values': cannot bind " \
           "dimensions 2 (height), 3 (width)" in s.message, s.message
    assert "--dim" not in s.message and "--inputs" not in s.message and f"Still showing {shown}" in s.message
    assert "beside the model" not in s.message  # no inputs file beside it
    assert s.dims_hint == "height=N width=N"  # no value known: the message's N
    s.dims = "height=bad"
    assert s.message_kind == "danger" and "Input dims: 'height=bad' is not NAME=N" in s.message, s.message
    s.dims = "height=4 width=5"
    assert s.model is not None and s.model.name == "conv", s.message
    assert [n.shape for n in s.model.graph.inputs] == [(1, 3, 4, 5)]


def conv_export(folder: Path) -> Path:
    """An image model as optimum exports one: `pixel_values [batch, num_channels, height, width]`, every dim symbolic,
    into a Conv of 3 input channels."""
    x = helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", "num_channels", "height", "width"])
    y = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 2, 2], np.ones(48, np.float32))
    graph = helper.make_graph([helper.make_node("Conv", ["pixel_values", "w"], ["out"], name="/patch/Conv",
                                                strides=[2, 2])], "patches", [x], [y], [w])
    path = folder / "patches.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_an_images_channels_never_take_the_sequence_length(tmp_path):
    """beit.optimum with `--dim height=224 --dim width=224` failed at its Conv ("input [1, 16, 224, 224] does not fit
    the kernel [32, 3, 8, 8]"): axis 1 of `pixel_values` took seq. A dim whose name says what it is, or axis 1 of a
    rank-4 input, is bound only by the user; the error names it."""
    from rlxviz.models.onnx import load_onnx
    from rlxviz.models.onnx.dims import default_dim, onnx_input_shapes

    model = conv_export(tmp_path)
    r = subprocess.run([sys.executable, "-m", "rlxviz.cli", "explain", str(model), "--dim", "height=8", "--dim",
                        "width=8"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "cannot bind dimension 1 (num_channels)" in r.stderr, r.stderr
    assert onnx_input_shapes(model, 1, 16, {"num_channels": 3, "height": 8, "width": 8}) == {
        "pixel_values": (1, 3, 8, 8)}
    with pytest.raises(Exception, match=r"cannot bind dimension 1 \(num_channels\)"):
        load_onnx(model, batch=1, seq=16)  # the Python API binds as the CLI does (`bind._bind_input`)
    assert load_onnx(model, input_shapes={"pixel_values": (1, 3, 8, 8)}).graph.outputs
    # by place: axis 1 of [batch, s] / [batch, s, hidden] is the sequence; of a rank-4 input it is not
    assert default_dim("s", 1, 2, 16, 2) == 16 and default_dim("s", 1, 2, 16, 3) == 16
    assert default_dim("d1", 1, 2, 16, 4) is None and default_dim("num_channels", 1, 2, 16, 2) is None
    assert default_dim("sequence_length", 2, 2, 16, 4) == 16 and default_dim("batch_size", 0, 2, 16, 4) == 2
    assert [n.shape for n in load_onnx(model, input_shapes={"pixel_values": (2, 3, 6, 4)}).graph.inputs] == [
        (2, 3, 6, 4)]


def test_beit_optimum_loads_with_its_channels_named(tmp_path):
    r = subprocess.run([sys.executable, "-m", "rlxviz.cli", "explain", str(BEIT), "--seq", "3", "--dim", "height=32",
                        "--dim", "width=32"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 2 and "cannot bind dimension 1 (num_channels); pass --dim num_channels=N" in r.stderr
    r = subprocess.run([sys.executable, "-m", "rlxviz.cli", "explain", str(BEIT), "--dim", "num_channels=3", "--dim",
                        "height=32", "--dim", "width=32"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0 and "2/2 layer(s) fused as expected" in r.stdout, r.stdout + r.stderr


DEIT = ROOT / "tests/fixtures/onnx/zoo/deit.optimum.onnx"
QWEN_KV = ROOT / "tests/fixtures/onnx/zoo/qwen2.kv.onnx"


def test_the_cli_names_every_unbound_dim_and_the_values_beside_it():
    """Newcomer run: deit.optimum was refused for num_channels, then height, then width; qwen2.kv's `past + 1` gave an
    empty `(Python: dims=)`. One line names them all, with the values the npz beside the model gives."""
    r = explain(DEIT)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert ("input 'pixel_values': cannot bind dimensions 1 (num_channels), 2 (height), 3 (width); pass --dim "
            "num_channels=N --dim height=N --dim width=N (Python: dims={'num_channels': N, 'height': N, 'width': N}) "
            "or the input's array with --inputs") in r.stderr, r.stderr
    assert ": --dim num_channels=3 --dim height=32 --dim width=32 (from the shapes in deit.optimum.npz beside the " \
           "file), or --inputs " in r.stderr, r.stderr
    r = explain(QWEN_KV)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert ("qwen2.kv.onnx: --dim past=7 (from the shapes in qwen2.kv.npz beside the file), or --inputs "  # its
            f"{QWEN_KV.with_suffix('.npz')}; input 'attention_mask': dimension 1 (past + 1) needs 'past'; pass --dim "
            "past=N (Python: dims={'past': N}) or the inputs with --inputs") in r.stderr, r.stderr  # kv's axis 2
    r = subprocess.run([sys.executable, "-m", "rlxviz.cli", "explain", str(QWEN_KV), "--dim", "past=7"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr  # the values proposed bind it


def test_the_app_names_every_unbound_dim_and_the_shapes_beside_the_model(monkeypatch):
    """The app asked for num_channels, then height, then width (one reload each), and never said the npz beside
    the model holds the shapes: now one message names all three for the Input dims box and gives the npz's values,
    which load the model."""
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(DEIT.parent))
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    s.param.update(checkpoint_dir=str(DEIT), source="checkpoint")
    assert s.message_kind == "danger" and s.model.name == "bert-tiny", s.message
    assert (f"{DEIT}: set num_channels=3 height=32 width=32 in the sidebar's Input dims box (from the shapes in "
            "deit.optimum.npz beside the model); input 'pixel_values': cannot bind dimensions 1 (num_channels), "
            "2 (height), 3 (width)") in s.message, s.message
    assert "--dim" not in s.message and "--inputs" not in s.message and "Still showing bert-tiny" in s.message
    # the empty box's placeholder is what the message asks for, not the 224 x 224 example (newcomer run 39)
    assert s.dims_hint == "num_channels=3 height=32 width=32"
    s.dims = "num_channels=3 height=32 width=32"
    assert s.model.name == "deit.optimum" and s.message_kind != "danger", s.message
    assert [n.shape for n in s.model.graph.inputs][0][1:] == (3, 32, 32)


def test_the_app_says_which_array_beside_the_model_when_its_shapes_give_no_value(tmp_path, monkeypatch):
    """An npz beside the model that holds the input, but no array with the name as a dim of its own (only in an
    expression), gives no value: the message names the array instead; one dim is `it`."""
    from rlxviz.session import UnboundDimsError

    folder = tmp_path / "models"
    folder.mkdir()
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "past + 1"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "past + 1"])
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "m", [x], [y]),
                                opset_imports=[helper.make_opsetid("", 17)]), folder / "m.onnx")
    np.savez(folder / "m_io.npz", x=np.ones((1, 5), np.float32))
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(folder))
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    s.param.update(checkpoint_dir=str(folder / "m.onnx"), source="checkpoint")
    assert ("m.onnx: set past=N in the sidebar's Input dims box (m_io.npz beside the model holds the array of 'x'); "
            "input 'x': dimension 1 (past + 1) needs 'past'") in s.message, s.message
    from rlxviz.session import load

    with pytest.raises(UnboundDimsError) as e:  # the session's error, as the CLI prints it
        load(str(folder / "m.onnx"))
    assert e.value.names == ("past",) and e.value.beside == "m_io.npz" and e.value.proposed == {}
    back = pickle.loads(pickle.dumps(e.value))  # as `session.isolated` sends it from its child
    assert type(back) is UnboundDimsError and back.__dict__ == e.value.__dict__ and str(back) == str(e.value)
    assert str(e.value).startswith(f"{folder / 'm.onnx'}: --inputs {folder / 'm_io.npz'} (m_io.npz beside the file "
                                   "holds the array of 'x'); input 'x': dimension 1 (past + 1) needs 'past'; pass "
                                   "--dim past=N"), str(e.value)


MISFIT = "num_channels=3 height=64 width=64"
"""deit.optimum's dims at a size its position embeddings (18 = 16 patches + 2 tokens at 32x32) do not fit."""


def test_dims_that_break_a_fixed_shape_are_named_on_the_messages_first_line(monkeypatch):
    """Newcomer run 31: deit.optimum with `height=100000 width=100000` said only `ShapeError: shapes [1, 156250002,
    32] and [1, 18, 32] do not broadcast at embeddings`. Run 32: the line naming the dims came second, and the
    banner (folded to its first line) and the stale box (`stale_why`: the first line) showed only the ShapeError."""
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(DEIT.parent))
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    s.param.update(checkpoint_dir=str(DEIT), source="checkpoint", dims=f" {MISFIT.replace(' ', ',  ')} ")
    assert s.message_kind == "danger" and s.model.name == "bert-tiny", s.message
    first, *rest = s.message.splitlines()
    said = f"Input dims {MISFIT} do not fit {DEIT}: Add node '/embeddings/Add' (opset 18): ShapeError: shapes "
    assert first.startswith(said) and "[add]" not in first, s.message
    assert rest and "change or clear them in the sidebar's Input dims box" in rest[-1], s.message
    assert f"loading the new one failed: {said[:60]}" in s.stale, s.stale  # the stale box's line
    assert md_escape(said[:40]) in _md_text(s.message).split("\n")[0]  # the banner's first line
    s.dims = "num_channels=3 height=32 width=32"
    assert s.model.name == "deit.optimum" and s.message_kind != "danger", s.message


def test_the_session_names_the_dims_a_shape_error_followed_from():
    """One error for both front ends (`DimsMisfitError`): the CLI prints the dims first as `--dim` options, the app
    as its Input dims box's values; it pickles (`session.isolated` sends it from its child)."""
    from rlxviz.app.wording import explain_error
    from rlxviz.session import DimsMisfitError, load

    dims = dict(parse_dims(MISFIT))
    with pytest.raises(DimsMisfitError) as e:
        load(str(DEIT), dims=dims)
    back = pickle.loads(pickle.dumps(e.value))
    assert type(back) is DimsMisfitError and back.__dict__ == e.value.__dict__ and str(back) == str(e.value)
    assert e.value.dims == dims and e.value.said.startswith("Add node '/embeddings/Add' (opset 18): ShapeError:")
    assert str(e.value).startswith(f"{DEIT}: --dim num_channels=3 --dim height=64 --dim width=64 do not fit this "
                                   f"model: {e.value.said}"), str(e.value)
    app = explain_error(e.value, "checkpoint", "bert-tiny", onnx=True)
    assert app.splitlines()[0] == f"Input dims {MISFIT} do not fit {DEIT}: {e.value.said.replace('[add] ', '')}"
    with pytest.raises(SessionError) as other:  # no dims given (an input's whole shape): nothing to name
        load(str(DEIT), input_shapes={"pixel_values": (1, 3, 64, 64)})
    assert type(other.value) is SessionError and "ShapeError" in str(other.value), str(other.value)


def test_the_cli_names_the_dims_a_shape_error_followed_from():
    r = subprocess.run([sys.executable, "-m", "rlxviz.cli", "explain", str(DEIT), "--dim", "num_channels=3", "--dim",
                        "height=64", "--dim", "width=64"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert (f"error: {DEIT}: --dim num_channels=3 --dim height=64 --dim width=64 do not fit this model: Add node "
            "'/embeddings/Add' (opset 18): ShapeError:") in r.stderr, r.stderr
    assert r.stderr.rstrip().endswith("; change or leave out the --dim values"), r.stderr


def test_the_dims_boxs_placeholder_follows_the_model_that_asked(monkeypatch):
    """The Input dims box's placeholder is what the last unbound-dims message asks to type, shown in the widget, and
    another model's source puts the example back (deit.optimum's message said height=32 under a 224 example)."""
    from rlxviz.app.controls import ModelControls
    from rlxviz.app.sources import DIMS_EXAMPLE

    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(DEIT.parent))
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    box = ModelControls(state=s).dims
    assert box.placeholder == DIMS_EXAMPLE
    s.param.update(checkpoint_dir=str(DEIT), source="checkpoint")
    assert box.placeholder == "num_channels=3 height=32 width=32", s.message
    s.source = "preset"
    assert box.placeholder == DIMS_EXAMPLE


def test_the_dims_box_is_off_for_a_checkpoint_folder(tmp_path, monkeypatch):
    """A Hugging Face checkpoint folder has no symbolic dims: the Input dims box, which it ignores, is disabled with a
    note saying why; an `.onnx` path turns it back on (newcomer run: the box was silently ignored)."""
    from rlxviz.app.controls import ModelControls

    monkeypatch.setenv(ALLOWED_DIRS_ENV, f"{tmp_path}:{DEIT.parent}")
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    mc = ModelControls(state=s)
    assert not mc.dims.disabled and mc.shape_note.object == ""
    s.param.update(checkpoint_dir=str(tmp_path), source="checkpoint")  # a folder (refused: no config.json in it)
    assert mc.dims.disabled and "apply to an .onnx export only" in mc.shape_note.object
    assert not mc.batch.disabled and not mc.seq.disabled
    s.param.update(checkpoint_dir=str(DEIT))
    assert not mc.dims.disabled and mc.shape_note.object == ""
