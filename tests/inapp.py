"""The app with a model opened in the test's own process: `opened` (a file by path, under the allowed folders) and
`uploaded` (its bytes, as a drop), each at seq 8 unless told. The served app loads a file in a child process
(`session.isolated.run_isolated`); here the load runs in the test's process, so a fixture's module cache and the
pipeline's caches serve it, and `pytest.MonkeyPatch` undoes the switch after the test."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlxviz.app.jobs import Runner
from rlxviz.app.sources import ALLOWED_DIRS_ENV
from rlxviz.app.state import AppState
from rlxviz.session import isolated


def in_this_process(mp: pytest.MonkeyPatch) -> None:
    """Make `isolated.run_isolated` call its function here, its limits (`timeout_s`, `wall_s`, `max_bytes`) unused."""
    mp.setattr(isolated, "run_isolated", lambda fn, *a, timeout_s=None, wall_s=None, max_bytes=None, what="",
               job=None, **kw: fn(*a, **kw))


def opened(mp: pytest.MonkeyPatch, path: Path, seq: int = 8) -> AppState:
    """The app (bert-tiny first, as it starts) with `path` opened by path (its folder allowed), checked loaded.

    Raises:
        AssertionError: the app did not load `path` (its message says why).
    """
    in_this_process(mp)
    mp.setenv(ALLOWED_DIRS_ENV, str(path.parent))
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=seq)
    s.param.update(checkpoint_dir=str(path), source="checkpoint")
    assert s.trace is not None and s.model is not None and s.model.name.startswith(path.stem), s.message
    return s


def uploaded(mp: pytest.MonkeyPatch, path: Path, seq: int = 8) -> AppState:
    """The app (bert-tiny first) with `path`'s bytes dropped on it as an upload named `path.name`, checked loaded.

    Raises:
        AssertionError: the upload failed (its message says why).
    """
    in_this_process(mp)
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=seq)
    s.load_upload({path.name: path.read_bytes()})
    assert s.message_kind != "danger", s.message
    return s
