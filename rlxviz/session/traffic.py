"""Memory traffic a pass's fusions removed: intermediates that are no longer written and read back."""

from __future__ import annotations

from dataclasses import dataclass

from ..passes.trace import PassStep


@dataclass(frozen=True)
class Traffic:
    """Memory traffic a pass removed: intermediates that fused nodes no longer write or read.

    Attributes:
        intermediates: per removed intermediate, `(node id, op, bytes, users)`: its output tensor of
            `bytes` (node.nbytes) was written once and read by `users` nodes before the fusion.
        bytes_written / bytes_read: totals over the intermediates (bytes).
    """

    intermediates: tuple[tuple[int, str, int, int], ...]
    bytes_written: int
    bytes_read: int

    @property
    def total(self) -> int:
        return self.bytes_written + self.bytes_read

    def __str__(self) -> str:
        return (f"{len(self.intermediates)} intermediate tensor(s) no longer materialized: "
                f"{_kib(self.bytes_written)} not written + {_kib(self.bytes_read)} not read = {_kib(self.total)}")


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"


def traffic_saved(step: PassStep) -> Traffic:
    """Bytes of intermediates a pass's fusions no longer write to and read from memory.

    An intermediate is a compute node the pass absorbed whose every reader was absorbed too and
    which is not a graph output (the match's result is still written by the fused node, so it is
    not counted). Its tensor was written once (`node.nbytes`) and read once per user.
    """
    before, after = step.before, step.after
    items = []
    for m in step.matches:
        if m.fused is None or m.fused not in after:
            continue
        absorbed = set(after[m.fused].absorbed)
        for i in sorted(absorbed):
            if i not in before:
                continue
            n = before[i]
            users = before.users(i)
            if before.is_output(i) or any(u.id not in absorbed for u in users) or i in after:
                continue
            items.append((i, n.op.value, n.nbytes, len(users)))
    return Traffic(tuple(items), sum(b for _, _, b, _ in items), sum(b * u for _, _, b, u in items))


__all__ = ["Traffic", "traffic_saved"]
