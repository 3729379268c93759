"""Policy lives on what it is about (issue 36): a pass declares its product and the layer traits that expect it, a
guard where its refusal is excused, and `passes.why.policy` only reads the declarations. A renamed guard carries its
excuse with it; a misspelt trait fails at import (`check_declarations`), never silently expecting nothing.
"""

from __future__ import annotations

import dataclasses

import pytest

from rlxviz.models import load_model
from rlxviz.passes import PASSES, Guard, Pipeline
from rlxviz.passes.pattern import RuleError
from rlxviz.passes.rule import Soft
from rlxviz.passes.why import policy
from rlxviz.passes.why.kinds import LayerArchitecture
from rlxviz.passes.why.verdict import RunVerdict


def _arch(kind: str, mask: str | None = "causal", kv_cache: bool = False) -> LayerArchitecture:
    return LayerArchitecture(kind, f"a {kind} layer", mask=mask, kv_cache=kv_cache)


def _with_guards(pass_name: str, fn) -> object:
    """`PASSES[pass_name]` with every guard of its rules mapped through `fn`."""
    def step(s):
        if isinstance(s, Soft):
            return dataclasses.replace(s, step=step(s.step))
        return fn(s) if isinstance(s, Guard) else s

    p = PASSES[pass_name]
    return dataclasses.replace(p, rules=tuple(dataclasses.replace(r, steps=tuple(step(s) for s in r.steps))
                                              for r in p.rules))


def test_products_are_what_the_passes_declare():
    declared = {p.name: p.product for p in PASSES.values() if p.product}
    assert policy.PRODUCTS == declared
    assert policy.PRODUCTS["fuse_transformer_layer"] == "FusedTransformerLayer"
    assert "dead_code_elimination" not in policy.PRODUCTS  # a pass that makes nothing a layer expects


def test_the_layer_pass_expects_post_ln_only_and_says_why():
    assert policy.not_expected(_arch("post_ln"), "fuse_transformer_layer") is None
    for kind in ("pre_ln", "llama", "parallel"):
        why = policy.not_expected(_arch(kind), "fuse_transformer_layer", "attn_is_fused_block")
        assert why == f"FusedTransformerLayer is the post-LN BERT layer; this layer is a {kind} layer"


@pytest.mark.parametrize("kind, mask, kv, counts", [
    ("post_ln", "keep", False, True), ("post_ln", "causal", False, True), ("llama", "keep", False, True),
    ("llama", "causal", False, False), ("llama", "additive", False, False), ("post_ln", "keep", True, False),
    ("pre_ln", None, False, False)])
def test_the_block_is_expected_where_its_declared_traits_say(kind, mask, kv, counts):
    why = policy.not_expected(_arch(kind, mask, kv), "fuse_attention_block", "qkv_split")
    assert (why is None) == counts, why
    if kv and why is not None:
        assert "KV cache" in why  # `excused_by` comes first, whatever the kind


def test_a_guard_excused_in_pre_norm_layers_only():
    for pass_name in ("fuse_residual_ln", "fuse_residual_rms_norm"):
        for guard in ("sum_single_user", "biased_single_user"):
            assert "pre-norm layout" in policy.not_expected(_arch("llama"), pass_name, guard)
            assert policy.not_expected(_arch("post_ln"), pass_name, guard) is None  # a post-LN layer: it counts
        assert policy.not_expected(_arch("llama"), pass_name, "sum_not_output") is None  # not declared: counts


def test_a_renamed_guard_carries_its_excuse(monkeypatch):
    """The excuse is the guard's, not a table's: rename it and the pre-norm layer still does not count it."""
    renamed = _with_guards("fuse_residual_ln", lambda g: g.renamed("sum_has_one_reader")
                           if g.name == "sum_single_user" else g)
    monkeypatch.setitem(PASSES, "fuse_residual_ln", renamed)
    assert "pre-norm layout" in policy.not_expected(_arch("pre_ln"), "fuse_residual_ln", "sum_has_one_reader")
    assert policy.not_expected(_arch("pre_ln"), "fuse_residual_ln", "sum_single_user") is None


def test_an_undeclared_excuse_counts(monkeypatch):
    """Drop the declaration and the same refusal counts: the policy is read from the guard."""
    bare = _with_guards("fuse_residual_ln", lambda g: dataclasses.replace(g, excuses=()))
    monkeypatch.setitem(PASSES, "fuse_residual_ln", bare)
    assert policy.not_expected(_arch("pre_ln"), "fuse_residual_ln", "sum_single_user") is None


@pytest.mark.parametrize("change, fragment", [
    (lambda p: dataclasses.replace(p, expected_of=("post_lm",)), "unknown layer trait 'post_lm'"),
    (lambda p: dataclasses.replace(p, excused_by=(("kv_cahce", "why"),)), "unknown layer trait 'kv_cahce'"),
    (lambda p: dataclasses.replace(p, expected_of=("post_ln",), unexpected=""), "without `unexpected`"),
])
def test_a_misspelt_pass_declaration_fails_the_check(monkeypatch, change, fragment):
    monkeypatch.setitem(PASSES, "fuse_swiglu", change(PASSES["fuse_swiglu"]))
    with pytest.raises(RuleError, match=fragment.replace("(", r"\(").replace("`", ".")):
        policy.check_declarations()


@pytest.mark.parametrize("where, why, fragment", [(("pre_nrom",), "x", "unknown layer trait 'pre_nrom'"),
                                                  (("pre_norm",), "", "without an excuse")])
def test_a_misspelt_guard_excuse_fails_the_check(monkeypatch, where, why, fragment):
    bad = _with_guards("fuse_residual_ln", lambda g: g.excused(where, why) if g.name == "sum_not_output" else g)
    monkeypatch.setitem(PASSES, "fuse_residual_ln", bad)
    with pytest.raises(RuleError, match=fragment):
        policy.check_declarations()


def test_every_declaration_today_passes_the_check():
    policy.check_declarations()
    assert {t for p in PASSES.values() for t in p.expected_of} <= set(policy.TRAITS)


@pytest.mark.parametrize("excused", [True, False])
def test_the_verdict_reads_the_guard_excuse(monkeypatch, excused):
    """llama-block (pre-norm): its residual sums feed the next residual add, so `fuse_residual_rms_norm` refuses
    them; the guard's declared excuse makes that "not expected here". Without the declaration the same refusal is
    judged otherwise (an illegal refusal, "fused as far as legal"): the verdict reads the guard, no table."""
    if not excused:
        for name in ("fuse_residual_ln", "fuse_residual_rms_norm"):
            monkeypatch.setitem(PASSES, name, _with_guards(name, lambda g: dataclasses.replace(g, excuses=())))
    v = RunVerdict.of(Pipeline.canonical().run(load_model("llama-block", seq=8).graph))
    lv = v.layers[0]
    said = [x for x in lv.not_expected if "(sum_single_user)" in x]
    if excused:
        assert lv.fused and said and all(x.endswith(": " + policy.not_expected(
            lv.expected_kind, "fuse_residual_rms_norm", "sum_single_user")) for x in said)
    else:
        assert not said and any(o.guard == "sum_single_user" for o in lv.illegal)  # judged as an illegal refusal
