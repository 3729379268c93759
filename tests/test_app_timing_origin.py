"""The Timing tab never passes off a stored run, or the kernels' speed-up, as something else (issue 39, newcomer run):

* a run shown from the app's cache (`measure.TIMING_RUNS`, shared by sessions) says when and in which session it was
  measured, and its busy verdict is said of that time; a new measurement says nothing of the kind;
* rows lowered with rlxviz's own CPU kernels are marked on the chart, whose title names the lowering;
* the split's sentence says its two paired ratios need not multiply to the total, and shows the product;
* the table's correctness column reads "numbers ok".

Runs are fabricated (no timing process): `timeproc.time_in_worker` is replaced by one returning made-up rows."""

import dataclasses
import re
import time
from datetime import UTC, datetime
from fractions import Fraction

import numpy as np
import pytest
from clirun import README_IR

from rlxviz.app import timeproc
from rlxviz.app.measure import TIMING_RUNS, measured_when, reuse_note
from rlxviz.app.timingchart import KERNELS_MARK, chart_title, fusion_kernels_markdown, machine_verdict, timing_figure
from rlxviz.runtime.timing import TimingContext
from rlxviz.session import VersionTiming, busy_warning, paired_verdict, timing_table
from rlxviz.session.lowerings import KERNEL_OPS
from rlxviz.session.timing_text import kernel_rows

KERNELS_RAN = "rlxviz CPU kernels: cached (avx2, 2 threads), ran attention, bias+gelu"


def timed(i: int, label: str, samples: list[float], context: TimingContext | None = None) -> VersionTiming:
    q1, q3 = np.percentile(samples, [25, 75])
    return VersionTiming(i, label, 10, median_ms=float(np.median(samples)), min_ms=min(samples), first_call_ms=5.0,
                         max_abs=1e-7, ok=True, iqr_ms=float(q3 - q1), samples_ms=tuple(samples), context=context)


def ctx(kernels: str, device: str = "cpu") -> TimingContext:
    return TimingContext(device, "f32", "openblas", "0.0", 1, kernels)


def fabricated_rows(trace, busy: bool, kernels: str = KERNELS_RAN) -> list[VersionTiming]:
    """One timed row per version of `trace` (each 0.8x the one before); `busy`: the input's median 3x its minimum."""
    rng = np.random.default_rng(11)
    base = 10 + rng.random(21)
    if busy:
        base[:4] = 3.0
    return [timed(i, label, list(base * 0.8 ** i), ctx(kernels)) for i, (label, _) in enumerate(trace.versions())]


# --- a stored run says it is stored -------------------------------------------------------------------------------


@pytest.mark.parametrize("minutes, session, ago, where", [
    (12, "other", "12 min ago", "in another session"),
    (0.3, "me", "under a minute ago", "earlier in this session"),
    (125, "", "2 h 5 min ago", "in another session"),  # a run with no session mark is never called this session's
])
def test_reuse_note_says_when_and_where(minutes, session, ago, where):
    now = 1_800_000_000.0
    run = timeproc.WorkerTiming([], 123, None, measured_at=now - minutes * 60, session=session)
    note = reuse_note(run, "me", now=now)
    hhmm = datetime.fromtimestamp(now - minutes * 60, UTC).strftime("%H:%M")
    assert f"measured {hhmm} UTC ({ago}, {where})" in note, note
    assert "Stored result" in note and "Time again** measures anew" in note


def test_reuse_note_of_a_run_with_no_time_says_earlier():
    note = reuse_note(timeproc.WorkerTiming([], 1), "me")
    assert "measured earlier (in another session)" in note and "UTC" not in note


def test_the_busy_verdict_is_said_of_the_time_a_stored_run_was_measured():
    rows = timing_table([timed(0, "input", [1.0] * 4 + [3.0] * 17), timed(1, "after fuse_sdpa", [0.5] * 21)])
    md, kind = machine_verdict(rows, "03:24 UTC")
    assert kind == "danger" and md.startswith("**Busy machine at 03:24 UTC:")
    quiet = timing_table([timed(0, "input", [1.0] * 21), timed(1, "after fuse_sdpa", [0.5] * 21)])
    assert machine_verdict(quiet, "03:24 UTC")[0].startswith("**Quiet enough at 03:24 UTC:")
    assert machine_verdict(rows)[0].startswith("**Busy machine:")  # a run just measured: no time named


