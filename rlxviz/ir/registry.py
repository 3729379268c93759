"""Per-op rule tables filled by decorators (JAX's per-primitive registries, rlx style.md §3).

`infer.rule`, `fused.decomposition`, `runtime.reference.impl` and `runtime.lowering.lowers` are
all `registrar(table)`: `@rule(Op.ADD, Op.SUB)` stores the decorated function under each op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from .ops import Op

F = TypeVar("F", bound=Callable[..., object])


def registrar(table: dict[Op, F]) -> Callable[..., Callable[[F], F]]:
    """A decorator factory storing the decorated function in `table` under each op given."""

    def for_ops(*ops: Op) -> Callable[[F], F]:
        def register(fn: F) -> F:
            for op in ops:
                table[op] = fn
            return fn

        return register

    return for_ops
