"""`explain -v` (and the app's Why tab, which shows the same text) names what each fused rule made after `->`: its
node(s), or what took the product when the match has no node of its own; never an empty `->`.

A newcomer read "[fused] fuse_sdpa.head_layout: -> node(s)" with no node in falcon's Why tab: the head split the
stage made (a transpose) went into the `attention` that `fuse_sdpa.hf_attention` made in the same pass, so the
settled match has no node of its own (`engine.settle`: `Match.fused` None).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from clirun import case_trace as trace_of

from rlxviz.passes import Trace, explain
from rlxviz.passes.explain import made_words
from rlxviz.passes.trace import Match
from rlxviz.passes.why.facts import RunFacts

TESTS = Path(__file__).parent
ONNX = TESTS / "fixtures" / "onnx" / "cases"
CASES = sorted((TESTS / "data" / "cases").glob("*.rlx")) + sorted(ONNX.glob("*.onnx"))
_FUSED = re.compile(r"^  \[fused\]    (\S+): -> (.*)$")
_TAKEN = re.compile(r"taken into node (\d+)(?: by (\S+))? in the same pass")


def fused_lines(trace: Trace) -> list[tuple[str, str]]:
    """`(rule, what follows ->)` of every `[fused]` line of every layer's explanation."""
    out = []
    for layer in RunFacts.of(trace).layers:
        for line in explain(trace, layer).render().splitlines():
            m = _FUSED.match(line)
            if m is not None:
                out.append((m.group(1), m.group(2)))
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_every_fused_line_names_what_it_made(case):
    trace = trace_of(case)
    ids = {n.id for _, g in trace.versions() for n in g}
    for rule, made in fused_lines(trace):
        assert made.strip() not in ("", "node(s)"), (rule, made)
        for part in made.split("; "):
            if part.startswith("node(s) "):
                assert all(int(i) in ids for i in part.removeprefix("node(s) ").split(", ")), (rule, made)
            else:
                assert part.startswith("no node of its own: "), (rule, made)


def test_falcons_head_layout_names_the_attention_that_took_it():
    trace = trace_of(ONNX / "falcon.onnx")
    said = [made for rule, made in fused_lines(trace) if rule == "fuse_sdpa.head_layout"]
    assert len(said) == 2, said
    for made in said:
        m = _TAKEN.search(made)
        assert m is not None and m.group(2) == "fuse_sdpa.hf_attention", made
        node = int(m.group(1))
        assert trace.final[node].op.value == "attention" if node in trace.final else any(
            node in g and g[node].op.value == "attention" for _, g in trace.versions())


def test_a_match_with_no_node_and_nothing_that_took_it_says_so():
    bare = Match("p", "p.r", 3, {"x": 3}, None)
    assert made_words([bare], {}) == "no node of its own: plain ops no one node stands for"
    assert made_words([bare], {("p.r", 3): (9, "p.s")}) == ("no node of its own: taken into node 9 by p.s in the "
                                                            "same pass")
    made = Match("p", "p.r", 4, {"x": 4}, 7)
    assert made_words([made, bare], {}) == "node(s) 7; no node of its own: plain ops no one node stands for"
