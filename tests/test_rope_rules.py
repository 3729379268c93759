"""RoPE's two rewrites as guarded rules (issue 36, item 1): `fuse_sdpa.rope_heads` and `fuse_sdpa.rope_pairs` are
`Rule`s the engine runs, so a rotation they refuse is their own near miss (a named guard in the trace, at the
rotation's sum), and `fuse_sdpa`'s `rope_on_heads` quotes that refusal (`engine.refusal`) instead of a second
recognizer's. Each kind of refusal is tried on two spellings of the form (full and partial rotary, both operand
orders, both rotate_every_two spellings)."""

from __future__ import annotations

import numpy as np
import pytest
from test_rope_heads import rope_attention
from test_rope_pairs import interleaved_attention

from rlxviz.ir import Graph, Op, parse_ir
from rlxviz.passes import Pipeline
from rlxviz.passes.engine import refusal
from rlxviz.passes.guard import RuleError
from rlxviz.passes.pattern import P
from rlxviz.passes.rule import Rule, reports
from rlxviz.passes.rules.rope_heads import ROPE_HEADS, rope_heads
from rlxviz.passes.rules.rope_pairs import ROPE_PAIRS, rope_pairs
from rlxviz.runtime import run_reference


def _own(t, rule: str) -> list:
    """The headline rejections of `rule` in run `t`."""
    return [r for r in t.rejections if r.rule == rule and r.headline]


def _quoted(t) -> str:
    (r,) = [r for r in t.rejections if r.guard == "rope_on_heads" and r.headline]
    return r.message


@pytest.mark.parametrize("n_rot, swapped", [(8, False), (16, True)])
def test_a_table_of_unknown_halves_is_the_rules_own_refusal_and_the_attention_quotes_it(n_rot, swapped):
    """Full-width tables whose values the graph does not carry: `rope_heads` refuses both rotations with its
    `cos_table` guard at the rotation's sum, and `rope_on_heads` says the same words."""
    g = parse_ir(rope_attention(n_rot=n_rot, duplicated=False, swapped=swapped))
    t = Pipeline.canonical().run(g)
    own = _own(t, "fuse_sdpa.rope_heads")
    assert [r.guard for r in own] == ["cos_table", "cos_table"]  # Q and K
    assert all(g[r.anchor].op == Op.ADD and "are not known to the pass" in r.message for r in own)
    assert f"fuse_sdpa.rope_heads did not rewrite it: {own[0].message}" in _quoted(t)
    assert refusal(ROPE_HEADS, g, own[0].anchor) == own[0].message
    assert [r.guard for r in t.rejections if r.rule == "fuse_sdpa.rope_heads" and not r.headline] == \
        ["sin_table", "sin_table"]  # every failing guard is reported, the first is the headline


def _with_output(g: Graph, extra: int) -> Graph:
    return Graph(list(g), [*g.outputs, extra], g.name, g.next_id, g.values)


@pytest.mark.parametrize("n_rot", [16, 8])
def test_a_product_of_the_form_read_elsewhere_is_named_not_or_ed(n_rot):
    """Q's `h * cos` also a graph output: Q's rotation stays (its product would vanish), refused by the engine's
    `absorbed_escape` naming that node (was "read elsewhere, or its dtypes differ, or ..."); K's is rewritten."""
    g = parse_ir(rope_attention(n_rot=n_rot))
    plain = next(n.id for n in g if n.op == Op.MUL and any(g[i].op == Op.RESHAPE and g[i].rank == 4
                                                          for i in n.inputs))
    g = _with_output(g, plain)
    h, matches = rope_heads(g)
    assert len(matches) == 1
    t = Pipeline.canonical().run(g)
    (r,) = _own(t, "fuse_sdpa.rope_heads")
    assert r.guard == "absorbed_escape" and r.subject == plain and "graph outputs" in r.message
    assert r.message in _quoted(t) and " or " not in r.message
    rng = np.random.default_rng(0)
    feeds = {"hidden_states": rng.standard_normal((2, 8, 64)).astype(np.float32),
             "attention_mask": np.ones((2, 8), np.int64)}
    w = {n.name: (0.2 * rng.standard_normal(n.shape)).astype(np.float32) for n in g.params}
    for a, b in zip(run_reference(g, feeds, w), run_reference(h, feeds, w), strict=True):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("case", [dict(d=8, n_rot=8), dict(d=16, n_rot=8, before_split=True, spelling="gather")])
def test_an_interleaved_table_whose_neighbours_differ_is_the_rules_own_refusal(case):
    g, _ = interleaved_attention(**case)
    bad = {k: v.copy() for k, v in g.values.items()}
    bad["rotary_emb.cos"].reshape(-1)[3] += 0.5
    g = g.with_values(bad)
    assert rope_pairs(g)[1] == []
    t = Pipeline.canonical().run(g)
    own = _own(t, "fuse_sdpa.rope_pairs")
    assert {r.guard for r in own} == {"cos_table"} and len(own) == 2
    assert "its cos table: the neighbour pairs of param 'rotary_emb.cos'" in own[0].message
    assert own[0].message in _quoted(t)


@pytest.mark.parametrize("spelling", ["pairs", "gather"])
def test_a_node_of_the_movement_chain_read_elsewhere_keeps_the_form(spelling):
    """The chain computing rotate_every_two is absorbed as a family of roles (`move*`): a chain node that is also a
    graph output is named by `absorbed_escape`, and that rotation stays."""
    g, _ = interleaved_attention(d=8, n_rot=8, spelling=spelling)
    neg = next(n.id for n in g if n.op == Op.NEG)
    g = _with_output(g, neg)
    h, matches = rope_pairs(g)
    assert len(matches) == 1 and neg in h
    t = Pipeline.canonical().run(g)
    (r,) = _own(t, "fuse_sdpa.rope_pairs")
    assert r.guard == "absorbed_escape" and r.subject == neg
    assert any(k.startswith("move") for k in r.bindings)


def test_the_rules_declare_every_guard_they_refuse_with():
    assert ROPE_HEADS.guard_names == ["cos_table", "sin_table", "heads_rank", "tables_alike", "one_dtype",
                                      "absorbed_escape"]
    assert ROPE_PAIRS.guard_names == ["cos_table", "sin_table", "tables_layout", "one_dtype", "absorbed_escape"]


@pytest.mark.parametrize("absorb", [("mov*",), ("moves",)])
def test_an_absorbed_family_or_role_no_step_binds_fails_at_import(absorb):
    """A misspelt absorbed family (`mov*` for `move*`) would absorb nothing and let the chain's readers escape."""
    @reports(reads=("add",), binds=("move*",))
    def step(c):
        return None

    with pytest.raises(RuleError, match="reads role"):
        Rule("t.family", P(Op.ADD, name="add"), steps=(step,), result="add", absorb=("add", *absorb),
             build=lambda c: (Op.ADD, [], {}))


@pytest.mark.parametrize("n_rot", [16, 8])
def test_a_rotation_the_rule_takes_has_no_refusal(n_rot):
    """`engine.refusal` is "" where the rule matches (and on an add that is no rotation at all)."""
    g = parse_ir(rope_attention(n_rot=n_rot))
    adds = [n.id for n in g if n.op == Op.ADD]
    sums = [m.anchor for m in rope_heads(g)[1]]
    assert len(sums) == 2 and all(refusal(ROPE_HEADS, g, a) == "" for a in adds)
