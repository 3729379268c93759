"""The Timing tab's formatting, no widget: the machine's verdict shown before any ratio, the fusion-vs-kernels
table, the bar labels (each bar's own number) and the Bokeh chart of the timing rows (`session.time_versions`' rows,
as `AppState.timings` holds them)."""

from __future__ import annotations

import math
from typing import Any

from ..session.defaults import MIN_VERDICT_ROUNDS
from ..session.lowerings import SPLIT_HEAD, shown_product
from ..session.timing import DISAGREE, quiet_rule
from ..session.timing_words import KERNELS_MARK, lowering_note, too_few_rounds, unchanged_text, version_mark
from .text import md_escape
from .wording import hide_server_paths, version_name

BUSY_SHOWN = ("No ratio is shown below (*busy: not read*): this run cannot tell the versions apart; the medians are "
              "shown as measured. Press *Time again* when the machine is quieter.")
"""What the busy banner says of the figures below it: none of them is a ratio (every speed-up cell reads "busy: not
read", no speed-up bar is drawn), as `rlxviz time`'s `cli.timing.BUSY_ADVICE` says of its table."""


def machine_verdict(rows: list[dict[str, Any]], when: str = "") -> tuple[str, str]:
    """The timing run's verdict on the machine, shown before any ratio: `(markdown, alert kind)`.

    Busy (`rows[i]["busy"]`, `session.busy_warning`: a version's median above `BUSY_RATIO` times its minimum, or its IQR
    above `NOISY_IQR` times its median): the warning and that no ratio below is a verdict ("danger"). Fewer timed rounds
    than a verdict needs (`timing_words.too_few_rounds`): that neither quiet nor busy can be told, so no verdict below
    is read ("warning"). Otherwise the run is usable ("success"). No rows: ("", "light"). `when`: the time a stored run
    was measured (`HH:MM UTC`, `measure.measured_when`): the verdict is said of the machine then ("Busy machine at 03:24
    UTC"), not now; "" for a run just measured."""
    if not rows:
        return "", "light"
    at = f" at {md_escape(when)}" if when else ""
    busy = next((r["busy"] for r in rows if r.get("busy")), "")
    if busy:
        return (f"**Busy machine{at}: {md_escape(busy)}.** {BUSY_SHOWN}", "danger")
    if few := too_few_rounds(r.get("rounds") for r in rows):
        return (f"**{few[0].upper()}{few[1:]}{at}:** no verdict below is read. Time again with more rounds "
                f"({MIN_VERDICT_ROUNDS} at least).", "warning")
    return (f"**Quiet enough{at}:** {quiet_rule('×')}, so the verdicts "
            "below can be read.", "success")


