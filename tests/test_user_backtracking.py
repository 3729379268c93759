"""A `User` step backtracks over the users it may bind (`passes.search.attempt`).

A value can have several users that fit a `User` step. Binding the first (in node-id order) and never trying the
second missed a real match when the first failed at a later step, and reported a near miss about a node that
plays no part in the candidate (a probe linear on h1 judged as FFN.1). Each graph below is IR text; the rule is a
small one of this file, so the test reads the engine alone; the last test reads the real layer rule.
"""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlxviz.ir import Op, format_graph, parse_ir
from rlxviz.models import load_model
from rlxviz.passes import P, Pipeline
from rlxviz.passes.engine import find
from rlxviz.passes.guard import NOT_RECOGNIZED, guard, single_user
from rlxviz.passes.rule import Rule, User
from rlxviz.passes.search import MAX_USER_CANDIDATES


def _rule(*late: object) -> Rule:
    """relu `a` -> an exp user `b` -> a tanh user `c`, with `late` steps between the two `User` steps."""
    return Rule("t.exp_tanh", P(Op.RELU, name="a"),
                steps=(User("b_is_exp", "b", "a", P(Op.EXP, name="b"), "exp"), *late,  # type: ignore[arg-type]
                       User("c_is_tanh", "c", "b", P(Op.TANH, name="c"), "tanh")),
                result="c", absorb=("b", "c"), rewrite=lambda c, rw: None)


def _graph(body: str) -> str:
    return f"graph t {{\n  %0 = input {{name=\"x\"}} : f32[2, 4]\n  %1 = relu(%0) : f32[2, 4]\n{body}\n}}\n"


FIRST_FAILS_LATE = _graph("""  %2 = exp(%1) : f32[2, 4]
  %3 = sigmoid(%2) : f32[2, 4]
  %4 = exp(%1) : f32[2, 4]
  %5 = tanh(%4) : f32[2, 4]
  return %3, %5""")
"""relu's first exp user (%2) feeds a sigmoid: the rule fails at its last step (`c_is_tanh`); the second (%4) feeds
a tanh and matches."""

FIRST_FAILS_A_GUARD = _graph("""  %2 = exp(%1) : f32[2, 4]
  %3 = tanh(%2) : f32[2, 4]
  %4 = neg(%2) : f32[2, 4]
  %5 = exp(%1) : f32[2, 4]
  %6 = tanh(%5) : f32[2, 4]
  return %3, %4, %6""")
"""relu's first exp user (%2) has a second reader (`b_single_user` fails); the second (%5) matches."""


def test_a_user_step_tries_the_second_user_when_the_first_fails_late():
    g = parse_ir(FIRST_FAILS_LATE)
    found, rejections = find(g, "t", [_rule()], {})
    assert [(f.ctx.bindings["b"], f.ctx.bindings["c"]) for f in found] == [(4, 5)]
    assert rejections == []


def test_a_user_step_tries_the_second_user_when_the_first_fails_a_guard():
    g = parse_ir(FIRST_FAILS_A_GUARD)
    found, rejections = find(g, "t", [_rule(single_user("b", "b_single_user"))], {})
    assert [(f.ctx.bindings["b"], f.ctx.bindings["c"]) for f in found] == [(5, 6)]
    assert rejections == []


def test_when_every_user_fails_the_one_that_got_furthest_is_reported():
    # %2 fails b_single_user (step 1); %5 passes it and fails c_is_tanh (step 2): %5 is the near miss
    g = parse_ir(_graph("""  %2 = exp(%1) : f32[2, 4]
  %3 = tanh(%2) : f32[2, 4]
  %4 = neg(%2) : f32[2, 4]
  %5 = exp(%1) : f32[2, 4]
  %6 = sigmoid(%5) : f32[2, 4]
  return %3, %4, %6"""))
    found, rejections = find(g, "t", [_rule(single_user("b", "b_single_user"))], {})
    assert found == []
    assert [(r.guard, r.headline, r.bindings["b"]) for r in rejections] == [("c_is_tanh", True, 5)]


def test_at_equal_depth_the_first_user_by_id_is_reported():
    g = parse_ir(_graph("""  %2 = exp(%1) : f32[2, 4]
  %3 = sigmoid(%2) : f32[2, 4]
  %4 = exp(%1) : f32[2, 4]
  %5 = neg(%4) : f32[2, 4]
  return %3, %5"""))
    found, rejections = find(g, "t", [_rule()], {})
    assert found == []
    assert [(r.guard, r.bindings["b"]) for r in rejections] == [("c_is_tanh", 2)]
    assert "sigmoid (node 3" in rejections[0].message


def test_a_step_tries_at_most_its_bound_of_users():
    seen: list[int] = []

    def count(c) -> bool:
        seen.append(c.id("b"))
        return False

    body = "\n".join(f"  %{k} = exp(%1) : f32[2, 4]" for k in range(2, 2 + 3 * MAX_USER_CANDIDATES))
    g = parse_ir(_graph(body + "\n  return " + ", ".join(f"%{k}" for k in range(2, 2 + 3 * MAX_USER_CANDIDATES))))
    rule = _rule(guard("b_counted", count, lambda c: "counted", requires=("b",), kind=NOT_RECOGNIZED))
    found, rejections = find(g, "t", [rule], {})
    assert found == [] and len(set(seen)) == MAX_USER_CANDIDATES
    assert seen[:MAX_USER_CANDIDATES] == sorted(seen[:MAX_USER_CANDIDATES]) == list(range(2, 2 + MAX_USER_CANDIDATES))
    assert rejections[0].bindings["b"] == 2  # every candidate fails the guard: the first by id is reported


