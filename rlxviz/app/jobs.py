"""Running long work off the page's thread (no Panel import).

* `Runner`: runs callables one at a time on a worker thread; a job submitted later makes queued
  jobs of the same kind stale, so a burst of widget changes runs only the last one.
  `Runner(background=False)` runs inline, which is what the state tests use (work asked for ahead is skipped).
* `Runner.on_page`: a job's step that changes what the page shows (the state's parameters, and through their
  watchers the Panel objects) runs on the thread that owns the page, the job waiting for it. Panel objects
  changed from the worker thread send their patches by a second route that can overtake the page thread's:
  a patch that names a model the browser has not received yet ("reference p2505 isn't known" in the console).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class Runner:
    """Run jobs in order on one worker thread (or inline), dropping superseded jobs of the same kind.

    Args:
        background: False runs every job inline in the caller's thread (tests, notebooks).
        page: `(schedule, alive)` for a served page: `schedule(fn)` runs `fn` soon on the page's thread (Bokeh's
            `Document.add_next_tick_callback`, the one thread-safe way in), `alive()` is False once its session
            ended (then `on_page` runs inline: nothing is shown, and the run still fills the shared caches). The
            thread that makes the runner is taken as the page's. None: `on_page` runs inline.
    """

    def __init__(self, background: bool = True,
                 page: tuple[Callable[[Callable[[], None]], None], Callable[[], bool]] | None = None) -> None:
        self.background = background
        self.page = page
        self._page_thread = threading.get_ident()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlxviz-job") if background else None
        self._generation: dict[str, int] = {}
        self._lock = threading.Lock()
        self.last: Future | None = None

    def submit(self, kind: str, fn: Callable[[], Any], ahead: bool = False) -> Future:
        """Queue `fn`; when a newer job of `kind` is submitted before `fn` starts, `fn` is skipped.

        `ahead`: work done ahead of any request (drawing the versions nobody has stepped to yet). It pays beside a
        page that stays usable meanwhile; inline (`background=False`: tests, notebooks) it would only delay the
        caller, so it is skipped there (the future's result is None)."""
        if ahead and self._pool is None:
            skipped: Future = Future()
            skipped.set_result(None)
            return skipped
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

    def on_page(self, fn: Callable[[], T], poll_s: float = 0.5) -> T:
        """Run `fn` on the page's thread and return its result (or raise its exception); inline when there is no
        page, the caller is that thread, or the page was closed. A job calls this for each step that changes the
        state the page shows."""
        if self.page is None or threading.get_ident() == self._page_thread:
            return fn()
        schedule, alive = self.page
        if not alive():
            return fn()
        done: Future = Future()

        def call() -> None:
            if not done.set_running_or_notify_cancel():
                return
            try:
                done.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed back to the job through the future
                done.set_exception(e)

        schedule(call)
        while True:
            try:
                return done.result(poll_s)
            except TimeoutError:
                if not alive() and done.cancel():  # closed before `call` ran: it never will
                    return fn()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the last submitted job is done (tests)."""
        if self.last is not None:
            self.last.exception(timeout)
