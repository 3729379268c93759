"""The busy-machine sentence shows a ratio with the digits that put it over its limit: a newcomer read "IQR 7.25 ms
is 0.5x the median 14.24 ms" where the rule is "an IQR over 0.5x the median" (7.25 / 14.24 = 0.51 rounded to the
limit itself), so the sentence seemed to blame the machine for sitting at the threshold."""

from rlxviz.session.timing import BUSY_RATIO, NOISY_IQR, VersionTiming, busy_warning


def test_a_noisy_row_reads_over_the_iqr_limit():
    row = VersionTiming(index=26, label="after mark_elementwise_regions", nodes=9, median_ms=14.24, min_ms=13.0,
                        iqr_ms=7.25)
    words = busy_warning(row)
    assert f"IQR 7.25 ms is 0.51x (over {NOISY_IQR:g}x) the median 14.24 ms" in words, words


def test_a_busy_row_reads_over_the_minimum_limit():
    row = VersionTiming(index=3, label="after canonicalize_gelu", nodes=9, median_ms=4.1, min_ms=2.0, iqr_ms=0.1)
    words = busy_warning(row)
    assert f"median 4.10 ms is 2.05x (over {BUSY_RATIO:g}x) the minimum 2.00 ms on #3" in words, words


def test_a_quiet_row_says_nothing():
    row = VersionTiming(index=1, label="after canonicalize_exported", nodes=9, median_ms=4.0, min_ms=3.9, iqr_ms=0.2)
    assert busy_warning(row) == ""
