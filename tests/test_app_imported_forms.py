"""What an ONNX file had already fused (ONNX Runtime's optimizer) and its quantization steps: `rlxviz explain` printed
"already fused in the file (ONNX Runtime's optimizer): 2 BiasGelu ..., 4 SkipLayerNormalization (... which
FusedTransformerLayer (bias first) does not take exactly)", while the app's banner and Why tab never said it (a
newcomer run on deit.ortopt.onnx). Both now show the lines of the one function `explain` prints
(`session.imported_forms`), word for word."""

from __future__ import annotations

from pathlib import Path

import pytest
from clirun import run

from rlxviz import session
from rlxviz.app.jobs import Runner
from rlxviz.app.sources import ALLOWED_DIRS_ENV
from rlxviz.app.state import AppState
from rlxviz.app.wording import md_lines
from rlxviz.session import isolated

ZOO = Path(__file__).resolve().parent / "fixtures" / "onnx" / "zoo"
CASES = {  # file, the words its line must hold
    "deit.ortopt.onnx": ("already fused in the file (ONNX Runtime's optimizer)", "4 SkipLayerNormalization"),
    "beit.ortopt.onnx": ("already fused in the file (ONNX Runtime's optimizer)", "SkipLayerNormalization"),
    "deit.qdq.onnx": ("quantized: ", "DequantizeLinear"),
}


def _explain_lines(capsys, path: Path) -> list[str]:
    """The lines `rlxviz explain` prints of what the file carried (above its verdict)."""
    code, out, err = run(capsys, "explain", path)
    assert code in (0, 1), err
    return [ln for ln in out.splitlines() if ln.startswith(("already fused in the file", "quantized: "))]


def _inline(fn, *args, timeout_s=None, wall_s=None, max_bytes=None, what="", job=None, **kwargs):
    """`isolated.run_isolated` without its child process (the same call, here): the load and the version-0 check
    the app runs in a child take most of a test's time."""
    return fn(*args, **kwargs)


@pytest.mark.parametrize("name", list(CASES))
def test_the_banner_and_the_why_tab_say_what_explain_says_of_the_file(name, capsys, monkeypatch):
    monkeypatch.setattr(isolated, "run_isolated", _inline)
    _check(name, capsys, monkeypatch)


@pytest.mark.sweep  # the load and its check each in their child process, as the server runs them
def test_the_served_load_says_it_too(capsys, monkeypatch):
    _check("deit.ortopt.onnx", capsys, monkeypatch)


def _check(name: str, capsys, monkeypatch) -> None:
    path = ZOO / name
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(ZOO))
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    s.param.update(checkpoint_dir=str(path), source="checkpoint")
    assert s.model is not None and s.model.meta.get("onnx_file"), s.message
    said = _explain_lines(capsys, path)
    assert said and all(any(w in ln for ln in said) for w in CASES[name]), said
    assert s.imported_forms() == said == session.imported_forms(s.model)  # one function, one answer
    for line in said:
        assert line in s.message, s.message  # the load's banner, after the version-0 check line
    why = s.why_layer(s.layers()[0])
    assert all(md_lines(line) in why for line in said), why


def test_a_model_not_read_from_a_file_says_nothing_of_one():
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    assert s.imported_forms() == [] and "The file:" not in s.why_layer(0)
    assert "already fused" not in s.message
