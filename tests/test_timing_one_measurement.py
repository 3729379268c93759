"""The Timing tab's "Fusion or kernels?" table and its chart are one measurement (issue 39, a newcomer run: the table
was a run of its own with its own machine check, so on a busy machine its input median differed from the chart's:
two numbers for one version). Now the table's input and final rows are the chart's rows, and only the final version
on MLX's own lowering is added, timed in the same paired rounds; one machine check covers all of them."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from rlxviz.app import timeproc
from rlxviz.app.timingchart import fusion_kernels_markdown, machine_verdict, ms_label
from rlxviz.session import VersionTiming, busy_warning, paired_verdict, timing_table
from rlxviz.session.lowerings import FUSION_LABELS, FusionAndKernels, fusion_and_kernels_of
from rlxviz.session.timing import OWN_LOWERING_LABEL


def timed(i: int, label: str, samples, nodes: int = 10) -> VersionTiming:
    s = [float(x) for x in samples]
    q1, q3 = np.percentile(s, [25, 75])
    return VersionTiming(i, label, nodes, median_ms=float(np.median(s)), min_ms=min(s), first_call_ms=5.0,
                         max_abs=1e-7, iqr_ms=float(q3 - q1), samples_ms=tuple(s))


def run_rows(seed: int = 1, rounds: int = 21) -> tuple[list[VersionTiming], VersionTiming]:
    """A quiet run of three versions (the middle one unchanged) and the own-lowering row of the same rounds."""
    base = 10 + np.random.default_rng(seed).random(rounds)
    rows = [timed(0, "input", base), timed(1, "after fuse_sdpa", base * 0.7, 8),
            VersionTiming(2, "after dead_code_elimination", 8, same_as=1), timed(3, "after fuse_layer", base * 0.3, 2)]
    return rows, timed(4, OWN_LOWERING_LABEL, base * 0.6, 2)


def _table_median(text: str, label: str) -> str:
    """The median ms cell of the split table's row `label`."""
    line = next(ln for ln in text.splitlines() if ln.startswith(f"| {label} |"))
    return line.split("|")[3].strip()


@pytest.mark.parametrize("seed", [1, 2])
def test_the_split_is_made_of_the_charts_rows(seed):
    rows, own = run_rows(seed)
    split = fusion_and_kernels_of(rows, own)
    chart = timing_table(rows, also=[own])
    assert split.shared and [r.label for r in split.rows] == list(FUSION_LABELS)
    assert split.rows[0].samples_ms == rows[0].samples_ms and split.rows[2].samples_ms == rows[3].samples_ms
    assert split.rows[1].samples_ms == own.samples_ms
    # the same version, the same number, in the chart and in the table
    text = fusion_kernels_markdown(split)
    assert _table_median(text, FUSION_LABELS[0]) + " ms" == ms_label(chart[0])
    assert _table_median(text, FUSION_LABELS[2]) + " ms" == ms_label(chart[-1])
    assert round(split.total.ratio, 2) == chart[-1]["speedup"]  # the final version's speed-up, one statistic
    assert "the chart's own measurements" in text and "machine check of its own" not in text
    assert split.warning == chart[0]["busy"] == ""


def test_a_busy_own_lowering_row_makes_the_whole_run_busy():
    """One machine check: the own-lowering row alone past `BUSY_RATIO` flags the chart and the table alike."""
    rows, own = run_rows(3)
    s = np.array(own.samples_ms)
    s[:5] = s[:5] / 4  # its minimum far below its median: that row was timed on a busy machine
    own = timed(4, OWN_LOWERING_LABEL, s, 2)
    assert busy_warning(own) and not busy_warning(*[r for r in rows if r.same_as is None])
    split = fusion_and_kernels_of(rows, own)
    chart = timing_table(rows, also=[own])
    assert split.warning and split.warning == chart[0]["busy"]
    assert OWN_LOWERING_LABEL in split.warning  # named by its label: "#4" alone names no version the chart shows
    assert machine_verdict(chart)[1] == "danger"
    text = fusion_kernels_markdown(split)
    assert "busy machine" in text and "faster" not in text and "slower" not in text


