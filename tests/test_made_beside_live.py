"""A label names only nodes of the version it is drawn in (a newcomer on llama at version 22, after
`fuse_attention_block`: concat %196 read "made by fuse_shared_input_matmul.concat_weights beside matmul %197 (the b
operand)", but %197 was absorbed into FusedAttentionBlock %210 in that version and searching %197 found nothing; the
same on GPT-J's concat %213 "beside matmul %214"). A product gone from the version is named with where it went:
"beside matmul %197 (the b operand; now in FusedAttentionBlock %210)" (`passes.made.where_now`, through the lists the
search follows). And a label's "made beside" words never end inside a parenthesis: the bias expands read "beside
FusedAttentionBlock %210 (the out_b", cut at 3 lines; they drop the rule first, the tooltip keeps the words whole."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from rlxviz import session
from rlxviz.app.explain import node_report
from rlxviz.app.graphpane import absorbed_index
from rlxviz.passes import Pipeline
from rlxviz.passes.made import made_in_run
from rlxviz.session.loading import layer_indices
from rlxviz.session.render import View, picture
from rlxviz.session.render import dot as render_dot
from rlxviz.viz.dot import node_tooltips

ONNX = Path(__file__).parent / "fixtures" / "onnx"
MODELS = [ONNX / "llama.onnx", ONNX / "zoo" / "gptj.dynamo-eager.onnx", ONNX / "zoo" / "mistral.dynamo-eager.onnx",
          ONNX / "bert.onnx", ONNX / "cases" / "esm.qdyn.onnx"]
GONE = re.compile(r"%(\d+) \([^()]*now (?:in [^()%]*%(\d+)|gone)\)")
"""A node id said with where it went: `%197 (the b operand; now in FusedAttentionBlock %210)`, `%197 (now gone)`."""


def _labels(dot: str) -> dict[int, str]:
    """Each drawn node's label text (tags dropped, lines joined by spaces) in DOT source `dot`, by id."""
    return {int(m[1]): " ".join(html.unescape(re.sub(r"<[^>]*>", "", s)) for s in m[2].split("<BR/>"))
            for m in re.finditer(r"^\tn(\d+) \[label=<(.*?)> (?:color|fillcolor|id)=", dot, re.M)}


@pytest.fixture(scope="module", params=MODELS, ids=lambda p: p.stem)
def run(request):
    return request.param.stem, Pipeline.canonical().run(session.load(str(request.param)).graph)


def _views(trace) -> list[View]:
    views = [View(version=i, side=side) for i in range(len(trace.versions())) for side in ("after", "before")]
    return views + [View(version=len(trace.steps), side="why", focus=k) for k in layer_indices(trace.input)]


def test_every_id_a_label_names_is_live_in_its_version_or_said_gone(run):
    """Every version, before and after its pass, and every layer's Why drawing; each model but esm.qdyn (no
    product made beside is absorbed later there) says some product gone."""
    name, trace = run
    said_gone = 0
    for v in _views(trace):
        g, _, _ = picture(trace, v)
        for i, text in _labels(render_dot(trace, v)).items():
            gone = {int(m[1]) for m in GONE.finditer(text)}
            assert all(int(m[2]) in g for m in GONE.finditer(text) if m[2]), (v, i, text)
            absent = [n for n in map(int, re.findall(r"%(\d+)", text)) if n not in g and n not in gone]
            assert not absent, (v, i, absent, text)
            said_gone += bool(gone)
    assert said_gone or name.startswith("esm"), name


def test_made_words_never_end_inside_a_parenthesis(run):
    trace = run[1]
    for v in _views(trace):
        for i, text in _labels(render_dot(trace, v)).items():
            assert text.count("(") == text.count(")"), (v, i, text)


def _llama():
    return Pipeline.canonical().run(session.load(str(MODELS[0])).graph)


def test_llamas_concat_names_the_fused_block_its_matmul_went_into():
    trace = _llama()
    k = next(k for k, s in enumerate(trace.steps, 1) if s.pass_name == "fuse_attention_block")
    g = trace.versions()[k][1]
    made = made_in_run(trace)
    cats = [i for i, b in made.items() if i in g and b.rule == "fuse_shared_input_matmul.concat_weights"]
    assert cats
    labels, tips = _labels(render_dot(trace, View(version=k))), node_tooltips(*picture(trace, View(version=k))[:2])
    for i in cats:
        b = made[i]
        assert b.product not in g
        fused = next(n for n in g if n.op.value == "FusedAttentionBlock" and i in n.inputs)
        now = f"now in FusedAttentionBlock %{fused.id})"
        assert f"beside matmul %{b.product} (the b operand; {now}" in labels[i], labels[i]
        whole = f"made by fuse_shared_input_matmul.concat_weights beside matmul %{b.product} (the b operand; {now}"
        assert whole in tips[i], tips[i]
        assert node_report(g, i, trace)["made"] == whole  # the inspector says the same
        held = absorbed_index(g, trace)[f"n{fused.id}"]  # and the search finds the matmul in that block
        assert any(b.product in ids for _, ids, _ in held), held


def test_the_bias_expands_keep_their_operand_whole_in_the_label_and_the_rule_in_the_tooltip():
    trace = _llama()
    k = next(k for k, s in enumerate(trace.steps, 1) if s.pass_name == "fuse_attention_block")
    g = trace.versions()[k][1]
    made = made_in_run(trace)
    expands = {i: b for i, b in made.items() if i in g and b.op == "FusedAttentionBlock" and g[i].op.value == "expand"}
    assert expands
    labels, tips = _labels(render_dot(trace, View(version=k))), node_tooltips(*picture(trace, View(version=k))[:2])
    for i, b in expands.items():
        assert f"made beside FusedAttentionBlock %{b.product} ({b.what})" in labels[i], labels[i]
        assert b.words in tips[i] and b.rule in tips[i], tips[i]
