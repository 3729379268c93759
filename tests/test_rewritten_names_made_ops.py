"""A layer's "expected:" and "rewritten as" name only what the layer's rewrites made.

Two newcomer reports on `explain`: every layer's expected list read "gelu / gelu_tanh" and "layer_norm / rms_norm"
whatever the layer had (falcon has an erf GELU and no norm rewritten at all: its norms are exported as LayerNorm);
and optimum-llama's "rewritten as: mul %42 (canonicalize_exported)" named the value a dropped no-op cast had read, an
op of the model's own that no rule made.

Decision: the GELU and norm canonicalizations name their forms as the exporter's rules do (`Rule.form`), and a pass
whose product is its forms (`gelu / gelu_tanh`) names only those the layer had (`why.policy.product`); a rule that
drops a node (`canonicalize_exported.noop_cast`, `.nan_guard`) makes none (`Match.fused` None), so nothing stands
for it in "rewritten as"; its form says it was dropped (in "expected:", and after `explain -v`'s `->`).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
from test_expected_forms import trace_of

from rlxviz.ir import Op
from rlxviz.passes import PASSES, Trace
from rlxviz.passes.explain import explain
from rlxviz.passes.why import policy
from rlxviz.passes.why.verdict import RunVerdict

ONNX = Path(__file__).parent / "fixtures" / "onnx" / "cases"
FORM_PASSES = ("canonicalize_gelu", "canonicalize_norm")
_ITEM = re.compile(r"^(\S+) %(\d+) \((\S+)\)$")
_REMADE_ITEM = re.compile(r"^(\S+) %(\d+) \((\S+)'s (?:.+ )?%(\d+), re-made by (\S+)\)$")
"""`rope %233 (fuse_sdpa's q_rope %194, re-made by fuse_attention_block.qkv_columns)` (`why.facts.REMADE`)."""


@functools.cache
def traced(stem: str) -> Trace:
    """The canonical run of the ONNX case `stem`."""
    return trace_of(ONNX / f"{stem}.onnx")


def made_forms(trace: Trace, pass_name: str, layer: int) -> list[str]:
    """The forms (`Rule.form`) of `pass_name`'s matches in `layer`, each once, in the pass's rule order."""
    rules = PASSES[pass_name].rules
    made = {m.rule for s in trace.steps if s.pass_name == pass_name for m in s.matches if m.layer == layer}
    return list(dict.fromkeys(r.form for r in rules if r.name in made))


def test_the_gelu_and_norm_rules_name_their_forms_and_the_products_list_them():
    for name in FORM_PASSES:
        p = PASSES[name]
        assert all(r.form for r in p.rules), name
        assert p.product == " / ".join(dict.fromkeys(r.form for r in p.rules)) == policy.product(name)


def test_falcon_expects_gelu_alone():
    for lv in RunVerdict.of(traced("falcon")).layers:
        items = lv.expected.split(", ")
        assert "gelu" in items, lv.expected
        assert "gelu_tanh" not in lv.expected and "gelu / " not in lv.expected, lv.expected
        assert "layer_norm" not in lv.expected and "rms_norm" not in lv.expected, lv.expected


@pytest.mark.parametrize("case", sorted(p.stem for p in ONNX.glob("*.onnx")))
def test_the_expected_list_names_the_forms_the_layer_had(case):
    """A layer whose list names a GELU or norm product (a post-LN layer names its whole-layer op alone) names the
    forms its matches made, in the pass's rule order; `every` passes' forms listed only where the layer had them."""
    trace = traced(case)
    checked = 0
    for lv in RunVerdict.of(trace).layers:
        items = lv.expected.split(", ")
        for name in FORM_PASSES:
            known = {r.form for r in PASSES[name].rules}
            said = [i for i in items if set(i.split(" / ")) <= known]
            forms = made_forms(trace, name, lv.layer)
            if forms and said:
                assert said == [" / ".join(forms)], (name, lv.expected)
                checked += 1
    if case in ("falcon", "optimum.llama-with-past", "granite"):
        assert checked, case


@pytest.mark.parametrize("case", sorted(p.stem for p in ONNX.glob("*.onnx")))
def test_rewritten_as_names_only_ops_a_rewrite_made(case):
    """Each `rewritten as` item names a node its pass made at some step (new in that step's graph), never a value
    that was there before it (the input of a dropped cast), and names it by the rule or stage whose match made it
    (`fuse_attention_block.qkv_columns`, not the pass alone: test_rewritten_names_its_rule)."""
    trace = traced(case)
    made = {n.id: s.pass_name.partition("/")[0] for s in trace.steps for n in s.after if n.id not in s.before}
    by_rule = {m.fused: m.rule for m in trace.matches if m.fused is not None}
    for lv in RunVerdict.of(trace).layers:
        for item in lv.rewritten:
            if (r := _REMADE_ITEM.match(item)) is not None:  # a product re-made beside the rule's own (`REMADE`)
                op, node, maker, old, rule = r.groups()
                assert by_rule.get(int(old), "").partition(".")[0] == maker, (lv.layer, item)
                assert made.get(int(node)) == rule.partition(".")[0] and int(node) not in by_rule, (lv.layer, item)
                continue
            m = _ITEM.match(item)
            assert m, item
            op, node, rule = m.groups()
            assert made.get(int(node)) == rule.partition(".")[0], (lv.layer, item)
            assert by_rule.get(int(node)) == rule, (lv.layer, item)
            assert Op(op) != Op.CAST


def test_optimum_llamas_dropped_casts_are_said_as_dropped():
    trace = traced("optimum.llama-with-past")
    dropped = [m for s in trace.steps for m in s.matches if m.rule == "canonicalize_exported.noop_cast"]
    assert dropped and all(m.fused is None for m in dropped)
    for lv in RunVerdict.of(trace).layers:
        assert "no-op cast dropped" in lv.expected, lv.expected
        assert not any(i.startswith(("mul ", "add ")) and "(canonicalize_exported." in i for i in lv.rewritten), \
            lv.rewritten
        ex = explain(trace, lv.layer)
        assert ex.made["canonicalize_exported.noop_cast"] == "no node of its own: no-op cast dropped"


def test_rewritten_names_its_rule(capsys):
    """gpt-neox read `attention %237 (fuse_attention_block)`, as if the block had fused; the node is the packed
    attention whose QKV columns the stage `fuse_attention_block.qkv_columns` reordered: still an `attention`. Text
    and --json (the app's Why tab reads the same verdict) name the stage, as `explain -v`'s `[fused]` line does."""
    import json

    from clirun import run as cli_run

    case = ONNX / "gpt-neox.legacy-sdpa.onnx"
    trace = traced("gpt-neox.legacy-sdpa")
    made = [(m.fused, m.layer) for m in trace.matches if m.rule == "fuse_attention_block.qkv_columns"]
    assert made and all(trace.final[i].op == Op.ATTENTION for i, _ in made if i in trace.final)
    code, out, _ = cli_run(capsys, "explain", case)
    lines = {int(ln.split(":", 1)[0].split()[1]): ln for ln in out.splitlines() if ln.startswith("layer ")}
    rewritten = [ln for ln in out.splitlines() if ln.startswith("  rewritten as: ")]
    assert len(rewritten) == len(lines) == 2, out
    for i, layer in made:
        assert f"attention %{i} (fuse_attention_block.qkv_columns)" in rewritten[int(layer)], rewritten
    assert "(fuse_attention_block)" not in " ".join(rewritten)
    # the packed attention %217 fuse_sdpa made was replaced by the reordered one: the line lists what the final graph
    # holds (newcomer run 17), as the fused ops' list does
    assert "(fuse_sdpa.hf_attention)" not in rewritten[0], rewritten
    assert all(int(i) in trace.final for ln in rewritten for i in re.findall(r"\S+ %(\d+) \(", ln)), rewritten
    _, out, _ = cli_run(capsys, "explain", "--json", case)
    said = [x for lv in json.loads(out)["layers"] for x in lv["rewritten"]]
    assert all(f"attention %{i} (fuse_attention_block.qkv_columns)" in said for i, _ in made), said
