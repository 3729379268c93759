"""rlxviz's packages stand on floors, and no import runs back up a floor.

The floors are the ones the code holds today (read from its imports, as `test_import_cycles` reads them: with `ast`,
function-level imports included, `TYPE_CHECKING` ones left out), the order the architecture review drew:

0. `ir`: the graph, its ops and their one meaning.
1. `kernels`: the C++ kernels' build and bindings (the lowering calls them), the CBLAS and the one `import mlx.core`.
2. `passes`, `runtime`: the fusion pipeline and the MLX runtime, beside each other (neither imports the other).
3. `models`: model builders and the ONNX importer/exporter (they run passes to canonicalize).
4. `viz`: drawings of graphs and traces.
5. `session`: the service every front end calls (it loads models and draws).
6. the front ends: `app`, `cli`, `teach`, `__main__` and the package's `__init__`.

An import within a floor (sideways) is allowed; one to a lower floor is the natural direction. `KNOWN` lists each
import that runs up today, with why; an entry whose import is gone fails, so the list only shrinks. A new package
or top-level module fails until it is given a floor.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_import_cycles import _modules, import_graph

FLOORS: dict[str, int] = {
    "ir": 0,
    "kernels": 1,
    "passes": 2, "runtime": 2,
    "models": 3,
    "viz": 4,
    "session": 5,
    "app": 6, "cli": 6, "teach": 6, "__main__": 6, "": 6,
}
"""Package (the first name under `rlxviz`; `""` is `rlxviz/__init__.py`) -> floor."""

KNOWN: dict[tuple[str, str], str] = {
}
"""Imports that run up a floor today, with why. Fix one, then delete its entry (the test says so)."""


def package_of(module: str) -> str:
    """`rlxviz.passes.rules.linear` -> `passes`; `rlxviz` -> `""`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def upward(graph: dict[str, set[str]], floors: dict[str, int]) -> list[tuple[str, str]]:
    """Every import `(a, b)` whose target's package stands on a higher floor than the importer's."""
    return sorted((a, b) for a, bs in graph.items() for b in bs
                  if floors[package_of(b)] > floors[package_of(a)])


def test_every_package_has_a_floor():
    packages = {package_of(m) for m in _modules()}
    assert packages - set(FLOORS) == set(), "give each new package a floor in FLOORS"
    assert set(FLOORS) - packages == set(), "a package in FLOORS is gone: remove it"


def test_no_import_runs_back_up_a_floor():
    graph = import_graph(_modules())
    assert "rlxviz.ir" in graph["rlxviz.passes.rule"] or "rlxviz.ir.ops" in graph["rlxviz.passes.rule"]
    found = upward(graph, FLOORS)
    gone = [e for e in KNOWN if e not in found]
    assert not gone, f"these imports no longer run up a floor: delete them from KNOWN: {gone}"
    new = [e for e in found if e not in KNOWN]
    assert not new, ("imports that run back up a floor (move the code down, or the import up): "
                     + "; ".join(f"{a} ({package_of(a)}, floor {FLOORS[package_of(a)]}) imports {b} "
                                 f"({package_of(b)}, floor {FLOORS[package_of(b)]})" for a, b in new))


@pytest.mark.parametrize("source, up", [("from ..top import f", True), ("def g():\n    from ..top import f\n", True),
                                        ("from ..low import f", False), ("from .sibling import f", False)])
def test_the_check_sees_an_upward_import_lazy_or_not(tmp_path: Path, source: str, up: bool):
    pkg = tmp_path / "pkg"
    for sub in ("low", "mid", "top"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("f = 1\n")
    (pkg / "__init__.py").write_text("")
    (pkg / "mid" / "sibling.py").write_text("f = 1\n")
    (pkg / "mid" / "a.py").write_text(source + "\n")
    found = upward(import_graph(_modules(pkg, "pkg")), {"low": 0, "mid": 1, "top": 2, "": 3})
    assert found == ([("pkg.mid.a", "pkg.top")] if up else [])
