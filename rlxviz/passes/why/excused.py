"""The refusals a layer's kind does not count ("not expected here"), gathered by rule, guard and why, and the places
each names: what `verdict.LayerVerdict.not_expected` lists, one line per group (`policy.not_expected_line`).

Split from `verdict.py` (one job per module): the verdict decides what a layer is expected to fuse; this module
words the refusals it does not count.
"""

from __future__ import annotations

from ..report import MissedFusion
from ..trace import Trace, layer_of
from .caveat import fix_caveat
from .facts import RunFacts
from .kinds import LayerArchitecture as Architecture
from .policy import excuse, not_expected_line, with_caveat


def expected_misses(trace: Trace, arch: Architecture, layer: int | None
                    ) -> tuple[list[MissedFusion], dict[tuple[str, str], str]]:
    """The misses of `layer` (None: the whole graph) that count for `arch`, and `(pattern, guard) -> "pattern (guard)
    @ %NODE (PATH): the guard's reason; why it is not expected here: why"` (`policy.not_expected_line`) for those that
    do not: one line per pattern, failing guard and why (keys `(pattern, guard)`, then `(pattern, "guard#2")` for a
    second why: deit's layer norms, where one place's compiler fix is not enough alone), naming every place (anchor
    node) it refused, as the app's chips
    count them `○` (granite's layer 1: the residual norm refused at %186 and %187, `at 2 places, %186 (...) and %187
    (...): at %186: REASON`), the reason and why of the first place, each place with its own guard (BART's decoder
    layer: FusedTransformerLayer refused at the cross-attention by `attn_is_fused_block` and at the self-attention by
    `fc1_is_fused_linear`, two lines). Misses are the run's missed fusions plus its "no rule recognizes this" findings
    (`passes.unrecognized`: a family-shaped chain no rule made a candidate)."""
    kept: list[MissedFusion] = []
    groups: dict[tuple[str, str, str], tuple[MissedFusion, dict[int, str]]] = {}  # places that share rule, guard, why
    for m in RunFacts.of(trace).misses():
        if layer is not None and layer_of(m.path) != layer:
            continue
        ex = excuse(arch, m.pattern.split(".")[0], m.guard, m.kind, m.remedy)
        if ex is None:
            kept.append(m)
            continue
        why = with_caveat(ex[1], fix_caveat(trace, m.pattern, m.node, m.guard, arch))
        groups.setdefault((m.pattern, m.guard, why), (m, {}))[1][m.node] = m.path
    ignored: dict[tuple[str, str], str] = {}
    for (pattern, guard, why), (m, at) in groups.items():  # the guard's own reason first, then why it does not count
        reason = m.reason if len(at) == 1 else f"at %{m.node}: {m.reason}"
        n = sum(k[0] == pattern and k[1].split("#")[0] == guard for k in ignored)  # another why: `GUARD#2`
        ignored[pattern, f"{guard}#{n + 1}" if n else guard] = not_expected_line(pattern, guard, reason, why,
                                                                                 places_words(at))
    return kept, ignored


def places_words(places: dict[int, str]) -> str:
    """The places (anchor node -> node path) a not-expected line names (`policy.not_expected_line`): `@ %186 (PATH)`
    for one, `at 2 places, %186 (PATH) and %187 (PATH)` for several, `-` for no path."""
    named = [f"%{n} ({p or '-'})" for n, p in places.items()]
    if len(named) == 1:
        return f"@ {named[0]}"
    return f"at {len(named)} places, {', '.join(named[:-1])} and {named[-1]}"


__all__ = ["expected_misses", "places_words"]
