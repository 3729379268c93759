"""The Model Explorer export words a refusal's fixes as `explain -v` does (newcomer findings, rlxviz issue 39).

Granite's attention scale is a gap in rlxviz's ops: `explain` names the compiler fix (`give FusedAttentionBlock a
scale attribute`) and the folded scale as `a workaround in the model`, while the export gave the workaround alone as
`fix_0`, read as the fix. esm's compiler fix alone is not enough (`qkv_packed (not recognized) fails next`): the text
and the app's △ mark say so, the export's fix fields did not. Decision: `fix_K` and `compiler_fix_K`, the `fix:` and
`compiler fix:` lines, framed as the not-expected line frames them (`model_explorer.fix_words`, from the same
`why.caveat` and `overlay.gap_caveats` words)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from test_near_miss_rule import trace_of

from rlxviz.passes import Trace
from rlxviz.passes.explain import explain
from rlxviz.passes.why.caveat import WORKAROUND
from rlxviz.passes.why.standing import standing
from rlxviz.viz.model_explorer import trace_json

FIX = Path(__file__).parent / "fixtures" / "onnx"
GRANITE, ESM = FIX / "cases" / "granite.onnx", FIX / "zoo" / "esm.dynamo-eager.onnx"
GAP = "△ gap in rlxviz's ops: fuse_attention_block."


@functools.cache
def _trace(path: Path) -> Trace:
    return trace_of(path)


def _gap_lines(trace: Trace, versions: str) -> list[tuple[str, str, str]]:
    """(rejected, fix, compiler fix) of each refusal line at a gap in fuse_attention_block of the export."""
    out = []
    for g in trace_json(trace, versions)["graphs"]:
        for n in g["nodes"]:
            a = {x["key"]: x["value"] for x in n["attrs"]}
            out += [(v, a.get(f"fix_{k[9:]}", ""), a.get(f"compiler_fix_{k[9:]}", "")) for k, v in a.items()
                    if k.startswith("rejected_") and v.startswith(GAP)]
    return out


def _refusal(trace: Trace, line: str):
    return next(r for r in trace.rejections if f": {r.rule}: {r.guard} ({r.stage}): " in line and line.endswith(
        r.message))


@pytest.mark.parametrize("versions", ["all", "final"])
@pytest.mark.parametrize("path", [GRANITE, ESM], ids=lambda p: p.stem)
def test_a_gap_refusals_fixes_say_what_explain_says(path, versions):
    t = _trace(path)
    lines = _gap_lines(t, versions)
    assert lines
    for line, fix, compiler in lines:
        r = _refusal(t, line)
        why = standing(t, r)[1]  # the not-expected line's reason: `... (compiler fix: C; CAVEATS)`
        o = next(o for o in explain(t, r.layer).rejected if (o.rule, o.guard) == (r.rule, r.guard))
        assert compiler.startswith(o.fix) and o.fix, (compiler, o.fix)  # `explain -v`'s `compiler fix:` line
        assert f"(compiler fix: {compiler}" in why, (compiler, why)
        assert fix.endswith(o.hint), (fix, o.hint)  # its `fix:` line
        if fix != o.hint:
            assert fix == WORKAROUND.format(fix=o.hint) and fix in why, (fix, why)


def test_granites_folded_scale_is_a_workaround_beside_the_compiler_fix():
    for _, fix, compiler in _gap_lines(_trace(GRANITE), "final"):
        assert fix.startswith("a workaround in the model: fold the scale into q_proj"), fix
        assert compiler == "give FusedAttentionBlock a scale attribute", compiler


def test_esms_compiler_fix_carries_the_caveat_its_mark_and_text_carry():
    lines = _gap_lines(_trace(ESM), "final")
    assert len(lines) == 2
    for _, fix, compiler in lines:
        assert fix.startswith("nothing to change in the model: ")
        assert compiler.endswith("; alone it is not enough: qkv_packed (not recognized) fails next"), compiler
