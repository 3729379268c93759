"""The Timing tab without a browser (issue 39): one statistic per plot (each bar labelled with its own number), the
busy-machine verdict before any ratio, and no "faster" on a busy run. Rows are built by hand, so each case holds
exactly the statistics it is about; the rows go through `session.timing_table`, as the app's do."""

import re

import numpy as np
import pytest
from bokeh.models import ColumnDataSource, Div, LabelSet, Whisker

from rlxviz.app.timingchart import BUSY_SPEEDUP_HEAD, machine_verdict, ms_label, speedup_label, timing_figure
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
    per-round ratios (input / fused) is above 1. Quiet: each median within `BUSY_RATIO` x its minimum and each IQR
    within `NOISY_IQR` x its median (the rounds spread 1.0..1.3 ms; a spread of 1.0..1.9 ms reads busy)."""
    rng = np.random.default_rng(seed)
    a = np.repeat([1.0, 1.3, 1.15], reps) * (1 + 0.001 * rng.random(3 * reps))
    b = np.repeat([0.95, 1.25, 1.3], reps) * (1 + 0.001 * rng.random(3 * reps))
    return [timed(0, "input", list(a)), timed(1, "after fuse_transformer_layer", list(b))]


def figure_parts(rows):
    """(median-ms plot, speed-up plot) of the app's timing chart and their shared data."""
    fig = timing_figure(rows)
    ms_plot, speed_plot = fig.children[0], fig.children[1].children[0]  # the speed-up plot: below, left
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
    assert kind == "danger" and md.startswith("**Busy machine") and "faster" not in md and "x) the minimum" in md
    _, speed_plot, _ = figure_parts(rows)  # no speed-up plot: the message in its place says why
    assert isinstance(speed_plot, Div) and BUSY_SPEEDUP_HEAD in speed_plot.text


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
    from rlxviz.app.state import AppState
    from rlxviz.app.timingview import TimingView

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


# --- fusion and kernels apart (issue 39): the final version on MLX's own lowering beside rlxviz's kernels ---


def bert_tiny_trace():
    from rlxviz import session
    from rlxviz.passes import Pipeline

    m = session.load("bert-tiny", 1, 8)
    return m, Pipeline.canonical().run(m.graph), session.feeds(m, "two words")


def test_fusion_and_kernels_pairs_the_input_and_the_final_version_on_both_lowerings():
    from rlxviz.session import FusionAndKernels, fusion_and_kernels
    from rlxviz.session.lowerings import FUSION_LABELS

    m, trace, feeds = bert_tiny_trace()
    split = fusion_and_kernels(trace.input, trace.final, feeds, m.weights, warmup=0, repeat=3)
    assert isinstance(split, FusionAndKernels) and [r.label for r in split.rows] == list(FUSION_LABELS)
    a, b, c = split.rows
    assert a.nodes == len(trace.input.compute_nodes()) > b.nodes == c.nodes == len(trace.final.compute_nodes())
    assert len(a.samples_ms) == len(b.samples_ms) == len(c.samples_ms) == 3  # one paired run
    # rows 0 and 1 on MLX's own lowering (kernels off), row 2 on the default (rlxviz's kernels where they build)
    assert "off (lowering option kernels=False)" in a.context.kernels and a.context.kernels == b.context.kernels
    assert c.context.kernels == split.kernels_note and "kernels=False" not in c.context.kernels
    # the three verdicts are ratios of those rows' medians (fusion x kernels = total), the same outputs within float32
    # rounding
    from rlxviz.session.lowerings import medians_verdict

    assert split.fusion == medians_verdict(a, b) and split.kernels == medians_verdict(b, c)
    assert split.total == medians_verdict(a, c) and split.warning == busy_warning(a, b, c)
    assert split.fusion.ratio * split.kernels.ratio == pytest.approx(split.total.ratio, rel=1e-12)
    assert b.err_unfused < 1e-4 and c.err_unfused < 1e-4


def fabricated_split(busy: bool):
    from rlxviz.session import FusionAndKernels
    from rlxviz.session.lowerings import FUSION_LABELS

    rng = np.random.default_rng(3)
    base = 10 + rng.random(21)
    if busy:
        base[:6] = 3.0  # the input's median more than BUSY_RATIO x its minimum
    rows = [timed(0, FUSION_LABELS[0], list(base)), timed(1, FUSION_LABELS[1], list(base * 0.8)),
            timed(2, FUSION_LABELS[2], list(base * 0.25))]
    rows[1].nodes = rows[2].nodes = 4
    return FusionAndKernels(rows, paired_verdict(rows[0], rows[1]), paired_verdict(rows[1], rows[2]),
                            paired_verdict(rows[0], rows[2]), busy_warning(*rows),
                            "rlxviz CPU kernels: not available (see /home/someone/.cache/rlxviz/kernels/build.log)")


