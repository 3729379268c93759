"""No import cycle in the `rlxviz` package: every module's imports, read with `ast`, form a DAG.

An edge `a -> b` is any `import` / `from ... import` in module `a` (at top level or inside a function: a lazy
import still ties the two modules together) that names module `b` of the package; `from pkg import name`
points at `pkg.name` when that is a module, else at `pkg` (its `__init__`). Imports under
`if TYPE_CHECKING:` are left out (they never run). `graphlib` finds the cycle and the message names it.

`KNOWN` lists accepted cycles, each by the one edge that closes it, so that any new cycle fails; an entry whose
edge is gone fails too (drop it from `KNOWN`). One today: `report.in_context` asks `why.standing.unexpected_fix`
(lazily) for the fix line of a refusal its layer's kind does not expect, so that `explain -v`'s rule outcomes
(`passes.explain`, which the verdict's package reads) print it as the table and `--json` do. It goes when the
verdict's layer words those outcomes itself (`session.advice.vetted` rewording the refusal, as it does a failed fix).
The one before (architecture's classifier -> pipeline -> rules.attention -> architecture's RoPE readers) went when
the readers moved to `passes/rope_forms.py`.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

import rlxviz

ROOT = Path(rlxviz.__file__).parent
KNOWN: set[tuple[str, str]] = {("rlxviz.passes.report", "rlxviz.passes.why.standing")}


def _modules(root: Path = ROOT, package: str = "rlxviz") -> dict[str, Path]:
    """Dotted module name -> file, for every `.py` file under `root` (a package is its `__init__.py`)."""
    out = {}
    for path in root.rglob("*.py"):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _runtime_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement in the tree, except those under `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package modules it imports (see the module docstring for what counts as an edge)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = graph.setdefault(name, set())
        for node in _runtime_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in modules)
                continue
            base = package.split(".")
            if node.level:
                base = base[:len(base) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in modules:
                    edges.add(sub)
                elif target in modules:
                    edges.add(target)
        edges.discard(name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle `[a, b, ..., a]` where each module imports the next, or None when the graph is a DAG."""
    try:
        graphlib.TopologicalSorter(graph).prepare()  # reads graph[a] as a's predecessors: cycles come reversed
    except graphlib.CycleError as e:
        return list(e.args[1])[::-1]
    return None


def test_rlxviz_has_no_import_cycle():
    graph = import_graph(_modules())
    assert len(graph) > 50 and "rlxviz.runtime.devices" in graph["rlxviz.runtime.executor"]  # the walk sees edges
    for a, b in KNOWN:
        assert b in graph[a], f"{a} no longer imports {b}: remove the entry from KNOWN"
        graph[a].discard(b)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_precision_is_one_module_devices_never_reads_it():
    """The precision policy reads the devices; devices and the rest of the runtime never import each other
    in a loop (the devices <-> tolerance cycle this module replaced)."""
    graph = import_graph(_modules())
    assert "rlxviz.runtime.devices" in graph["rlxviz.runtime.precision"]
    assert "rlxviz.runtime.precision" not in graph["rlxviz.runtime.devices"]
    assert not (ROOT / "runtime" / "tolerance.py").exists() and not (ROOT / "session" / "tolerance.py").exists()


def test_the_walk_finds_a_cycle_lazy_or_relative(tmp_path):
    """The detector itself: a lazy (in-function) relative import closing a loop is a cycle, named in import
    order; a TYPE_CHECKING-only import is not."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .a import f\n")
    (pkg / "sub" / "a.py").write_text("from ..b import g\ndef f():\n    return g()\n")
    (pkg / "b.py").write_text("from .c import h\ndef g():\n    return h()\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub import a\n"
                              "def h():\n    return 1\n")
    mods = _modules(pkg, "pkg")
    assert find_cycle(import_graph(mods)) is None
    (pkg / "c.py").write_text("def h():\n    from .sub.a import f\n    return f\n")
    cycle = find_cycle(import_graph(mods))
    assert cycle is not None and cycle[0] == cycle[-1], cycle
    start = cycle.index("pkg.b")
    assert (cycle[:-1] * 2)[start:start + 3] == ["pkg.b", "pkg.c", "pkg.sub.a"], cycle


@pytest.mark.parametrize("source, edge", [("from . import a", "pkg.a"), ("from .a import x", "pkg.a"),
                                          ("import pkg.a", "pkg.a"), ("from pkg import a", "pkg.a"),
                                          ("from pkg import x", "pkg")])
def test_import_forms_resolve_to_modules(tmp_path, source, edge):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("")
    (pkg / "b.py").write_text(source + "\n")
    assert import_graph(_modules(pkg, "pkg"))["pkg.b"] == {edge}
