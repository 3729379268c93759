"""A refusal whose candidate a later pass fused after all reads one standing everywhere: taken later.

clip-text.ortopt's layer 1 (and starcoder2.ortopt's two layers) refuse the attention's out_proj linear for its bias
added after the residual (`fuse_matmul_bias_act.bias_after_residual`), and fuse_attention_block then takes its matmul.
`explain` said `also rejected: ...; a near-miss (the app's chips mark it ✗), not counted` while `-v`'s rule line for
the same place said `△ gap in rlxviz's ops`: one place, two standings. Now `standing` gives it
`policy.TAKEN_LATER_GROUP` with what took it, and the text (`taken later: ...`), `-v`'s mark, `--json` and the chips
say that alone: neither a near-miss nor a gap."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest
from clirun import run as cli_run

from rlxviz.ir import Op
from rlxviz.models.onnx import load_onnx
from rlxviz.passes import Pipeline
from rlxviz.passes.why.places import places
from rlxviz.passes.why.policy import TAKEN_LATER_GROUP
from rlxviz.passes.why.standing import standing
from rlxviz.passes.why.text import TAKEN_LATER_STANDING
from rlxviz.passes.why.verdict import OP_GAP_GROUP, STANDING_GROUPS

ONNX = Path(__file__).parent / "fixtures" / "onnx"
RULE, GUARD = "fuse_matmul_bias_act.bias_after_residual", "bias_after_residual"
CASES = {ONNX / "ortopt" / "clip-text.ortopt.onnx": 1, ONNX / "zoo" / "starcoder2.ortopt.onnx": 2}
"""File -> how many of its places a later pass took (each at the attention's out_proj)."""
WORDS = re.compile(r"its matmul was fused later by fuse_attention_block into %(\d+)")


@functools.cache
def _trace(path: Path):
    return Pipeline.canonical().run(load_onnx(str(path), batch=1, seq=16).graph)


@pytest.mark.parametrize("path", list(CASES), ids=lambda p: p.stem)
def test_a_place_taken_later_stands_as_taken_later_in_the_chips(path):
    trace = _trace(path)
    k = next(k for k, s in enumerate(trace.steps) if s.pass_name == "fuse_matmul_bias_act")
    heads = [r for r in trace.steps[k].rejections if r.rule == RULE and r.headline]
    taken = [(r, st) for r in heads if (st := standing(trace, r)) is not None and st[0] == TAKEN_LATER_GROUP]
    assert TAKEN_LATER_GROUP in STANDING_GROUPS
    assert len(taken) == CASES[path], [(r.anchor, standing(trace, r)) for r in heads]
    final = {n.id: n for n in trace.final}
    for r, (_, why) in taken:
        m = WORDS.fullmatch(why)
        assert m, why
        block = final[int(m[1])]
        assert block.op == Op.FUSED_ATTENTION_BLOCK and r.bindings["mm"] in block.absorbed
    p = places(trace, k)
    anchors = {r.anchor for r, _ in taken}
    assert not anchors & {r.anchor for r in p.near_misses}  # no ✗
    assert not anchors & set(p.excused_at.get(OP_GAP_GROUP, []))  # no △
    assert anchors <= set(p.faded_at[TAKEN_LATER_GROUP])  # a faded ○, as taken later


@pytest.mark.parametrize("path", list(CASES), ids=lambda p: p.stem)
def test_text_verbose_and_json_say_taken_later_alike(capsys, path):
    code, text, _ = cli_run(capsys, "explain", path, "-v")
    jcode, out, _ = cli_run(capsys, "explain", path, "--json")
    assert code == jcode == 0
    lines = [ln for ln in text.splitlines() if ln.startswith(f"  taken later: {RULE}: {GUARD} ")]
    assert len(lines) == CASES[path], text
    for ln in lines:
        words = WORDS.search(ln)
        assert words and ln.endswith("; " + TAKEN_LATER_STANDING), ln
        # -v's rule line for the same place: the same words, never `△ gap` nor `✗ near-miss`
        mark = f"[rejected] {RULE}: {GUARD} (guard, not recognized; ○ nothing to fix, taken later: {words[0]})"
        assert mark in text, ln
    # the "also rejected ... a near-miss" line is gone for these places
    assert not [ln for ln in text.splitlines() if ln.startswith(f"  also rejected: {RULE}:")], text
    layers = json.loads(out)["layers"]
    taken = [x for v in layers for x in v["taken"]]
    assert [WORDS.search(x)[0] for x in taken] == [WORDS.search(ln)[0] for ln in lines]
    assert not [o for v in layers for o in v["rejections"] if o["rule"] == RULE]
    assert not [g for v in layers for g in v["gaps"] for a in g["at"]
                if any(f"@ %{a}:" in x for x in taken)]  # no gap lists a taken place


def _verbose_marks(block: str) -> dict[tuple[str, str], list[str]]:
    """(rule, guard) -> the standing marks of `-v`'s `[rejected]` lines in one layer's block."""
    marks: dict[tuple[str, str], list[str]] = {}
    for m in re.finditer(r"\[rejected\] (\S+): (\S+) \([^;\n]*; ([^\n]*?)\): ", block):
        marks.setdefault((m[1], m[2]), []).append(m[3])
    return marks


@pytest.mark.parametrize("path", list(CASES), ids=lambda p: p.stem)
def test_every_also_rejected_line_is_a_near_miss_on_the_verbose_rule_line_too(capsys, path):
    """One standing per place: an `also rejected` line says a near-miss, so the layer's `-v` rule line for that rule
    and guard marks one `✗ near-miss` (before, clip-text's said `△ gap in rlxviz's ops`)."""
    code, text, _ = cli_run(capsys, "explain", path, "-v")
    assert code == 0
    for block in re.split(r"\n(?=layer \d+)", text):
        marks = _verbose_marks(block)
        for m in re.finditer(r"^  also rejected: (\S+): (\S+) ", block, re.M):
            assert any(x.startswith("✗ near-miss") for x in marks.get((m[1], m[2]), [])), (m[0], marks)


def test_the_chips_tooltip_item_says_what_took_the_place():
    trace = _trace(ONNX / "ortopt" / "clip-text.ortopt.onnx")
    k = next(k for k, s in enumerate(trace.steps) if s.pass_name == "fuse_matmul_bias_act")
    (item,) = places(trace, k).faded[TAKEN_LATER_GROUP]
    assert f"{RULE} ({GUARD}): " in item and WORDS.search(item), item


def test_every_standing_group_has_a_heading():
    """The chips' tooltips head each group with `left_out_heading`: a group without one stopped the app's load
    (starcoder2.ortopt: `KeyError: 'taken later'`, newcomer run 27) while `explain` printed it."""
    from rlxviz.passes.why.text import left_out_heading
    from rlxviz.passes.why.verdict import LEFT_OUT_GROUPS

    for group in {*STANDING_GROUPS, *LEFT_OUT_GROUPS}:
        assert left_out_heading(group, 1).startswith("1 ") and left_out_heading(group, 2).startswith("2 ")


@pytest.mark.parametrize("path", list(CASES), ids=lambda p: p.stem)
def test_the_chips_tooltip_heads_the_taken_later_places(path):
    from rlxviz.app.derived import not_near_misses
    from rlxviz.app.panels import not_near_miss_mark

    trace = _trace(path)
    k = next(k for k, s in enumerate(trace.steps) if s.pass_name == "fuse_matmul_bias_act")
    p = places(trace, k)
    mark = not_near_miss_mark(not_near_misses(trace.steps[k], trace), p.excused_at)
    n = CASES[path]
    took = "refusal whose candidate a later fusion took" if n == 1 else "refusals whose candidates later fusions took"
    assert f"{n} {took} (not" in mark, mark
