"""The missed-fusion report on a pipeline's final graph, in our guard names.

RLX's `fusion_report` re-scans the final graph for three patterns with fixed reasons (rlx-notes
§3.1, with false positives). Here misses come from the matcher itself: every rejection of the run
whose anchor or offending nodes are still in the final graph (i.e. no later fusion absorbed
them) is a miss, reported with the rule, the node, the guard that said no, and the guard's hint.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir import Graph
from .pipeline import Pipeline
from .trace import Trace


@dataclass(frozen=True)
class MissedFusion:
    """A fusion that did not happen.

    Attributes:
        pattern: the rule, e.g. `fuse_transformer_layer.bert_post_ln`.
        node: the anchor node id (in the graph version the pass saw; still in the final graph or one
            of `offending` is).
        path: its model path.
        guard: the guard or structure step that rejected it.
        reason: the rejection message (actual vs required values).
        hint: how to fix it.
    """

    pattern: str
    node: int
    path: str
    guard: str
    reason: str
    hint: str

    def __str__(self) -> str:
        hint = f" -> {self.hint}" if self.hint else ""
        return f"{self.pattern} @ %{self.node} ({self.path or '-'}): {self.guard}: {self.reason}{hint}"


def missed_fusions(source: Graph | Trace, pipeline: Pipeline | None = None) -> list[MissedFusion]:
    """Misses of a run (a `Trace`, or a graph run through `pipeline`, default canonical), in pass order.

    A rejection counts when its anchor or one of its offending nodes survives in the final graph;
    duplicates (same rule and anchor) keep the last pass's reason.
    """
    trace = source if isinstance(source, Trace) else (pipeline or Pipeline.canonical()).run(source)
    final = trace.final
    out: dict[tuple[str, int], MissedFusion] = {}
    for r in trace.rejections:
        if r.anchor in final or any(i in final for i in r.offending):
            out[(r.rule, r.anchor)] = MissedFusion(r.rule, r.anchor, r.path, r.guard, r.message, r.hint)
    return list(out.values())


def format_report(trace: Trace) -> str:
    """A short text report: node counts before/after, fused-op counts, then the misses."""
    before, after = trace.input, trace.final
    fused = after.fused_op_counts()
    lines = [f"fusion report ({trace.pipeline}): nodes {len(before)} -> {len(after)}; "
             + ", ".join(f"{k}={v}" for k, v in fused.items())]
    errors = [s for s in trace.steps if s.error]
    lines += [f"  ERROR in {s.pass_name}: {s.error}" for s in errors]
    missed = missed_fusions(trace)
    if missed:
        lines.append("  missed:")
        lines += [f"    {m}" for m in missed]
    return "\n".join(lines)


__all__ = ["MissedFusion", "format_report", "missed_fusions"]
