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
from typing import Generic, Protocol, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class HasDigest(Protocol):
    """Anything with a content digest: `Graph`, `Trace`."""

    @property
    def digest(self) -> str: ...


class DigestCache(Generic[V]):
    """`obj -> value` by `obj.digest` (a `Graph`'s or a `Trace`'s content identity), least recently used first out.

    Two objects with the same digest share an entry: the value must be a function of the object's content (it is
    for every view derived from an immutable graph or a finished trace). Thread-safe; a value two threads compute
    at once is computed twice and stored once.

    Args:
        limit: the most entries kept (the least recently used is dropped first).
    """

    __slots__ = ("_items", "_lock", "limit")

    def __init__(self, limit: int = 8) -> None:
        self._items: OrderedDict[str, V] = OrderedDict()
        self._lock = threading.Lock()
        self.limit = limit

    def get(self, obj: HasDigest, default: V | None = None) -> V | None:
        """The value stored for `obj`'s digest (`default` when there is none)."""
        key = obj.digest
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        return default

    def __contains__(self, obj: HasDigest) -> bool:
        with self._lock:
            return obj.digest in self._items

    def __setitem__(self, obj: HasDigest, value: V) -> None:
        key = obj.digest
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.limit:
                self._items.popitem(last=False)

    def get_or_compute(self, obj: HasDigest, compute: Callable[[], V]) -> V:
        """The value stored for `obj`'s digest, else `compute()` stored under it."""
        key = obj.digest
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = compute()
        with self._lock:
            if key in self._items:  # another thread computed it meanwhile: keep one value
                return self._items[key]
            self._items[key] = value
            while len(self._items) > self.limit:
                self._items.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


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


__all__ = ["DigestCache", "HasDigest", "IdentityMap"]
