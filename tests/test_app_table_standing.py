"""The matches table reads each place's standing as the chips and `explain` do (newcomer report): on llama-block the
table's kind said "rejected" (why "not recognized"/"illegal") for the three rows the Why tab and `explain` call "not
expected here", and on deit's ORT-optimized file the `fuse_residual_ln` chip showed ○7 while the table listed the same
places as "rejected". The table's kind is now `places.place_status` of the place's `places.place_standings`, the
one reading `places.places` (the chips' ✗ and ○) counts; the guard's kind stays in the `why` column. A not-expected
place at a gap in rlxviz's ops reads `gap in rlxviz's ops` (`verdict.OP_GAP_GROUP`, the chips' △), the refusals
`explain` names under "rlxviz's ops lack"."""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path

import pytest
from test_app_views import tiny

from rlxviz import session
from rlxviz.app.explain import decision_rows
from rlxviz.passes.why.places import LEFT_OUT_STATUS, REJECTED, places
from rlxviz.passes.why.policy import NOT_EXPECTED_HERE
from rlxviz.passes.why.text import run_dict
from rlxviz.passes.why.verdict import OP_GAP_GROUP, STANDING_GROUPS, RunVerdict

HERE = Path(__file__).parent
RUNS = ["llama-block", "bert-tiny pre_ln", "bert-tiny extra_h1_user", "bert-tiny tanh_gelu",
        "n4-15-residual-logged.rlx", "n4-06-deepnorm-residual.rlx", "deit.ortopt.onnx"]


@functools.cache
def _run(name: str):
    if name.startswith("bert-tiny"):
        return tiny(variant=name.split()[1]).trace
    if name == "llama-block":
        m = session.load("llama-block", 1, 8)
    elif name.endswith(".onnx"):
        m = session.load(str(HERE / "fixtures" / "onnx" / "cases" / name), 1, 8)
    else:
        m = session.load_ir_text((HERE / "data" / "cases" / name).read_text())
    return session.run_pipeline(m.graph, session.build_pipeline())


def _table_places(trace) -> dict[int, Counter]:
    """Step -> status -> how many places (rule, anchor) the table's refusal rows hold with that status."""
    seen: dict[int, dict[tuple[str, int], str]] = {}
    for r in decision_rows(trace):
        if r["kind"] == "fused":
            continue
        at = seen.setdefault(r["step"], {})
        # every row of one place (its further failing guards too) reads the place's one status
        assert at.setdefault((r["rule"], r["anchor"]), r["kind"]) == r["kind"], r
    return {k: Counter(v.values()) for k, v in seen.items()}


@pytest.mark.parametrize("name", RUNS)
def test_the_tables_status_per_place_is_the_chips_count(name):
    trace = _run(name)
    table = _table_places(trace)
    for k in range(len(trace.steps)):
        p = places(trace, k)
        got = table.get(k, Counter())
        assert got[REJECTED] == len(p.near_misses), (trace.steps[k].pass_name, got)
        assert {g: got[g] for g in STANDING_GROUPS if got[g]} == {g: len(v) for g, v in p.excused.items()}, \
            (trace.steps[k].pass_name, got, p.excused)
        assert set(got) <= {REJECTED, LEFT_OUT_STATUS, *STANDING_GROUPS}


@pytest.mark.parametrize("name", RUNS)
def test_the_tables_near_misses_and_not_expected_are_explains_lists(name):
    trace = _run(name)
    d = run_dict(RunVerdict.of(trace))
    table = sum(_table_places(trace).values(), Counter())
    if d["layers"]:
        # `explain` words each layer's not-expected refusals once per rule and guard (its places alike), and those at
        # a gap in rlxviz's ops apart (issue 39: the table's kind, the text's heading, `--json`'s list agree)
        for kind, key in ((NOT_EXPECTED_HERE, "not_expected"), (OP_GAP_GROUP, "gap_refusals")):
            lines = [(s["layer"], line) for s in d["layers"] for line in s[key]]
            lines += [(None, line) for line in d["outside_gaps"]] if kind == OP_GAP_GROUP else []  # in no layer
            listed = {(layer, line.split(" (", 1)[0], line.split(" (", 1)[1].split(")", 1)[0]) for layer, line in lines}
            rows = {(r["layer"], r["rule"], r["guard"]) for r in decision_rows(trace)
                    if r["kind"] == kind and not r["why"].startswith("also:")}
            assert rows == listed, (kind, rows, listed)
        # the gap rows are the refusals `explain` says rlxviz's ops lack a form for
        gaps = {(s["layer"], g.rsplit(" (", 1)[1].split(": ")[0], g.rsplit(": ", 1)[1].rstrip(")"))
                for s in d["layers"] for g in s["op_gaps"]}
        gaps |= {(None, x.split(" (", 1)[0], x.split(" (", 1)[1].split(")", 1)[0]) for x in d["outside_gaps"]}
        assert {(r["layer"], r["rule"], r["guard"]) for r in decision_rows(trace)
                if r["kind"] == OP_GAP_GROUP and not r["why"].startswith("also:")} == gaps
        # a layer lists its own near-misses, hard and left out; a place outside every layer the run lists
        assert table[REJECTED] + table[LEFT_OUT_STATUS] == sum(len(s["misses"]) for s in d["layers"]) + len(
            d["misses"]) + len(d["outside_misses"])


def test_llama_blocks_not_expected_rows_read_not_expected_with_the_guards_kind_kept():
    rows = [r for r in decision_rows(_run("llama-block")) if r["kind"] != "fused"]
    assert len(rows) >= 3 and {r["kind"] for r in rows} == {NOT_EXPECTED_HERE, OP_GAP_GROUP}
    assert {r["rule"] for r in rows if r["kind"] == OP_GAP_GROUP} == {"fuse_attention_block.qkv_attention_out"}
    assert {r["why"] for r in rows} & {"not recognized", "illegal"}  # the guard's kind, in its own column


def test_deits_residual_norm_places_are_not_rejected_in_the_table():
    trace = _run("deit.ortopt.onnx")
    k = next(i for i, s in enumerate(trace.steps) if s.pass_name == "fuse_residual_ln")
    rows = [r for r in decision_rows(trace) if r["step"] == k and r["kind"] != "fused"]
    assert rows and REJECTED not in {r["kind"] for r in rows}
    assert sum(len(v) for v in places(trace, k).excused.values()) == len({(r["rule"], r["anchor"]) for r in rows})
