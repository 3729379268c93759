"""Every change of source says what replaced what (issue 39): "Now showing X (source), was Y (source)." Loading an
ONNX file by path (the Path tab, under `RLXVIZ_ALLOWED_DIRS`) after the IR text model said nothing of it: the
announcement was made, then the ONNX check's line replaced it. One function says a switch (`AppState._say_switch`),
and a message the load gives after it keeps it in front (`AppState.with_switch`). Each ordered pair of the four
sources a test can drive without a browser (built-in, IR text, path, upload) is walked once."""

from __future__ import annotations

from pathlib import Path

import pytest
from onnx_tiny import onnx_bytes

from rlxviz.app.jobs import Runner
from rlxviz.app.sources import ALLOWED_DIRS_ENV
from rlxviz.app.state import SOURCE_WORDS, AppState

SMALL_IR = """graph small {
  %0 = input {name="x"} : f32[2, 8]
  %1 = tanh(%0) : f32[2, 8]
  return %1
}"""

WALK = ["preset", "ir", "checkpoint", "preset", "checkpoint", "upload", "preset", "upload", "ir", "upload",
        "checkpoint", "ir", "preset"]
"""An Euler circuit of the complete directed graph on the four sources: each ordered pair once."""


@pytest.fixture
def folder(monkeypatch, tmp_path) -> Path:
    """An allowed folder (`RLXVIZ_ALLOWED_DIRS`) holding `onpath.onnx`."""
    inside = tmp_path / "models"
    inside.mkdir()
    (inside / "onpath.onnx").write_bytes(onnx_bytes())
    monkeypatch.setenv(ALLOWED_DIRS_ENV, str(inside))
    return inside


def show(s: AppState, source: str, folder: Path) -> None:
    """Load a model from `source` as the sidebar does."""
    if source == "preset":
        s.param.update(preset="bert-tiny", source="preset")
    elif source == "ir":
        s.param.update(ir_text=SMALL_IR, source="ir")
    elif source == "checkpoint":
        s.param.update(checkpoint_dir=str(folder / "onpath.onnx"), source="checkpoint")
    else:
        s.load_upload({"uploaded.onnx": onnx_bytes()})
    assert s.model is not None and s.message_kind != "danger", s.message
    assert s.shown_kind() == source, (source, s.shown_kind(), s.message)


def said(s: AppState, was: tuple[str, str]) -> None:
    """The message starts with the switch from `was` (name, source) to the model shown, and says it once."""
    want = (f"Now showing {s.model.name} ({SOURCE_WORDS[s.shown_kind()]}), was {was[0]} "
            f"({SOURCE_WORDS[was[1]]}).")
    assert s.message.startswith(want) and s.message.count("Now showing") == 1, (want, s.message)


def test_a_path_after_ir_text_says_it_replaced_the_ir_text_model(folder):
    """The newcomer's case: the ONNX check's line follows the switch, it does not replace it."""
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    show(s, "ir", folder)
    show(s, "checkpoint", folder)
    said(s, ("small", "ir"))
    assert "version 0" in s.message and "ONNX" in s.message  # the check's line, after the switch
    on_path = s.model.name
    show(s, "ir", folder)  # and back: the IR text replaced the path's model
    said(s, (on_path, "checkpoint"))


@pytest.mark.slow  # six ONNX loads, each in the isolated child process, and their checks
def test_every_ordered_pair_of_sources_says_the_switch(folder):
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    pairs = set()
    for a, b in zip(WALK, WALK[1:], strict=False):
        assert s.shown_kind() == a
        was = (s.model.name, a)
        show(s, b, folder)
        said(s, was)
        pairs.add((a, b))
    assert len(pairs) == 12 == len(WALK) - 1  # every ordered pair of the four sources, once