@pytest.fixture
def fake_worker(monkeypatch):
    """`timeproc.time_in_worker` replaced: each call returns a busy fabricated run of the trace, measured
    `fake_worker.age_s` seconds ago; `calls` counts them."""
    class Fake:
        age_s = 12 * 60.0
        calls = 0
        busy = True

        def __call__(self, trace, *a, **k):
            self.calls += 1
            return timeproc.WorkerTiming(fabricated_rows(trace, self.busy), 4242, None,
                                         measured_at=time.time() - self.age_s)

    fake = Fake()
    monkeypatch.setattr(timeproc, "time_in_worker", fake)
    TIMING_RUNS.clear()
    yield fake
    TIMING_RUNS.clear()


def app_state():
    from rlxviz.app.jobs import Runner
    from rlxviz.app.state import AppState

    return AppState(runner=Runner(background=False), preset="bert-tiny", seq=8, repeat=21, warmup=0)


def test_a_run_from_another_session_says_so_next_to_its_figures(fake_worker):
    """Session A measures (a fabricated busy run); session B presses "Time every version" and gets A's run at once:
    B's tab says it is stored, measured in another session 12 minutes ago, and the busy verdict names that time; B's
    "Time again" measures anew and the note goes; pressing the button again in B then says "earlier in this
    session"."""
    from rlxviz.app.timingview import TimingView

    a, b = app_state(), app_state()
    a.time_all()
    assert fake_worker.calls == 1 and a.timings and a.timing_origin == "" and a.timing_when == ""
    view = TimingView(state=b)
    b.time_all()
    assert fake_worker.calls == 1, "the stored run is shown, not measured again"
    assert "pid 4242" in b.blas  # A's worker: the note is what says so
    assert re.search(r"measured \d\d:\d\d UTC \(1[12] min ago, in another session\)", b.timing_origin), b.timing_origin
    assert view.origin.visible and view.origin.object == b.timing_origin
    assert re.fullmatch(r"\d\d:\d\d UTC", b.timing_when) and b.timing_when in b.timing_origin
    assert view.machine.alert_type == "danger" and view.machine.object.startswith(f"**Busy machine at {b.timing_when}")
    order = list(view.__panel__().objects)
    assert order.index(view.origin) < order.index(view.machine) < order.index(view.chart)
    # "Time again": a new measurement, no note, the verdict of now
    fake_worker.age_s = 0.0
    b.time_all(fresh=True)
    assert fake_worker.calls == 2 and b.timing_origin == "" and not view.origin.visible
    assert view.machine.object.startswith("**Busy machine:")
    b.time_all()
    assert fake_worker.calls == 2 and "earlier in this session" in b.timing_origin
    # a new pipeline run shows no timing, and no note about one
    b.runs._set_trace(b.trace)
    assert b.timings == [] and b.timing_origin == "" and b.timing_when == "" and not view.origin.visible


# --- the lowering each row ran ------------------------------------------------------------------------------------


def bert_tiny_trace():
    from rlxviz import session
    from rlxviz.passes import Pipeline

    m = session.load("bert-tiny", 1, 8)
    return Pipeline.canonical().run(m.graph)


@pytest.fixture(scope="module")
def trace():
    return bert_tiny_trace()


def holds_kernel_op(graph) -> bool:
    return any(n.op in KERNEL_OPS for n in graph.compute_nodes())




def mlp_trace():
    from rlxviz.ir.parser import parse_ir
    from rlxviz.passes import Pipeline

    return Pipeline.canonical().run(parse_ir(README_IR))


