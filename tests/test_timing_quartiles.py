"""The IQR the busy rule reads is the p25..p75 span the timing table and its whiskers show (a newcomer saw "IQR
0.40 ms is 0.5x the median" beside p25 0.78 / p75 0.981: `statistics.quantiles`' exclusive method made three rounds'
IQR their whole range)."""

import numpy as np
import pytest

from rlxviz.runtime.timing import summarize
from rlxviz.session.timing import VersionTiming


@pytest.mark.parametrize("n", [2, 3, 4, 5, 21, 100])
def test_summarize_iqr_is_the_span_of_the_shown_quartiles(n):
    for seed in range(20):
        s = np.random.default_rng(seed * 1000 + n).lognormal(-7, 0.5, n)
        t = summarize(list(s), 0.01)
        row = VersionTiming(0, "input", 5, median_ms=t.median_ms, min_ms=t.min_ms, iqr_ms=t.iqr_ms,
                            samples_ms=t.samples_ms)
        p25, p75 = row.quartiles()
        assert t.iqr_ms == pytest.approx(p75 - p25, rel=1e-9, abs=1e-12)


def test_three_rounds_iqr_is_not_their_range():
    t = summarize([0.00078, 0.00079, 0.00118], 0.01)
    assert t.iqr_ms == pytest.approx(np.subtract(*np.percentile([0.78, 0.79, 1.18], [75, 25])))
    assert t.iqr_ms < 0.40 - 1e-9  # the exclusive method gave max - min = 0.40 ms
