"""Encoder-decoder models (issue 37, item 6): layers numbered per stack, decoder layers judged as decoder layers.

`encoder.layers.i` and `decoder.layers.i` (T5: `encoder.block.i` / `decoder.block.i`) are two layers each, reported
as `encoder layer i` and `decoder layer i`; a one-stack model keeps `layer i`. A decoder layer with self- and
cross-attention is expected to get what it legally can (packed attention for both; FusedAttentionBlock only for a
self-attention with a keep mask; residual-norm and MLP fusions), never FusedTransformerLayer, which holds one hidden
input's self-attention; a fused encoder layer is never called NOT fused. The handed file is full BART (dynamo); the
two made here are a BART-like post-LN model and a T5-like pre-norm RMSNorm model, built as Hugging Face primitives.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from rlxviz.ir import Builder, DType, Graph, Op
from rlxviz.models.bert import random_weights
from rlxviz.models.onnx import load_onnx
from rlxviz.passes import Pipeline, layer_of
from rlxviz.passes.trace import Layer, layer_keys, layer_label, resolve_layers
from rlxviz.runtime import run_reference
from rlxviz.session import check_fusion
from rlxviz.session.loading import layer_indices

CASES = Path(__file__).parent / "fixtures" / "onnx" / "cases"
B, S, T, H, NH = 2, 6, 4, 16, 2
D = H // NH


def _attention(b: Builder, q_in: int, kv_in: int, mask: int | None, prefix: str, bias: bool, scale: bool) -> int:
    """HF eager attention as primitives: projections, heads, `softmax(QK^T [/ sqrt(d)] + mask) V`, out proj."""
    sq, sk = b.shape_of(q_in)[1], b.shape_of(kv_in)[1]

    def proj(x: int, name: str) -> int:
        w = b.param(f"{prefix}.{name}.weight", (H, H))
        y = b.matmul(x, w)
        return b.add(y, b.param(f"{prefix}.{name}.bias", (H,))) if bias else y

    def heads(t: int, s: int) -> int:
        return b.transpose(b.reshape(t, (B, s, NH, D)), (0, 2, 1, 3))

    q, k, v = heads(proj(q_in, "q_proj"), sq), heads(proj(kv_in, "k_proj"), sk), heads(proj(kv_in, "v_proj"), sk)
    scores = b.matmul(q, b.transpose(k, (0, 1, 3, 2)))
    if scale:
        scores = b.div(scores, math.sqrt(D))
    if mask is not None:
        scores = b.add(scores, mask)
    ctx = b.reshape(b.transpose(b.matmul(b.softmax(scores, -1), v), (0, 2, 1, 3)), (B, sq, H))
    return proj(ctx, "out_proj")


def _norm(b: Builder, x: int, prefix: str, rms: bool) -> int:
    g = b.param(f"{prefix}.weight", (H,))
    return b.rms_norm(x, g, None, 1e-6) if rms else b.layer_norm(x, g, b.param(f"{prefix}.bias", (H,)), 1e-5)


def _mlp(b: Builder, x: int, prefix: str, act: str, bias: bool) -> int:
    w1, w2 = b.param(f"{prefix}.fc1.weight", (H, 2 * H)), b.param(f"{prefix}.fc2.weight", (2 * H, H))
    mid = b.matmul(x, w1)
    if bias:
        mid = b.add(mid, b.param(f"{prefix}.fc1.bias", (2 * H,)))
    out = b.matmul(b.unary(act, mid), w2)
    return b.add(out, b.param(f"{prefix}.fc2.bias", (H,))) if bias else out


def encoder_decoder(kind: str, n_enc: int = 2, n_dec: int = 2) -> Graph:
    """`bart`: post-LN layers under `encoder.layers.i` / `decoder.layers.i` (biases, scaled scores, GELU);
    `t5`: pre-norm RMSNorm layers under `encoder.block.i` / `decoder.block.i` (no biases, unscaled scores, ReLU).
    Inputs `enc` [B, S, H], `attention_mask` i64 [B, S], `dec` [B, T, H]; outputs the decoder's and the encoder's
    last hidden states."""
    t5 = kind == "t5"
    stack = "block" if t5 else "layers"
    b = Builder(f"{kind}_like")
    x, mask_i, y = b.input("enc", (B, S, H)), b.input("attention_mask", (B, S), DType.i64), b.input("dec", (B, T, H))
    with b.scope("encoder"):
        keep = b.cast(mask_i, DType.f32)
        pad = b.reshape(b.mul(b.sub(1.0, keep), float(np.finfo(np.float32).min)), (B, 1, 1, S))
        for i in range(n_enc):
            p = f"encoder.{stack}.{i}"
            with b.scope(f"{stack}.{i}"):
                if t5:
                    with b.scope("layer.0.SelfAttention"):
                        x = b.add(x, _attention(b, n := _norm(b, x, f"{p}.ln0", True), n, pad, p + ".sa", False,
                                                False))
                    with b.scope("layer.1.DenseReluDense"):
                        x = b.add(x, _mlp(b, _norm(b, x, f"{p}.ln1", True), p + ".mlp", "relu", False))
                else:
                    with b.scope("self_attn"):
                        a = _attention(b, x, x, pad, p + ".sa", True, True)
                    with b.scope("self_attn_layer_norm"):
                        x = _norm(b, b.add(x, a), f"{p}.ln0", False)
                    with b.scope("mlp"):
                        f = _mlp(b, x, p + ".mlp", "gelu", True)
                    with b.scope("final_layer_norm"):
                        x = _norm(b, b.add(x, f), f"{p}.ln1", False)
        if t5:
            x = _norm(b, x, "encoder.final_layer_norm", True)
    with b.scope("decoder"):
        causal = b.param("decoder.causal_mask", (1, 1, T, T))
        for i in range(n_dec):
            p = f"decoder.{stack}.{i}"
            with b.scope(f"{stack}.{i}"):
                if t5:
                    with b.scope("layer.0.SelfAttention"):
                        y = b.add(y, _attention(b, n := _norm(b, y, f"{p}.ln0", True), n, causal, p + ".sa", False,
                                                False))
                    with b.scope("layer.1.EncDecAttention"):
                        y = b.add(y, _attention(b, _norm(b, y, f"{p}.ln1", True), x, pad, p + ".ca", False, False))
                    with b.scope("layer.2.DenseReluDense"):
                        y = b.add(y, _mlp(b, _norm(b, y, f"{p}.ln2", True), p + ".mlp", "relu", False))
                else:
                    with b.scope("self_attn"):
                        a = _attention(b, y, y, causal, p + ".sa", True, True)
                    with b.scope("self_attn_layer_norm"):
                        y = _norm(b, b.add(y, a), f"{p}.ln0", False)
                    with b.scope("encoder_attn"):
                        a = _attention(b, y, x, pad, p + ".ca", True, True)
                    with b.scope("encoder_attn_layer_norm"):
                        y = _norm(b, b.add(y, a), f"{p}.ln1", False)
                    with b.scope("mlp"):
                        f = _mlp(b, y, p + ".mlp", "gelu", True)
                    with b.scope("final_layer_norm"):
                        y = _norm(b, b.add(y, f), f"{p}.ln2", False)
    b.output(y, x)
    return b.build()


def _feeds_weights(g: Graph) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    feeds = {"enc": rng.standard_normal((B, S, H)).astype(np.float32),
             "attention_mask": np.array([[1] * S, [1] * (S - 2) + [0] * 2], np.int64),
             "dec": rng.standard_normal((B, T, H)).astype(np.float32)}
    w = random_weights(g, seed=1, std=0.2)
    w["decoder.causal_mask"] = np.triu(np.full((T, T), -1e9, np.float32), 1)[None, None]
    return feeds, w


def _stacked_labels(check) -> list[str]:
    return [layer_label(s.layer) for s in check.layers]


@pytest.mark.parametrize("kind", ["bart", "t5"])
def test_own_encoder_decoder_layers_are_numbered_per_stack(kind):
    g = encoder_decoder(kind)
    trace = Pipeline.canonical().run(g)
    assert not [s.error for s in trace.steps if s.error]
    check = check_fusion(trace, g.name)
    assert _stacked_labels(check) == ["encoder layer 0", "encoder layer 1", "decoder layer 0", "decoder layer 1"]
    text = check.render()
    assert "encoder layer 1:" in text and "decoder layer 1:" in text
    for s in check.layers:  # a layer's report cites its own stack's nodes only (T5's layer 1 cited a decoder node)
        for o in (*s.rejections, *([s.first] if s.first else [])):
            for i in o.nodes:
                path = next(v[i].path for _, v in trace.versions() if i in v)
                assert layer_of(path) == s.layer and layer_of(path).stack == s.layer.stack, (s.layer, path)
    dec = [s for s in check.layers if s.layer.stack == "decoder"]
    assert all(s.architecture.kind == "cross_decoder" for s in dec)
    assert all(not s.bert_style for s in dec) and all("FusedTransformerLayer" not in s.expected for s in dec)
    assert all(s.fused for s in dec), text  # what a decoder layer can legally get, it got (pre-norm: no residual norm)
    feeds, w = _feeds_weights(g)
    for a, b in zip(run_reference(g, feeds, w), run_reference(trace.final, feeds, w), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
    # both attentions of every decoder layer pack
    packed = [n for n in trace.final if n.op in (Op.ATTENTION, Op.FUSED_ATTENTION_BLOCK, Op.FUSED_TRANSFORMER_LAYER)]
    assert sum(layer_of(n.path).stack == "decoder" for n in packed if layer_of(n.path) is not None) == 4


def test_own_bart_like_encoder_layers_fuse_and_decoder_layers_fuse_as_expected():
    g = encoder_decoder("bart")
    check = check_fusion(Pipeline.canonical().run(g), g.name)
    enc = [s for s in check.layers if s.layer.stack == "encoder"]
    dec = [s for s in check.layers if s.layer.stack == "decoder"]
    assert all(s.fused and s.bert_style and s.fused_node is not None for s in enc)
    assert all(s.fused for s in dec), check.render()
    assert check.ok


def test_bart_full_export_layers_per_stack_with_its_numbers():
    """The handed full BART (dynamo): 4 layers (2 per stack), the fused encoder layers called fused, the decoder
    layers judged as decoder layers with cross-attention; the exporter's numbers in the input and final versions."""
    io = dict(np.load(CASES / "bart-full_io.npz"))
    feeds = {k: v for k, v in io.items() if not k.startswith("out:")}
    m = load_onnx(CASES / "bart-full.onnx", input_shapes={k: v.shape for k, v in feeds.items()})
    trace = Pipeline.canonical().run(m.graph)
    assert not [s.error for s in trace.steps if s.error]
    check = check_fusion(trace, "bart-full")
    assert _stacked_labels(check) == ["encoder layer 0", "encoder layer 1", "decoder layer 0", "decoder layer 1"]
    enc, dec = check.layers[:2], check.layers[2:]
    assert all(s.fused and s.fused_node is not None for s in enc)
    assert all(s.architecture.kind == "cross_decoder" and s.fused for s in dec), check.render()
    names = [n.attrs["name"] for n in m.graph.outputs_nodes] if hasattr(m.graph, "outputs_nodes") else None
    want = [io[f"out:{k}"] for k in ("last_hidden_state", "encoder_last_hidden_state")]
    for g in (m.graph, trace.final):
        got = run_reference(g, feeds, m.weights)
        assert names is None or len(got) == len(names)
        for a, w in zip(got, want, strict=True):
            np.testing.assert_allclose(a, w, atol=1e-5, rtol=0)


