"""ONNX export: any graph version (fused ops via unfuse) runs in ONNX Runtime with the outputs of the
original export and of the reference interpreter (atol 1e-5); exported node names carry the IR path back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlxviz.models import load_model
from rlxviz.models.onnx_export import export_onnx
from rlxviz.models.onnx_import import load_onnx
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
