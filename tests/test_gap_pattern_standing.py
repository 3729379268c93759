"""A gap whose compiler fix alone is not enough, with a pattern rlxviz does not recognize next, is not "as far as
rlxviz's ops go".

A newcomer's run read esm.dynamo-eager's layers as "fused as far as rlxviz's ops go" (exit 0) while the same headline
said "alone it is not enough in 2 of them: qkv_packed (not recognized) fails next": with the op form added, rlxviz's
own `qkv_packed` pattern would still refuse the layer (the head split between the QKV narrow and the RoPE), so the op
alone is not what holds it back. Decision: the blocker's refusal kind is data (`OpGap.blocker_kind`), and a layer
whose gap leaves a `not recognized` form next is "fused as far as rlxviz's ops and patterns go" (or "held back by
rlxviz's ops and patterns"): still nothing in the model to change (exit 0), but both of rlxviz's parts named. A gap
whose fix leaves an illegal use or the model's own term next keeps its words (the caveat says what fails next).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import run as cli_run

from rlxviz.models.onnx import load_onnx
from rlxviz.passes import Pipeline
from rlxviz.passes.refusal_kinds import NOT_RECOGNIZED
from rlxviz.passes.why.text import (
    FUSED_AS_FAR_AS_OPS,
    HELD_BACK_BY_LEGAL_AND_OPS,
    HELD_BACK_BY_OPS,
    gap_status,
)
from rlxviz.passes.why.verdict import RunVerdict

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"
PATTERNS = "fused as far as rlxviz's ops and patterns go"


def test_gap_status_words():
    """The plain words stay the constants front ends and docs know; `patterns` adds `and patterns` to each."""
    assert gap_status(True) == FUSED_AS_FAR_AS_OPS
    assert gap_status(False) == HELD_BACK_BY_OPS
    assert gap_status(False, legal=True) == HELD_BACK_BY_LEGAL_AND_OPS
    assert gap_status(True, legal=True) == "fused as far as legal and rlxviz's ops go"
    assert gap_status(True, patterns=True) == PATTERNS
    assert gap_status(False, patterns=True) == "held back by rlxviz's ops and patterns"
    assert gap_status(True, legal=True, patterns=True) == "fused as far as legal, rlxviz's ops and patterns go"
    assert gap_status(False, legal=True, patterns=True) == "held back by what is legal, rlxviz's ops and patterns"


@pytest.mark.parametrize("name", ["esm.dynamo-eager", "gptj.dynamo-eager"])
def test_a_recognizer_miss_behind_a_gap_names_the_patterns(name):
    """ESM (head split before the RoPE) and GPT-J (its QKV merged with the MLP's input projection): the gap's
    fix alone leaves `not recognized`; the layers, the headline and `--json` say `ops and patterns`; exit stays 0."""
    trace = Pipeline.canonical().run(load_onnx(ZOO / f"{name}.onnx", seq=8).graph)
    run = RunVerdict.of(trace, model=name)
    assert run.ok and run.exit_status == 0
    for lv in run.layers:
        assert lv.gap_only and lv.pattern_blocked, lv.gaps
        assert any(g.blocker_kind == NOT_RECOGNIZED and g.blocker.endswith(f"({NOT_RECOGNIZED})") for g in lv.gaps)
        assert lv.status == PATTERNS
    assert f"{len(run.layers)} {PATTERNS} (rlxviz lacks " in run.headline
    assert FUSED_AS_FAR_AS_OPS + " (" not in run.headline


def test_cli_text_and_json_agree_on_esm(capsys):
    path = ZOO / "esm.dynamo-eager.onnx"
    code, out, err = cli_run(capsys, "explain", path, "--seq", "8")
    assert code == 0, err
    assert f"layer 0: {PATTERNS}: " in out
    code, got, err = cli_run(capsys, "explain", path, "--seq", "8", "--json")
    assert code == 0, err
    data = json.loads(got)
    assert [lv["status"] for lv in data["layers"]] == [PATTERNS, PATTERNS]
    assert all(g["blocker_kind"] == NOT_RECOGNIZED for lv in data["layers"] for g in lv["gaps"])
    assert data["headline"] in out


def test_an_illegal_blocker_keeps_the_ops_words():
    """gpt-neox: the gap's fix alone leaves an illegal use (the NaN-guard reader rlxviz's own rewrite made): not a
    pattern rlxviz misses, so the layers stay "as far as rlxviz's ops go", the caveat saying what fails next."""
    trace = Pipeline.canonical().run(load_onnx(ZOO.parent / "cases" / "gpt-neox.legacy-sdpa.onnx", seq=8).graph)
    run = RunVerdict.of(trace)
    assert run.layers and all(lv.gap_only and not lv.pattern_blocked for lv in run.layers)
    assert all(lv.status == FUSED_AS_FAR_AS_OPS for lv in run.layers)
    assert any(g.blocker for lv in run.layers for g in lv.gaps)
