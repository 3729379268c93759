"""The Timing tab (`TimingView`): time every version in the timing process, and show the machine's verdict, the
chart, the fusion-vs-kernels rows and the table (`timingchart` formats them)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import panel as pn
import param
from panel.viewable import Viewer

from .numberbox import BoxNotes, NumberBox
from .stale import StaleMark
from .state import AppState
from .text import md_escape
from .timingchart import (
    chart_legend,
    error_formatter,
    fusion_kernels_markdown,
    machine_verdict,
    table_rows,
    timing_figure,
)

TIMING_HIDDEN = ["#", "p25_ms", "p75_ms", "ci_low", "ci_high", "min_ms", "iqr_ms", "busy", "lowering", "rounds",
                 "same_as", "lowering_change"]
"""Timing columns the table leaves out: the chart's axis, whiskers (the IQR) and label numbers, so the rest (speed-up,
its interval, both verdicts) fits a 1280 px window."""


TIMING_TITLES = {"median_ms": "median ms", "first_call_ms": "first call ms", "max_err": "max err",
                 "speedup": "speed-up", "ci": "95% ci", "vs_input": "vs input", "vs_previous": "vs previous",
                 "verdict": "numbers ok"}
"""Column titles in words, so they wrap in a narrow column instead of being cut off; the correctness column
(`VersionTiming.verdict`: the numbers against the reference) reads "numbers ok", never a timing verdict beside "busy:
not read"."""

TIMING_HEADER_CSS = (".tabulator .tabulator-header .tabulator-col .tabulator-col-content .tabulator-col-title "
                     "{ white-space: normal !important; overflow-wrap: break-word; word-break: normal; "
                     "text-overflow: clip; font-size: 12px; line-height: 1.2; } "
                     ".tabulator .tabulator-row .tabulator-cell { white-space: normal !important; "
                     "overflow-wrap: break-word; word-break: normal; text-overflow: clip; font-size: 12px; "
                     "line-height: 1.25; }")
"""Timing table headers and cells wrap between words, never inside one and never cut ("media n ms", "1.10x faste",
"within nois" at 1280 px with the sidebar open); the columns' widths are `TIMING_WIDTHS`."""

TIMING_WIDTHS = {"ops": 58, "median_ms": 80, "first_call_ms": 58, "max_err": 70, "speedup": 92, "ci": 80,
                 "vs_input": 84, "vs_previous": 104, "verdict": 84}
"""Each timing column's width, px, but the version's: every word of its title and cells fits (a title keeps 34 px
for its padding and sort arrow); the version column takes the rest of the pane (about 180 px at 1280 px with the
sidebar open, the whole name at 1920: "19: after fuse_shared_input_ma" was cut when it was fixed at 200 px)."""


ROUNDS_LABELS = {"repeat": "Timed rounds", "warmup": "Untimed rounds"}
"""The rounds boxes' labels, as the messages about them name them."""

ROUNDS_WHY = {"repeat": "a run times at least one round, and the cap keeps a typo from starting a run that never "
                        "ends; rlxviz time --repeat takes the same",
              "warmup": "0 is none, and the cap keeps a typo from starting a run that never ends; rlxviz time "
                        "--warmup takes the same"}
"""Why the rounds' ranges (`AppState.repeat`, `AppState.warmup`; `session.MAX_REPEAT`, `session.MAX_WARMUP`) are what
they are, said when a value past them is clamped."""


PREVIOUS_RUN = ("**A new timing run is under way ({repeat} interleaved round(s) per version).** The verdict, chart and "
                "table below are the previous run's, shown faded until the new one ends.")
"""The banner over the last run's figures while a new run measures (`AppState.timing_running`): its banner, chart and
"3 interleaved round(s)" stayed up unmarked, and only the thin progress line said another run was under way."""

PREVIOUS_MARK = "Previous run: "
"""What the stored-result note, the machine's verdict and the "Measured in" line begin with while a new run measures
(`PREVIOUS_RUN`)."""


def tip_below(text: str) -> Any:
    """A button's tooltip shown below it (Panel puts a text's to the right, where the Timing tab's row holds the next
    button and the rounds' boxes: after a click, with the pointer still on the button, it hid them)."""
    from bokeh.models import Tooltip

    return Tooltip(content=text, position="bottom")


