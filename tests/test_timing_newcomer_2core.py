"""A newcomer on a 2-core machine read the Timing tab and `rlxviz time` as misleading: speed-ups shown on a busy run
(the app's bars and table, while the CLI printed "busy: not read"), a busy banner naming a row "#28" no view shows,
paired ratios that contradict the medians beside them without a word, a median label drawn at the whisker's end,
green bars for "slower", and a legend saying every bar is labelled when on a busy run none is. Rows are built by
hand (`timed`), so each case holds exactly the statistics it is about."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from bokeh.models import LabelSet
from timed_versions import timed

from rlxviz.app.timingchart import (
    FASTER_COLOR,
    NEUTRAL_COLOR,
    SLOWER_COLOR,
    chart_legend,
    fusion_kernels_markdown,
    machine_verdict,
    speedup_color,
    table_rows,
    timing_factor,
    timing_figure,
)
from rlxviz.cli.timing import split_text
from rlxviz.session import VersionTiming, busy_warning, format_timings, paired_verdict, timing_table
from rlxviz.session.lowerings import fusion_and_kernels_of, step_cell
from rlxviz.session.timing import (
    DISAGREE,
    DISAGREE_CELL,
    NOT_READ,
    OWN_LOWERING_LABEL,
    medians_disagree,
    speedup_shown,
    speedup_text,
)


def busy_versions(seed: int) -> list[VersionTiming]:
    """Three versions on a busy machine (the input's median 3x its minimum), each fused version's paired rounds
    clearly faster: a quiet run would print speed-ups."""
    rng = np.random.default_rng(seed)
    a = np.concatenate([[1.0] * 4, 3.0 + rng.random(17)])
    return [timed(0, "input", a), timed(1, "after fuse_sdpa", a * 0.6),
            timed(2, "after fuse_transformer_layer", a * 0.5)]


def speed_parts(rows):
    """The speed-up plot of the app's chart (on a busy run the message in its place) and the chart's data: its bar
    values, labels and colours (one source for every plot)."""
    fig = timing_figure(rows)
    sp = fig.children[1].children[0]
    src = next(a for a in fig.children[0].center if isinstance(a, LabelSet)).source
    return sp, src.data


# 1. a busy run shows no speed-up, in the app as in the CLI (one function)

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_busy_run_shows_no_speed_up_number_or_bar_in_the_app_as_in_the_cli(seed):
    versions = busy_versions(seed)
    table = timing_table(versions)
    assert table[0]["busy"]
    shown = table_rows(table)  # the app's table
    assert [r["speedup"] for r in shown] == [NOT_READ, NOT_READ, NOT_READ]  # the input too: no number on a busy run
    cli = format_timings(versions, table[0]["busy"]).splitlines()
    for line, row in zip(cli[1:], shown, strict=True):  # the CLI's `x input` cell is the app's
        assert f"  {row['speedup']}  " in line
    sp, data = speed_parts(table)
    assert all(math.isnan(x) for x in data["x"]) and all(math.isnan(x) for x in data["x_high"])
    assert set(data["speedup"]) == {""}  # no label with a number
    assert "busy" in sp.text and not hasattr(sp, "renderers")  # a message in the plot's place, no empty plot
    assert not any(speedup_shown(r) for r in table[1:])
    # the busy line names a row by its number: the app's table shows that number (newcomer run 4: "#21" cited,
    # no number in the table)
    cited = re.search(r"#(\d+) ", table[0]["busy"]).group(1)
    assert any(r["version"].startswith(f"{cited}: ") for r in shown), ([r["version"] for r in shown], cited)


def test_format_timings_checks_the_machine_itself_when_not_told():
    """`format_timings(rows)` with no `busy` reads the run's own machine check (`timing_table`): a busy run printed
    its medians' ratios when a caller forgot to pass the warning."""
    out = format_timings(busy_versions(3))
    assert out.count(NOT_READ) == 3  # every row, the input own included


def test_a_quiet_run_keeps_its_numbers_in_both_front_ends():
    base = 1.0 + 0.01 * np.random.default_rng(4).random(21)
    versions = [timed(0, "input", base), timed(1, "after fuse_sdpa", base * 0.5)]
    table = timing_table(versions)
    assert not table[0]["busy"]
    cell = speedup_text(table[1])
    assert cell == f"{table[1]['speedup']:.2f}" and float(cell) == pytest.approx(2.0, abs=0.01)
    assert f"  {cell}  " in format_timings(versions).splitlines()[2]
    _, data = speed_parts(table)
    assert data["x"][1] == pytest.approx(2.0, abs=0.01) and data["speedup"][1].startswith(cell)


# 2. the banner names a row the user can see

def own_run(busy_own: bool, seed: int = 0):
    """Versions 0..2 quiet and the own-lowering row timed in the same rounds; with `busy_own` the own row alone has
    its median 3x its minimum."""
    rng = np.random.default_rng(seed)
    base = 10 + rng.random(21)
    versions = [timed(0, "input", base), timed(1, "after fuse_sdpa", base * 0.7), timed(2, "after fuse_ln", base * 0.6)]
    own = base * 0.65
    if busy_own:
        own = own.copy()
        own[:5] = own[:5] / 3.5
    return versions, timed(3, OWN_LOWERING_LABEL, own)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_busy_banner_names_the_own_row_as_its_table_shows_it(seed):
    versions, own = own_run(busy_own=True, seed=seed)
    table = timing_table(versions, also=[own])
    warning = table[0]["busy"]
    assert OWN_LOWERING_LABEL in warning and "#3" not in warning  # no number past the versions
    split = fusion_and_kernels_of(versions, own)
    md, _ = machine_verdict(table)
    # the row it names is a row of the split's table, by the same label, in the app and in the CLI
    assert f"| {OWN_LOWERING_LABEL} |" in fusion_kernels_markdown(split)
    assert any(ln.startswith(OWN_LOWERING_LABEL) for ln in split_text(split).splitlines())
    assert '"Fusion or kernels?"' in warning and "Fusion or kernels?" in fusion_kernels_markdown(split)
    assert "Busy machine" in md


def test_a_busy_version_is_named_by_the_number_and_label_its_rows_show():
    versions = busy_versions(5)
    warning = busy_warning(*versions)
    named = next(r for r in versions if f"#{r.index} {r.label} " in warning)
    factor = timing_factor(timing_table(versions)[named.index])  # the chart's axis: `0: input`
    assert factor == f"{named.index}: {named.label}"
    cli = format_timings(versions, warning).splitlines()
    assert cli[1 + named.index].split()[:2] == [str(named.index), named.label]


# 3. a paired ratio the medians contradict is not read

def contradicted(shift: int, scale: float = 0.98) -> list[VersionTiming]:
    """Two quiet versions whose medians say the second is about 2% faster (0.50 vs 0.49 ms) while the paired
    per-round ratio says otherwise, by rolling the second's rounds against the first's (llama-block: 0.50 and 0.49 ms
    under "kernels: 0.87x")."""
    a = np.linspace(0.40, 0.60, 21)
    return [timed(0, "final, MLX's own lowering", a),
            timed(1, "final, rlxviz's CPU kernels", np.roll(a * scale, shift))]


@pytest.mark.parametrize("shift", [-10, -8, -5, 3])
def test_a_ratio_the_medians_contradict_reads_disagree(shift):
    a, b = contradicted(shift)
    v = paired_verdict(a, b)
    of_medians = a.median_ms / b.median_ms
    assert b.median_ms < a.median_ms and of_medians == pytest.approx(1 / 0.98)
    assert not busy_warning(a, b)
    # the case: opposite directions, or the medians' ratio further from the paired one than its interval is wide
    assert (v.ratio < 1) or not v.low <= of_medians <= v.high
    assert v.words == DISAGREE and medians_disagree(v.ratio, v.low, v.high, of_medians)
    table = timing_table([a, b])
    assert table[1]["vs_input"] == DISAGREE
    assert speedup_text(table[1]) == DISAGREE_CELL and not speedup_shown(table[1])
    assert DISAGREE_CELL in format_timings([a, b]).splitlines()[2]
    cell = step_cell("kernels", v, "")
    assert cell == "kernels: no ratio (medians disagree)" and f"{v.ratio:.2f}" not in cell


def test_ratios_and_medians_that_agree_keep_their_verdict():
    for shift, words in ((0, "1.02x faster"), (1, "1.04x faster")):
        a, b = contradicted(shift)
        assert paired_verdict(a, b).words == words
    assert not medians_disagree(1.20, 1.18, 1.22, 1.205)
    assert medians_disagree(0.87, 0.80, 0.95, 1.004)  # llama-block: the medians equal, the ratio 13% slower
    assert medians_disagree(1.19, 1.10, 1.25, 134.70 / 295.59)  # minilm: the medians 2.2x slower, "1.19x"


def test_the_split_prints_no_ratio_where_busy_or_contradicted():
    versions, own = own_run(busy_own=True)
    split = fusion_and_kernels_of(versions, own)
    assert split.warning
    for text in (fusion_kernels_markdown(split), split_text(split)):
        assert f"{split.fusion.ratio:.2f}" not in text and f"{split.total.ratio:.2f}" not in text, text
        assert "no ratio (busy)" in text


# 4. chart labels, colours and legend

def test_bars_are_coloured_by_their_reading():
    assert speedup_color({"vs_input": "1.25x faster", "busy": ""}) == FASTER_COLOR
    assert speedup_color({"vs_input": "1.09x slower", "busy": ""}) == SLOWER_COLOR
    for words in ("within noise", "", DISAGREE, "too few rounds (3 < 21) for a verdict"):
        assert speedup_color({"vs_input": words, "busy": ""}) == NEUTRAL_COLOR
    assert speedup_color({"vs_input": "1.25x faster", "busy": "unusable run"}) == NEUTRAL_COLOR
    base = 1.0 + 0.01 * np.random.default_rng(8).random(21)
    rows = timing_table([timed(0, "input", base), timed(1, "slower", base * 1.4), timed(2, "faster", base * 0.6)])
    _, data = speed_parts(rows)
    assert data["x_color"] == [NEUTRAL_COLOR, SLOWER_COLOR, FASTER_COLOR]


def test_the_median_label_says_where_it_is_placed():
    rows = timing_table(busy_versions(0))
    ms_plot = timing_figure(rows).children[0]
    label = next(a for a in ms_plot.center if isinstance(a, LabelSet))
    data = label.source.data
    # drawn at the bar's end (it was after the whisker's, at another gridline): the axis says so
    assert label.x == "ms_at" and data["ms_at"] == data["ms"] and label.x_offset > 0
    assert "median" in ms_plot.xaxis.axis_label and "labelled at its end" in ms_plot.xaxis.axis_label


def test_the_legend_is_true_in_each_mode():
    busy = chart_legend(timing_table(busy_versions(1)))
    assert "No speed-up is drawn or printed" in busy and "speed-up bar is labelled" not in busy
    assert "printed at the bar's end" in busy and "after the end of its whisker" not in busy
    base = 1.0 + 0.01 * np.random.default_rng(9).random(21)
    quiet = chart_legend(timing_table([timed(0, "input", base), timed(1, "fused", base * 0.5)]))
    assert "each speed-up bar is labelled with its own number" in quiet and "red where it reads *slower*" in quiet
    assert chart_legend([]) == ""


def test_the_timing_tab_shows_the_clis_cells_and_a_legend_for_its_mode():
    """The Timing tab (an `AppState` and its `TimingView`): on a busy run the table's speed-up column reads what
    `rlxviz time` prints, no number, and the legend says no speed-up is drawn; on a quiet one, the numbers and the
    legend of the labelled, coloured bars."""
    from rlxviz.app.jobs import Runner
    from rlxviz.app.state import AppState
    from rlxviz.app.timingview import TimingView

    s = AppState(runner=Runner(background=False), preset="bert-tiny", seq=8)
    view = TimingView(state=s)
    versions = busy_versions(6)
    s.param.update(blas="MLX", timings=timing_table(versions))
    cells = list(view.table.value["speedup"])
    assert cells == [NOT_READ] * 3  # the input own row too
    cli = format_timings(versions).splitlines()
    assert all(f"  {c}  " in line for c, line in zip(cells, cli[1:], strict=True))
    assert "No speed-up is drawn or printed" in view.blas.object and "own number" not in view.blas.object
    base = 1.0 + 0.01 * np.random.default_rng(10).random(21)
    s.timings = timing_table([timed(0, "input", base), timed(1, "after fuse_sdpa", base * 0.5)])
    assert float(view.table.value["speedup"][1]) == pytest.approx(2.0, abs=0.01)
    assert "each speed-up bar is labelled with its own number" in view.blas.object
