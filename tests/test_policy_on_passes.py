"""Policy lives on the pass it is about (issue 36, item 2): which pass makes the whole layer (`Pass.whole_layer`), which
unrecognized families a pass recognizes (`recognizes_families`), what quantized activations do to it
(`quantization`) and under which traits a layer names its product (`listed_for`) are declared on the pass, and
`passes/why/` names no pass. A renamed copy of a pass registered in its place keeps every verdict; a misspelt
declaration fails where the pass is built or when the registry is checked.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rlxviz.models import load_model
from rlxviz.passes import PASSES, Pipeline, pipeline
from rlxviz.passes.engine import Pass, PassResult, rule_pass
from rlxviz.passes.pattern import RuleError
from rlxviz.passes.why import policy
from rlxviz.passes.why.kinds import LayerArchitecture
from rlxviz.passes.why.verdict import RunVerdict

WHY = Path(policy.__file__).parent

POLICY_FIELDS = ("product", "expected_of", "excused_by", "unexpected", "whole_layer", "recognizes_families",
                 "quantization", "listed_for")


def renamed(p: Pass, name: str) -> Pass:
    """A copy of rule pass `p` under `name`: its rules renamed `name.RULE` (so its records name the new pass) and
    every policy declaration carried over as it is."""
    rules = [dataclasses.replace(r, name=f"{name}.{r.name.split('.', 1)[1]}") for r in p.rules]
    return rule_pass(name, rules, p.doc, p.requires, **{f: getattr(p, f) for f in POLICY_FIELDS})


@contextmanager
def swapped(old: str, new: Pass) -> Iterator[None]:
    """`PASSES` with `new` in `old`'s place (same position; `old` gone), restored after."""
    saved = dict(PASSES)
    PASSES.clear()
    PASSES.update({(new.name if k == old else k): (new if k == old else v) for k, v in saved.items()})
    try:
        yield
    finally:
        PASSES.clear()
        PASSES.update(saved)


def _order(old: str, new: str) -> tuple[str, ...]:
    return tuple(new if n == old else n for n in pipeline.CANONICAL_ORDER)


def _arch(kind: str, mask: str | None = "causal", quantized: int = 0, **kw: object) -> LayerArchitecture:
    return LayerArchitecture(kind, f"a {kind} layer", mask=mask, quantized=quantized, **kw)


def pass_names_in(source: str) -> list[tuple[int, str]]:
    """(line, name) for every string literal of `source` (docstrings aside) that names a registered pass, a stage of
    one or a rule of one as a word."""
    names = {*PASSES, *(st.name for p in PASSES.values() for st in p.stages),
             *(r.name for p in PASSES.values() for st in (*p.stages, p) for r in st.rules)}
    tree = ast.parse(source)
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [(n.lineno, x) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
            for x in sorted(names) if re.search(rf"(?<![\w/]){re.escape(x)}(?![\w/])", n.value)]


@pytest.mark.parametrize("path", sorted(WHY.glob("*.py")), ids=lambda p: p.name)
def test_no_module_of_why_names_a_pass(path: Path):
    assert pass_names_in(path.read_text()) == [], "declare it on the pass (engine.Pass) and read the declaration"


@pytest.mark.parametrize("source, name", [('LAYER_PASS = "fuse_transformer_layer"', "fuse_transformer_layer"),
                                          ('X = {"glu": ("fuse_swiglu",)}', "fuse_swiglu"),
                                          ('r = f"{p}.x" if p else "fuse_transformer_layer.bert_post_ln"',
                                           "fuse_transformer_layer.bert_post_ln")])
def test_the_scan_sees_a_pass_name(source: str, name: str):
    assert name in [x for _, x in pass_names_in(f'"""doc: {name} may be named here."""\n{source}\n')]


