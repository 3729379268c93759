"""A chip's `○` names each place that keeps the model's own term by its node and its reason, as `explain` does.

A newcomer found t5.encdec's `○4` after fuse_sdpa listing four layer scopes alone ("4 places keep the model's own
terms ...: model.encoder.block.0.layer.0.SelfAttention, ...": no node, no reason), while `rlxviz explain -v` names
`fuse_sdpa.hf_attention @ %39 (...): mask_model_term [the model's own term]: additive score term kept ... one row per
head`, and every other chip's tooltip names nodes and reasons. The places that were said by scope alone were every
place whose reason is its refusal's own (the model's own term, a lookalike, a merge the cost test declined that left
no other node out): each now reads `%ANCHOR (PATH): RULE (GUARD): MESSAGE` from the refusal `explain` lists
(`places.own_item`, `report.block_cost_in_context`). Checked against the CLI's own lines: t5.encdec (a relative position
bias) and swin.dynamo-sdpa (another architecture, a vision model whose bias is a parameter).
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from clirun import run as cli_run
from inapp import opened

from rlxviz.app.panels import NOT_NEAR_MISS_MARK, VersionStepper
from rlxviz.passes.guard import DOES_NOT_PAY, MODEL_TERM
from rlxviz.passes.why.text import left_out_heading

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"
_LINE = re.compile(r"^  (?P<rule>\S+) @ (?P<place>%\d+ \([^)]*\)): (?P<guard>\S+) \[[^]]+\]: (?P<message>.*)$")
"""One line of `explain`'s list of the model's own terms: `RULE @ %ANCHOR (PATH): GUARD [KIND]: MESSAGE`."""


def _faded_tips(monkeypatch, path: Path) -> dict[str, str]:
    """Version label -> the tooltip of its chip's faded `○` mark, unescaped, for `path` loaded in the app at seq 8
    (the run in this process)."""
    s = opened(monkeypatch, path)
    out = {}
    for chip in VersionStepper(state=s)._counts().split("<span class='rv-chip'")[1:]:
        label = re.search(r"title='([^']*)'>", chip).group(1).split(" (", 1)[0]
        mark = re.search(r"<span class='rv-lookalike' title='([^']*)'[^>]*>" + NOT_NEAR_MISS_MARK, chip)
        if mark is not None:
            out[label] = html.unescape(mark.group(1))
    return out


def _cli_own_terms(capsys, path: Path, group: str = MODEL_TERM) -> list[re.Match[str]]:
    """The lines of `rlxviz explain PATH --seq 8 -v` under its heading of `group` (the model's own terms), parsed."""
    code, text, err = cli_run(capsys, "explain", str(path), "--seq", "8", "-v")
    assert code == 0 and "Traceback" not in err, err
    heading = left_out_heading(group, 2).split(" ", 1)[1]
    lines = text.splitlines()
    k = next(i for i, x in enumerate(lines) if re.fullmatch(rf"\d+ {re.escape(heading)}:", x))
    out = []
    for x in lines[k + 1:]:
        if not x.startswith("  "):
            break
        out.append(_LINE.match(x))
    assert out and all(out), lines[k:k + 8]
    return out


@pytest.mark.parametrize(("stem", "guard"), [("t5.encdec", "mask_model_term"), ("swin.dynamo-sdpa", "mask_model_term")])
def test_the_own_term_chip_names_each_node_and_reason_as_explain_does(capsys, monkeypatch, stem, guard):
    path = ZOO / f"{stem}.onnx"
    tip = _faded_tips(monkeypatch, path)["after fuse_sdpa"]
    said = [m for m in _cli_own_terms(capsys, path) if m["rule"].startswith("fuse_sdpa.")]
    assert said and {m["guard"] for m in said} == {guard}, [m.group(0) for m in said]
    head = f"{left_out_heading(MODEL_TERM, len(said))}: "
    assert head in tip, tip
    # each place by its node and path, its rule and guard, then the CLI's own reason: the same record's words
    items = [f"{m['place']}: {m['rule']} ({m['guard']}): {m['message']}" for m in said]
    assert tip.split(head, 1)[1] == "; ".join(items), tip
    if stem == "t5.encdec":
        assert items[0].startswith("%39 (model.encoder.block.0.layer.0.SelfAttention): fuse_sdpa.hf_attention "
                                   "(mask_model_term): additive score term kept as the attention's operand"), items
        assert all("one row per head" in x for x in items), items


def test_a_place_the_model_term_holds_is_named_by_its_node_too(capsys, monkeypatch):
    """t5's cross-attention (held by `self_attention` behind its `default_scale` gap) is named `%324 (PATH)` as the
    CLI's list names it, its reason the CLI's line's."""
    path = ZOO / "t5.encdec.onnx"
    tip = _faded_tips(monkeypatch, path)["after fuse_attention_block"]
    said = [m for m in _cli_own_terms(capsys, path) if m["rule"].startswith("fuse_attention_block.")]
    assert [m["place"].split(" ", 1)[0] for m in said] == ["%324", "%326"], [m.group(0) for m in said]
    for m in said:
        assert f"{m['place']}: {m['rule']}: {m['guard']} ({MODEL_TERM}): {m['message']}" in tip, tip


def test_a_declined_merge_is_named_as_explain_names_it_whole(capsys, monkeypatch):
    """Newcomer run 36: falcon.dynamo-sdpa's ○2 after fuse_shared_input_matmul said `PATH: ... left out matmul (node
    60, ...): it would cost ...`, no `%13`, and dropped the message's last clause (`fewer than 2 matmuls would be left
    to merge`), while `explain -v` lists the place whole. The chip item is now the CLI's line: node, rule, guard and
    the whole message in context (`places.own_item`)."""
    path = ZOO / "falcon.dynamo-sdpa.onnx"
    tips = _faded_tips(monkeypatch, path)
    tip = tips["after fuse_shared_input_matmul"]
    said = _cli_own_terms(capsys, path, DOES_NOT_PAY)
    assert len(said) == 2 and all("fewer than 2 matmuls would be left to merge" in m["message"] for m in said)
    head = f"{left_out_heading(DOES_NOT_PAY, len(said))}: "
    assert tip.split(head, 1)[1] == "; ".join(f"{m['place']}: {m['rule']} ({m['guard']}): {m['message']}"
                                              for m in said), tip
