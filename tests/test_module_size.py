"""No module of rlxviz holds more than `MAX_LINES` lines (issue 36: one job per module).

`KNOWN` lists the modules over the limit today, each waiting to be split; an entry whose module is gone or now
fits fails, so the list only shrinks. A new module over the limit fails at once, naming itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest

MAX_LINES = 600
PACKAGE = Path(__file__).resolve().parents[1] / "rlxviz"

KNOWN: dict[str, str] = {}
"""Modules over `MAX_LINES` today (path under rlxviz/ -> what it still holds). Split one, then delete its entry."""


def oversized(package: Path, limit: int = MAX_LINES) -> dict[str, int]:
    """Each `.py` file under `package` with more than `limit` lines: its path under `package` -> its line count."""
    sizes = {p.relative_to(package).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
             for p in sorted(package.rglob("*.py"))}
    return {name: n for name, n in sizes.items() if n > limit}


def test_no_module_over_the_limit_but_the_known_ones():
    found = oversized(PACKAGE)
    new = {name: n for name, n in found.items() if name not in KNOWN}
    assert not new, (f"modules over {MAX_LINES} lines (split each by job, as rlxviz/models/onnx/ and rlxviz/cli/ "
                     f"are): " + "; ".join(f"rlxviz/{name}: {n} lines" for name, n in new.items()))
    fits = [name for name in KNOWN if name not in found]
    assert not fits, f"these modules fit now (or are gone): delete them from KNOWN: {fits}"


def test_the_importer_and_the_cli_are_packages_of_small_modules():
    for folder in ("models/onnx", "cli"):
        files = sorted((PACKAGE / folder).rglob("*.py"))
        assert len(files) >= 8, folder
        assert not oversized(PACKAGE / folder), folder
    assert not (PACKAGE / "cli.py").exists() and not (PACKAGE / "models" / "cpu_limit.py").exists()


@pytest.mark.parametrize("lines, limit, over", [(600, 600, False), (601, 600, True), (3, 2, True), (5, 10, False)])
def test_the_check_counts_lines(tmp_path: Path, lines: int, limit: int, over: bool):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "m.py").write_text("x = 1\n" * lines)
    (tmp_path / "small.py").write_text("y = 2\n")
    assert oversized(tmp_path, limit) == ({"sub/m.py": lines} if over else {})
