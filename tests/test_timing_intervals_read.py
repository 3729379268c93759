"""An interval is shown only where its ratio is read (a newcomer at 3 rounds saw "0.98..1.38" in the table's 95% ci
column, "fusion: 0.82× (0.71–1.13)" and whiskers, beside "not read"): not from fewer rounds than a verdict needs,
not on a busy run. The table, the chart's whiskers and "Fusion or kernels?" follow one rule."""

import math
import re

import numpy as np
from test_app_timing import busy_run, figure_parts, timed

from rlxviz.app.timingchart import fusion_kernels_markdown
from rlxviz.session import FusionAndKernels, timing_table
from rlxviz.session.defaults import MIN_VERDICT_ROUNDS
from rlxviz.session.lowerings import FUSION_LABELS
from rlxviz.session.timing import busy_warning, paired_verdict

INTERVAL = re.compile(r"\(\d+\.\d\d–\d+\.\d\d\)")


def _quiet(n: int) -> list:
    base = 10.0 + np.random.default_rng(n).random(n)
    return [timed(0, "input", list(base)), timed(1, "after fuse_sdpa", list(base / 2))]


def _whiskers(rows) -> list[tuple[float, float]]:
    _, _, data = figure_parts(rows)
    return list(zip(data["x_low"], data["x_high"], strict=True))


def test_too_few_rounds_show_no_interval_and_enough_do():
    for n in (3, MIN_VERDICT_ROUNDS - 1):
        rows = timing_table(_quiet(n))
        assert rows[1]["ci"] == "not read" and math.isnan(rows[1]["ci_low"]) and math.isnan(rows[1]["ci_high"])
        lo, hi = _whiskers(rows)[1]
        assert math.isnan(lo) and math.isnan(hi)
    rows = timing_table(_quiet(MIN_VERDICT_ROUNDS))
    assert re.fullmatch(r"\d\.\d\d\.\.\d\.\d\d", rows[1]["ci"]) and rows[1]["ci_low"] <= 2.0 <= rows[1]["ci_high"]


def test_a_busy_run_shows_no_interval():
    runs = busy_run()
    assert busy_warning(*runs)
    rows = timing_table(runs)
    assert all(r["ci"] == "not read" for r in rows[1:]) and all(math.isnan(r["ci_low"]) for r in rows[1:])


def _split(n: int, busy: bool) -> str:
    a = list(10.0 + np.random.default_rng(n).random(n))
    if busy:
        a = [1.0] * (n // 4 + 1) + [3.0 + x / 10 for x in a[n // 4 + 1:]]
    rows = [timed(i, FUSION_LABELS[i], [x / (1 + i) for x in a]) for i in range(3)]
    f, k, t = paired_verdict(rows[0], rows[1]), paired_verdict(rows[1], rows[2]), paired_verdict(rows[0], rows[2])
    return fusion_kernels_markdown(FusionAndKernels(rows, f, k, t, busy_warning(*rows), ""))


def test_fusion_or_kernels_prints_an_interval_only_where_it_is_read():
    assert not INTERVAL.search(_split(3, busy=False))
    assert not INTERVAL.search(_split(MIN_VERDICT_ROUNDS, busy=True))
    assert len(INTERVAL.findall(_split(MIN_VERDICT_ROUNDS, busy=False))) == 2
