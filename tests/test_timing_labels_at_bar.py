"""A newcomer's Timing tab on minilm at 1280x800 and 1920x1080: each median label was printed after its p75 whisker,
so on a noisy run the input's bar ended near 56 ms while "55.91 ms" sat at the 600 ms gridline ("16.90 ms" near the
24 ms gridline at 1920): from the back of a room the number read against the wrong gridline. And on every busy run the
speed-up panel was an empty plot holding only the red rule at 1. Now each label sits at its own bar's end (the whisker
along the bar's lower edge, below the label), and a busy run's speed-up panel is a message with the busy flag's
figures. Bar and label stay the same quantity (issue 39). Busy runs are forced as the browser tests force them
(`app.timeproc.force_busy`); rows are built by hand (`timed`)."""

from __future__ import annotations

import numpy as np
import pytest
from bokeh.models import Div, LabelSet, Whisker
from bokeh.plotting import figure as Figure  # noqa: N812 - the class the plots are
from timed_versions import timed

from rlxviz.app.timeproc import force_busy
from rlxviz.app.timingchart import (
    BUSY_SPEEDUP_HEAD,
    LABEL_GAP_PX,
    WHISKER_DODGE,
    busy_speedup_html,
    ms_label,
    speedup_label,
    timing_figure,
)
from rlxviz.session import VersionTiming, timing_table


def noisy_minilm() -> list[VersionTiming]:
    """The newcomer's noisy run, in shape: the input's median near 56 ms, its p75 near 600 ms (rounds stalled
    by a busy machine: 10 rounds in 24), the fused versions quiet and near 17 ms."""
    rng = np.random.default_rng(3)
    base = 55.0 + rng.random(24)
    stalled = np.where(np.arange(24) % 12 < 5, base * 11, base)  # 10 rounds in 24 stalled: p75 far past the median
    return [timed(0, "input", stalled), timed(1, "after fuse_sdpa", base * 0.31),
            timed(2, "after fuse_transformer_layer", base * 0.30)]


def quiet_run() -> list[VersionTiming]:
    rng = np.random.default_rng(4)
    base = 20.0 + 0.2 * rng.random(24)
    return [timed(0, "input", base), timed(1, "after fuse_sdpa", base * 0.8),
            timed(2, "after fuse_transformer_layer", base * 0.5)]


def plot_parts(plot):
    """(labels, whisker, bar's `right` column, data) of one timing plot."""
    label = next(a for a in plot.center if isinstance(a, LabelSet))
    whisker = next(a for a in plot.center if isinstance(a, Whisker))
    bar = next(r.glyph.right for r in plot.renderers)
    return label, whisker, bar, label.source.data


def assert_at_bar_end(plot, what: str) -> None:
    """Each label of `plot` lies at its own bar's end: its x within 1% of the x range from the bar's end (data units,
    plus a few px to its right), never at its whisker's end where that lies farther; the whisker is drawn below it."""
    label, whisker, bar, data = plot_parts(plot)
    span = plot.x_range.end - plot.x_range.start
    for k, x in enumerate(data[label.x]):
        assert abs(x - data[bar][k]) <= 0.01 * span, (what, k, x, data[bar][k])
        if data[whisker.upper][k] - data[bar][k] > 0.05 * span:  # a long whisker: the label is not at its end
            assert abs(x - data[whisker.upper][k]) > 0.04 * span, (what, k)
    assert 0 < label.x_offset <= 2 * LABEL_GAP_PX and label.text_baseline == "middle" and label.y_offset >= 0
    # the whisker along the bar's lower edge, off the label's centre line
    assert whisker.base.transform.value == WHISKER_DODGE < 0
    assert whisker.upper_head.size <= 8 and whisker.lower_head.size <= 8


def test_the_noisy_inputs_median_label_sits_at_its_bar_not_at_the_600_ms_whisker():
    rows = timing_table(noisy_minilm())
    assert rows[0]["p75_ms"] > 8 * rows[0]["median_ms"]  # the case: p75 far past the median (busy by IQR)
    ms_plot = timing_figure(rows).children[0]
    label, whisker, bar, data = plot_parts(ms_plot)
    assert 55 < data[bar][0] < 57 and data[whisker.upper][0] > 500
    assert_at_bar_end(ms_plot, "median ms")
    # the label is its bar's own number (issue 39), placed where that number is on the axis
    for k, row in enumerate(rows):
        assert data[label.text][k] == ms_label(row) == f"{data[bar][k]:.2f} ms"
        assert data[label.x][k] == data[bar][k]


@pytest.mark.parametrize("make", [quiet_run, noisy_minilm])
def test_every_median_label_at_its_bar_end_quiet_or_noisy(make):
    assert_at_bar_end(timing_figure(timing_table(make())).children[0], "median ms")


def test_the_speed_up_labels_sit_at_their_bars_too():
    rows = timing_table(quiet_run())
    assert not rows[0]["busy"]
    sp = timing_figure(rows).children[1].children[0]
    assert isinstance(sp, Figure().__class__) and sp.title.text.startswith("speed-up")
    assert_at_bar_end(sp, "speed-up")
    label, _, bar, data = plot_parts(sp)
    for k, row in enumerate(rows):  # the bar's own number, at the bar's end (its interval is in the label's words)
        assert data[label.text][k] == speedup_label(row) and data[label.text][k].startswith(f"{data[bar][k]:.2f}×")


@pytest.mark.parametrize("make", [quiet_run, noisy_minilm])
def test_a_busy_runs_speed_up_panel_is_a_message_with_the_flags_figures(make):
    rows = timing_table(force_busy(make()))
    flag = rows[0]["busy"]
    assert flag and all(r["busy"] == flag for r in rows)
    fig = timing_figure(rows)
    below = fig.children[1].children
    note, err = below
    # no empty plot: the speed-up figure is gone, a message stands in its place
    assert isinstance(note, Div) and not any(getattr(c, "title", None) is not None and
                                             str(c.title.text).startswith("speed-up") for c in below)
    assert busy_speedup_html(rows) in note.text and BUSY_SPEEDUP_HEAD in note.text
    assert "busy" in note.text and "Time again" in note.text
    figures = [w for w in flag.split() if any(ch.isdigit() for ch in w)]
    assert figures and all(w.rstrip(".,:;") in note.text for w in figures), (figures, note.text)
    # as tall as its text, within the row of the error plot (the chart's column stays twice a plot's height)
    assert note.height is None and note.sizing_mode == "stretch_width" and note.margin[0] == note.margin[2] == 0
    assert err.height == fig.children[0].height and fig.height == 2 * err.height
    # the error plot beside it names the versions itself (the speed-up plot named them)
    assert all(a.visible for a in err.yaxis) and err.y_range is fig.children[0].y_range
    # the median plot is drawn as measured, labels at their bars
    assert_at_bar_end(fig.children[0], "median ms (busy)")


def test_the_busy_message_escapes_the_flag_and_is_empty_on_a_usable_run():
    rows = [{"busy": "unusable run: median 3.00 ms is 3.0x the minimum 1.00 ms on #1 <b>x</b> & y", "median_ms": 3.0}]
    text = busy_speedup_html(rows)
    assert "&lt;b&gt;x&lt;/b&gt; &amp; y" in text and "<b>x</b>" not in text
    assert busy_speedup_html(timing_table(quiet_run())) == ""
