"""A timing run laid out for the front ends: `rlxviz time`'s text table (`format_timings`), the speed-up `--json` may
give (`json_speedup`) and the versions that ran rlxviz's kernels (`kernel_rows`), in the words of `timing_words`. No
MLX import; `timing.timing_table` makes the rows these read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .lowerings import KERNEL_OPS
from .timing import speedup_shown, speedup_text, timing_table
from .timing_words import lowering_note, unchanged_text, version_mark


def kernel_rows(trace: Any, rows: Sequence[Any]) -> frozenset[int]:
    """Indices of the versions lowered with rlxviz's own CPU kernels: the run's context says they ran
    (`runtime.timing.kernels_line`: "..., ran attention, bias+gelu"; never on the GPU or with them off or not built)
    and the version holds an op they take (`lowerings.KERNEL_OPS`). A version a pass left unchanged is marked as the
    one it equals. `rows`: `timing.time_versions`' rows of `trace` (a `passes.Trace`)."""
    versions = trace.versions()
    ran = any(", ran " in (getattr(r.context, "kernels", "") or "") for r in rows if r.context is not None)
    if not ran:
        return frozenset()
    return frozenset(r.index for r in rows if r.index < len(versions)
                     and any(n.op in KERNEL_OPS for n in versions[r.index][1].compute_nodes()))


def json_speedup(row: Mapping[str, Any]) -> float | None:
    """A `timing_table` row's speed-up as `rlxviz time --json` gives it: the number only where the text and the app
    print one (`timing.speedup_shown`); None on a busy run, where the medians disagree, and for a version not timed
    again, so a script reads no ratio the other front ends refuse (the medians in ms stay)."""
    return float(row["speedup"]) if speedup_shown(row) else None


def format_timings(rows: Sequence[Any], busy: str = "", table: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The timing table as aligned text (ops per version; ms; max abs error vs the oracle (`vs input` for a quantized
    graph: version 0 in its dtype judges, `runtime.precision.judge_of`) and vs the unfused graph on MLX; the verdict,
    naming the input set that broke a version). The `x input` column is `speedup_text` of `timing_table`'s row, the
    words the app's table and chart print: with `busy` (`busy_warning` of the run, as `timing_table`'s `busy`; or
    `timing_table`'s own check) every version's cell, the input's own included, reads `NOT_READ`: no ratio of a busy
    run is a verdict, and none is printed. A version that ran rlxviz's kernels is named with `KERNELS_MARK`, and the
    row where the lowering changes has `lowering_note` under it; a version a pass left unchanged reads
    `unchanged_text`. `table`: `timing_table` of `rows` when the caller has made it already (`rlxviz time` makes it
    with the own-lowering row and the kernels' rows); else made here (every row MLX's own lowering)."""
    by_index = {t["#"]: t for t in (timing_table(rows) if table is None else table)}
    busy = busy or next(iter(by_index.values()), {}).get("busy", "")
    cells = {i: speedup_text({**t, "busy": busy}) for i, t in by_index.items()}
    names = {r.index: r.label + version_mark(by_index.get(r.index, {})) for r in rows}
    w = max(len(n) for n in names.values())
    sw = max([7, *(len(cells[r.index]) for r in rows if r.same_as is None)])  # the `x input` column
    quantized = any(r.policy is not None and not r.policy.judge.oracle for r in rows)
    lines = [f"{'#':>2}  {'version':<{w}}  {'ops':>5}  {'median ms':>9}  {'min ms':>8}  {'IQR ms':>7}  "
             f"{'x input':>{sw}}  {'first ms':>8}  {'vs input' if quantized else 'vs oracle':>9}  "
             f"{'vs unfused':>10}  ok"]
    for r in rows:
        if r.same_as is not None:
            lines.append(f"{r.index:>2}  {names[r.index]:<{w}}  {r.nodes:>5}  ({unchanged_text(r.same_as)})")
        else:
            iqr = f"{r.iqr_ms:>7.2f}" if r.iqr_ms is not None else f"{'-':>7}"
            lines.append(f"{r.index:>2}  {names[r.index]:<{w}}  {r.nodes:>5}  {r.median_ms:>9.2f}  {r.min_ms:>8.2f}  "
                         f"{iqr}  {cells[r.index]:>{sw}}  {r.first_call_ms:>8.1f}  {r.max_abs:>9.2e}  "
                         f"{r.err_unfused:>10.2e}  {r.note}")
        if note := lowering_note(by_index.get(r.index, {})):
            lines.append(f"{'':>2}  ^ {note}")
    return "\n".join(lines)


__all__ = ["format_timings", "json_speedup", "kernel_rows"]
