"""docs/onnx.md's coverage table is `scripts/onnx_coverage.py`'s output: it lists every export the script covers, in
its order, and the rows of the small committed exports are what the script prints for them today (the whole zoo
takes minutes: `PYTHONPATH=$PWD python scripts/onnx_coverage.py` regenerates the table)."""

from __future__ import annotations

import importlib.util
import re
import sys
from types import ModuleType

import pytest
from clirun import ROOT
from test_docs_onnx_examples import same_line

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
    # error figures' last digits follow the machine's BLAS and vector width: compared as one token
    assert same_line(str(dict(doc_rows())[name]), str(script._row(name, path, io)))


def pivot_cell(row: str) -> str:
    """The deployed-forms table's cell for a coverage row: `packed` or `no: ...`, the layers fused as expected and,
    after `;`, how many more are fused as far as rlxviz's ops go (`... ops and patterns go` where the gap's compiler
    fix alone leaves a form rlxviz's patterns do not recognize next: the row's own words)."""
    cells = [c.strip() for c in row.strip("|").split("|")]
    m = re.match(r"(\d+/\d+) layer\(s\) fused as expected(?:; (\d+) (?:fused as far as|held back by) "
                 r"(rlxviz's ops(?: and patterns)?))?", cells[8])
    assert m, cells[8]
    more = f"; {m.group(2)} as far as {m.group(3)} go" if m.group(2) else ""
    return f"{'packed' if cells[4] == 'yes' else 'no'}, {m.group(1)}{more}"


def test_deployed_forms_cells_read_the_coverage_rows():
    """Each cell of the deployed-forms table (architecture by form) says what the coverage table's row of
    `ARCH.FORM` says: packed or not, and its `explain` counts; every cell names a row and every row of those files
    has its cell."""
    rows = dict(doc_rows())
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| architecture | dynamo-eager"))
    forms = [c.strip() for c in lines[start].strip("|").split("|")][1:]
    seen = set()
    for line in lines[start + 2:]:
        if not line.startswith("| "):
            break
        arch, *cells = (c.strip() for c in line.strip("|").split("|"))
        for form, cell in zip(forms, cells, strict=True):
            if not cell:
                continue
            name = f"{arch}.{form}"
            seen.add(name)
            want = pivot_cell(rows[name])
            packed, _, counts = want.partition(", ")
            assert cell.startswith("packed" if packed == "packed" else "no: "), (name, cell, want)
            assert cell.endswith(f", {counts}"), (name, cell, want)
    zoo = {p.stem for p in (ROOT / "tests" / "fixtures" / "onnx" / "zoo").glob("*.onnx")}
    deployed = {n for n, _ in doc_rows() if n in zoo and n.split(".", 1)[-1] in forms[1:]}
    assert deployed <= seen, sorted(deployed - seen)
