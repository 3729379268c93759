"""Static values shared by graph versions: a value computed from weights alone (the gate|up weight `concat` that
`fuse_swiglu` leaves, the Q|K|V `concat` of `fuse_shared_input_matmul`) is made once per executor and weight set,
not once per version that holds it.

Each program's static frontier value gets a *cone key* (`cone_keys`): a hash of the ops, attributes, types and
constants of the static nodes it is computed from, down to its params by name. Two versions whose frontier values
have the same cone key and read the same param arrays (by identity) compute the same array with the same emitter,
so the executor hands the first one's array to the second (`SharedStatics`). Exactness: the value is the one the
second version would compute (same nodes, same operands, same lowering options); any attribute the key cannot read
exactly (an object without a stable repr) makes the keys differ, never equal by mistake.

Why: `rlxviz time` keeps every version's program and static values while it times them interleaved; on an
8B-shaped export's first two layers the gate|up concat (2 x 470 MB) was held once per version after fuse_swiglu
(three versions), 2.8 GB of copies of the same values.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..ir import Graph, Op
from ..kernels.mlx_backend import mx

_FRESH = itertools.count()
"""Tokens for attribute values with no stable text: each use is a new one, so no two cone keys equal through it."""


def _attr_text(value: Any) -> str:
    """`value` as exact text: arrays by dtype, shape and a hash of their bytes; containers item by item; an
    object whose repr names its address (no stable text) by a fresh token, so no two keys equal through it."""
    if isinstance(value, np.ndarray | np.generic):
        a = np.ascontiguousarray(value)
        return f"nd:{a.dtype}:{a.shape}:{hashlib.sha1(a.tobytes()).hexdigest()}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_attr_text(v) for v in value) + "]"
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: repr(kv[0]))
        return "{" + ",".join(f"{k!r}:{_attr_text(v)}" for k, v in items) + "}"
    text = repr(value)
    if " at 0x" in text:
        return f"unique:{next(_FRESH)}"
    return f"{type(value).__name__}:{text}"


def cone_keys(graph: Graph, ids: Sequence[int], static: set[int]) -> list[tuple[str, tuple[str, ...]] | None]:
    """For each of `ids` (static values of `graph`): `(cone key, param names it is computed from)`, or None for a
    leaf (a param or const: nothing to share). `static`: the ids computed from params and constants alone."""
    memo: dict[int, str] = {}
    params: dict[int, frozenset[str]] = {}

    def key(i: int) -> str:
        if i in memo:
            return memo[i]
        n = graph[i]
        if n.op == Op.PARAM:
            text, names = f"param:{n.attrs['name']}:{n.type}", frozenset({str(n.attrs["name"])})
        elif n.op == Op.CONST:
            text, names = f"const:{n.type}:{_attr_text(np.asarray(n.attrs['value']))}", frozenset()
        else:
            for j in n.inputs:
                key(j)
            text = f"{n.op.value}|{_attr_text(dict(n.attrs))}|{n.type}|" + ",".join(memo[j] for j in n.inputs)
            names = frozenset().union(*(params[j] for j in n.inputs)) if n.inputs else frozenset()
        memo[i] = hashlib.sha1(text.encode()).hexdigest()
        params[i] = names
        return memo[i]

    out: list[tuple[str, tuple[str, ...]] | None] = []
    for i in ids:
        if i not in static or graph[i].op in (Op.PARAM, Op.CONST):
            out.append(None)
            continue
        out.append((key(i), tuple(sorted(params[i]))))
    return out


class SharedStatics:
    """Static values by (cone key, lowering options), each with the param arrays it was computed from.

    `get` answers only when the params now bound are the same arrays (identity); `forget` drops every value made
    from an array that is being replaced (new weights), so no stale weight set is kept alive through it.
    """

    def __init__(self) -> None:
        self._values: dict[tuple[str, Any], tuple[tuple[mx.array, ...], mx.array]] = {}

    def get(self, key: tuple[str, Any], params: Sequence[mx.array]) -> mx.array | None:
        hit = self._values.get(key)
        if hit is None or len(hit[0]) != len(params) or not all(a is b for a, b in zip(hit[0], params, strict=True)):
            return None
        return hit[1]

    def put(self, key: tuple[str, Any], params: Sequence[mx.array], value: mx.array) -> None:
        self._values[key] = (tuple(params), value)

    def forget(self, arrays: Iterable[mx.array]) -> None:
        """Drop the values computed from any of `arrays`."""
        gone = list(arrays)
        for k, (ps, _) in list(self._values.items()):
            if any(p is g for p in ps for g in gone):
                del self._values[k]

    def clear(self) -> None:
        self._values.clear()

    def __len__(self) -> int:
        return len(self._values)


__all__ = ["SharedStatics", "cone_keys"]