def fusion_kernels_markdown(split: Any) -> str:
    """The final version on MLX's own lowering next to rlxviz's kernels (`session.FusionAndKernels`), as Markdown:
    a table of the three rows (ops, median ms, the speed-up over the row above as the ratio of the two medians,
    `session.lowerings.medians_verdict`, with its 95% interval and its verdict) and one sentence splitting the final
    version's speed-up into the fusion's and the kernels' (fusion × kernels = total). A split of
    the chart's own run (`shared`) says its input and final rows are the chart's; one measured apart says it has a
    machine check of its own. A busy run says so first and gives no verdict. None (timed on the GPU): why there is
    nothing to split; a str: why the split's row could not be measured. Where the chart's input row
    ran an op of rlxviz's kernels (`FusionAndKernels.input_kernel_ops`, bert-tiny's `attention`), the input row says
    which (`FusionAndKernels.label`), and a sentence says the fusion ratio is not the fusion's alone."""
    if split is None:
        return ("#### Fusion or kernels?\nrlxviz's own kernels run on the CPU only: on the GPU every version runs "
                "MLX's own lowering, so the speed-ups above are the fusion's alone.")
    if isinstance(split, str):  # the split's run failed; the versions above were timed
        return f"#### Fusion or kernels?\nNot measured: {md_escape(hide_server_paths(split))}"
    input_kernel_ops = split.input_kernel_ops
    from ..session.lowerings import step_cell
    from ..session.timing import NOT_READ

    busy = split.warning
    steps = [None, ("fusion", split.fusion), ("kernels", split.kernels)]
    few = too_few_rounds([split.fusion.rounds])
    check = (f"**busy machine: {md_escape(busy)}.** No verdict below." if busy else
             f"{few}: no verdict below is read." if few else f"quiet enough ({quiet_rule('×')}).")
    if getattr(split, "shared", False):  # one measurement with the chart: its rows, one more program in its rounds
        where = (f"The input and final rows are the chart's own measurements above (the same medians); the final "
                 f"version on MLX's own lowering ran in the same {split.fusion.rounds} paired rounds on the CPU, so "
                 "the machine check above covers it too: " + check)
    else:
        where = (f"Timed together on the CPU in {split.fusion.rounds} paired rounds, apart from the chart, with a "
                 "machine check of its own: " + check)
    lines = ["#### Fusion or kernels? The final version on MLX's own lowering and on rlxviz's kernels", where]
    lines += ["", f"| run | ops | median ms | {SPLIT_HEAD} | verdict |",
              "|---|---:|---:|---|---|"]
    for r, step in zip(split.rows, steps, strict=True):
        if step is None:
            lines.append(f"| {md_escape(split.label(0))} | {r.nodes} | {_ms(r.median_ms)} | | |")
            continue
        what, v = step
        words = NOT_READ if busy else v.words
        # the cell `rlxviz time` prints (`session.lowerings.step_cell`): no number when busy or where medians disagree
        lines.append(f"| {md_escape(r.label)} | {r.nodes} | {_ms(r.median_ms)} | {step_cell(what, v, busy, '×', '–')} "
                     f"| {words} |")
    lines += ["", split.sentence("×", "The speed-up the chart above and the table below print")
              + ((" Where the chart above says a row ran rlxviz's CPU kernels, its speed-up over the input is the "
                  "fusion's and the kernels' together.") if split.read() else ""),
              "", f"*{md_escape(hide_server_paths(split.kernels_note))}*" if split.kernels_note else ""]
    if input_kernel_ops:
        lines += ["", f"**The input is not all MLX's own lowering:** it already holds "
                      f"{', '.join(input_kernel_ops)}, which ran on rlxviz's kernel, so the *fusion* ratio compares "
                      "that with the final version on MLX's own lowering: it is not the fusion's alone."]
    return "\n".join(lines)


def error_formatter() -> Any:
    """A table cell formatter that shows an error in scientific notation with 3 significant digits (2.93e-8, as
    `rlxviz time` shows 2.93e-08), whatever its size; the column keeps its float values, so it sorts by number."""
    from bokeh.models.widgets.tables import ScientificFormatter

    # scientific whenever |x| <= 10**0 or |x| >= 10**0: every non-zero error (0 shows as 0.0)
    return ScientificFormatter(precision=2, power_limit_low=0, power_limit_high=0, nan_format="–")


LABEL_ROOM = 1.6
"""The timing charts' x axes end at the largest whisker end times this: room for a bar's label after the bar's end
(up to "0.88× (0.80–0.95)" or "0.88× within noise", about 120 px), which lies at or before its whisker's end."""

WHISKER_DODGE = -0.26
"""Where each whisker is drawn in its row, in rows from the row's centre (negative: down): along the lower edge of the
bar (0.7 of a row high), below the bar's label, which sits on the row's centre line at the bar's end. Drawn through
the centre, a whisker ran through the label; the label printed after the whisker's end (p75) sat at the 600 ms
gridline beside a bar that ended at 56 ms (a newcomer's busy minilm run at 1280x800)."""

LABEL_LIFT_PX = 2
"""How far a bar's label sits above its row's centre, px (vertically centred text, 11 px): clear of its whisker's
caps (`WHISKER_DODGE`, `WHISKER_CAP_PX`) below it."""

WHISKER_CAP_PX = 6
"""A whisker's end caps, px across: inside the bar's lower half, clear of the label above them."""

LABEL_GAP_PX = 4
"""A bar's label starts this far right of the bar's end, px."""


def on_kernels(row: dict[str, Any]) -> bool:
    """The row's version was lowered with rlxviz's own CPU kernels (`row["lowering"]`,
    `session.timing_text.kernel_rows`)."""
    return bool(version_mark(row))


