"""The Timing tab without a browser (issue 39): one statistic per plot (each bar labelled with its own number), the
busy-machine verdict before any ratio, and no "faster" on a busy run. Rows are built by hand, so each case holds
exactly the statistics it is about; the rows go through `session.timing_table`, as the app's do."""

import re

import numpy as np
import pytest
from bokeh.models import ColumnDataSource, LabelSet, Whisker

from rlxviz.app.panels import machine_verdict, ms_label, speedup_label, timing_figure
from rlxviz.session import VersionTiming, busy_warning, paired_verdict, timing_table
from rlxviz.session.timing import BUSY_RATIO, NOT_READ


def timed(i: int, label: str, samples: list[float]) -> VersionTiming:
    """A version timed in `samples` (ms, round order: round r of every version ran back to back)."""
    q1, q3 = np.percentile(samples, [25, 75])
    return VersionTiming(i, label, 10 - i, median_ms=float(np.median(samples)), min_ms=min(samples),
                         first_call_ms=5.0, max_abs=1e-7, iqr_ms=float(q3 - q1), samples_ms=tuple(samples))


def contradicting(reps: int = 7, seed: int = 0) -> list[VersionTiming]:
    """Two versions whose medians and whose per-round ratios point opposite ways (issue 39's bert-tiny run: the fused
    bar longer than the input's, yet "1.32x"): the fused median is above the input's, the median of the paired
    per-round ratios (input / fused) is above 1. Quiet: each median within `BUSY_RATIO` x its minimum."""
    rng = np.random.default_rng(seed)
    a = np.repeat([1.0, 1.9, 1.4], reps) * (1 + 0.001 * rng.random(3 * reps))
    b = np.repeat([0.9, 1.7, 1.75], reps) * (1 + 0.001 * rng.random(3 * reps))
    return [timed(0, "input", list(a)), timed(1, "after fuse_transformer_layer", list(b))]


def figure_parts(rows):
    """(median-ms plot, speed-up plot) of the app's timing chart and their shared data."""
    fig = timing_figure(rows)
    ms_plot, speed_plot = fig.children[0], fig.children[1]
    src = next(a for a in ms_plot.center if isinstance(a, LabelSet)).source
    assert isinstance(src, ColumnDataSource)
    return ms_plot, speed_plot, src.data


def leading_number(label: str) -> float:
    return float(re.match(r"\d+\.\d+", label).group())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_bar_is_labelled_with_its_own_statistic_where_medians_and_ratios_disagree(seed):
    versions = contradicting(seed=seed)
    a, b = versions
    v = paired_verdict(a, b)
    # the case: the two statistics disagree (the fused median is longer, its per-round ratio says faster)
    assert b.median_ms > a.median_ms and v.ratio > 1 and not busy_warning(*versions)
    rows = timing_table(versions)
    ms_plot, speed_plot, data = figure_parts(rows)
    ms_text = next(a for a in ms_plot.center if isinstance(a, LabelSet)).text
    speed_text = next(a for a in speed_plot.center if isinstance(a, LabelSet)).text
    ms_bar = next(r.glyph.right for r in ms_plot.renderers)
    speed_bar = next(r.glyph.right for r in speed_plot.renderers)
    for k, row in enumerate(rows):
        # the median plot: its bar and its label are the median ms, nothing else
        assert data[ms_text][k] == ms_label(row) and data[ms_text][k].endswith(" ms") and "×" not in data[ms_text][k]
        assert leading_number(data[ms_text][k]) == pytest.approx(data[ms_bar][k], abs=0.005)
        # the speed-up plot: its bar and its label are the median of the paired ratios
        assert data[speed_text][k] == speedup_label(row)
        assert leading_number(data[speed_text][k]) == pytest.approx(data[speed_bar][k], abs=0.005)
    # inside each plot the longer bar is the larger label: the fused version is longer in ms and in speed-up
    assert data[ms_bar][1] > data[ms_bar][0] and leading_number(data[ms_text][1]) > leading_number(data[ms_text][0])
    assert data[speed_bar][1] == pytest.approx(round(v.ratio, 2)) and data[speed_bar][1] > data[speed_bar][0] == 1.0
    # the speed-up's whisker is its own interval (the median ms whiskers are p25..p75)
    w = next(a for a in speed_plot.center if isinstance(a, Whisker))
    assert (data[w.lower][1], data[w.upper][1]) == (rows[1]["ci_low"], rows[1]["ci_high"])
    assert data[w.lower][1] <= data[speed_bar][1] <= data[w.upper][1]
    assert speed_plot.x_range.end > max(data[w.upper]) and ms_plot.x_range.end > max(data["high"])


