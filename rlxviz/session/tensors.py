"""A tensor's statistics for a reader (the app's node panel): shape, dtype, min/max/mean/std, a few values.

Bounded work on any size: at most `SAMPLE_LIMIT` elements are read (an evenly strided sample of a bigger
tensor, and the summary says so), so a click on a 2 GB embedding table costs the same as on a bias.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SAMPLE_LIMIT = 1 << 20
"""Most elements a summary reads (an evenly strided sample beyond this)."""
FIRST_VALUES = 8
"""Leading values a summary lists (in memory order)."""


@dataclass(frozen=True)
class TensorSummary:
    """What one tensor holds.

    Attributes:
        shape / dtype / size: as NumPy gives them (size: elements).
        read: elements the statistics are over (`size`, or `SAMPLE_LIMIT` evenly strided ones).
        min / max / mean / std: over the finite values read (None when there is none: all NaN, or not numeric).
        nonfinite: NaN and infinities among the values read.
        first: the first `FIRST_VALUES` values (memory order), as Python numbers.
    """

    shape: tuple[int, ...]
    dtype: str
    size: int
    read: int
    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    nonfinite: int
    first: tuple[float | int | bool, ...]

    def lines(self) -> list[str]:
        """The summary as short lines of plain text (numbers in 4 significant digits)."""
        out = [f"{self.dtype}{list(self.shape)}, {self.size:,} elements"]
        over = "" if self.read == self.size else f" (over an evenly spaced sample of {self.read:,})"
        if self.min is not None:
            out.append(f"min {self.min:.4g}, max {self.max:.4g}, mean {self.mean:.4g}, std {self.std:.4g}{over}")
        if self.nonfinite:
            out.append(f"{self.nonfinite:,} NaN or infinite value(s){over}")
        more = ", ..." if self.size > len(self.first) else ""
        out.append("first values: " + ", ".join(_num(v) for v in self.first) + more)
        return out


def _num(v: float | int | bool) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def summarize(array: np.ndarray, limit: int = SAMPLE_LIMIT) -> TensorSummary:
    """`array`'s `TensorSummary`, reading at most `limit` elements (>= 1).

    Raises:
        ValueError: `limit` < 1.
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    a = np.asarray(array)
    flat = a.reshape(-1)  # a view for contiguous arrays; NumPy copies only what it must for the others
    size = int(flat.size)
    sample = flat[:: -(-size // limit)] if size > limit else flat
    first = tuple(x.item() for x in flat[:FIRST_VALUES])
    lo = hi = mean = std = None
    bad = 0
    if a.dtype.kind in "biuf" and sample.size:
        v = sample.astype(np.float64)
        ok = np.isfinite(v)
        bad = int(v.size - np.count_nonzero(ok))
        if bad:
            v = v[ok]
        if v.size:
            lo, hi, mean, std = float(v.min()), float(v.max()), float(v.mean()), float(v.std())
    return TensorSummary(tuple(int(d) for d in a.shape), str(a.dtype), size, int(sample.size), lo, hi, mean, std, bad,
                         first)


__all__ = ["FIRST_VALUES", "SAMPLE_LIMIT", "TensorSummary", "summarize"]
