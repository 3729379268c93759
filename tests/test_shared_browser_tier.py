"""The browser tests that share the cores in `make test` (`conftest.SHARED_BROWSER_FILES`, `SHARED_BROWSER_TESTS`)
time nothing: no test there, nor a helper of its file it calls, presses the Timing tab's button or waits on a timing
run. A Timing run on a loaded runner could read as a busy machine or miss a bound; such a test stays in the serial
run, one test at a time. (The engineer's "time share" overlay in test_browser_flows measures per-node times in a
job bounded at 300 s and asserts only its legend: no figure of it is compared.)"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import SHARED_BROWSER_FILES, SHARED_BROWSER_TESTS

HERE = Path(__file__).parent
TIMES = ("rv-time button", "time_bert_tiny(", 'open_tab(pg, "Timing")', "Time every version")
"""What a test that runs a Timing job says in its source: the button's class, the helper that times bert-tiny."""


def _timing_tests(path: Path) -> dict[str, bool]:
    """Each `test_*` function of `path` -> whether it, or a function of the same file it calls (transitively), says
    one of `TIMES`."""
    src = path.read_text(encoding="utf-8")
    funcs = {n.name: ast.get_source_segment(src, n) or "" for n in ast.parse(src).body
             if isinstance(n, ast.FunctionDef)}

    def times(name: str, seen: frozenset[str]) -> bool:
        body = funcs[name]
        return any(t in body for t in TIMES) or any(
            times(f, seen | {name}) for f in funcs if f not in seen and f != name and f"{f}(" in body)

    return {n: times(n, frozenset()) for n in funcs if n.startswith("test_")}


@pytest.mark.parametrize("name", sorted(SHARED_BROWSER_FILES))
def test_a_shared_browser_file_times_nothing(name):
    timed = [t for t, yes in _timing_tests(HERE / name).items() if yes]
    assert not timed, f"{name}: {timed} run a Timing job: move the file out of SHARED_BROWSER_FILES"


@pytest.mark.parametrize("name", sorted(SHARED_BROWSER_TESTS))
def test_a_shared_browser_test_times_nothing(name):
    found = _timing_tests(HERE / name)
    listed = SHARED_BROWSER_TESTS[name]
    assert set(listed) <= set(found), set(listed) - set(found)
    timed = [t for t in listed if found[t]]
    assert not timed, f"{name}: {timed} run a Timing job: take them out of SHARED_BROWSER_TESTS"
    assert any(found.values()), f"{name} times nothing: list the whole file in SHARED_BROWSER_FILES"


def test_the_check_finds_a_timing_test():
    """The scan can fail: the serial file that times bert-tiny reads as timing."""
    assert _timing_tests(HERE / "test_browser_timing.py")["test_timing_tab_verdict_first_bars_agree_kernels_apart"]
