"""The words every front end prints for a timing row (`rlxviz time`'s table and `--json`, the Timing tab's table and
chart): which lowering a row ran and where it changes, and what a version not timed again reads. No import of the
timing service: `timing.timing_table` makes the rows these read (`timing_text` lays them out)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .defaults import MIN_VERDICT_ROUNDS

MLX_LOWERING = "MLX ops"
"""A timing row's `lowering` where every op ran MLX's own lowering."""

KERNELS_LOWERING = "rlxviz kernels"
"""A timing row's `lowering` where ops ran rlxviz's own CPU kernels (`kernel_rows`)."""

KERNELS_MARK = f" ({KERNELS_LOWERING})"
"""Appended to the name of a version that ran rlxviz's CPU kernels: in `rlxviz time`'s table, the app's table and the
app's chart (`version_mark`)."""


def too_few_rounds(rounds: Iterable[int | None]) -> str:
    """Why a run's machine check cannot call it quiet: "" when the run's timed rounds (`rounds`: each row's, as
    `timing.timing_table`'s `rounds` or a split's; 0 and None, rows not compared, passed over) reach
    `defaults.MIN_VERDICT_ROUNDS`, else `too few rounds to judge the machine quiet or busy (3 < 21)`. Three rounds
    whose medians sat within 2x their minimums read "Quiet enough ... the verdicts below can be read" beside verdicts
    of too few rounds: with so few, a spread within the limits says nothing of the machine. The one rule the Timing
    tab's banner, its split's check and `rlxviz time`'s split read (a busy warning, `timing.busy_warning`, still goes
    first: a spread past the limits in a few rounds is busy already)."""
    have = [n for n in rounds if n]
    if not have or min(have) >= MIN_VERDICT_ROUNDS:
        return ""
    return f"too few rounds to judge the machine quiet or busy ({min(have)} < {MIN_VERDICT_ROUNDS})"


def lowering_change(before: str, after: str) -> str:
    """Where the lowering differs from the listed row above: `lowering changes here: MLX ops -> rlxviz kernels`; ""
    where it is the same. Its comparison with the row above is the pass and the lowering together, not the pass."""
    return "" if before == after else f"lowering changes here: {before} -> {after}"


def lowering_note(row: Mapping[str, Any]) -> str:
    """The note on the row where the lowering changes (`row["lowering_change"]`, `timing.timing_table`), as `rlxviz
    time` prints it under the row and the app's table beside its `vs previous`: the change, and that the comparison
    with the row above is the pass and the lowering together (a speed-up there is not the pass's own); "" elsewhere."""
    change = row.get("lowering_change") or ""
    return f"{change}: against the row above, this pass and the lowering change together" if change else ""


def version_mark(row: Mapping[str, Any]) -> str:
    """`KERNELS_MARK` where the row ran rlxviz's CPU kernels (`row["lowering"]`), else "": its speed-up over the input
    is the fusion's and the kernels' together."""
    return KERNELS_MARK if row.get("lowering") == KERNELS_LOWERING else ""


KERNELS_NOTE = (f"{KERNELS_MARK.strip()}: the version ran rlxviz's CPU kernels, so its speed-up over the input is "
                "the fusion's and the kernels' together, not the pass's alone.")
"""The line under `rlxviz time`'s table where a row is named `KERNELS_MARK` (the app's chart says it in its
speed-up plot's title: "fusion + rlxviz's kernels together")."""


def unchanged_text(same_as: int) -> str:
    """What a version a pass left unchanged reads in place of its figures, in `rlxviz time`'s table and the app's
    table and chart alike: `unchanged: same as #17, not timed again` (it is not measured twice)."""
    return f"unchanged: same as #{same_as}, not timed again"


_MAX_DIGITS = 6
"""The most decimals `over_limit` and `over_limit_ms` print to show a value past its limit."""


def over_limit(ratio: float, limit: float) -> str:
    """`ratio` beside the `limit` it is over (`timing.busy_warning`'s words), with the digits that show it is over:
    `0.54x (over 0.5x)`, `2.004x (over 2x)`, never a rounded `0.5x` or `2.00x` that reads as the limit itself (a
    newcomer read "2.00x (over 2x)"); past `_MAX_DIGITS` decimals, `just over 2x`."""
    for d in range(2, _MAX_DIGITS + 1):
        if round(ratio, d) > limit:
            return f"{ratio:.{d}f}x (over {limit:g}x)"
    return f"just over {limit:g}x"


def over_limit_ms(value: float, base: float, limit: float) -> tuple[str, str]:
    """`value` and `base` (ms) with the decimals (2 at least) at which the printed `value` is over `limit` times the
    printed `base`, as the rule compares them: "median 1.88 ms is 2.004x the minimum 0.94 ms" read as exactly 2x."""
    d = next((d for d in range(2, _MAX_DIGITS + 1) if round(value, d) > limit * round(base, d)), _MAX_DIGITS)
    return f"{value:.{d}f}", f"{base:.{d}f}"


__all__ = ["KERNELS_LOWERING", "KERNELS_MARK", "KERNELS_NOTE", "MLX_LOWERING", "lowering_change", "lowering_note",
           "over_limit", "over_limit_ms", "too_few_rounds",
           "unchanged_text", "version_mark"]
