"""One limits record for every front end: how much memory one run of a loaded graph may need at its peak.

The limit comes from (first that is set): the caller's option (the CLI's `--max-memory-mb`), the
environment variable `RLXVIZ_MAX_MEMORY_MB`, its deprecated alias `RLXVIZ_MAX_TENSOR_MB` (still read,
with a `DeprecationWarning`), else `DEFAULT_MAX_MEMORY_MB`. It is checked before weights or inputs
are allocated (`Limits.check`: the peak of live bytes over the graph's schedule, `ir.memory`); checkpoint
configs are checked against `max_bytes` before their graph is built (`models.checkpoint`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from ..ir import Graph
from ..ir.memory import WORKLOADS, format_bytes, node_bytes, workload_peak
from .errors import LimitError, SessionError

DEFAULT_MAX_MEMORY_MB = 2048
"""Default limit (MiB) on the peak memory of one run of a graph."""

MAX_MEMORY_ENV = "RLXVIZ_MAX_MEMORY_MB"
"""The environment variable holding the limit in MiB."""

DEPRECATED_MEMORY_ENV = "RLXVIZ_MAX_TENSOR_MB"
"""The app's old name for `MAX_MEMORY_ENV`; read when the new one is unset, with a DeprecationWarning."""


def human_bytes(n: float) -> str:
    """`n` bytes as `12 B`, `3.4 KiB`, `149.0 GiB` (`ir.memory.format_bytes`)."""
    return format_bytes(round(n))


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
        max_memory_mb: limit in MiB on the peak memory of one run of a graph (a positive number; fractions allowed).
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

    def check(self, graph: Graph, source: str, workload: str = "load", unloaded: Collection[str] = (),
              hint: str = "", shared: Collection[str] = ()) -> int:
        """Refuse `graph` when `workload` would hold more than the limit at once: inputs, params and every
        node's output while it is live, and the copies the command makes (`ir.memory.workload_peak`: for
        `run` the saved outputs, for `run-mlx` the MLX copies, for `time` the float64 oracle and the MLX
        versions too), from shapes and dtypes, checked before anything is allocated for them.

        Args:
            graph: the graph whose schedule is counted.
            source: what the graph came from, named first in the message (a preset, a file, `IR text`).
            workload: `load` (every front end, on load), `run`, `run-mlx`, `time` or `export` (`ir.memory.WORKLOADS`).
            unloaded: with `load`, params left in their file (`models.onnx.weights.lazy_names`): not counted.
            hint: said after the refusal instead of "use smaller shapes" (e.g. how to run a slice of the model).
            shared: with `run-mlx`/`time`, params held once for NumPy and MLX (`ir.memory.workload_peak`).

        Returns:
            The peak bytes of the workload.

        Raises:
            LimitError: over the limit; the message names the peak, where it is reached, the largest
                tensor and how to raise the limit.
        """
        need, p = workload_peak(graph, workload, unloaded=unloaded, shared=shared)
        if need > self.max_bytes:
            where = f" at %{p.at_node} ({graph[p.at_node].op.value})" if p.at_node is not None else ""
            big = ""
            if p.largest is not None:
                name = p.largest.attrs.get("name")
                label = f' "{name}"' if isinstance(name, str) else ""
                big = (f" (the largest tensor, %{p.largest.id}{label} {p.largest.type}, "
                       f"{human_bytes(node_bytes(p.largest))})")
            what = "a run needs" if workload == "load" else f"{workload} needs ({WORKLOADS[workload]})"
            raise LimitError(
                f"{source}: {what} {human_bytes(need)} at its peak{where}{big}, over the limit of "
                f"{human_bytes(self.max_bytes)} ({self.source}); {hint or 'use smaller shapes'}, or raise "
                f"{MAX_MEMORY_ENV} (CLI: --max-memory-mb) if the machine has the memory", need, self.max_bytes)
        return need


__all__ = ["DEFAULT_MAX_MEMORY_MB", "DEPRECATED_MEMORY_ENV", "MAX_MEMORY_ENV", "Limits", "human_bytes"]