def test_the_worker_builds_the_split_from_the_versions_run(monkeypatch):
    """`timeproc._time` (the timing process's body), with fabricated measurements: a measurement of the split apart
    from the versions (the old road, `lowerings.fusion_and_kernels`) gives the input another median; the split shown
    must be the versions' run, so its input and final medians are the chart's."""
    from rlxviz.session import lowerings, timing

    rows, own = run_rows(5)
    apart = [timed(0, FUSION_LABELS[0], np.array(rows[0].samples_ms) * 1.8),  # a busier moment: another median
             timed(1, FUSION_LABELS[1], np.array(own.samples_ms) * 1.8, 2),
             timed(2, FUSION_LABELS[2], np.array(rows[3].samples_ms) * 1.8, 2)]

    def separate(*a, **k):
        return FusionAndKernels(apart, paired_verdict(apart[0], apart[1]), paired_verdict(apart[1], apart[2]),
                                paired_verdict(apart[0], apart[2]), busy_warning(*apart), "")

    monkeypatch.setattr(timing, "time_versions", lambda *a, **k: rows)
    monkeypatch.setattr(timing, "time_versions_and_own", lambda *a, **k: (rows, own), raising=False)
    monkeypatch.setattr(lowerings, "fusion_and_kernels", separate)
    monkeypatch.delenv(timeproc.FORCE_BUSY_ENV, raising=False)
    rows[0].context = type("Ctx", (), {"device": "cpu", "kernels": ""})()  # timed on the CPU: a split is made
    run = timeproc._time(SimpleNamespace(input=None, final=None), {}, {}, 0, 21, "cpu", None)
    assert isinstance(run.split, FusionAndKernels), run.split
    chart = timing_table(run.rows, also=[run.split.rows[1]])
    assert run.split.rows[0].median_ms == run.rows[0].median_ms == pytest.approx(chart[0]["median_ms"], abs=1e-3)
    assert run.split.rows[2].median_ms == run.rows[3].median_ms
    text = fusion_kernels_markdown(run.split)
    assert _table_median(text, FUSION_LABELS[0]) + " ms" == ms_label(chart[0])


def test_the_forced_busy_hook_flags_the_split_with_the_versions(monkeypatch):
    """`RLXVIZ_FORCE_BUSY` slows the versions and the own-lowering row alike: the split is still the chart's rows."""
    from rlxviz.session import timing

    rows, own = run_rows(6)
    monkeypatch.setattr(timing, "time_versions_and_own", lambda *a, **k: (rows, own))
    monkeypatch.setenv(timeproc.FORCE_BUSY_ENV, "1")
    run = timeproc._time(SimpleNamespace(input=None), {}, {}, 0, 21, "cpu", None)  # a trace stand-in
    assert run.split.warning and run.split.rows[0].samples_ms == run.rows[0].samples_ms
    assert timing_table(run.rows, also=[run.split.rows[1]])[0]["busy"] == run.split.warning


def test_a_real_run_shares_its_rounds():
    """bert-tiny on the CPU, 3 rounds, in this process: the split's input and final rows are the versions' rows
    (the same rounds), and the own-lowering row ran with rlxviz's kernels off."""
    from rlxviz import session
    from rlxviz.passes import Pipeline

    m = session.load("bert-tiny", 1, 8)
    trace, feeds = Pipeline.canonical().run(m.graph), session.feeds(m, "two words")
    run = timeproc._time(trace, feeds, m.weights, 0, 3, "cpu", None)
    assert isinstance(run.split, FusionAndKernels) and run.split.shared
    timed_rows = [r for r in run.rows if r.same_as is None]
    assert run.split.rows[0].samples_ms == timed_rows[0].samples_ms
    assert run.split.rows[2].samples_ms == timed_rows[-1].samples_ms
    own = run.split.rows[1]
    assert len(own.samples_ms) == 3 and own.nodes == len(trace.final.compute_nodes())
    assert "kernels=False" in own.context.kernels