def test_a_renamed_layer_pass_carries_its_policy():
    new = renamed(PASSES["fuse_transformer_layer"], "fuse_whole_layer")
    with swapped("fuse_transformer_layer", new):
        assert policy.layer_pass() is new
        assert policy.PRODUCTS["fuse_whole_layer"] == "FusedTransformerLayer"
        assert "fuse_transformer_layer" not in policy.PRODUCTS
        assert policy.not_expected(_arch("llama"), "fuse_whole_layer") == ("FusedTransformerLayer is the post-LN BERT "
                                                                            "layer; this layer is a llama layer")
        assert policy.not_expected(_arch("llama"), "fuse_transformer_layer") is None  # no pass of that name now
        assert "quantized" in policy.not_expected(_arch("post_ln", "unknown", quantized=2), "fuse_whole_layer")
        assert policy.not_expected(_arch("post_ln", "keep", quantized=2), "fuse_whole_layer") is None
        assert policy.expected_products(_arch("post_ln", "keep")) == ["FusedTransformerLayer"]
        policy.check_declarations()
    assert policy.layer_pass() is PASSES["fuse_transformer_layer"]


def test_a_renamed_pass_carries_its_families_and_quantization():
    new = renamed(PASSES["canonicalize_gelu"], "gelu_forms")
    assert policy.recognizers("gelu") == {"canonicalize_gelu"}
    with swapped("canonicalize_gelu", new):
        assert policy.recognizers("gelu") == {"gelu_forms"}
        assert "quantized" in policy.not_expected(_arch("llama", quantized=1), "gelu_forms")
        assert policy.not_expected(_arch("llama", quantized=0), "gelu_forms") is None
        assert policy.not_expected(_arch("llama", quantized=1), "canonicalize_gelu") is None
    new = renamed(PASSES["fuse_swiglu"], "gated_mlp")
    with swapped("fuse_swiglu", new):
        assert policy.recognizers("glu") == {"gated_mlp"}
        assert policy.expected_products(_arch("llama", swiglu=True)) == ["packed attention", "FusedSwiGLU"]


@pytest.mark.parametrize("model", ["bert-tiny", "llama-block"])
def test_the_verdict_of_a_renamed_layer_pass_is_the_same(monkeypatch, model: str):
    """The whole `explain` text and `--json` of the run are the same, but for the pass's name."""
    g = load_model(model, seq=8).graph
    base = RunVerdict.of(Pipeline.canonical().run(g))
    with swapped("fuse_transformer_layer", renamed(PASSES["fuse_transformer_layer"], "fuse_whole_layer")):
        monkeypatch.setattr(pipeline, "CANONICAL_ORDER", _order("fuse_transformer_layer", "fuse_whole_layer"))
        v = RunVerdict.of(Pipeline.canonical().run(g))
        bert = [lv.bert_style for lv in v.layers]
        text, data = v.render(verbose=True), json.dumps(v.to_dict(), sort_keys=True)
        without = RunVerdict.of(Pipeline([n for n in pipeline.CANONICAL_ORDER if n != "fuse_whole_layer"]).run(g))
    assert bert == [lv.bert_style for lv in base.layers] == [model == "bert-tiny"] * len(base.layers)
    assert text == base.render(verbose=True).replace("fuse_transformer_layer", "fuse_whole_layer")
    assert data == json.dumps(base.to_dict(), sort_keys=True).replace("fuse_transformer_layer", "fuse_whole_layer")
    assert base.ok and v.ok
    if model == "bert-tiny":
        assert [lv.expected for lv in v.layers] == ["FusedTransformerLayer"] * len(v.layers)
        assert any(x.startswith("the pipeline has no fuse_whole_layer: FusedTransformerLayer cannot be made @ %")
                   for x in without.layers[0].cannot_make) and not without.ok


def test_a_crash_of_a_renamed_layer_pass_names_its_own_rule(monkeypatch):
    def boom(graph, params) -> PassResult:
        raise RuntimeError("boom in the layer pass")

    new = dataclasses.replace(renamed(PASSES["fuse_transformer_layer"], "fuse_whole_layer"), fn=boom)
    g = load_model("bert-tiny", seq=8).graph
    with swapped("fuse_transformer_layer", new):
        monkeypatch.setattr(pipeline, "CANONICAL_ORDER", _order("fuse_transformer_layer", "fuse_whole_layer"))
        first = RunVerdict.of(Pipeline.canonical().run(g)).layers[0].first
    assert first is not None and (first.pass_name, first.rule, first.guard) == (
        "fuse_whole_layer", "fuse_whole_layer.bert_post_ln", "pass_crashed")
    assert "boom in the layer pass" in first.message