def test_the_split_table_names_fusion_and_kernels_and_reads_no_verdict_when_busy():
    from rlxviz.app.timingchart import fusion_kernels_markdown

    quiet = fusion_kernels_markdown(fabricated_split(busy=False))
    assert "fusion: 1.25×" in quiet and "kernels: 3.20×" in quiet and "4.00× over the input" in quiet
    assert quiet.count("faster") == 2 and "Busy" not in quiet
    assert "/home/someone" not in quiet and "build.log" in quiet  # no server path
    busy = fusion_kernels_markdown(fabricated_split(busy=True))
    assert "faster" not in busy and "slower" not in busy and busy.count("not read") >= 3
    assert busy.index("busy machine") < busy.index("fusion: ")  # the verdict on the machine before any ratio
    assert "CPU only" in fusion_kernels_markdown(None)


@pytest.mark.parametrize("text, shown", [
    ("BLAS cmeel-openblas (/srv/app/.venv/lib/python3.11/site-packages/cmeel.prefix/lib/libopenblas.so.0), 2 threads",
     "BLAS cmeel-openblas (libopenblas.so.0), 2 threads"),
    ("debian-openblas (/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3)", "debian-openblas (libblas.so.3)"),
    ("kernels: not available (g++ failed, see /home/u/.cache/rlxviz/kernels/build.log); fused ops run MLX's",
     "kernels: not available (g++ failed, see build.log); fused ops run MLX's"),
    ("median 1.2/0.9 ms, 2 CPU streams", "median 1.2/0.9 ms, 2 CPU streams"),
])
def test_timing_text_names_files_not_server_paths(text, shown):
    from rlxviz.app.wording import hide_server_paths

    assert hide_server_paths(text) == shown


def test_the_timing_tab_shows_the_split_and_no_server_path():
    """One real timing run of bert-tiny in the timing process (3 rounds): the header names the BLAS library without
    the server's virtualenv path, and the tab shows the three rows of the fusion / kernels split."""
    import sys

    from rlxviz.app.jobs import Runner
    from rlxviz.app.state import AppState
    from rlxviz.app.timingview import TimingView
    from rlxviz.session.lowerings import FUSION_LABELS

    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8, repeat=3, warmup=0)
    view = TimingView(state=s)
    s.time_all(fresh=True)
    assert s.timings and s.message_kind != "danger", s.message
    assert sys.prefix not in s.blas and sys.prefix not in view.blas.object and "BLAS" in s.blas
    if s.device == "cpu":
        assert s.timing_split is not None and all(lbl in view.split.object for lbl in FUSION_LABELS)
        assert sys.prefix not in view.split.object
        order = list(view.__panel__().objects)
        assert order.index(view.machine) < order.index(view.split)


def test_a_failed_split_leaves_the_versions_timed_and_says_why(monkeypatch):
    """The split's own-lowering row is timed with the versions in the timing process (issue 39: one measurement); if
    it cannot be built (memory, a lowering), the versions' rows stand and the tab says why the split is missing (run
    in this process: `timeproc._time` is the worker's body)."""
    from rlxviz.app import timeproc
    from rlxviz.app.timingchart import fusion_kernels_markdown
    from rlxviz.session import timing

    def refuse(*a, **k):
        raise MemoryError("no room at /srv/app/.venv/lib/x.so for the split")

    # the split is no separate run any more (it was `lowerings.fusion_and_kernels`): its row's executor refuses
    monkeypatch.setattr(timing, "own_lowering_executor", refuse)
    m, trace, feeds = bert_tiny_trace()
    run = timeproc._time(trace, feeds, m.weights, 0, 2, "cpu", None)
    assert run.rows and all(r.median_ms for r in run.rows if r.same_as is None)
    assert isinstance(run.split, str) and run.split.startswith("MemoryError")
    text = fusion_kernels_markdown(run.split)
    assert "Not measured: MemoryError" in text and "/srv/app" not in text and "x.so" in text