def test_explain_layer_n_of_an_encoder_decoder_model_reports_each_stack():
    g = encoder_decoder("bart")
    check = check_fusion(Pipeline.canonical().run(g), g.name, [1])
    assert _stacked_labels(check) == ["encoder layer 1", "decoder layer 1"]


def test_layer_keys_one_stack_models_are_unchanged():
    """A one-stack model keeps `layer i` (OPT's `model.decoder.layers.i`, BERT's `encoder.layer.i`); a plain int
    equals every stack's layer of that index, and `resolve_layers` picks them all."""
    bert = layer_keys([layer_of("encoder.layer.1.x"), layer_of("encoder.layer.0.x")])
    assert bert == (0, 1) and [k.label for k in bert] == ["layer 0", "layer 1"]
    opt = layer_keys([layer_of("model.decoder.layers.0.fc1")])
    assert [k.label for k in opt] == ["layer 0"]
    both = layer_keys([layer_of("decoder.block.0.x"), layer_of("encoder.block.0.x")])
    assert [k.label for k in both] == ["encoder layer 0", "decoder layer 0"]
    assert both[0] != both[1] and both[0] == 0 and both[1] == 0 and len(set(both)) == 2
    assert resolve_layers(both, [0]) == list(both) and resolve_layers(both, [both[1]]) == [both[1]]
    assert layer_of("text_model.encoder.layers.2.mlp") == Layer(2, "text_model.encoder")
    assert layer_of("model.layers.3.mlp").stack == "" and str(layer_of("decoder.layers.3")) == "3"


def test_layer_indices_of_a_graph_are_stack_qualified():
    g = encoder_decoder("t5", 1, 1)
    assert [k.label for k in layer_indices(g)] == ["encoder layer 0", "decoder layer 0"]


def test_layer_view_keeps_the_stacks_apart():
    from rlxviz.viz.layers import layer_groups

    g = encoder_decoder("bart")
    keys = [k for k, grp in layer_groups(g).items() if grp.layer is not None]
    assert len(keys) == 4 and {grp.title for grp in layer_groups(g).values() if grp.layer is not None} == {
        "encoder.layers.0", "encoder.layers.1", "decoder.layers.0", "decoder.layers.1"}


def test_bart_full_explain_from_the_cli_numbers_layers_per_stack(capsys):
    from clirun import run

    code, out, _ = run(capsys, "explain", CASES / "bart-full.onnx", "--batch", 2, "--seq", 8)
    assert code == 0 and "4/4 layer(s) fused as expected" in out
    for label in ("encoder layer 0: fused -> FusedTransformerLayer", "encoder layer 1: fused -> FusedTransformerLayer",
                  "decoder layer 0: fused as expected", "decoder layer 1: fused as expected"):
        assert label in out
    assert "NOT fused" not in out
