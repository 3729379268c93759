"""A version's timing made from its samples, for the timing tests (`timed`): one helper, not one per test file."""

from __future__ import annotations

import numpy as np

from rlxviz.session import VersionTiming


def timed(i: int, label: str, samples) -> VersionTiming:
    """Version `i` timed in `samples` (ms, round order: round r of every version ran back to back), named `label`,
    with `10 - i` ops (at least 1), its median, minimum and interquartile range read from the samples."""
    s = [float(x) for x in samples]
    q1, q3 = np.percentile(s, [25, 75])
    return VersionTiming(i, label, 10 - min(i, 9), median_ms=float(np.median(s)), min_ms=min(s), first_call_ms=5.0,
                         max_abs=1e-7, err_unfused=0.0, ok=True, iqr_ms=float(q3 - q1), samples_ms=tuple(s))
