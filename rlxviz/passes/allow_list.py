"""The epilogue allow-list as the rules read it: `guard.EPILOGUE_ACTIVATIONS`, extended only inside a what-if.

A compiler fix that extends the allow-list (`add gelu_tanh to the epilogue allow-list`) is checked by running the
pipeline as if it were made (`passes.whatif`): `fuse_matmul_bias_act` then takes the activation into its epilogue and
the layer rule sees a fused fc1, so what it refuses next is the real next failure, not a consequence of the gelu node
still standing apart. The extension is scoped (`allowing`, a `ContextVar` reset on exit): no table is ever patched,
and a run outside the `with` block (every ordinary run) reads the one table `ir.ops.EPILOGUE_ACTIVATIONS`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from ..ir.ops import EPILOGUE_ACTIVATIONS as _EPILOGUE_OPS

_LISTED: tuple[str, ...] = tuple(a.value for a in _EPILOGUE_OPS)
_EXTRA: ContextVar[tuple[str, ...]] = ContextVar("rlxviz_epilogue_extra", default=())


def epilogue_allowed() -> tuple[str, ...]:
    """The activation names a fused linear's epilogue takes now: the allow-list, plus those an enclosing `allowing`
    adds (a what-if's)."""
    extra = _EXTRA.get()
    return _LISTED + tuple(a for a in extra if a not in _LISTED) if extra else _LISTED


@contextmanager
def allowing(*names: str) -> Iterator[None]:
    """Within the block, the rules take the activations `names` (op names, e.g. `gelu_tanh`) as allow-listed too;
    the previous list is restored on exit, on an exception as well. Only what-if runs use it."""
    token = _EXTRA.set((*_EXTRA.get(), *names))
    try:
        yield
    finally:
        _EXTRA.reset(token)


__all__ = ["allowing", "epilogue_allowed"]
