"""Large `.onnx` files by path (issue 39): a path under `RLXVIZ_ALLOWED_DIRS` typed in the Folder source's box loads
the export with its external data in place; paths outside the roots (`..`, symlinks, external data pointing out) are
refused in one line; an upload over the limit says where to put the file instead; the input graph is shown before
the passes run."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlxviz.app.jobs import Runner
from rlxviz.app.sources import ALLOWED_DIRS_ENV, PATH_BOX, SourceError, check_upload, where_big_files
from rlxviz.app.state import AppState
from rlxviz.app.views import COLLAPSED

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """A 2-layer LLaMA-shaped export (`scripts/make_big_onnx.py --shape tiny`), every weight in `tiny.onnx.data`."""
    out = tmp_path_factory.mktemp("export") / "tiny.onnx"
    subprocess.run([sys.executable, str(ROOT / "scripts/make_big_onnx.py"), "--shape", "tiny", "--layers", "2",
                    str(out)], check=True, capture_output=True, cwd=ROOT)
    assert (out.parent / "tiny.onnx.data").is_file()
    return out


def state() -> AppState:
    return AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)


def models_dir(tmp_path: Path, exported: Path) -> Path:
    """`tmp_path/models` holding the export and its external data, as a server's model folder would."""
    inside = tmp_path / "models"
    inside.mkdir()
    for f in (exported, exported.parent / "tiny.onnx.data"):
        shutil.copy(f, inside / f.name)
    return inside


def open_path(s: AppState, path: str) -> None:
    s.param.update(checkpoint_dir=path, source="checkpoint")


def refused(s: AppState, *words: str) -> None:
    assert s.message_kind == "danger", s.message
    assert len(s.message.strip().splitlines()) == 1 and "Traceback" not in s.message, s.message
    for w in words:
        assert w in s.message, s.message


def test_an_upload_over_the_limit_names_the_allowed_folder_and_the_path_box(tmp_path):
    with pytest.raises(SourceError) as e:
        check_upload({"big.onnx": b"\0" * 2048}, limit=1024)
    msg = str(e.value)
    assert "at most 0 MB" in msg and ALLOWED_DIRS_ENV in msg and PATH_BOX in msg
    said = where_big_files([tmp_path])
    assert str(tmp_path) in said and PATH_BOX in said and "not uploaded" in said
    said = where_big_files([])  # no folder allowed: how to start the server with one
    assert f"{ALLOWED_DIRS_ENV}=" in said and PATH_BOX in said


def test_the_app_upload_over_the_limit_says_where_to_put_it(monkeypatch, tmp_path):
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(tmp_path))
    monkeypatch.setenv("RLXVIZ_MAX_UPLOAD_MB", "0.001")
    s = state()
    s.load_upload({"llama-8b.onnx": b"\0" * 4096})
    refused(s, tmp_path.name, PATH_BOX)  # the folder named (a temp folder's head is written <temp>)


@pytest.mark.sweep  # each load runs in the isolated child process
def test_an_onnx_path_under_the_roots_loads_with_its_external_data(monkeypatch, tmp_path, exported):
    inside = models_dir(tmp_path, exported)
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(inside))
    s = state()
    open_path(s, str(inside / "tiny.onnx"))
    assert s.message_kind != "danger", s.message
    assert Path(s.model.meta["onnx_file"]).resolve() == (inside / "tiny.onnx").resolve()
    assert len(s.trace.steps) > 0 and len(s.layers()) == 2
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob(f"rlxviz-upload-{os.getpid()}-*"))  # nothing copied


@pytest.mark.sweep  # each load runs in the isolated child process
def test_onnx_paths_outside_the_roots_are_refused_in_one_line(monkeypatch, tmp_path, exported):
    inside = models_dir(tmp_path, exported)
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(inside))
    s = state()
    open_path(s, str(exported))  # a real file, elsewhere
    refused(s, "outside the allowed")
    open_path(s, str(inside / ".." / ".." / exported.parent.name / "tiny.onnx"))  # `..` out of the root
    refused(s, "outside the allowed")
    (inside / "link.onnx").symlink_to(exported)  # a symlink inside pointing out
    open_path(s, str(inside / "link.onnx"))
    refused(s, "outside the allowed")
    (inside / "sub").symlink_to(exported.parent, target_is_directory=True)  # a linked folder pointing out
    open_path(s, str(inside / "sub" / "tiny.onnx"))
    refused(s, "outside the allowed")
    open_path(s, str(inside / "missing.onnx"))
    refused(s, "no such file")
    assert s.model.name == "bert-tiny"  # every refusal left the model shown as it was


@pytest.mark.sweep  # each load runs in the isolated child process
def test_external_data_linked_out_of_the_model_folder_is_refused(monkeypatch, tmp_path, exported):
    inside = tmp_path / "models"
    inside.mkdir()
    shutil.copy(exported, inside / "tiny.onnx")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(exported.parent / "tiny.onnx.data", outside / "tiny.onnx.data")
    (inside / "tiny.onnx.data").symlink_to(outside / "tiny.onnx.data")  # the weights come from outside the root
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(inside))
    s = state()
    open_path(s, str(inside / "tiny.onnx"))
    refused(s, "outside")


@pytest.mark.sweep  # each load runs in the isolated child process
def test_the_input_graph_is_shown_before_the_passes(monkeypatch, tmp_path, exported):
    """The first trace a new model shows has no pass (its input graph as read); the full run follows and selects the
    version selected before (the input)."""
    inside = models_dir(tmp_path, exported)
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(inside))
    s = state()
    s.view = COLLAPSED  # one box per layer: where a verdict would show
    seen, drawn = [], []
    s.param.watch(lambda e: seen.append((e.new is not None and len(e.new.steps), s.model and s.model.name)), "trace")
    s.param.watch(lambda e: e.new is not None and drawn.append(s.svg()), "trace")
    open_path(s, str(inside / "tiny.onnx"))
    assert s.message_kind != "danger", s.message
    assert seen[0] == (0, s.model.name) and seen[-1][0] > 0, seen
    assert "layers.1" in drawn[0] and "not fused" not in drawn[0] and "rejected" not in drawn[0]  # no verdict yet
    assert "fused" in drawn[-1].replace("unfused", "")  # the full run's boxes say their verdict
    assert s.version == 0 and s.trace.steps
    seen.clear()
    s.seq = 12  # a reload of the same source: a new model, again drawn first
    assert seen and seen[0][0] == 0 and seen[-1][0] > 0, seen
