"""docs/onnx.md's coverage table is `scripts/onnx_coverage.py`'s output: it lists every export the script covers, in
its order, and the rows of the small committed exports are what the script prints for them today (the whole zoo
takes minutes: `PYTHONPATH=$PWD python scripts/onnx_coverage.py` regenerates the table)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pytest
from clirun import ROOT

pytestmark = pytest.mark.sweep  # four small exports through the canonical pipeline and the reference: ~10 s

DOC = ROOT / "docs" / "onnx.md"
HEADER = "| export | imports | layers | fused ops (final version) |"


def coverage_script(monkeypatch) -> ModuleType:
    """scripts/onnx_coverage.py as a module, with no extra files on its command line."""
    monkeypatch.setattr(sys, "argv", ["onnx_coverage.py"])
    spec = importlib.util.spec_from_file_location("onnx_coverage", ROOT / "scripts" / "onnx_coverage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def doc_rows() -> list[tuple[str, str]]:
    """(export name, row) of each row of docs/onnx.md's coverage table, in the doc's order (a name may repeat: a
    handed case and a zoo file of the same stem)."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(HEADER))
    rows: list[tuple[str, str]] = []
    for line in lines[start + 2:]:
        if not line.startswith("| "):
            break
        rows.append((line.split("|")[1].strip(), line))
    return rows


def test_table_lists_every_export_the_script_covers(monkeypatch):
    """One row per export the script reads (committed, handed cases, zoo), in its order."""
    names = [name for name, _, _ in coverage_script(monkeypatch)._cases()]
    assert [name for name, _ in doc_rows()] == names


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "vit"])
def test_committed_export_rows_are_the_scripts(name, monkeypatch):
    """The row of a committed export (verdict, fused ops, errors) is what the script prints for it now."""
    script = coverage_script(monkeypatch)
    path, io = next((p, io) for n, p, io in script._cases() if n == name)
    assert dict(doc_rows())[name] == script._row(name, path, io)