# property: over random fan-outs, the engine matches exactly when some (b, c) pair does, and binds the first pair in
# node-id order (what an exhaustive search over every pair finds)
_OPS = ("exp", "neg", "sigmoid")
_LEAF_OPS = ("tanh", "sigmoid", "neg")


@st.composite
def _fanouts(draw: st.DrawFn) -> tuple[str, list[tuple[int, str, list[tuple[int, str]]]]]:
    """IR text of relu `%1` read by 1-4 unary ops, each read by 0-3 unary ops (node ids in a random order), and the
    structure `[(b id, b op, [(c id, c op), ...]), ...]`."""
    shape = [(draw(st.sampled_from(_OPS)), draw(st.lists(st.sampled_from(_LEAF_OPS), max_size=3)))
             for _ in range(draw(st.integers(1, 4)))]
    n = sum(1 + len(cs) for _, cs in shape)
    ids = draw(st.permutations(list(range(2, 2 + n))))
    it = iter(ids)
    tree = [(next(it), op, [(next(it), c) for c in cs]) for op, cs in shape]
    lines = []
    for b, op, cs in tree:
        lines.append(f"  %{b} = {op}(%1) : f32[2, 4]")
        lines += [f"  %{c} = {cop}(%{b}) : f32[2, 4]" for c, cop in cs]
    outs = [c for _, _, cs in tree for c, _ in cs] + [b for b, _, cs in tree if not cs]
    return _graph("\n".join(lines) + "\n  return " + ", ".join(f"%{i}" for i in outs)), tree


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_fanouts())
def test_backtracking_finds_the_first_pair_an_exhaustive_search_finds(case):
    text, tree = case
    g = parse_ir(text)
    rule = _rule(single_user("b", "b_single_user"))
    pairs = sorted((b, c) for b, op, cs in tree if op == "exp" and len(cs) == 1 for c, cop in cs if cop == "tanh")
    found, rejections = find(g, "t", [rule], {})
    assert [(f.ctx.bindings["b"], f.ctx.bindings["c"]) for f in found] == pairs[:1]
    if not pairs and any(op == "exp" for _, op, _ in tree):
        # the near miss names the exp user that got furthest: one with a single reader (it fails at c_is_tanh, the
        # last step), else one whose run went on to the last step (it has a tanh reader), the first by id at a tie
        r = next(r for r in rejections if r.headline)
        single = sorted(b for b, op, cs in tree if op == "exp" and len(cs) == 1)
        others = sorted((not any(cop == "tanh" for _, cop in cs), b) for b, op, cs in tree if op == "exp")
        assert r.bindings["b"] == (single[0] if single else others[0][1])
        assert r.guard == ("c_is_tanh" if single else "b_single_user")


def _with_probe() -> str:
    """bert-tiny with a probe on layer 0's h1 (linear -> linear -> a graph output) written before FFN.1, so the probe's
    fused linear has the lower node id of h1's two linear users."""
    g = load_model("bert-tiny")
    g = getattr(g, "graph", g)
    lines = format_graph(g).splitlines()
    at = max(k for k, line in enumerate(lines) if "layer.0.attention.output.LayerNorm" in line)
    h1 = int(re.match(r"\s*%(\d+)", lines[at]).group(1))  # type: ignore[union-attr]
    shape = re.search(r": f32\[([^\]]*)\]", lines[at]).group(1)  # type: ignore[union-attr]
    d, n = int(shape.split(",")[-1]), g.next_id
    lines[at + 1:at + 1] = [f'  %{n} = param {{name="probe.w1"}} : f32[{d}, {d}]',
                            f"  %{n + 1} = matmul(%{h1}, %{n}) : f32[{shape}] @probe",
                            f'  %{n + 2} = param {{name="probe.b1"}} : f32[{d}]',
                            f"  %{n + 3} = add(%{n + 1}, %{n + 2}) : f32[{shape}] @probe",
                            f'  %{n + 4} = param {{name="probe.w2"}} : f32[{d}, {d}]',
                            f"  %{n + 5} = matmul(%{n + 3}, %{n + 4}) : f32[{shape}] @probe"]
    ret = next(k for k, line in enumerate(lines) if line.strip().startswith("return"))
    lines[ret] += f", %{n + 5}"
    return "\n".join(lines).replace(f"next_id={n}", f"next_id={n + 6}")


def test_a_probe_linear_on_h1_is_not_judged_as_ffn1():
    """h1 read by a probe linear (that feeds a linear too) and FFN.1: the layer is refused for h1's third user, and
    nothing else is said: before, FFN.1 was bound to the probe (the first user by id) and `fc1_activation` reported
    the probe's missing activation."""
    trace = Pipeline.canonical().run(parse_ir(_with_probe()))
    refused = [r for s in trace.steps for r in s.rejections
               if r.rule.startswith("fuse_transformer_layer") and "layer.0." in r.path]
    assert [r.guard for r in refused] == ["h1_user_count"]
    step = next(s for s in trace.steps if s.pass_name == "fuse_transformer_layer")
    fc1 = step.before[refused[0].bindings["fc1"]]
    assert "probe" not in fc1.path and fc1.path.startswith("encoder.layer.0")
