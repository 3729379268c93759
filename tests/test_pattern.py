"""The matcher reports the deepest partial match; rules refuse to build with unbound roles; guard kinds.

The property test runs every pattern pass, alone and in the canonical pipeline, over random graphs and
the project's models, and checks every structure rejection: the op found at the failing edge is never
among the ops the pattern needed there, and the message says the same as the fields.
"""

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from strategies import random_graphs, random_transformer_like_graphs

from rlxviz.ir import Builder, Graph, Op
from rlxviz.models import VARIANTS, load_model
from rlxviz.passes import P, Pipeline, run_passes
from rlxviz.passes.guard import KINDS, NOT_RECOGNIZED, RuleError, guard, single_user
from rlxviz.passes.pattern import Miss
from rlxviz.passes.pipeline import PASSES
from rlxviz.passes.rule import Rule, Shape, reports

PATTERN_PASSES = [name for name, p in PASSES.items() if p.rules]


def check_rejections(trace) -> int:
    """Assert the message properties on every rejection of `trace`; returns how many structure ones."""
    n = 0
    for r in trace.rejections:
        assert r.kind in KINDS, (r.rule, r.guard, r.kind)
        if r.stage != "structure" or not r.needed:
            continue
        n += 1
        assert r.found and r.found not in r.needed, (r.rule, r.guard, r.message)
        needs = r.message.split("; needs ", 1)[1].split(": ")[0]
        assert r.found not in needs.split(" or "), r.message
        assert len(set(r.needed)) == len(r.needed)
    return n


def all_passes_on(g: Graph) -> int:
    n = check_rejections(Pipeline.canonical().run(g))
    for name in PATTERN_PASSES:  # each pass alone on the input: misses the pipeline order would hide
        n += check_rejections(run_passes(g, [name]))
    return n


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_transformer_like_graphs())
def test_found_op_is_never_among_the_needed_ones_transformer_like(case):
    all_passes_on(case.graph)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs(min_ops=3, max_ops=10))
def test_found_op_is_never_among_the_needed_ones_random(case):
    all_passes_on(case.graph)


@pytest.mark.parametrize("model,variant", [("bert-tiny", None), ("bert-tiny", "tanh_gelu"), ("bert-tiny", "pre_ln"),
                                           ("llama-block", None)])
@pytest.mark.parametrize("style", ["hf", "rlx"])
def test_found_op_is_never_among_the_needed_ones_models(model, variant, style):
    v = replace(VARIANTS[variant], layer=0) if variant else None
    g = load_model(model, batch=1, seq=8, style=style if model == "bert-tiny" else None, variant=v).graph
    n = all_passes_on(g)
    assert n > 0 or style == "hf"  # rlx style: fuse_transformer_layer alone misses at attn_is_fused_block


def scores_graph(k_perms=((0, 2, 1, 3), (0, 1, 3, 2)), mask_first=False):
    """HF attention primitives; `k_perms` are the transposes applied to K's reshape."""
    b = Builder("s")
    B, S, nh, dh = 1, 4, 2, 4
    x = b.input("x", (B, S, nh * dh))
    mask = b.input("mask", (B, 1, 1, S))

    def split(n):
        return b.reshape(b.matmul(x, b.param(n, (nh * dh, nh * dh))), (B, S, nh, dh))
    q = b.transpose(split("q"), (0, 2, 1, 3))
    k = split("k")
    for perm in k_perms:
        k = b.transpose(k, perm)
    s = b.div(b.matmul(q, k), 2.0)
    s = b.add(mask, s) if mask_first else b.add(s, mask)
    ctx = b.matmul(b.softmax(s, axis=-1), b.transpose(split("v"), (0, 2, 1, 3)))
    b.output(b.reshape(b.transpose(ctx, (0, 2, 1, 3)), (B, S, nh * dh)))
    return b.build()


def test_deepest_miss_names_k_through_a_single_permute():
    """K reaches the scores through one [0, 2, 3, 1] permute: the miss is at K's edge, not at the softmax. The
    deepest reading takes K's reshape for repeat_kv's (it then needs an expand); the other reading, a plain head
    split, is named too: K's transpose reads a reshape where it needs the head transpose."""
    g = scores_graph(k_perms=((0, 2, 3, 1),))
    (r,) = run_passes(g, ["fuse_sdpa"]).rejections
    kt = g.find(Op.TRANSPOSE)[1]
    reshape = kt.inputs[0]
    assert r.guard == "scores_form" and r.subject == g[reshape].inputs[0]
    assert r.message.startswith(f"k_rep (node {reshape}).inputs[0] (k_rep_expand) is matmul (node ")
    assert r.found == "matmul" and r.needed == ("expand",)
    assert f"(read another way: k_t (node {kt.id}).inputs[0] is reshape (node {reshape}); needs mul or div or " \
           f"transpose)" in r.message
    assert "mask_add" not in r.message and "softmax" not in r.message.split(":")[0]


