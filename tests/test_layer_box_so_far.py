"""A layer box's `at this version:` line counts what the matches so far made in the layer, plain ops included (a
newcomer run: after `fuse_sdpa` packed each MiniLM layer's attention, every box still read `at this version:
unfused` in the grey of `unfused`, and later `partly fused (FusedMatMulBiasAct×4)` without the packed attention).
The nodes counted are the run's matches' (`why.facts.made_nodes`, what the verdict lists), named as the verdict names
them (`ir.ops.made_as`: fused ops, then `rewritten as` and the plain ops)."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from rlxviz.ir import parse_ir
from rlxviz.ir.ops import FUSED
from rlxviz.models import load_model
from rlxviz.passes import Pipeline, layer_of
from rlxviz.passes.why.facts import made_nodes
from rlxviz.session.render import View, dot, listed_nodes
from rlxviz.viz import Verdict, layers_to_dot
from rlxviz.viz.styles import STATUS_COLORS


@pytest.fixture(scope="module")
def run():
    return Pipeline.canonical().run(load_model("minilm", seq=8).graph)


def _box(source: str, k: int) -> tuple[str, str, str]:
    """(label text without markup, tooltip, fill) of layer k's box in a layers-view DOT source."""
    line = re.search(rf"^\s*layer{k} \[label=<(.*)$", source, re.M).group(1)
    label = " ".join(re.sub(r"<[^>]+>", " ", line.split("> ", 1)[0]).split())
    return label, re.search(r'tooltip="([^"]*)"', line).group(1), re.search(r'fillcolor="([^"]*)"', line).group(1)


def _version(run, name: str) -> int:
    return [label for label, _ in run.versions()].index(f"after {name}")


def test_after_fuse_sdpa_the_box_counts_the_packed_attention(run):
    label, tip, fill = _box(dot(run, View(version=_version(run, "fuse_sdpa"), view="layers")), 0)
    assert "final: fused" in label and "at this version: no fused op; rewritten as attention" in label, label
    assert "unfused" not in label and "at this version: no fused op; rewritten as attention" in tip, tip
    assert fill == STATUS_COLORS["rewritten"]  # no fused op yet: not the yellow of `partly fused`


def test_a_later_version_counts_fused_and_rewritten_ops_together(run):
    label, _, fill = _box(dot(run, View(version=_version(run, "fuse_matmul_bias_act"), view="layers")), 0)
    assert "at this version: partly fused (FusedMatMulBiasAct×4; rewritten as attention)" in label, label
    assert fill == STATUS_COLORS["partly fused"]


def test_every_unsettled_box_names_each_op_the_matches_made_there(run):
    # a plain op a match re-made in place (one op of its kind taken in, none listed by the verdict: a `where` a
    # canonicalization moved) is no rewrite's product (`render.listed_nodes`, tests/test_layer_box_legend.py)
    made = made_nodes(run) & frozenset().union(*listed_nodes(run).values())
    for version, (_, g) in enumerate(run.versions()):
        source = dot(run, View(version=version, view="layers"))
        for k in sorted({k for n in g if (k := layer_of(n.path)) is not None}):
            label, _, _ = _box(source, int(k))
            if "at this version:" not in label:
                continue
            ops = Counter(n.op.value for n in g if layer_of(n.path) == k and n.id in made)
            line = label.split("at this version:", 1)[1]
            for op, count in ops.items():
                assert (f"{op}×{count}" if count > 1 else op) in line, (version, k, op, line)
            assert ("unfused" in line) == (not ops), (version, k, line)
            plain = [op for op in ops if op not in {o.value for o in FUSED}]
            assert ("rewritten as" in line) == bool(plain), (version, k, line)


def test_the_drawing_alone_reads_the_verdicts_made_nodes():
    g = parse_ir("""graph toy {
  %0 = input {name="x"} : f32[2, 8]
  %1 = tanh(%0) : f32[2, 8] @encoder.layer.0.block
  %2 = add(%1, %0) : f32[2, 8] @encoder.layer.0.block
  return %2
}""")
    bare, _, bare_fill = _box(layers_to_dot(g, verdicts={0: Verdict(True, settled=False)}), 0)
    made, tip, fill = _box(layers_to_dot(g, verdicts={0: Verdict(True, settled=False, made=frozenset({1}))}), 0)
    assert "at this version: unfused" in bare and bare_fill == STATUS_COLORS["unfused"]
    assert "at this version: no fused op; rewritten as tanh" in made and "rewritten as tanh" in tip, made
    assert fill == STATUS_COLORS["rewritten"]
