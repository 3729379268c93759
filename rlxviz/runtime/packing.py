"""Weights packed once into rlxviz's GEMM panel layout, per weight array: the emitter's one weight cache.

A program's weights are the same `mx.array` on every call (the executor converts them once), so the lazy packed
array (`RlxvizPackWeights`) is kept, keyed by the weight array's identity, evaluated with the first call's graph
and reused after. A new array (new weights) is packed anew; `drop` forgets replaced ones, so a session that loads
weight set after weight set keeps one packed copy, not one per set.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from ..ir.identity import IdentityMap
from ..kernels.mlx_backend import mx

T = TypeVar("T")


class PackedWeights:
    """The packed layouts of the weight arrays one emitter has seen (`RlxvizPackWeights`).

    Args:
        pack: `pack(w [K, N] float32) -> packed` (the kernels' `pack_weights`); None when no kernel packs (then
            `get` is never called: `KernelRouting.gemm_applies` is False).
    """

    def __init__(self, pack: Callable[[mx.array], mx.array] | None) -> None:
        self.pack = pack
        self.cache: IdentityMap[mx.array, mx.array] = IdentityMap()
        """Weight array (by identity) -> its lazy packed array."""

    def get(self, w: mx.array) -> mx.array:
        """`w [K, N]` in the GEMM's panel layout, packed on the first request for this array.

        Raises:
            RuntimeError: there is no packing function (the kernels are not loaded).
        """
        hit = self.cache.get(w)
        if hit is None:
            if self.pack is None:
                raise RuntimeError("[PackedWeights.get] no kernels loaded: nothing packs weights")
            hit = self.cache[w] = self.pack(w)
        return hit

    def arrays(self) -> list[mx.array]:
        """The packed arrays kept so far (lazy until the first call that uses them is evaluated)."""
        return [self.cache[w] for w in self.cache]

    def with_evaluated(self, build: Callable[[], T]) -> tuple[T, bool]:
        """`build()` (lowering a program's call), then the packed weights it made evaluated, so that the next
        build reads them as constants: packing is once per weight, not part of every call. Only those this build
        made: an earlier trace's entries may be placeholders, which cannot be evaluated. Returns what `build`
        returned and whether it packed any weight."""
        before: IdentityMap[mx.array, bool] = IdentityMap()
        for a in self.arrays():
            before[a] = True
        out = build()
        if made := [a for a in self.arrays() if a not in before]:
            mx.eval(made)
        return out, bool(made)

    def drop(self, weights: Sequence[mx.array]) -> None:
        """Forget the packed layouts of these weight arrays (replaced by new ones: `MlxExecutor.static_values`)."""
        for w in weights:
            self.cache.pop(w)

    def clear(self) -> None:
        """Drop every packed weight (`MlxExecutor.clear`)."""
        self.cache.clear()

    def __len__(self) -> int:
        return len(self.cache)


__all__ = ["PackedWeights"]