def test_the_forced_busy_hook_turns_a_quiet_run_busy(monkeypatch):
    """`timeproc.force_busy` (the `RLXVIZ_FORCE_BUSY` test hook the browser test serves the app with): a quiet run
    comes out flagged busy, each row's minimum kept, and the table gives no verdict; the split too."""
    from rlxviz.app.timeproc import _force_busy_split, force_busy

    quiet = contradicting(seed=4)
    assert not busy_warning(*quiet)
    busy = force_busy(quiet)
    assert busy_warning(*busy) and [r.min_ms for r in busy] == [r.min_ms for r in quiet]
    assert all(r.median_ms > BUSY_RATIO * r.min_ms for r in busy)
    rows = timing_table(busy)
    assert all(r["busy"] for r in rows) and rows[1]["vs_input"] == NOT_READ
    split = _force_busy_split(fabricated_split(busy=False))
    assert split.warning and split.warning == busy_warning(*split.rows)
    from rlxviz.app.timingchart import fusion_kernels_markdown

    text = fusion_kernels_markdown(split)
    assert "busy machine" in text and "faster" not in text and "slower" not in text
    # a row with too few rounds to be judged, or not timed, is kept as it is
    few = [timed(0, "input", [1.0, 1.1])]
    assert force_busy(few) == few


def test_medians_that_point_the_other_way_give_no_verdict():
    """Issue 39: the split's row "final, rlxviz's CPU kernels" rose from 1.27 to 1.63 ms under "kernels: 1.21×":
    the median per-round ratio and the ratio of the medians can point opposite ways (here most rounds are faster,
    the middle one slower). Then neither is read: the row, the chart's label and the split's sentence say so."""
    from rlxviz.app.timingchart import fusion_kernels_markdown, speedup_label
    from rlxviz.session import FusionAndKernels
    from rlxviz.session.lowerings import FUSION_LABELS
    from rlxviz.session.timing import DISAGREE

    base = [1.0] * 10 + [5.0] + [10.0] * 10
    slower_median = [0.9] * 10 + [6.0] + [9.5] * 10  # 20 rounds faster, the median round slower: 5 -> 6 ms
    rows = [timed(0, FUSION_LABELS[0], base), timed(1, FUSION_LABELS[1], slower_median),
            timed(2, FUSION_LABELS[2], [x * 0.5 for x in slower_median])]
    v = paired_verdict(rows[0], rows[1])
    assert v.ratio > 1 and rows[1].median_ms > rows[0].median_ms and v.words == DISAGREE
    assert paired_verdict(rows[1], rows[2]).words == "2.00x faster"  # medians and rounds agree: read
    split = FusionAndKernels(rows, v, paired_verdict(rows[1], rows[2]), paired_verdict(rows[0], rows[2]), "", "")
    text = fusion_kernels_markdown(split)
    assert f"| {DISAGREE} |" in text and "(not read: medians and paired rounds disagree)." in text, text
    label = speedup_label({"speedup": v.ratio, "vs_input": v.words, "ci_low": v.low, "ci_high": v.high})
    assert "not read" in label and "faster" not in label, label


@pytest.mark.parametrize("n", [1, 2, 6, 12])
def test_the_median_plot_has_a_row_of_its_own(n):
    """Issue 39: in one row with the speed-up and error plots (and the version names on its axis) the median plot had
    about 65 px of plot at 1280x800. Now it stretches over the chart's width alone; the speed-up plot below names the
    versions again (its y axis shows), beside the fixed-width error plot; each plot is as tall as its rows need."""
    from bokeh.models import Column, Row

    from rlxviz.app.timingchart import plot_height

    rows = timing_table([timed(i, "input" if i == 0 else f"after pass_{i}", [1.0 + 0.1 * i, 1.1, 1.2])
                         for i in range(n)])
    fig = timing_figure(rows)
    assert isinstance(fig, Column) and len(fig.children) == 2
    ms_plot, below = fig.children
    assert isinstance(below, Row) and ms_plot.sizing_mode == "stretch_width"
    speed_plot, err_plot = below.children
    assert speed_plot.sizing_mode == "stretch_width" and err_plot.width == 240
    assert all(a.visible for a in speed_plot.yaxis) and not any(a.visible for a in err_plot.yaxis)
    h = plot_height(n)
    assert ms_plot.height == speed_plot.height == err_plot.height == h and fig.height == 2 * h
    assert h >= 200 and (n < 4 or plot_height(n + 1) > h)  # more versions, taller plots
    assert speed_plot.y_range is ms_plot.y_range is err_plot.y_range and len(ms_plot.y_range.factors) == n


