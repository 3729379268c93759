"""Write the teaching notebooks `notebooks/NN_*.ipynb` from their jupytext sources `notebooks/src/NN_*.py`.

Edit a notebook by editing its source, then run `python notebooks/build.py` (`make notebooks-build`);
`python notebooks/build.py --check` only says which stored notebooks differ from their sources (exit 1).
`tests/test_notebooks.py` checks that every stored notebook is exactly what this script writes and executes each
one top to bottom.

A source is jupytext's percent format: `# %%` starts a code cell, `# %% [markdown]` a markdown cell (its lines
commented), cell metadata follows the marker (`# %% tags=["ftl-matches"]`: a cell whose output a test checks;
`collapsed=true jupyter={"source_hidden": true}`: a solution, its source shown on a click), and the header holds
the notebook's kernelspec. A code cell that is only `# %load NAME.py` (IPython's `%load`, commented by jupytext)
is replaced by the text of `notebooks/src/NAME.py`: the setup cell the six notebooks share is written once, in
`src/setup_cell.py`. The notebooks are stored without outputs, with cell ids `c00`, `c01`, ... so that a rebuild
gives byte-identical files.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import jupytext
import nbformat

HERE = Path(__file__).resolve().parent
SRC = HERE / "src"
LOAD = re.compile(r"%load (\w+\.py)")
NOTEBOOKS = [p.stem + ".ipynb" for p in sorted(SRC.glob("[0-9][0-9]_*.py"))]


def build(source: Path) -> nbformat.NotebookNode:
    """The notebook of one percent-format source, `%load` cells expanded; ValueError names a missing file."""
    nb = jupytext.read(source, fmt="py:percent")
    nb.metadata.pop("jupytext", None)  # how the source was read, not part of the notebook
    for i, cell in enumerate(nb.cells):
        load = LOAD.fullmatch(cell.source) if cell.cell_type == "code" else None
        if load:
            included = SRC / load.group(1)
            if not included.is_file():
                raise ValueError(f"{source.name}: cell {i} loads {load.group(1)}, which is not in {SRC}")
            cell.source = included.read_text(encoding="utf-8").strip("\n")
        cell["id"] = f"c{i:02d}"  # stable ids: rebuilding gives byte-identical files
    return nb


def render(name: str) -> str:
    """The notebook file's text for `name` (e.g. `01_what_is_fusion.ipynb`), as `main` writes it."""
    return nbformat.writes(build(SRC / (Path(name).stem + ".py"))) + "\n"


def main(argv: list[str] | None = None) -> int:
    check = "--check" in (argv or [])
    stale = []
    for name in NOTEBOOKS:
        text, path = render(name), HERE / name
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(name)
        if not check:
            path.write_text(text, encoding="utf-8")
            print("wrote", path)
    if check and stale:
        print("stale (run python notebooks/build.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
