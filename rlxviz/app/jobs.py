"""Running long work off the page's thread (no Panel import).

* `Runner`: runs callables one at a time on a worker thread; a job submitted later makes queued
  jobs of the same kind stale, so a burst of widget changes runs only the last one.
  `Runner(background=False)` runs inline, which is what the state tests use.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class Runner:
    """Run jobs in order on one worker thread (or inline), dropping superseded jobs of the same kind.

    Args:
        background: False runs every job inline in the caller's thread (tests, notebooks).
    """

    def __init__(self, background: bool = True) -> None:
        self.background = background
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlxviz-job") if background else None
        self._generation: dict[str, int] = {}
        self._lock = threading.Lock()
        self.last: Future | None = None

    def submit(self, kind: str, fn: Callable[[], Any]) -> Future:
        """Queue `fn`; when a newer job of `kind` is submitted before `fn` starts, `fn` is skipped."""
        with self._lock:
            gen = self._generation[kind] = self._generation.get(kind, 0) + 1

        def job() -> Any:
            if self._generation.get(kind) != gen:
                return None
            return fn()

        if self._pool is None:
            fut: Future = Future()
            try:
                fut.set_result(job())
            except BaseException as e:  # noqa: BLE001 - handed to the caller through the future
                fut.set_exception(e)
        else:
            fut = self._pool.submit(job)
        self.last = fut
        return fut

    def wait(self, timeout: float | None = None) -> None:
        """Block until the last submitted job is done (tests)."""
        if self.last is not None:
            self.last.exception(timeout)
