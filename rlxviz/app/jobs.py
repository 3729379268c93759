"""Caches shared by all sessions, and running long work off the page's thread (no Panel import).

* `LRUCache`: a small thread-safe cache keyed by tuples such as `(model key, shapes, pipeline)`.
* `Runner`: runs callables one at a time on a worker thread; a job submitted later makes queued
  jobs of the same kind stale, so a burst of widget changes runs only the last one.
  `Runner(background=False)` runs inline, which is what the state tests use.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class LRUCache:
    """A thread-safe least-recently-used cache.

    Args:
        maxsize: number of entries kept.
    """

    def __init__(self, maxsize: int = 8) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.RLock()
        self._key_locks: dict[Hashable, threading.Lock] = {}
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable, default: Any = None) -> Any:
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                self.hits += 1
                return self._data[key]
            return default

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._data

    def put(self, key: Hashable, value: Any) -> Any:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)
        return value

    def get_or_compute(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """The cached value, or `compute()` stored under `key` (computed once even when sessions race)."""
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                self.hits += 1
                return self._data[key]
            lock = self._key_locks.setdefault(key, threading.Lock())
        with lock:
            with self._lock:
                if key in self._data:
                    self.hits += 1
                    return self._data[key]
            self.misses += 1
            value = compute()
            self.put(key, value)
        with self._lock:
            self._key_locks.pop(key, None)
        return value

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


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
