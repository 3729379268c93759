"""Session set-up: rlxviz's CPU kernels are built (or loaded from the cache) once, before any test, so the
first build (~30 s of CPU) never lands inside a test with a time bound of its own (the fuzz watchdogs)."""

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _cpu_kernels_built():
    from rlxviz import kernels
    from rlxviz.kernels.build import LOCK_WAIT_ENV

    os.environ.setdefault(LOCK_WAIT_ENV, "900")  # another session's build (~1 min, longer on a loaded machine)
    kernels.status()
