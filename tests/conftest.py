"""Session set-up and the speed tiers.

rlxviz's CPU kernels are built (or loaded from the cache) once, before any test, so the first build (~30 s of CPU)
never lands inside a test with a time bound of its own (the fuzz watchdogs).

Speed tiers (issue 36): a test is `slow` when it drives a browser, executes notebooks, fuzzes, runs a benchmark or
spends its time in child processes (a served app, a CLI subprocess, an isolated loader). `make test-fast` runs
`pytest -m "not slow"` for every commit; `make test` (and CI) runs everything. `SLOW_FILES` marks whole files,
`SLOW_TESTS` single tests of otherwise fast files (the name before any `[param]`); `@pytest.mark.slow` in a test
file works too. A listed name that matches no collected test fails the run, so a rename cannot quietly move a slow
test into the fast tier.
"""

import os

import pytest

SLOW_FILES: dict[str, str] = {
    "test_browser_app.py": "browser (a served app driven by Playwright)",
    "test_browser_flows.py": "browser",
    "test_browser_nav.py": "browser",
    "test_browser_problems.py": "browser",
    "test_browser_security.py": "browser",
    "test_notebooks.py": "executes every notebook with nbclient",
    "test_fuzz.py": "fuzzing: thousands of mutated inputs",
    "test_fuzz_onnx.py": "fuzzing the ONNX importer",
    "test_bench_processes.py": "a benchmark, one process per configuration",
    "test_bench_runtime.py": "a benchmark",
    "test_isolated.py": "child processes killed at their limits",
}
"""Test files whose every test is slow, with the reason."""

SLOW_TESTS: dict[str, str] = {
}
"""`file::test` (parameters dropped) of single slow tests in otherwise fast files, with the reason."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seen_files = {item.path.name for item in items}
    matched: set[str] = set()
    for item in items:
        name = f"{item.path.name}::{item.originalname if hasattr(item, 'originalname') else item.name}"
        if item.path.name in SLOW_FILES or name in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
            matched.add(name if name in SLOW_TESTS else item.path.name)
    stale = [n for n in SLOW_TESTS if n.split("::")[0] in seen_files and n not in matched]
    if stale:
        raise pytest.UsageError(f"conftest.SLOW_TESTS names tests that were not collected (renamed?): {stale}")


@pytest.fixture(scope="session", autouse=True)
def _cpu_kernels_built():
    from rlxviz import kernels
    from rlxviz.kernels.build import LOCK_WAIT_ENV

    os.environ.setdefault(LOCK_WAIT_ENV, "900")  # another session's build (~1 min, longer on a loaded machine)
    kernels.status()
