"""One limits record for every front end: how much memory a loaded graph's tensors may declare.

The limit comes from (first that is set): the caller's option (the CLI's `--max-memory-mb`), the
environment variable `RLXVIZ_MAX_MEMORY_MB`, its deprecated alias `RLXVIZ_MAX_TENSOR_MB` (still read,
with a `DeprecationWarning`), else `DEFAULT_MAX_MEMORY_MB`. It is checked before weights or inputs
are allocated (`check_memory`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

from ..ir import Graph
from .errors import LimitError, SessionError

DEFAULT_MAX_MEMORY_MB = 2048
"""Default limit (MiB) on the inputs + params a graph may declare."""

MAX_MEMORY_ENV = "RLXVIZ_MAX_MEMORY_MB"
"""The environment variable holding the limit in MiB."""

DEPRECATED_MEMORY_ENV = "RLXVIZ_MAX_TENSOR_MB"
"""The app's old name for `MAX_MEMORY_ENV`; read when the new one is unset, with a DeprecationWarning."""


def human_bytes(n: float) -> str:
    """`n` bytes as `12 B`, `3.4 KiB`, `149.0 GiB`."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _positive(raw: str, what: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0 or value != value or value == float("inf"):
        raise SessionError(f"{what}: must be a positive number (MiB)")
    return value


@dataclass(frozen=True)
class Limits:
    """What a session may allocate for a graph's tensors.

    Attributes:
        max_memory_mb: limit in MiB on a graph's declared inputs + params (a positive number; fractions allowed).
        source: where the value came from (`default`, `--max-memory-mb`, or the environment variable's name),
            named in refusals.
    """

    max_memory_mb: float = DEFAULT_MAX_MEMORY_MB
    source: str = "default"

    @property
    def max_bytes(self) -> int:
        return int(self.max_memory_mb * (1 << 20))

    @classmethod
    def resolve(cls, option: float | None = None, env: Mapping[str, str] | None = None) -> Limits:
        """The limits record: `option` if given, else `$RLXVIZ_MAX_MEMORY_MB`, else `$RLXVIZ_MAX_TENSOR_MB`
        (deprecated), else 2048 MiB.

        Raises:
            SessionError: the option or the variable is not a positive number.
        """
        if option is not None:
            if not option > 0:
                raise SessionError(f"--max-memory-mb must be a positive number (MiB), got {option}")
            return cls(float(option), "--max-memory-mb")
        env = os.environ if env is None else env
        raw = env.get(MAX_MEMORY_ENV, "").strip()
        if raw:
            return cls(_positive(raw, f"{MAX_MEMORY_ENV}={raw!r}"), MAX_MEMORY_ENV)
        old = env.get(DEPRECATED_MEMORY_ENV, "").strip()
        if old:
            warnings.warn(f"{DEPRECATED_MEMORY_ENV} is deprecated; set {MAX_MEMORY_ENV} instead",
                          DeprecationWarning, stacklevel=2)
            return cls(_positive(old, f"{DEPRECATED_MEMORY_ENV}={old!r}"), DEPRECATED_MEMORY_ENV)
        return cls()

    def check(self, graph: Graph, source: str, inputs: bool = True, params: bool = True) -> int:
        """Refuse `graph` when its inputs and/or params (`node.nbytes`) exceed the limit, before anything
        is allocated for them.

        Args:
            graph: the graph whose declared tensors are counted.
            source: what the graph came from, named first in the message (a preset, a file, `IR text`).
            inputs / params: which tensors count (an IR file's params are allocated at load, its inputs later).

        Returns:
            The bytes needed.

        Raises:
            LimitError: over the limit; the message names the largest tensor and how to raise the limit.
        """
        nodes = (graph.inputs if inputs else []) + (graph.params if params else [])
        total = sum(n.nbytes for n in nodes)
        if total > self.max_bytes:
            big = max(nodes, key=lambda n: n.nbytes)
            what = " and ".join(w for w, on in (("inputs", inputs), ("params", params)) if on)
            raise LimitError(
                f"{source}: its {what} need {human_bytes(total)} (the largest, %{big.id} \"{big.attrs.get('name')}\" "
                f"{big.type}, {human_bytes(big.nbytes)}), over the limit of {human_bytes(self.max_bytes)} "
                f"({self.source}); use smaller shapes, or raise {MAX_MEMORY_ENV} (CLI: --max-memory-mb) if the "
                "machine has the memory", total, self.max_bytes)
        return total


__all__ = ["DEFAULT_MAX_MEMORY_MB", "DEPRECATED_MEMORY_ENV", "MAX_MEMORY_ENV", "Limits", "human_bytes"]