def test_rows_that_ran_rlxviz_kernels_are_the_ones_holding_an_op_they_take(trace):
    """bert-tiny's input already holds an `attention` op (the attention kernel takes it): every row is marked. The
    README's MLP: the input (matmul, add, gelu) is not, the version after fuse_matmul_bias_act is."""
    for t in (trace, mlp_trace()):
        rows = fabricated_rows(t, busy=False)
        marked = kernel_rows(t, rows)
        assert marked and marked == {i for i, (_, g) in enumerate(t.versions()) if holds_kernel_op(g)}
    mlp = mlp_trace()
    marked = kernel_rows(mlp, fabricated_rows(mlp, busy=False))
    labels = [label for label, _ in mlp.versions()]
    assert 0 not in marked and labels.index("after fuse_matmul_bias_act") in marked
    # the kernels did not run: on the GPU, switched off, or no fused op they take ran
    for line in ("", "rlxviz CPU kernels: off (lowering option kernels=False); fused ops run MLX's composed lowering",
                 "rlxviz CPU kernels: cached (avx2, 2 threads), none ran (no fused op they take)"):
        assert kernel_rows(trace, fabricated_rows(trace, busy=False, kernels=line)) == frozenset()


def test_the_chart_names_the_lowering_of_each_row():
    from rlxviz.app.state import AppState

    trace = mlp_trace()
    rows = fabricated_rows(trace, busy=False)
    marked = kernel_rows(trace, rows)
    assert 0 < len(marked) < len(rows)
    visible = [(r.index, r.label) for r in rows]
    table = AppState._timing_rows(rows, visible, (), marked)
    fig = timing_figure(table)
    ms_plot, speed_plot = fig.children[0], fig.children[1].children[0]  # the speed-up plot: below, left
    assert ms_plot.title.text == "median ms per version\nMLX; rlxviz's kernels where marked"
    assert speed_plot.title.text.endswith("fusion + rlxviz's kernels together")
    factors = list(ms_plot.y_range.factors)
    assert [f.endswith(KERNELS_MARK) for f in factors[::-1]] == [r["#"] in marked for r in table]
    # no kernels ran: no mark, and the title says MLX alone; the rows are the session's own
    plain = AppState._timing_rows(rows, visible)
    assert plain == timing_table(rows, visible) and chart_title(plain) == "median ms per version (MLX)"
    assert not any(f.endswith(KERNELS_MARK) for f in timing_figure(plain).children[0].y_range.factors)


def test_every_row_on_rlxviz_kernels_is_said_once_in_the_title(trace):
    """bert-tiny: every version (its input too) holds an op the kernels take: the title says "on every row" and the
    axis labels carry no mark (they would squeeze the plot to nothing at 1280 px)."""
    from rlxviz.app.state import AppState

    rows = fabricated_rows(trace, busy=False)
    table = AppState._timing_rows(rows, [(r.index, r.label) for r in rows], (), kernel_rows(trace, rows))
    assert all(r["lowering"] == "rlxviz kernels" for r in table)
    fig = timing_figure(table)
    ms_plot, speed_plot = fig.children[0], fig.children[1].children[0]  # the speed-up plot: below, left
    assert ms_plot.title.text == "median ms per version\nMLX with rlxviz's kernels, every row"
    assert not any(f.endswith(KERNELS_MARK) for f in ms_plot.y_range.factors)
    assert "kernels together" in speed_plot.title.text


def test_the_table_calls_the_correctness_column_numbers_ok():
    from rlxviz.app.timingview import TIMING_HIDDEN, TIMING_TITLES

    assert TIMING_TITLES["verdict"] == "numbers ok" and "verdict" not in TIMING_HIDDEN
    assert "lowering" in TIMING_HIDDEN


# --- the split's ratios and their product --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1])
def test_the_split_sentence_shows_the_product_of_its_two_ratios(seed):
    """Per-round ratios that vary independently: the median of the fusion's per-round ratios times the kernels' is
    not the median of the total's, so the split reads ratios of the medians (`lowerings.medians_verdict`): the
    printed product of the two factors is the printed total (or the sentence gives the unrounded total beside it)."""
    from rlxviz.session.lowerings import FUSION_LABELS, fusion_and_kernels_of

    rng = np.random.default_rng(seed)
    base = 10 + rng.random(21)
    own = base / (0.9 + 0.2 * rng.random(21))
    final = own / (4 + 4 * rng.random(21))
    f, k, t = paired_verdict(timed(0, "a", list(base)), timed(1, "b", list(own))), \
        paired_verdict(timed(1, "b", list(own)), timed(2, "c", list(final))), \
        paired_verdict(timed(0, "a", list(base)), timed(2, "c", list(final)))
    assert abs(f.ratio * k.ratio - t.ratio) > 0.005, "the case: per-round medians do not multiply"
    split = fusion_and_kernels_of([timed(0, "input", list(base)), timed(1, "final", list(final))],
                                  timed(2, FUSION_LABELS[1], list(own)))
    text = fusion_kernels_markdown(split)
    assert "need not multiply to the total" not in text
    x, y = f"{split.fusion.ratio:.2f}", f"{split.kernels.ratio:.2f}"
    shown = re.search(rf"{re.escape(x)} × {re.escape(y)} = (\d+\.\d\d)", text)
    assert shown and abs(Fraction(shown[1]) - Fraction(x) * Fraction(y)) <= Fraction(1, 200), text
    assert split.fusion.ratio * split.kernels.ratio == pytest.approx(split.total.ratio, rel=1e-12)
    assert "says a row ran rlxviz's CPU kernels" in text


