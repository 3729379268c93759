"""Open by path with a relative path (issue 39's newcomer: "onnx/roberta.onnx" was refused as outside the allowed
folders, though the only allowed folder held it): it is resolved against the allowed folder that holds it; in two,
it is refused as ambiguous; `..` and symlinks out of a folder stay refused. A refused path says which model is still
shown, as a refused upload does."""

from pathlib import Path

import pytest

from rlxviz.app.jobs import Runner
from rlxviz.app.sources import ALLOWED_DIRS_ENV, SourceError, resolve_in_roots
from rlxviz.app.state import AppState

FIX = Path(__file__).parent / "fixtures" / "onnx"


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Two allowed folders `a` and `b` and a folder `out` beside them holding `secret.onnx`."""
    a, b, out = (tmp_path / n for n in ("a", "b", "out"))
    for d in (a / "onnx", b / "other", out):
        d.mkdir(parents=True)
    (a / "onnx" / "m.onnx").write_bytes(b"x")
    (b / "other" / "n.onnx").write_bytes(b"x")
    (out / "secret.onnx").write_bytes(b"x")
    return a.resolve(), b.resolve(), out.resolve()


@pytest.mark.parametrize("typed, root, rel", [("onnx/m.onnx", 0, "onnx/m.onnx"), ("./onnx/m.onnx", 0, "onnx/m.onnx"),
                                               ("other/n.onnx", 1, "other/n.onnx"), ("onnx", 0, "onnx"),
                                               (" onnx/m.onnx ", 0, "onnx/m.onnx")])
def test_a_relative_path_is_found_in_the_allowed_folder_that_holds_it(roots, typed, root, rel):
    got = Path(resolve_in_roots(typed, list(roots[:2])))
    assert got.is_absolute() and got.resolve() == (roots[root] / rel).resolve(), got


def test_a_relative_path_in_two_allowed_folders_is_refused_as_ambiguous(roots):
    a, b, _ = roots
    (b / "onnx").mkdir()
    (b / "onnx" / "m.onnx").write_bytes(b"y")
    with pytest.raises(SourceError, match=r"onnx/m.onnx is in more than one allowed folder .*type the full path"):
        resolve_in_roots("onnx/m.onnx", [a, b])


def test_escapes_and_links_out_are_no_candidates(roots):
    a, b, out = roots
    (a / "link.onnx").symlink_to(out / "secret.onnx")
    (a / "linked").symlink_to(out, target_is_directory=True)
    for typed in ("../out/secret.onnx", "onnx/../../out/secret.onnx", "link.onnx", "linked/secret.onnx",
                  "../../" + str(out.relative_to(out.anchor)) + "/secret.onnx", "missing.onnx"):
        assert resolve_in_roots(typed, [a, b]) == typed, typed  # unchanged: the loader refuses it
    absolute = str(out / "secret.onnx")
    assert resolve_in_roots(absolute, [a, b]) == absolute  # an absolute path as typed: the loader checks it


def _state() -> AppState:
    return AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)


def _refused(s: AppState, *words: str) -> None:
    assert s.message_kind == "danger" and len(s.message.strip().splitlines()) == 1, s.message
    assert all(w in s.message for w in words), s.message
    assert s.model.name == "bert-tiny"


def test_an_ambiguous_or_escaping_path_is_refused_saying_what_is_still_shown(monkeypatch, roots):
    a, b, _ = roots
    (b / "onnx").mkdir()
    (b / "onnx" / "m.onnx").write_bytes(b"y")
    monkeypatch.setenv(ALLOWED_DIRS_ENV, f"{a}:{b}")
    s = _state()
    s.param.update(checkpoint_dir="onnx/m.onnx", source="checkpoint")
    _refused(s, "more than one allowed folder", "Still showing bert-tiny.")
    s.checkpoint_dir = "../out/secret.onnx"
    _refused(s, "outside the allowed", "Still showing bert-tiny.")


@pytest.mark.sweep  # the load runs in the isolated child process
def test_the_app_opens_a_relative_onnx_path_in_the_allowed_folder(monkeypatch, tmp_path):
    models = tmp_path / "models"
    (models / "onnx").mkdir(parents=True)
    (models / "onnx" / "gpt2.onnx").write_bytes((FIX / "gpt2.onnx").read_bytes())
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(models))
    monkeypatch.chdir(tmp_path)  # the server's working folder is not the allowed one
    s = _state()
    s.param.update(checkpoint_dir="onnx/gpt2.onnx", source="checkpoint")
    assert s.message_kind != "danger", s.message
    assert Path(s.model.meta["onnx_file"]).resolve() == (models / "onnx" / "gpt2.onnx").resolve()
    (tmp_path / "out.onnx").write_bytes((FIX / "gpt2.onnx").read_bytes())
    s.checkpoint_dir = "../out.onnx"  # a real export beside the allowed folder: still refused
    assert s.message_kind == "danger" and "outside the allowed" in s.message, s.message
    assert f"Still showing {s.model.name}." in s.message and s.model.meta["onnx_file"].endswith("gpt2.onnx")
