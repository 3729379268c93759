"""A use-count reason says a graph output is one (a newcomer run, cases 08-k-proj-without-bias and n4-03: `attn (node
51) has 0 users (none); needs exactly 1`, of an `attn` the graph returns). One function words every such reason
(`guard.use_count`): a value no node reads `is read by no node` (`: it is a graph output (output #k)`
when returned), a value that has users and is returned says both."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from clirun import run as cli_run

from rlxviz.ir import parse_ir
from rlxviz.passes.guard import Ctx, all_single_use, single_user, use_count, user_count

CASES = Path(__file__).parent / "data" / "cases"


def _graph(ret: str, extra: str = ""):
    """x -> tanh %1 -> exp %2 (and `extra` lines), returning `ret`."""
    return parse_ir(f"""graph toy {{
  %0 = input {{name="x"}} : f32[2, 4]
  %1 = tanh(%0) : f32[2, 4]
  %2 = exp(%1) : f32[2, 4]
{extra}  return {ret}
}}""")


def _why(guard, g, role_id: int) -> str:
    c = Ctx(g, {"v": role_id})
    assert not guard.check(c)
    return guard.explain(c)


@pytest.mark.parametrize("make", [lambda: single_user("v"), lambda: user_count("v", 2, "two readers"),
                                  lambda: all_single_use(("v",), "v_single_use")])
def test_a_returned_value_no_node_reads_is_called_a_graph_output(make):
    why = _why(make(), _graph("%2"), 2)
    assert why.startswith("v (node 2) is read by no node: it is a graph output (output #0); needs exactly ") or \
        why.startswith("v (node 2) is read by no node: it is a graph output (output #0); every intermediate"), why
    assert "0 users" not in why and "(none)" not in why


def test_a_dead_value_is_read_by_no_node_and_no_output():
    g = _graph("%2", "  %3 = neg(%1) : f32[2, 4]\n")
    why = _why(single_user("v"), g, 3)
    assert why == "v (node 3) is read by no node; needs exactly 1", why


@pytest.mark.parametrize("ret, extra, users, out", [
    ("%2, %1", "", 1, " and is a graph output (output #1)"),
    ("%2, %3", "  %3 = neg(%1) : f32[2, 4]\n", 2, ""),
    ("%3, %1", "  %3 = add(%2, %1) : f32[2, 4]\n", 2, " and is a graph output (output #1)"),
])
def test_users_and_an_output_are_both_said(ret, extra, users, out):
    g = _graph(ret, extra)
    for guard, tail in ((user_count("v", 3, "three readers"), "; needs exactly 3: three readers"),
                        (all_single_use(("v",), "v_single_use"), "; every intermediate must have exactly 1 user "
                                                                 "and be no graph output")):
        c = Ctx(g, {"v": 1})
        if guard.check(c):
            continue
        why = guard.explain(c)
        noun = "user" if users == 1 else "users"
        assert re.fullmatch(rf"v \(node 1\) has {users} {noun} \(.*\){re.escape(out)}{re.escape(tail)}",
                            why), why
    assert use_count(g, 1, "v", str).startswith(f"v has {users} user")


@pytest.mark.parametrize("case", ["08-k-proj-without-bias", "n4-03-chunked-attn-llama4"])
def test_cases_call_the_returned_attention_a_graph_output(capsys, case):
    code, out, err = cli_run(capsys, "explain", next(CASES.glob(f"{case}*.rlx")))
    assert "Traceback" not in err
    assert "0 users" not in out and "users (none)" not in out, out
    assert re.search(r"attn \(node \d+[^)]*\) is read by no node: it is a graph output \(output #0\); "
                     r"needs exactly 1;", out), out