def test_measured_when_is_utc():
    assert measured_when(0.0) == "00:00 UTC" and measured_when(3600 * 27 + 60 * 5) == "03:05 UTC"


def shared_split(seed: int = 0):
    from rlxviz.session import FusionAndKernels
    from rlxviz.session.lowerings import FUSION_LABELS

    rng = np.random.default_rng(seed)
    base = 10 + rng.random(21)
    rows = [timed(0, FUSION_LABELS[0], list(base)), timed(1, FUSION_LABELS[1], list(base * 0.9)),
            timed(2, FUSION_LABELS[2], list(base * 0.3))]
    return FusionAndKernels(rows, paired_verdict(rows[0], rows[1]), paired_verdict(rows[1], rows[2]),
                            paired_verdict(rows[0], rows[2]), busy_warning(*rows), "", shared=True)


def test_an_input_that_ran_a_kernel_is_not_called_mlx_own_lowering():
    """bert-tiny's input holds an `attention` op, which rlxviz's attention kernel runs under the default lowering:
    the split's first row (the chart's input row) says that op ran on rlxviz's kernels, and the fusion ratio is said
    not to be the fusion's alone. Without such an op the row keeps its name and no such sentence is added."""
    from rlxviz.session.lowerings import FUSION_LABELS

    text = fusion_kernels_markdown(dataclasses.replace(shared_split(), input_kernel_ops=("attention",)))
    assert f"{FUSION_LABELS[0]} except attention (on rlxviz's kernels)" in text
    assert "not the fusion's alone" in text
    plain = fusion_kernels_markdown(shared_split())
    assert FUSION_LABELS[0] in plain and "except" not in plain and "not the fusion's alone" not in plain


def test_the_view_names_the_input_rows_kernel_ops():
    from rlxviz.app.state import AppState
    from rlxviz.app.timingview import TimingView

    s = app_state()
    view = TimingView(state=s)
    assert s.trace is not None and any(n.op.value == "attention" for n in s.trace.input.compute_nodes())
    rows = fabricated_rows(s.trace, busy=False)
    table = AppState._timing_rows(rows, s._visible(s.trace), (), kernel_rows(s.trace, rows))
    # the split names the input's kernel ops (`session.fusion_and_kernels_of`, one answer for the app and the CLI)
    s.param.update(timing_split=dataclasses.replace(shared_split(), input_kernel_ops=("attention",)), timings=table)
    assert "input, MLX's own lowering except attention (on rlxviz's kernels)" in view.split.object
    s.param.update(timing_split=shared_split(),  # the kernels did not run
                   timings=AppState._timing_rows(rows, s._visible(s.trace)))
    assert "except attention" not in view.split.object


@pytest.mark.parametrize("median", [1.45496, 2.00499, 0.1249])
def test_the_split_table_reads_a_median_as_its_bar_does(median):
    """The chart labels the timing table's row (3 decimals, then 2): the split's table shows that same text for
    the same median, also on a rounding boundary (the newcomer saw 1.46 ms on the bar and 1.45 in the table)."""
    from rlxviz.app.timingchart import ms_label

    split = shared_split()
    row0 = dataclasses.replace(split.rows[0], median_ms=median)
    split = dataclasses.replace(split, rows=[row0, *split.rows[1:]])
    bar = ms_label({"median_ms": round(median, 3)}).removesuffix(" ms")
    assert f"| {bar} |" in fusion_kernels_markdown(split)