def timing_factor(row: dict[str, Any], mark: bool = False) -> str:
    """A timing row's place on the chart's axis: `#: version` (unique where a pass runs twice, e.g. two
    `after dead_code_elimination` when unchanged passes are shown; Bokeh refuses repeated factors); with `mark`,
    then `KERNELS_MARK` where the row ran rlxviz's CPU kernels (`on_kernels`)."""
    name = version_name(row["#"], row["version"]) if "#" in row else row["version"]
    return name + (KERNELS_MARK if mark and on_kernels(row) else "")


def kernels_marked(rows: list[dict[str, Any]]) -> bool:
    """The chart marks rows one by one: some, not all, ran rlxviz's CPU kernels (when all did, the title says so
    once and the axis labels stay short enough for a 1280 px window)."""
    return any(map(on_kernels, rows)) and not all(map(on_kernels, rows))


def chart_title(rows: list[dict[str, Any]]) -> str:
    """The median plot's title, naming the lowering its rows ran: "median ms per version" and on a second line
    "MLX; rlxviz's kernels where marked" (some rows ran rlxviz's CPU kernels, `timing_factor` marks those) or "MLX
    with rlxviz's kernels, every row" (all did); "(MLX)" when none did."""
    if kernels_marked(rows):
        return "median ms per version\nMLX; rlxviz's kernels where marked"
    if rows and all(map(on_kernels, rows)):
        return "median ms per version\nMLX with rlxviz's kernels, every row"
    return "median ms per version (MLX)"


def speedup_label(row: dict[str, Any]) -> str:
    """The speed-up bar's label: the bar's own number (the paired speed-up over the input, `N.NN×`), then "within
    noise" when its verdict says so (its 95% interval holds 1 or spans more than `session.timing.WIDE_CI`), else the
    interval (`1.25× (1.18–1.31)`); on a run flagged busy (`row["busy"]`), or where the medians point the other way
    (`session.timing.DISAGREE`), "not read" instead of either; with fewer paired rounds (the row's `rounds`,
    `session.timing_table`) than a verdict needs (`session.defaults.MIN_VERDICT_ROUNDS`) "not read (3 rounds < 21)",
    not an interval (three rounds' bootstrap interval read "1.25× (1.18–1.31)" beside a verdict of too few rounds);
    the input's own bar reads `1.00×`; a version not timed again has no bar, its label says which version it equals
    (`unchanged_text`)."""
    if row.get("same_as") is not None:
        return unchanged_text(row["same_as"])
    if row.get("busy") and row.get("vs_input"):
        return f"{row['speedup']:.2f}× not read (busy)"
    rounds = row.get("rounds")
    if row.get("vs_input") not in (None, "", "-") and rounds is not None and rounds < MIN_VERDICT_ROUNDS:
        return f"{row['speedup']:.2f}× not read ({rounds} rounds < {MIN_VERDICT_ROUNDS})"
    if row.get("vs_input") == "within noise":
        return f"{row['speedup']:.2f}× within noise"
    if row.get("vs_input") == DISAGREE:
        return f"{row['speedup']:.2f}× not read (medians disagree)"
    lo, hi = row.get("ci_low"), row.get("ci_high")
    if row.get("vs_input") and lo is not None and hi is not None and lo == lo and hi == hi:
        return f"{row['speedup']:.2f}× ({lo:.2f}–{hi:.2f})"
    return f"{row['speedup']:.2f}×"


FASTER_COLOR = "#2e7d32"
"""Fill of a speed-up bar read as faster (green)."""

SLOWER_COLOR = "#c62828"
"""Fill of a speed-up bar read as slower (red): a bar below 1x was green, the colour of "faster"."""

NEUTRAL_COLOR = "#9e9e9e"
"""Fill of a speed-up bar that reads no direction: the input's own 1.00x, within noise, too few rounds, or a ratio
the medians contradict (`session.timing.DISAGREE`)."""


def speedup_color(row: dict[str, Any]) -> str:
    """A speed-up bar's fill, by its reading (`row["vs_input"]`, `session.timing_table`): `FASTER_COLOR` for
    "N.NNx faster", `SLOWER_COLOR` for "N.NNx slower", `NEUTRAL_COLOR` for anything else (within noise, not read,
    the input's own bar), whatever side of 1 the bar ends."""
    words = str(row.get("vs_input") or "")
    if row.get("busy"):
        return NEUTRAL_COLOR
    return FASTER_COLOR if words.endswith("x faster") else SLOWER_COLOR if words.endswith("x slower") else NEUTRAL_COLOR


