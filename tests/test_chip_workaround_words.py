"""A chip's workaround in `rlxviz explain`'s words (newcomer): t5-encoder.ortopt's △2 tooltip said the scale fold
`changes the numbers at rounding level only: 2.82843 is not a power of two` (the rule's own hint, off the bare run)
where `explain` says `changes the numbers at rounding level only, max err 4.2e-08 in float64 on random, ...` (its
checked fix line, `session.advice`). The chips read the run with its fixes checked (`Derived.chip_trace`), so
each tooltip's workaround words are the CLI's, measured error included."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from clirun import run as cli_run
from inapp import opened

from rlxviz.app.panels import VersionStepper
from rlxviz.passes.refusal_kinds import ROUNDING_ONLY

ONNX = Path(__file__).parent / "fixtures" / "onnx"
WITH_WORKAROUNDS = [ONNX / "ortopt" / "t5-encoder.ortopt.onnx", ONNX / "zoo" / "granite.dynamo-eager.onnx",
                    ONNX / "zoo" / "t5.encdec.onnx"]
"""Files where a checked change to the model works around a gap, at rounding level (the scale fold)."""
_ROUNDING = re.compile(r"\(" + re.escape(ROUNDING_ONLY) + r"[^)]*\)")
"""A rounding-only change's words, from `ROUNDING_ONLY` to its closing parenthesis (error and reason included)."""


def _chip_tips(monkeypatch, path: Path) -> list[str]:
    """Every tooltip of the app's version chips for `path` (loaded at seq 8, the run in this process), unescaped."""
    s = opened(monkeypatch, path)
    return [html.unescape(t) for t in re.findall(r"title='([^']*)'", VersionStepper(state=s)._counts())]


def _cli_words(capsys, path: Path) -> list[str]:
    """The rounding-only words of `rlxviz explain PATH --seq 8 -v`, in order."""
    _, text, err = cli_run(capsys, "explain", str(path), "--seq", "8", "-v")
    assert "Traceback" not in err, err
    return _ROUNDING.findall(text)


def test_t5_encoders_gap_chip_says_the_measured_error_as_explain_does(capsys, monkeypatch):
    path = WITH_WORKAROUNDS[0]
    gap_tips = [t for t in _chip_tips(monkeypatch, path) if t.startswith("rlxviz's ops lack")]
    assert len(gap_tips) == 1, gap_tips  # the △2 of fuse_attention_block
    chip = _ROUNDING.findall(gap_tips[0])
    assert len(chip) == 2 and all(", max err " in w and " in float64 on " in w for w in chip), chip
    assert set(chip) == set(_cli_words(capsys, path))  # one answer: the CLI's words, both places


@pytest.mark.parametrize("path", WITH_WORKAROUNDS[1:], ids=[p.stem for p in WITH_WORKAROUNDS[1:]])
def test_every_chips_rounding_words_are_explains(capsys, monkeypatch, path):
    chip = {w for t in _chip_tips(monkeypatch, path) for w in _ROUNDING.findall(t)}
    cli = set(_cli_words(capsys, path))
    assert chip and cli and chip <= cli, (chip - cli, cli)
    assert all(", max err " in w for w in chip), chip  # measured, never the bare rule's hint
