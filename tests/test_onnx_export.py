"""ONNX export: any graph version (fused ops via unfuse) runs in ONNX Runtime with the outputs of the
original export and of the reference interpreter (atol 1e-5); exported node names carry the IR path back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlxviz.models import load_model
from rlxviz.models.onnx import load_onnx
from rlxviz.models.onnx.export import export_onnx
from rlxviz.passes import Pipeline
from rlxviz.runtime import run_reference

ort = pytest.importorskip("onnxruntime")  # dev extra
FIX = Path(__file__).parent / "fixtures" / "onnx"


def _ort(model_or_path, feeds):
    src = str(model_or_path) if isinstance(model_or_path, Path) else model_or_path.SerializeToString()
    sess = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in names})


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "vit"])
def test_round_trip_import_export_onnxruntime(name):
    d = dict(np.load(FIX / f"{name}.npz"))
    feeds = {k: v for k, v in d.items() if not k.startswith("out:")}
    first = next(iter(feeds.values()))
    m = load_onnx(FIX / f"{name}.onnx", batch=first.shape[0], seq=first.shape[1],
                  input_shapes={k: v.shape for k, v in feeds.items()})
    want = _ort(FIX / f"{name}.onnx", feeds)[0]
    trace = Pipeline.canonical().run(m.graph)
    assert any(n.op.value[0].isupper() for n in trace.final)  # the final version has fused ops to unfuse
    for g in (trace.input, trace.final):
        got = _ort(export_onnx(g, m.weights), feeds)[0]
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("preset", ["bert-tiny", "llama-block"])
def test_fully_fused_versions_export_to_what_the_reference_computes(preset, tmp_path):
    m = load_model(preset, batch=2, seq=8)
    feeds = m.random_feeds(seed=1)
    trace = Pipeline.canonical().run(m.graph)
    fused = {n.op.value for n in trace.final if n.op.value[0].isupper()}
    assert fused  # FusedTransformerLayer / FusedSwiGLU / ... all go through unfuse
    want = run_reference(trace.final, feeds, m.weights)
    path = tmp_path / f"{preset}.onnx"
    export_onnx(trace.final, m.weights, path)
    got = _ort(path, feeds)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    back = load_onnx(path, batch=2, seq=8)  # and the file imports again, paths included
    np.testing.assert_allclose(run_reference(back.graph, feeds, back.weights)[0], want[0], atol=1e-5, rtol=0)
    assert {n.path for n in trace.final if n.path} & {n.path for n in back.graph if n.path}


def test_model_explorer_json_annotates_matches_and_rejections(tmp_path):
    import json

    from rlxviz.models.bert import VARIANTS
    from rlxviz.viz.model_explorer import save_model_explorer

    m = load_model("bert-tiny", seq=8, variant=VARIANTS["extra_h1_user"])
    trace = Pipeline.canonical().run(m.graph)
    data = json.loads(save_model_explorer(trace, tmp_path / "g.json").read_text())
    graphs = data["graphs"]
    assert graphs[0]["id"].endswith("0 input") and len(graphs) > 2
    final = graphs[-1]
    nodes = {n["id"]: n for n in final["nodes"]}
    assert set(nodes) == {str(n.id) for n in trace.final}
    for n in trace.final:  # every operand is an edge at its position
        assert [(e["sourceNodeId"], e["targetNodeInputId"]) for e in nodes[str(n.id)]["incomingEdges"]] == \
            [(str(i), str(k)) for k, i in enumerate(n.inputs)]
    ftl = [n for n in final["nodes"] if n["label"] == "FusedTransformerLayer"]
    assert len(ftl) == 1 and ftl[0]["namespace"] == "encoder/layer/1"  # layer 0 is the broken one
    assert {"key": "match", "value": "fuse_transformer_layer.bert_post_ln"} in ftl[0]["attrs"]
    assert ftl[0]["style"]["backgroundColor"]
    flagged = [n for g in graphs for n in g["nodes"] if any(a["key"].startswith("rejected_") for a in n["attrs"])]
    assert any("h1_user_count" in a["value"] for n in flagged for a in n["attrs"] if a["key"].startswith("rejected_"))
    assert all(n["style"]["borderColor"] for n in flagged)


def test_cli_export_writes_onnx_and_model_explorer_json(tmp_path, capsys):
    from rlxviz.cli import main

    out = tmp_path / "v.onnx"
    assert main(["export", "bert-tiny", str(out), "--seq", "8", "--after", "fuse_residual_ln"]) == 0
    m = load_model("bert-tiny", seq=8)
    feeds = m.random_feeds()
    want = run_reference(m.graph, feeds, m.weights)[0]
    np.testing.assert_allclose(_ort(out, feeds)[0], want, atol=1e-5, rtol=0)
    assert main(["export", "bert-tiny", str(tmp_path / "g.json"), "--seq", "8", "--after", "final"]) == 0
    assert main(["export", "bert-tiny", str(tmp_path / "g.txt"), "--seq", "8"]) == 2
    assert "must end in .onnx" in capsys.readouterr().err


@pytest.mark.parametrize("mask_kind", ["causal", "keep", "additive", "none"])
def test_attention_forms_export_exactly(mask_kind):
    """Grouped-query attention (4 query heads, 2 kv heads) with each mask kind, Sq < Sk, a custom scale,
    and RoPE on q: ONNX Runtime computes what the reference computes."""
    from rlxviz.ir import Builder

    b = Builder("attn")
    B, Sq, Sk, H, KV, D = 2, 3, 5, 4, 2, 8
    q = b.input("q", (B, Sq, H * D))
    k, v = b.input("k", (B, Sk, KV * D)), b.input("v", (B, Sk, KV * D))
    cos, sin = b.param("cos", (16, D // 2)), b.param("sin", (16, D // 2))
    mask_shape = {"keep": (B, Sk), "additive": (B, 1, Sq, Sk)}.get(mask_kind)
    mask = b.input("m", mask_shape) if mask_shape else None
    q = b.rope(q, cos, sin, D)
    b.output(b.attention(q, k, v, mask, num_heads=H, head_dim=D, mask_kind=mask_kind, scale=0.3, num_kv_heads=KV))
    g = b.build()
    rng = np.random.default_rng(0)
    feeds = {n.attrs["name"]: rng.standard_normal(n.shape).astype(np.float32) for n in g.inputs}
    if mask_kind == "keep":
        feeds["m"] = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=np.float32)
    w = {"cos": rng.standard_normal((16, D // 2)).astype(np.float32),
         "sin": rng.standard_normal((16, D // 2)).astype(np.float32)}
    want = run_reference(g, feeds, w)[0]
    np.testing.assert_allclose(_ort(export_onnx(g, w), feeds)[0], want, atol=1e-5, rtol=0)


CASES = FIX / "cases"


@pytest.mark.parametrize("name", ["falcon", "roberta", "gpt-neox.legacy-sdpa"])
def test_every_version_of_the_handed_exports_runs_in_onnxruntime(name):
    """Every distinct version of each handed export (masked decoders included: ORT has no bool Where, so a bool
    where is written as and/or) loads in ONNX Runtime and gives the exporter's numbers."""
    d = dict(np.load(CASES / f"{name}_io.npz"))
    feeds = {k: v for k, v in d.items() if not k.startswith("out:")}
    want = d["out:last_hidden_state"]
    m = load_onnx(CASES / f"{name}.onnx", input_shapes={k: v.shape for k, v in feeds.items()})
    trace = Pipeline.canonical().run(m.graph)
    for _, g in trace.versions():
        got = _ort(export_onnx(g, m.weights), feeds)[0]
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