OK_VERDICTS = ("ok", "unchanged")
"""A version's table verdicts (`session.timing_table`'s `verdict`) that say its numbers are right."""

ERROR_LEGEND = ("Beside it: the max error against the table's reference (the float64 oracle, the unfused graph; "
                "version 0 where the precision line says the graph is quantized), a green dot where the table's "
                "verdict is ok (within the tolerance the precision line states), a red one where it is not.")
"""The error plot in the chart's legend (`chart_legend`), as `error_color` colours it."""


def error_color(row: dict[str, Any]) -> str:
    """The max-error dot's colour, by the verdict the table gives the version (`row["verdict"]`), not by the error's
    size: `FASTER_COLOR` (green) for `ok` or `unchanged`, `SLOWER_COLOR` (red) for any other verdict (the reason it
    is not ok), `NEUTRAL_COLOR` for a row with no verdict. Every dot was red, ok or not."""
    verdict = row.get("verdict")
    if not verdict:
        return NEUTRAL_COLOR
    return FASTER_COLOR if verdict in OK_VERDICTS else SLOWER_COLOR


def chart_legend(rows: list[dict[str, Any]]) -> str:
    """What the timing chart shows, in words true of this run's chart (`timing_figure`), as Markdown: the median bars
    (whiskers p25 to p75 along each bar's lower edge, each bar labelled with its median at the bar's end); on a usable
    run the speed-up bars (each labelled with its own number, coloured by its reading) and what *within noise* means;
    on a busy run (`rows[i]["busy"]`) that no speed-up bar or number is shown. "" without rows."""
    from ..session.timing import PRACTICAL, WIDE_CI

    if not rows:
        return ""
    top = ("Top: the median ms over the rounds (bars; whiskers along each bar's lower edge: p25 to p75); each "
           "median bar's label is its median, printed at the bar's end.")
    if any(r.get("busy") for r in rows):
        return (f"{top} No speed-up is drawn or printed: the machine was busy (above), so no ratio of this run is "
                f"read; the medians are shown as measured. {ERROR_LEGEND}")
    return (f"{top} Below it: the speed-up over the input, the median of the per-round ratios (round *r* of every "
            "version ran back to back), with its 95% bootstrap interval (*ci*); each speed-up bar is labelled with its "
            "own number, green where it reads *faster*, red where it reads *slower*, grey where it reads neither. "
            f"*Within noise*: that interval holds 1, lies within 1 ± {PRACTICAL:.0%} or spans more than {WIDE_CI}x "
            "(high/low), so these rounds do not tell the two versions apart; time again with more "
            f"rounds ({MIN_VERDICT_ROUNDS} at least for a verdict). {ERROR_LEGEND}")


