"""Newcomer run 31: granite.optimum-past's fix line (`explain -v`, the app's Matches table) said "then kv_cache fails:
K is concat (node 287, ...)": the what-if run's id. In the graph the user sees, %287 is a reshape and K's concat is
%282, as the same row's message says. A what-if's blocker now names nodes by their ids in the shown run
(`passes.rerun_ids`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from clirun import run as cli_run

from rlxviz.ir import parse_ir
from rlxviz.passes.rerun_ids import counterpart, in_shown_ids

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"

SHOWN = """graph "shown" {
  %0 = input {name="x"} : f32[2, 4]
  %1 = relu(%0) : f32[2, 4] @"l0"
  %2 = tanh(%0) : f32[2, 4] @"l0"
  %3 = exp(%1) : f32[2, 4] @"l0"
  return %3, %2
}
"""
RERUN = """graph "rerun" {
  %0 = input {name="x"} : f32[2, 4]
  %1 = tanh(%0) : f32[2, 4] @"l0"
  %2 = relu(%0) : f32[2, 4] @"l0"
  %7 = exp(%2) : f32[2, 4] @"l0"
  %8 = sigmoid(%2) : f32[2, 4] @"l0"
  return %7, %1, %8
}
"""


def test_a_rerun_node_is_named_by_its_shown_counterpart_or_as_the_reruns():
    shown, rerun = parse_ir(SHOWN), parse_ir(RERUN)
    assert [counterpart(rerun, i, shown) for i in (0, 1, 2, 7, 8)] == [0, 2, 1, 3, None]
    said = in_shown_ids("exp (node 7, l0) reads %2; sigmoid (node 8, l0)", rerun, shown)
    assert said == "exp (node 3, l0) reads %1; sigmoid (the what-if run's node 8, l0)"


def _strings(o: object) -> list[str]:
    """Every string in a JSON value (each line of a multi-line one apart)."""
    if isinstance(o, dict):
        return [t for v in o.values() for t in _strings(v)]
    if isinstance(o, list):
        return [t for v in o for t in _strings(v)]
    return o.splitlines() if isinstance(o, str) else []


def test_granite_with_past_fix_checks_name_the_shown_k_concat(capsys):
    path = ZOO / "granite.optimum-past.onnx"
    code, js, _ = cli_run(capsys, "explain", path, "--json", "--inputs", ZOO / "granite.optimum-past.npz")
    d = json.loads(js)
    refused = {m.group(1) for text in _strings(d) if "applying it (" not in text and "alone:" not in text
               for m in re.finditer(r"K is concat \(node (\d+)", text)}  # the refusals' own messages, shown ids
    said = [m.group(1) for c in d["fix_checks"] for text in (c["fix"], c["compiler_fix"] or "")
            for m in re.finditer(r"K is concat \(node (\d+)", text)]
    assert code == 0 and refused and said, (refused, said)
    assert set(said) <= refused, (said, refused)  # each id the fix lines name is the one the shown refusal names
    assert all(text.count("made by") <= text.count("(node ") for c in d["fix_checks"] for text in (c["fix"],))
