"""Cache keys: by content (`DigestCache`, for graphs and traces) or, for arrays only, by identity (`IdentityMap`).

A graph and a trace have a content identity (`Graph.digest`, `Trace.digest`): every cache of a view derived from
one is a `DigestCache`, so a rebuilt but equal graph hits, and a changed graph can never be answered from an entry
made for another. Arrays have no cheap content identity; an array-keyed cache is an `IdentityMap`, below.

`id(x)` is unique only while `x` lives: CPython reuses the address of a freed object, so a cache keyed by
the `id()` of a temporary (a NumPy array made while importing, a graph replaced by the next run) hands a later
object the entry of an earlier one. That bound an ONNX constant to another constant's node (Falcon imported with
max abs error 2.2, every check saying ok). `IdentityMap` holds a reference to each key, so an id in it can never
be reused while the entry exists; it is the only place in rlxviz that calls `id()` (a test checks that).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar

K = TypeVar("K")
V = TypeVar("V")


_GENERATION = [0]
"""Bumped by `definitions_changed`: a `DigestCache` made under an older generation starts empty."""


def definitions_changed() -> None:
    """Empty every `DigestCache`: what a view derived from a graph or a run means has changed (the pass registry
    gained, lost or replaced a pass: a notebook's new rule, a test's patched guard policy), so an entry made for the
    same content under the old definitions is stale. Cheap; nothing in a normal run calls it."""
    _GENERATION[0] += 1


class HasDigest(Protocol):
    """Anything with a content digest: `Graph`, `Trace`."""

    @property
    def digest(self) -> str: ...


_MISSING: Any = object()
"""`DigestCache.get_or_compute`'s sentinel: a stored None is a hit."""


class DigestCache(Generic[V]):
    """`obj -> value` by `obj.digest` (a `Graph`'s or a `Trace`'s content identity), least recently used first out.

    Two objects with the same digest share an entry: the value must be a function of the object's content and of
    the pass definitions (it is for every view derived from an immutable graph or a finished trace); when those
    change, `definitions_changed` empties every cache. Thread-safe; a value two threads compute at once is computed
    twice and stored once.

    Args:
        limit: the most entries kept (the least recently used is dropped first).
    """

    __slots__ = ("_generation", "_items", "_lock", "limit")

    def __init__(self, limit: int = 8) -> None:
        self._items: OrderedDict[str, V] = OrderedDict()
        self._lock = threading.Lock()
        self._generation = _GENERATION[0]
        self.limit = limit

    def _current(self) -> OrderedDict[str, V]:
        """The entries, emptied first when the definitions changed since they were made (call under the lock)."""
        if self._generation != _GENERATION[0]:
            self._items.clear()
            self._generation = _GENERATION[0]
        return self._items

    def get(self, obj: HasDigest, default: V | None = None) -> V | None:
        """The value stored for `obj`'s digest (`default` when there is none)."""
        key = obj.digest
        with self._lock:
            items = self._current()
            if key in items:
                items.move_to_end(key)
                return items[key]
        return default

    def __contains__(self, obj: HasDigest) -> bool:
        key = obj.digest
        with self._lock:
            return key in self._current()

    def __setitem__(self, obj: HasDigest, value: V) -> None:
        key = obj.digest
        with self._lock:
            self._store(self._current(), key, value)

    def _store(self, items: OrderedDict[str, V], key: str, value: V) -> None:
        """Put `value` last under `key`, dropping the least recently used entries past `limit` (under the lock)."""
        items[key] = value
        items.move_to_end(key)
        while len(items) > self.limit:
            items.popitem(last=False)

    def get_or_compute(self, obj: HasDigest, compute: Callable[[], V]) -> V:
        """The value stored for `obj`'s digest, else `compute()` stored under it."""
        hit = self.get(obj, _MISSING)
        if hit is not _MISSING:
            return hit
        value = compute()
        key = obj.digest
        with self._lock:
            items = self._current()
            if key in items:  # another thread computed it meanwhile: keep one value
                return items[key]
            self._store(items, key, value)
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._current())


class IdentityMap(Generic[K, V]):
    """`key -> value` by `key is other` (not `==`, not hash): for keys with no content identity, NumPy and MLX
    arrays (a graph or a trace has one: use `DigestCache`). Holds every key alive until its entry is removed.
    `limit`: the most entries kept, the oldest dropped first (None: unbounded)."""

    __slots__ = ("_items", "limit")

    def __init__(self, limit: int | None = None) -> None:
        self._items: dict[int, tuple[K, V]] = {}
        self.limit = limit

    def get(self, key: K, default: V | None = None) -> V | None:
        hit = self._items.get(id(key))
        return hit[1] if hit is not None and hit[0] is key else default

    def __contains__(self, key: object) -> bool:
        hit = self._items.get(id(key))
        return hit is not None and hit[0] is key

    def __getitem__(self, key: K) -> V:
        hit = self._items.get(id(key))
        if hit is None or hit[0] is not key:
            raise KeyError(key)
        return hit[1]

    def __setitem__(self, key: K, value: V) -> None:
        k = id(key)
        self._items.pop(k, None)
        self._items[k] = (key, value)
        if self.limit is not None and len(self._items) > self.limit:
            self._items.pop(next(iter(self._items)))

    def setdefault(self, key: K, value: V) -> V:
        if key in self:
            return self[key]
        self[key] = value
        return value

    def pop(self, key: K, default: V | None = None) -> V | None:
        """Remove `key`'s entry and return its value (`default` when there is none)."""
        hit = self._items.get(id(key))
        if hit is None or hit[0] is not key:
            return default
        del self._items[id(key)]
        return hit[1]

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[K]:
        return (k for k, _ in self._items.values())


__all__ = ["DigestCache", "HasDigest", "IdentityMap", "definitions_changed"]
