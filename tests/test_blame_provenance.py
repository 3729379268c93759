"""Blame names the user's nodes (issue 38): a rejection on a node a canonicalization re-made (here `fuse_sdpa`'s
`hoist_scale`, which emits K's reshape/expand/transpose again above a moved scale) names the input-graph node it came
from: `k_rep (node 32, made by fuse_sdpa.hoist_scale from your node 12)`, in the text, `--json` (the outcome's
`subject_origin`) and the app's Why tab alike. The user's own nodes and fused products are named as before."""

import json
import re
from pathlib import Path

import pytest
from clirun import run

from rlxviz.app.jobs import Runner
from rlxviz.app.state import AppState
from rlxviz.ir import parse_ir
from rlxviz.models import load_model
from rlxviz.passes import Pipeline
from rlxviz.passes.report import name_users_nodes, user_origin
from rlxviz.session.status import check_fusion, layer_status

CASE = (Path(__file__).parent / "data" / "cases" / "07-gqa-fused-qkv.rlx").read_text()
TILE = {"%10 = reshape(%9) {shape=[2, 2, 1, 8, 16]} : f32[2, 2, 1, 8, 16]":
        "%10 = reshape(%9) {shape=[2, 1, 2, 8, 16]} : f32[2, 1, 2, 8, 16]",
        "%15 = reshape(%14) {shape=[2, 2, 1, 8, 16]} : f32[2, 2, 1, 8, 16]":
        "%15 = reshape(%14) {shape=[2, 1, 2, 8, 16]} : f32[2, 1, 2, 8, 16]"}
"""K and V repeated as a tile (query head i reads kv head i % 2): `kv_repeat_form` refuses it on K's `k_rep`
(reshape %12)."""
SCORES = "  %19 = matmul(%7, %18) : f32[2, 4, 8, 8]\n  %20 = const {value=0.25} : f32[]\n" \
         "  %21 = mul(%19, %20) : f32[2, 4, 8, 8]\n"


def _tile(src: str) -> str:
    for a, b in TILE.items():
        assert a in src
        src = src.replace(a, b)
    return src


def k_after_transpose(src: str) -> str:
    """The scale on K^T (after the transpose), the scores unscaled: hoist_scale moves it up to K's head split."""
    return src.replace(SCORES, "  %20 = const {value=0.25} : f32[]\n  %28 = mul(%18, %20) : f32[2, 4, 16, 8]\n"
                               "  %21 = matmul(%7, %28) : f32[2, 4, 8, 8]\n")


def k_after_expand(src: str) -> str:
    """K divided by 4 between the expand and the head-merging reshape."""
    return src.replace("  %12 = reshape(%11) {shape=[2, 4, 8, 16]}",
                       "  %29 = const {value=4.0} : f32[]\n  %30 = div(%11, %29) : f32[2, 2, 2, 8, 16]\n"
                       "  %12 = reshape(%30) {shape=[2, 4, 8, 16]}").replace(
        SCORES, "  %21 = matmul(%7, %18) : f32[2, 4, 8, 8]\n")


def in_layer(src: str) -> str:
    """Every node in layer 0 (`@model.layers.0.self_attn`)."""
    return re.sub(r"^(  %\d+ = .*)$", r"\1 @model.layers.0.self_attn", src, flags=re.MULTILINE)


MOVED = {"k_after_transpose": k_after_transpose, "k_after_expand": k_after_expand}


@pytest.mark.parametrize("name", list(MOVED))
def test_a_refusal_on_a_re_made_node_names_the_users_node(name):
    g = parse_ir(MOVED[name](_tile(CASE)))
    trace = Pipeline.canonical().run(g)
    assert any(m.rule == "fuse_sdpa.hoist_scale" for s in trace.steps for m in s.matches)
    check = check_fusion(trace, "gqa")
    assert not check.ok and len(check.misses) == 1
    miss = check.misses[0]
    made = int(re.search(r"k_rep \(node (\d+),", miss).group(1))
    assert made not in trace.input  # the refused node is the pipeline's, not the user's
    assert f"k_rep (node {made}, made by fuse_sdpa.hoist_scale from your node 12)" in miss
    assert user_origin(trace, made) == ("fuse_sdpa.hoist_scale", (12,))
    assert g[12].op.value == "reshape" and g[12].shape == (2, 4, 8, 16)  # the user's k_rep


@pytest.mark.parametrize("name", list(MOVED))
def test_a_layer_verdict_names_the_users_node_in_text_json_and_app(capsys, tmp_path, name):
    src = in_layer(MOVED[name](_tile(CASE)))
    trace = Pipeline.canonical().run(parse_ir(src))
    st = layer_status(trace, 0)
    assert not st.fused and st.first.guard == "kv_repeat_form"
    assert st.first.subject not in trace.input and st.first.subject_origin == ("fuse_sdpa.hoist_scale", (12,))
    said = f"(node {st.first.subject}, made by fuse_sdpa.hoist_scale from your node 12, model.layers.0.self_attn)"
    assert said in st.render()
    f = tmp_path / "gqa.rlx"
    f.write_text(src)
    code, out, _ = run(capsys, "explain", f)
    assert code == 1 and said in out
    code, out, _ = run(capsys, "explain", f, "--json")
    first = json.loads(out)["layers"][0]["first"]
    assert said in first["message"] and first["subject_origin"] == ["fuse_sdpa.hoist_scale", [12]]
    s = AppState(runner=Runner(background=False), source="ir", ir_text=src)
    assert said in s.why_layer(0).replace("\\_", "_").replace("&nbsp;", " ")


def test_the_users_own_node_is_named_as_before():
    g = parse_ir(_tile(CASE))  # no scale to move: k_rep is the user's reshape %12
    trace = Pipeline.canonical().run(g)
    miss = check_fusion(trace, "gqa").misses[0]
    assert "k_rep (node 12)" in miss and "made by" not in miss
    assert user_origin(trace, 12) is None


def test_fused_products_are_not_re_made_nodes():
    trace = Pipeline.canonical().run(load_model("bert-tiny", seq=8).graph)
    made = [n.id for n in trace.final if n.pass_name]
    assert made and all(user_origin(trace, i) is None for i in made)
    text = f"attn is FusedTransformerLayer (node {made[0]}, encoder.layer.0)"
    assert name_users_nodes(trace, text) == text
