"""A mapping keyed by object identity that keeps its keys alive.

`id(x)` is unique only while `x` lives: CPython reuses the address of a freed object, so a cache keyed by
the `id()` of a temporary (a NumPy array made while importing, a graph replaced by the next run) hands a later
object the entry of an earlier one. That bound an ONNX constant to another constant's node (Falcon imported with
max abs error 2.2, every check saying ok). `IdentityMap` holds a reference to each key, so an id in it can never
be reused while the entry exists; it is the only place in rlxviz that calls `id()` (a test checks that).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class IdentityMap(Generic[K, V]):
    """`key -> value` by `key is other` (not `==`, not hash): for unhashable or costly-to-hash keys such as
    NumPy arrays and graphs. Holds every key alive until its entry is removed. `limit`: the most entries kept,
    the oldest dropped first (None: unbounded)."""

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


__all__ = ["IdentityMap"]
