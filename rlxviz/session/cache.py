"""A small thread-safe LRU cache, keyed by content keys (a graph digest, a `Trace.key`), shared by sessions."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
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


__all__ = ["LRUCache"]