def test_the_ratio_direction_reverses_the_other_way_too():
    """The mirror case: the fused median shorter than the input's while the per-round ratio is below 1; the two
    plots still label each bar with its own number, so neither says the opposite of its bar."""
    a, b = contradicting(seed=3)
    rows = timing_table([timed(0, "input", list(b.samples_ms)), timed(1, "after fuse_sdpa", list(a.samples_ms))])
    ms_plot, speed_plot, data = figure_parts(rows)
    assert data["ms"][1] < data["ms"][0] and data["x"][1] < 1.0
    assert leading_number(data["ms_label"][1]) < leading_number(data["ms_label"][0])
    assert leading_number(data["speedup"][1]) < 1.0 and "faster" not in data["speedup"][1]


def busy_run() -> list[VersionTiming]:
    """A run on a busy machine: the input's median is 3x its minimum (above `BUSY_RATIO`), while the fused version's
    paired rounds are all clearly faster (a quiet run would read "faster")."""
    rng = np.random.default_rng(7)
    a = np.concatenate([[1.0] * 4, 3.0 + rng.random(17)])
    return [timed(0, "input", list(a)), timed(1, "after fuse_sdpa", list(a * 0.5)),
            timed(2, "after fuse_transformer_layer", list(a * 0.45))]


def test_a_busy_run_reads_no_faster_anywhere_and_says_so_first():
    runs = busy_run()
    warning = busy_warning(*runs)
    assert warning and runs[0].median_ms > BUSY_RATIO * runs[0].min_ms
    assert paired_verdict(runs[0], runs[1]).words.endswith("faster")  # what a quiet run would have printed
    rows = timing_table(runs)
    assert all(r["busy"] == warning for r in rows)
    for r in rows[1:]:
        assert r["vs_input"] == NOT_READ and r["vs_previous"] == NOT_READ
    for r in rows:
        text = " ".join(str(v) for v in r.values()) + " " + speedup_label(r)
        assert "faster" not in text and "slower" not in text, text
    assert all("not read" in speedup_label(r) for r in rows[1:])
    md, kind = machine_verdict(rows)
    assert kind == "danger" and md.startswith("**Busy machine") and "faster" not in md and "x the minimum" in md
    _, speed_plot, _ = figure_parts(rows)
    assert "busy" in speed_plot.title.text


def test_a_quiet_run_gives_verdicts_and_says_the_machine_was_quiet():
    runs = busy_run()
    quiet = [timed(r.index, r.label, [x if x > 2 else 3.2 for x in r.samples_ms]) for r in runs]
    assert not busy_warning(*quiet)
    rows = timing_table(quiet)
    assert all(r["busy"] == "" for r in rows) and rows[1]["vs_input"].endswith("faster")
    md, kind = machine_verdict(rows)
    assert kind == "success" and "Quiet" in md
    assert machine_verdict([]) == ("", "light")


def test_a_busy_version_hidden_from_the_table_still_flags_the_run():
    """The verdict reads every timed version (as the notebooks do), not only the shown ones: a busy round hits the
    whole run."""
    runs = busy_run()
    rows = timing_table(runs, visible=[(1, runs[1].label), (2, runs[2].label)])
    assert rows[0]["busy"] and rows[1]["vs_input"] == NOT_READ


def test_the_timing_view_puts_the_machine_verdict_before_the_charts():
    from rlxviz.app.jobs import Runner
    from rlxviz.app.panels import TimingView
    from rlxviz.app.state import AppState

    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    view = TimingView(state=s)
    assert not view.machine.visible
    s.param.update(blas="MLX", timings=timing_table(busy_run()))
    assert view.machine.visible and view.machine.alert_type == "danger" and "Busy machine" in view.machine.object
    order = list(view.__panel__().objects)
    assert order.index(view.machine) < order.index(view.chart) and order.index(view.machine) < order.index(view.table)
    assert "busy" not in view.table.value.columns or "busy" in view.table.hidden_columns
    s.timings = timing_table([timed(0, "input", [1.0] * 21), timed(1, "after fuse_sdpa", [0.5] * 21)])
    assert view.machine.alert_type == "success"