def table_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Timing tab's table rows: `session.timing_table`'s, each `speedup` the cell `rlxviz time` prints in its `x
    input` column (`session.timing.speedup_text`, one function): `1.00` for the input, `busy: not read` on a busy run
    (every row, the input's own included: no number), `not read: medians disagree` where the medians contradict the
    ratio, `unchanged: same as #17, not timed again` for a version not timed again, else `N.NN`; each `version`
    numbered as the chart and the busy-machine line name it (`wording.version_name`: `21: after fuse_sdpa`; the
    banner cited "#21" while the table showed no number) and marked `KERNELS_MARK` where it ran rlxviz's kernels, as
    `rlxviz time` names it; the row where the lowering changes says so after its `vs previous`
    (`session.timing_words.lowering_note`: that comparison is the pass and the lowering together)."""
    from ..session.timing import speedup_text

    def previous(r: dict[str, Any]) -> str:
        note = lowering_note(r)
        return "; ".join(w for w in (r.get("vs_previous", ""), note) if w)

    return [{**r, "speedup": speedup_text(r), "vs_previous": previous(r),
             "version": (version_name(r["#"], r["version"]) if "#" in r else r["version"]) + version_mark(r)}
            for r in rows]


def _ms(median_ms: float) -> str:
    """A median as the chart labels it (`ms_label` of the table's row, which holds it to 3 decimals), so a value on
    a rounding boundary (1.45496) reads the same in the split's table as on its bar (1.46, not 1.45)."""
    return f"{round(median_ms, 3):.2f}"


def ms_label(row: dict[str, Any]) -> str:
    """The median bar's label: the bar's own number, `N.NN ms` (the median over the rounds); a version not timed
    again (`row["same_as"]`) has no bar, and its label says which version it equals (`unchanged_text`)."""
    if row.get("same_as") is not None:
        return unchanged_text(row["same_as"])
    return f"{row['median_ms']:.2f} ms"


PLOT_ROW_PX = 30
"""Height of one version's row in each timing plot, px (the bar, its whisker and its label)."""

PLOT_FRAME_PX = 120
"""Height of a timing plot's title (up to two lines) and x axis with its label, px, above and below the rows."""


def plot_height(n_rows: int) -> int:
    """Height in px of one timing plot showing `n_rows` versions: `PLOT_FRAME_PX` plus `PLOT_ROW_PX` per row, at
    least 200 (a plot of one or two versions still has room for its axes)."""
    return max(200, PLOT_FRAME_PX + PLOT_ROW_PX * n_rows)


MS_AXIS = "ms; bar: median, labelled at its end; whisker (below the label): p25 to p75"
"""The median plot's x-axis label (it fits the plot's width at 1280 px with the sidebar open)."""

SPEEDUP_AXIS = "× over the input (paired); whisker: 95% ci"
"""The speed-up plot's x-axis label: about 290 px of plot at 1280 px with the sidebar open ("× (median of paired
per-round ratios); whisker: 95% interval" was cut to "whisker: 95% int"; the legend says what the ratio is)."""


def speedup_title(rows: list[dict[str, Any]]) -> str:
    """The speed-up plot's title, in lines short enough for its width at 1280 px (a longer one ran into the error
    plot's title): "speed-up over the input", then where rows ran rlxviz's kernels "fusion + rlxviz's kernels
    together" (those rows' speed-ups are not the fusion's alone). A busy run draws no speed-up plot
    (`busy_speedup_html` stands in its place)."""
    if any(map(on_kernels, rows)):
        return "speed-up over the input\nfusion + rlxviz's kernels together"
    return "speed-up over the input"


BUSY_SPEEDUP_HEAD = "Speed-up over the input: not read, the machine was busy"
"""The first line of what stands in the speed-up plot's place on a busy run (`busy_speedup_html`)."""


BUSY_BOX_STYLE = ("border: 1px solid #f5c2c7; background: #f8d7da; color: #58151c; padding: 10px; font-size: 13px; "
                  "line-height: 1.4; border-radius: 4px")
"""The box of `busy_speedup_html` (the colours of the busy banner above it, Panel's "danger" alert)."""


def busy_speedup_html(rows: list[dict[str, Any]]) -> str:
    """What stands in the speed-up plot's place on a busy run (`rows[i]["busy"]`), as HTML: `BUSY_SPEEDUP_HEAD`, the
    busy flag's own sentence with its figures (`session.busy_warning`: "median 3.02 ms is 3.0x the minimum 1.00 ms on
    #0 input"), escaped (it names the model's versions), why no ratio is drawn and what to do. A plot holding only
    the rule at 1 read as a large blank area. "" on a run not flagged busy."""
    import html

    flag = next((str(r["busy"]) for r in rows if r.get("busy")), "")
    if not flag:
        return ""
    return (f"<b>{BUSY_SPEEDUP_HEAD}.</b><br>What the busy check found: {html.escape(flag)}.<br>"
            "On a machine this busy the per-round ratios cannot tell the versions apart, so no speed-up bar or "
            "number is drawn; the medians above are shown as measured. Press <i>↻ Time again</i> when the machine "
            "is quieter.")


def timing_figure(rows: list[dict[str, Any]]) -> Any:
    """Three plots on one y range (one row per version), each bar labelled with its own number:

    * median ms per version (bars; whiskers p25 to p75 of the rounds along each bar's lower edge, `WHISKER_DODGE`;
      label `N.NN ms` at the bar's end, `LABEL_GAP_PX` right of it, as the axis label says: it reads against the
      gridline at its own bar's end, not at its whisker's);
    * the speed-up over the input (bars: the median of the paired per-round ratios, `session.paired_verdict`;
      whiskers: its 95% bootstrap interval, placed as the median plot's; label `speedup_label`, that same number, at
      the bar's end; fill `speedup_color`, by its reading), a rule at 1. On a busy run (`row["busy"]`) no plot: a
      message in its place says why (`busy_speedup_html`; `session.timing.speedup_text` prints no number there
      either), and the error plot beside it names the versions itself;
    * max |error| vs the table's reference (log axis; a dot coloured by the table's verdict, `error_color`).

    A bar and its label are one statistic: a median ms bar longer than the input's may sit next to a speed-up
    above 1 (the medians and the per-round ratios are different statistics), but never inside one plot.

    Laid out as a column, `plot_height(len(rows))` px per plot (the column's `height` is their sum): the median plot
    on a row of its own, the speed-up plot (with the version names again) and the error plot (240 px) below it. In
    one row the version names on the axis (about 250 px) left the median plot about 65 px of plot at 1280x800 with
    the sidebar open (issue 39); now it has the pane's width less the names (about 640 px there)."""
    from bokeh.layouts import column, row
    from bokeh.models import ColumnDataSource, Div, FixedTicker, Range1d, Span
    from bokeh.plotting import figure
    from bokeh.transform import dodge

    labels = [timing_factor(r, kernels_marked(rows)) for r in rows]
    low = [r.get("p25_ms", r["median_ms"] - r.get("iqr_ms", 0.0) / 2) for r in rows]
    high = [r.get("p75_ms", r["median_ms"] + r.get("iqr_ms", 0.0) / 2) for r in rows]
    busy = any(r.get("busy") for r in rows)
    nan = float("nan")
    # a busy run draws no speed-up bar and prints no speed-up number (`session.timing.speedup_text`, as `rlxviz time`
    # prints "busy: not read"); the medians stay
    speed = [nan if busy else r.get("speedup", nan) for r in rows]
    s_low = [nan if busy else r.get("ci_low", x) for r, x in zip(rows, speed, strict=True)]
    s_high = [nan if busy else r.get("ci_high", x) for r, x in zip(rows, speed, strict=True)]
    # each label at its own bar's end; a version not timed again: no bar, its label ("unchanged: same as #17, ...")
    # at the axis's start
    at = [0.0 if r.get("same_as") is not None else r["median_ms"] for r in rows]
    src = ColumnDataSource({"version": labels, "ms": [r["median_ms"] for r in rows], "low": low, "high": high,
                            "ms_at": at,
                            "ms_label": [ms_label(r) for r in rows],
                            "x": speed, "x_low": s_low, "x_high": s_high,
                            "x_at": [0.0 if r.get("same_as") is not None else x for r, x in zip(rows, speed,
                                                                                                strict=True)],
                            "speedup": ["" if busy and r.get("same_as") is None else speedup_label(r) for r in rows],
                            "x_color": [speedup_color(r) for r in rows],
                            "err": [max(r["max_err"], 1e-12) for r in rows],
                            "err_color": [error_color(r) for r in rows]})
    h = plot_height(len(rows))
    p = figure(y_range=labels[::-1], height=h, sizing_mode="stretch_width", min_width=300,
               title=chart_title(rows), toolbar_location=None,
               x_axis_label=MS_AXIS)
    p.title.align = "left"
    if "\n" in p.title.text:
        p.title.text_font_size = "12px"  # two lines in the plot's width
    p.hbar(y="version", right="ms", height=0.7, source=src, color="#1565c0")
    p.add_layout(_whisker(src, "low", "high", dodge("version", WHISKER_DODGE, range=p.y_range)))
    p.add_layout(_bar_label(src, "ms_at", "ms_label"))
    # Bokeh's automatic range covers the bars only (not annotations): set it so every whisker end and the
    # label after it show.
    p.x_range = Range1d(start=min([0.0, *(v for v in low if v == v)]),
                        end=max([1e-6, *(v for v in high if v == v)]) * LABEL_ROOM)
    # the speed-up's label in its plot's width at 1280 px (16 px, it ran past the figure's edge)
    p.xaxis.axis_label_text_font_size = "12px"
    hi = max([1e-2, *(10 * r["max_err"] for r in rows if r["max_err"] == r["max_err"])])
    q = figure(y_range=p.y_range, height=h, width=240, x_axis_type="log", x_range=(1e-9, hi),
               title="max |error| vs the reference", toolbar_location=None)
    # a tick every third decade: one per decade (10^-9 to 10^-2) ran into each other in 230 px
    top = math.ceil(math.log10(hi)) if math.isfinite(hi) else 0
    q.xaxis.ticker = FixedTicker(ticks=[10.0 ** k for k in range(-9, top + 1, 3)])
    q.scatter(x="err", y="version", source=src, size=9, color="err_color")  # by the table's verdict: `error_color`
    if busy:  # no ratio to draw: the message in the speed-up plot's place, the error plot names the versions
        q.sizing_mode, q.min_width = "stretch_width", 360
        # the box as tall as its text (the row stretches the Div to the error plot's height: a box that tall was a
        # large blank area again); no vertical margin: the row stays the error plot's height, the column's `2 * h`
        note = Div(text=f'<div style="{BUSY_BOX_STYLE}">{busy_speedup_html(rows)}</div>',
                   sizing_mode="stretch_width", min_width=240, css_classes=["rv-speedup-busy"], margin=(0, 10, 0, 5))
        return column(p, row(note, q, sizing_mode="stretch_width"), sizing_mode="stretch_width", height=2 * h)
    q.yaxis.visible = False
    sp = figure(y_range=p.y_range, height=h, sizing_mode="stretch_width", min_width=300, toolbar_location=None,
                title=speedup_title(rows), x_axis_label=SPEEDUP_AXIS)
    sp.xaxis.axis_label_text_font_size = "12px"
    sp.title.align = "left"
    sp.title.text_font_size = "12px"  # two short lines in about 290 px of plot at 1280 px with the sidebar open
    sp.hbar(y="version", right="x", height=0.7, source=src, color="x_color")  # by reading: `speedup_color`
    sp.add_layout(_whisker(src, "x_low", "x_high", dodge("version", WHISKER_DODGE, range=p.y_range)))
    sp.add_layout(Span(location=1.0, dimension="height", line_color="#c62828", line_dash="dashed"))
    sp.add_layout(_bar_label(src, "x_at", "speedup"))
    ends = [v for v in (*s_high, *speed) if v == v]
    sp.x_range = Range1d(start=0.0, end=max([1.0, *ends]) * (LABEL_ROOM + 0.3))
    return column(p, row(sp, q, sizing_mode="stretch_width"), sizing_mode="stretch_width", height=2 * h)


def _whisker(src: Any, lower: str, upper: str, base: Any) -> Any:
    """A plot's whiskers, `lower` to `upper` (columns of `src`), along each bar's lower edge (`base`: the rows dodged
    by `WHISKER_DODGE`), with small caps (`WHISKER_CAP_PX`) clear of the bar's label."""
    from bokeh.models import TeeHead, Whisker

    heads = {k: TeeHead(size=WHISKER_CAP_PX, line_color="#333") for k in ("lower_head", "upper_head")}
    return Whisker(base=base, lower=lower, upper=upper, dimension="width", source=src, line_color="#333", **heads)


def _bar_label(src: Any, x: str, text: str) -> Any:
    """Each bar's label (`text` column of `src`) at `x` (the bar's end), `LABEL_GAP_PX` right of it, on the row's
    centre line lifted `LABEL_LIFT_PX` above its whisker."""
    from bokeh.models import LabelSet

    return LabelSet(x=x, y="version", text=text, source=src, x_offset=LABEL_GAP_PX, y_offset=LABEL_LIFT_PX,
                    text_baseline="middle", text_font_size="11px")


__all__ = ["BUSY_SPEEDUP_HEAD", "LABEL_GAP_PX", "WHISKER_DODGE", "busy_speedup_html", "ERROR_LEGEND", "OK_VERDICTS",
           "error_color",
           "FASTER_COLOR", "KERNELS_MARK", "LABEL_ROOM", "NEUTRAL_COLOR", "SLOWER_COLOR", "chart_legend",
           "speedup_color", "table_rows", "PLOT_FRAME_PX", "PLOT_ROW_PX", "chart_title", "error_formatter",
           "fusion_kernels_markdown", "kernels_marked", "machine_verdict", "ms_label", "on_kernels", "plot_height",
           "shown_product", "speedup_label", "speedup_title", "MS_AXIS", "SPEEDUP_AXIS", "timing_factor",
           "timing_figure"]