def test_miss_alternatives_are_deduplicated_and_exclude_the_found_op():
    b = Builder("m")
    x = b.input("x", (2, 3))
    y = b.exp(b.neg(x))
    b.output(y)
    g = b.build()
    pat = P(Op.EXP, P(Op.NEG, P(Op.RELU) | P(Op.TANH) | P(Op.RELU), name="n") | P(Op.NEG, P(Op.SIGMOID)), name="e")
    m = pat.match(g, y)
    assert isinstance(m, Miss)
    assert m.parent == g[y].inputs[0] and m.operand == 0 and m.depth == 2
    assert m.needed == ("relu", "tanh", "sigmoid") and m.found_op == "input"
    assert m.message == f"n (node {m.parent}).inputs[0] is input (node {x}); needs relu or tanh or sigmoid"


def test_commutative_miss_reports_the_real_operand_index():
    b = Builder("c")
    x = b.input("x", (2, 3))
    s = b.add(x, b.neg(x))
    b.output(s)
    g = b.build()
    m = P(Op.ADD, P(Op.RELU, name="r"), P.var("o"), name="a", commutative=True).match(g, s)
    assert isinstance(m, Miss) and m.parent == s and m.operand == 0 and m.found_op == "input"


def test_rule_refuses_to_build_when_a_guard_reads_an_unbound_role():
    anchor = P(Op.ADD, P(Op.MATMUL, name="mm"), P.var("bias"), name="add")
    ok = Rule("t.ok", anchor, steps=(single_user("mm"),), result="add", absorb=("mm", "add"))
    assert ok.guard_names == ["mm_single_user", "absorbed_escape"]
    with pytest.raises(RuleError, match="reads role 'mn'"):
        Rule("t.typo", anchor, steps=(single_user("mn"),), result="add", absorb=("mm", "add"))
    with pytest.raises(RuleError, match="reads role 'later'"):  # bound only by a later step
        Rule("t.order", anchor, steps=(guard("g", lambda c: True, lambda c: "", requires=("later",),
                                             kind=NOT_RECOGNIZED),
                                       Shape("s", "add", P(Op.ADD, P.var("later"), P.var("b2"), name="add"))),
             result="add", absorb=("add",))
    with pytest.raises(RuleError, match="'sum'"):  # absorb names a role nothing binds
        Rule("t.absorb", anchor, steps=(), result="add", absorb=("sum", "add"))
    with pytest.raises(RuleError, match="kind must be one of"):
        guard("g", lambda c: True, lambda c: "", kind="nope")
    with pytest.raises(RuleError, match="@reports"):
        Rule("t.undeclared", anchor, steps=(lambda c: None,), result="add", absorb=("add",))


def test_a_guard_reading_an_undeclared_role_raises_when_it_runs():
    @reports()
    def nothing(c):
        return None
    role = "bias"  # held in a variable: a literal c["bias"] now fails when the guard is built (test_spelling.py)
    sneaky = guard("sneaky", lambda c: c[role] is None, lambda c: "", requires=("mm",), kind=NOT_RECOGNIZED)
    rule = Rule("t.sneaky", P(Op.ADD, P(Op.MATMUL, name="mm"), P.var("bias"), name="add"), steps=(nothing, sneaky),
                result="add", absorb=("add",))
    b = Builder("l")
    x = b.input("x", (2, 4))
    b.output(b.add(b.matmul(x, b.param("w", (4, 4))), b.param("b", (4,))))
    from rlxviz.passes.engine import find
    with pytest.raises(RuleError, match=r"\[Guard sneaky\] reads role 'bias'"):
        find(b.build(), "t", [rule], {})


def test_every_guard_of_every_rule_declares_a_kind():
    for p in PASSES.values():
        for rule in p.rules:
            kinds = rule.guard_kinds
            assert set(kinds) == set(rule.guard_names) and set(kinds.values()) <= set(KINDS), rule.name
    from rlxviz.passes.rules.linear import BIAS_ACT
    assert BIAS_ACT.guard_kinds["add_not_output"] == "illegal"
    assert BIAS_ACT.guard_kinds["epilogue_activation"] == "not recognized"
    from rlxviz.session.pipeline import pass_catalog
    (shared,) = [p for p in pass_catalog() if p["name"] == "fuse_shared_input_matmul"]
    assert shared["rules"][0]["guard_kinds"]["merge_keeps_fusions"] == "not profitable"
