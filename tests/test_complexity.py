"""Ruff's C901 ceiling (`[tool.ruff.lint.mccabe] max-complexity` in pyproject.toml) only goes down: `ruff check`
enforces it, and this test fails when no function of rlxviz reaches it any more, so the ceiling follows the code
down (issue 36: complexity checked with a ceiling that only goes down)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _ceiling() -> int:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]["mccabe"]["max-complexity"]


def _complexities() -> list[int]:
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "rlxviz", "--select", "C901", "--no-cache",
                          "--config", "lint.mccabe.max-complexity=1", "--output-format", "concise"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120).stdout
    return [int(m) for m in re.findall(r"is too complex \((\d+) > 1\)", out)]


def test_the_ceiling_is_todays_most_complex_function():
    found = _complexities()
    assert found, "ruff reported no function at all: the probe is broken"
    assert max(found) <= _ceiling(), "a function is over the ceiling: `ruff check` should have failed"
    assert max(found) == _ceiling(), (f"the most complex function is now {max(found)}: lower max-complexity in "
                                      f"pyproject.toml to {max(found)}")