@pytest.mark.parametrize("arch, want", [
    (_arch("post_ln", "keep", swiglu=True), ["FusedTransformerLayer"]),
    (_arch("llama", "causal", swiglu=True, evidence=("attention %9: grouped-query (8 query heads, 2 kv heads)",)),
     ["packed attention (grouped-query)", "FusedSwiGLU"]),
    (_arch("pre_ln", "keep"), ["packed attention", "FusedAttentionBlock"]),
    (_arch("pre_ln", "keep", kv_cache=True), ["packed attention"]),
    (_arch("llama", "unknown", quantized=3, swiglu=True), ["FusedSwiGLU"]),
    (_arch("no_attention", None, evidence=("grouped-query in a comment",)), []),
])
def test_expected_products_are_read_from_the_declarations(arch: LayerArchitecture, want: list[str]):
    assert policy.expected_products(arch) == arch.expected() == want


@pytest.mark.parametrize("change, fragment", [
    (lambda: dataclasses.replace(PASSES["fuse_transformer_layer"], whole_layer=False), "found none"),
    (lambda: dataclasses.replace(PASSES["fuse_swiglu"], whole_layer=True, expected_of=("swiglu",), unexpected="x"),
     "found fuse_swiglu, fuse_transformer_layer"),
])
def test_exactly_one_pass_makes_the_whole_layer(monkeypatch, change, fragment: str):
    p = change()
    monkeypatch.setitem(PASSES, p.name, p)
    with pytest.raises(RuleError, match=fragment):
        policy.check_declarations()


def _fn(graph, params) -> PassResult:
    return PassResult(graph)


@pytest.mark.parametrize("kw, fragment", [
    ({"recognizes_families": ("gelu", "glue")}, r"unknown unrecognized family 'glue'; did you mean 'glu'"),
    ({"quantization": ("brakes", "a reason")}, r"unknown quantization mode 'brakes'; did you mean 'breaks'"),
    ({"quantization": ("breaks", "")}, r"quantization must be \(mode, why\)"),
    ({"quantization": ("breaks",)}, r"quantization must be \(mode, why\)"),
    ({"product": "X", "listed_for": (("swigul", ""),)}, r"unknown layer trait 'swigul'; did you mean 'swiglu'"),
    ({"listed_for": (("swiglu", ""),)}, "listed_for without a product"),
    ({"whole_layer": True, "product": "X"}, "whole_layer needs a product"),
    ({"whole_layer": True, "expected_of": ("post_ln",), "unexpected": "x"}, "whole_layer needs a product"),
])
def test_a_misspelt_or_incomplete_declaration_fails_where_the_pass_is_built(kw: dict, fragment: str):
    with pytest.raises(RuleError, match=fragment):
        Pass("t_pass", _fn, **kw)
    with pytest.raises(RuleError, match=fragment):
        rule_pass("t_pass", [], **kw)


def test_a_stage_declares_no_policy():
    for p in PASSES.values():
        for st in p.stages:
            assert (st.whole_layer, st.recognizes_families, st.quantization, st.listed_for) == (False, (), (), ())


def test_every_family_and_quantized_pass_is_declared_today():
    assert {f: policy.recognizers(f) for f in policy.FAMILIES} == {
        "norm": {"canonicalize_norm"}, "gelu": {"canonicalize_gelu"}, "glu": {"fuse_swiglu"},
        "where_mask": {"canonicalize_exported", "fuse_sdpa"}, "attention": {"fuse_sdpa"},
        "activation": {"canonicalize_exported", "fuse_matmul_bias_act"}}
    assert {p.name: p.quantization[0] for p in PASSES.values() if p.quantization} == {
        "canonicalize_gelu": "breaks", "fuse_residual_ln": "breaks", "fuse_residual_rms_norm": "breaks",
        "fuse_sdpa": "attention", "fuse_attention_block": "attention", "fuse_transformer_layer": "attention",
        "fuse_shared_input_matmul": "attention"}