class TimingView(Viewer):
    """Time every version on MLX in a worker process, in interleaved rounds (`session.time_versions`, as the CLI);
    median ms per version as a Bokeh bar chart with the IQR as a whisker and the speed-up over the unfused graph,
    the max error against the table's reference (the float64 oracle), and where it ran (device, precision, BLAS)."""

    state = param.ClassSelector(class_=AppState)

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        s = self.state
        # "on MLX" is in its tooltip: beside an open sidebar at 1280 px the label was cut ("Time every version on")
        # its tooltip below it (`tip_below`): to its right it hid "↻ Time again" and the rounds' label after a click
        self.button = pn.widgets.Button(label="Time every version", color="primary", css_classes=["rv-time"],
                                        description=tip_below("time every version on MLX in a worker process, with "
                                                              "the rounds and device set here"))
        self.button.on_click(lambda e: s.time_all())
        # an outlined button (a "light" one read as plain text: nothing said it could be pressed)
        # shown once there are figures to measure again (before any, "Time again" spoke of a timing that never was)
        self.again = pn.widgets.Button(label="↻ Time again", button_type="primary", button_style="outline",
                                       css_classes=["rv-time-again"], visible=bool(s.timings),
                                       description=tip_below("measure again instead of showing the last figures"))
        self.again.on_click(lambda e: s.time_all(fresh=True))
        # not bound to the state's parameters, and no start/end (as Batch and Sequence length, `Controls`): the
        # browser's number box put back a value past its start or end with no word, so the server never saw it;
        # now a value out of range is clamped here and the message says the range (`_rounds_typed`). Text boxes read
        # on the server (`NumberBox`): the browser's integer box made a typed 2.5 into 25 and put back abc unsaid
        self.notes = BoxNotes(s)
        self.repeat = NumberBox(ROUNDS_LABELS["repeat"], s.repeat, lambda t: self._rounds_unreadable("repeat", t),
                                width=110, css_classes=["rv-repeat"])
        self.warmup = NumberBox(ROUNDS_LABELS["warmup"], s.warmup, lambda t: self._rounds_unreadable("warmup", t),
                                width=110, css_classes=["rv-warmup"])
        for name in ("repeat", "warmup"):
            getattr(self, name).param.watch(lambda e, n=name: self._rounds_typed(n, e.new), "value")
            s.param.watch(lambda e, n=name: setattr(getattr(self, n), "value", e.new), name)
        self.device = pn.widgets.Select.from_param(s.param.device, name="Device", width=90)
        self.blas = pn.pane.Markdown("", css_classes=["rv-blas"])
        # the run's verdict on the machine, above every ratio (the notebooks' `session.busy_warning`)
        self.machine = pn.pane.Alert("", alert_type="light", visible=False, css_classes=["rv-machine"],
                                     sizing_mode="stretch_width", margin=(5, 10))
        # a stored run shown instead of a new measurement says when and where it was measured (`measure.reuse_note`)
        self.origin = pn.pane.Alert("", alert_type="warning", visible=False, css_classes=["rv-timing-origin"],
                                    sizing_mode="stretch_width", margin=(5, 10))
        self.policy = pn.pane.Markdown("", css_classes=["rv-precision"])
        self.inputs = pn.widgets.FileInput(accept=".npz", name="Your inputs (.npz)", css_classes=["rv-inputs"])
        self.inputs.param.watch(self._inputs_chosen, "value")
        # the file chooser follows the state: a new model drops the arrays, a refused file is not used, and the
        # chooser no longer names a file (a file name the run does not use is never shown)
        s.param.watch(lambda e: not e.new and self.inputs.value is not None and self._clear_inputs(), "inputs_file")
        # fit_columns: every column within the pane's width (speed-up, verdict, vs_input were cut off at 1280 px)
        self.table = pn.widgets.Tabulator(pd.DataFrame(), show_index=False, disabled=True, sizing_mode="stretch_width",
                                          css_classes=["rv-timings"], layout="fit_columns", widths=TIMING_WIDTHS,
                                          hidden_columns=TIMING_HIDDEN, titles=TIMING_TITLES,
                                          stylesheets=[TIMING_HEADER_CSS],
                                          formatters={"max_err": error_formatter()})
        self.chart = pn.pane.Bokeh(None, sizing_mode="stretch_width", height=340, css_classes=["rv-timing-chart"])
        self.split = pn.pane.Markdown("", css_classes=["rv-fusion-kernels"], sizing_mode="stretch_width")
        self.stale = StaleMark(s, "timing", self.chart, self.table)
        # while a new run measures, the figures still shown are marked as the last run's (`PREVIOUS_RUN`)
        self.previous = pn.pane.Alert("", alert_type="info", visible=False, css_classes=["rv-timing-previous"],
                                      sizing_mode="stretch_width", margin=(5, 10))
        s.param.watch(self._update, ["timings", "blas", "timing_policy", "timing_split", "timing_origin",
                                     "timing_when", "timing_running"])
        s.param.watch(lambda e: self.button.param.update(disabled=e.new), "busy")
        s.param.watch(lambda e: self.again.param.update(disabled=e.new), "busy")
        self._update()

    def _rounds_typed(self, name: str, typed: int | None) -> None:
        """Rounds typed (`repeat` or `warmup`): within the state's bounds (`AppState.repeat`, `AppState.warmup`: the
        ranges `session.check_rounds` takes) they are the state's; past them, the nearest bound instead, and the
        message says the range and why (`ROUNDS_WHY`); an empty box is put back."""
        s, widget = self.state, getattr(self, name)
        if typed is None:
            widget.value = getattr(s, name)
            return
        lo, hi = s.param[name].bounds
        if lo <= typed <= hi:
            self.notes.drop(name)  # the last note about this box no longer holds
            setattr(s, name, typed)
            return
        near = lo if typed < lo else hi
        widget.value = near  # back here with a value in range: it becomes the state's
        self.notes.say(name, f"{ROUNDS_LABELS[name]} {typed} is out of range {lo}..{hi} ({ROUNDS_WHY[name]}), so it "
                             f"became {near}.")

    def _rounds_unreadable(self, name: str, typed: str) -> None:
        """Rounds that are no whole number (`abc`, `2.5`, `1e3`): the box shows the state's value again, and the
        message says so (it replaces any older note about the box)."""
        self.notes.say(name, f"{ROUNDS_LABELS[name]} must be a whole number; {typed} is not, so it stays "
                             f"{getattr(self.state, name)}.")

    def _inputs_chosen(self, event: param.parameterized.Event) -> None:
        """A file chosen (or the box emptied): the state takes its arrays (`AppState.set_user_inputs`); refused, the
        box is emptied, so choosing the same file again (after setting what the message says) is a new choice (the
        browser's chooser sends no change for the value it holds)."""
        s = self.state
        s.set_user_inputs(event.new, self.inputs.filename or "inputs.npz")
        if event.new is not None and not s.inputs_file:
            self._clear_inputs()

    def _clear_inputs(self) -> None:
        """Empty the file chooser: in the browser (`clear`) and here (its value and file name)."""
        self.inputs.clear()
        self.inputs.param.update(value=None, filename=None)

    def _update(self, *events: param.parameterized.Event) -> None:
        s = self.state
        rows = s.timings
        previous = bool(rows) and s.timing_running  # the figures shown are the last run's: a new one measures
        mark = f"**{PREVIOUS_MARK.strip()}** " if previous else ""
        self.previous.param.update(object=PREVIOUS_RUN.format(repeat=s.repeat) if previous else "", visible=previous)
        # the legend of this run's chart: true of a busy run's (no speed-up bars) and a usable one's
        self.blas.object = (f"{mark}**Measured in:** {md_escape(s.blas)}. " + chart_legend(s.timings or [{}])
                            if s.blas else "")
        self.policy.object = md_escape(s.timing_policy)
        # the stored run's note is the previous run's too: at full strength under the under-way banner it read as
        # said of the run just asked for ("… ↻ Time again measures anew." right after that button was pressed)
        self.origin.param.update(object=mark + s.timing_origin if rows and s.timing_origin else "",
                                 visible=bool(rows and s.timing_origin))
        text, kind = machine_verdict(rows, s.timing_when)
        self.machine.param.update(object=mark + text if text else text, alert_type=kind, visible=bool(text))
        # "1" as `StaleMark` puts it back
        for p in (self.origin, self.machine, self.blas, self.split, self.chart, self.table):
            faded = previous or (p in self.stale.panes and bool(s.stale))
            p.styles = {**p.styles, "opacity": "0.45" if faded else "1"}
        self.again.visible = bool(rows)
        self.table.value = pd.DataFrame(table_rows(rows))  # the speed-up cell as `rlxviz time` prints it
        fig = timing_figure(rows) if rows else None
        # the pane as tall as the chart's column (its plots' heights follow the number of versions)
        self.chart.param.update(object=fig, height=fig.height if fig is not None else self.chart.height)
        # an input row that ran rlxviz's kernels (bert-tiny's attention op) is named by the split itself
        self.split.object = fusion_kernels_markdown(s.timing_split) if rows else ""

    def __panel__(self) -> pn.viewable.Viewable:
        return pn.Column(pn.Row(self.button, self.again, self.repeat, self.warmup, self.device, self.inputs),
                         self.stale.banner, self.previous, self.origin, self.machine, self.blas,
                         self.policy, self.chart, self.split, self.table,
                         sizing_mode="stretch_width")


__all__ = ["PREVIOUS_MARK", "PREVIOUS_RUN", "ROUNDS_LABELS",
           "ROUNDS_WHY", "TIMING_HEADER_CSS", "TIMING_HIDDEN", "TIMING_TITLES", "TIMING_WIDTHS",
           "TimingView", "tip_below"]