def test_the_chart_pane_is_as_tall_as_its_plots():
    """The Timing tab's chart pane takes the column's height (it was a fixed 340 px for one row of plots)."""
    from rlxviz.app.jobs import Runner
    from rlxviz.app.state import AppState
    from rlxviz.app.timingchart import plot_height
    from rlxviz.app.timingview import TimingView

    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    view = TimingView(state=s)
    for n in (2, 9):
        s.param.update(blas="MLX", timings=timing_table([timed(i, f"v{i}", [1.0] * 5) for i in range(n)]))
        assert view.chart.height == view.chart.object.height == 2 * plot_height(n)


@pytest.mark.parametrize("reps", [1, 2, 5])
def test_the_round_count_is_read_from_the_row_not_from_the_verdict_words(reps):
    """Issue 39 (code debt): `timing_table` rows carry `rounds` (the paired rounds `vs_input` was read from; the
    input's row its own), and `speedup_label` reads that, not the count parsed back out of the verdict's words: a
    verdict worded otherwise still gives "not read (N rounds < 21)"."""
    from rlxviz.session.defaults import MIN_VERDICT_ROUNDS

    versions = contradicting(reps=reps)
    n = 3 * reps
    assert n < MIN_VERDICT_ROUNDS
    rows = timing_table(versions)
    assert [r["rounds"] for r in rows] == [n, n]
    assert speedup_label(rows[1]).endswith(f"not read ({n} rounds < {MIN_VERDICT_ROUNDS})")
    reworded = {**rows[1], "vs_input": "not enough rounds"}  # the words no longer hold the numbers
    assert speedup_label(reworded) == speedup_label(rows[1])
    enough = timing_table(contradicting(reps=MIN_VERDICT_ROUNDS))
    assert enough[1]["rounds"] == 3 * MIN_VERDICT_ROUNDS and "rounds <" not in speedup_label(enough[1])


def test_a_busy_run_prints_no_speed_up_on_the_input_row_either():
    """A newcomer's forced busy run: the chart's caption said no speed-up is printed, yet the table's input row
    showed speed-up "1.00" and an interval "1.0–1.0". On a busy run every row's speed-up cell, the input's own
    included, reads the word the others read, and no interval is printed; `rlxviz time`'s `x input` cell (one
    function, `speedup_text`) prints no "1.00" either."""
    from rlxviz.app.jobs import Runner
    from rlxviz.app.state import AppState
    from rlxviz.app.timeproc import force_busy
    from rlxviz.app.timingview import TimingView
    from rlxviz.session.timing import speedup_text

    runs = force_busy(contradicting(seed=4))
    rows = timing_table(runs)
    assert rows[0]["busy"]
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    view = TimingView(state=s)
    s.param.update(blas="MLX", timings=rows)
    table = view.table.value
    assert list(table["speedup"]) == [NOT_READ] * len(rows)
    assert all(c in ("not read", "-") for c in table["ci"]), list(table["ci"])
    assert all(x != x for x in table["ci_low"]) and all(x != x for x in table["ci_high"])
    assert speedup_text(rows[0]) == NOT_READ  # `format_timings`' `x input` cell, as `rlxviz time` prints it


def test_too_few_rounds_are_not_called_quiet():
    """minilm timed in 3 rounds on a busy machine: the banner read "Quiet enough ... the verdicts below can be read"
    beside verdicts of "too few rounds (3 < 21)" (an IQR at 0.49x its median). With fewer rounds than a verdict needs
    the banner says they are too few to judge the machine (`timing_words.too_few_rounds`), in the app's view too."""
    from rlxviz.app.jobs import Runner
    from rlxviz.app.state import AppState
    from rlxviz.app.timingview import TimingView

    rows = timing_table([timed(0, "input", [1.0, 1.2, 1.9]), timed(1, "after fuse_sdpa", [0.5, 0.6, 0.9])])
    assert not rows[0]["busy"] and rows[1]["rounds"] == 3
    md, kind = machine_verdict(rows)
    assert kind == "warning" and md.startswith("**Too few rounds to judge the machine quiet or busy (3 < 21):"), md
    assert "Quiet" not in md and "can be read" not in md, md
    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    view = TimingView(state=s)
    s.param.update(blas="MLX", timings=rows)
    assert view.machine.alert_type == "warning" and "Too few rounds" in view.machine.object
    s.timings = timing_table([timed(0, "input", [1.0] * 21), timed(1, "after fuse_sdpa", [0.5] * 21)])
    assert view.machine.alert_type == "success" and "Quiet enough" in view.machine.object
