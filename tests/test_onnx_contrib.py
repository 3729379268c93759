"""ONNX Runtime's contrib ops (`models.onnx.handlers.contrib`): the handed transformer-optimizer output (deit.ortopt)
and small files built here with each other contrib op, imported with their meaning and checked against ONNX Runtime
on the same file (reference and MLX, input and final version)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from clirun import run
from onnx import TensorProto, helper, numpy_helper

from rlxviz.ir import Op
from rlxviz.models.onnx import OnnxImportError, load_onnx
from rlxviz.models.onnx.notes import imported_forms
from rlxviz.passes import Pipeline
from rlxviz.runtime import run_reference
from rlxviz.runtime.executor import MlxExecutor
from rlxviz.runtime.lowering import LoweringOptions
from rlxviz.session import check_fusion

CASES = Path(__file__).parent / "fixtures" / "onnx" / "cases"
MS = "com.microsoft"
B, S, H, N = 2, 6, 16, 2


def _check(path: Path, feeds: dict[str, np.ndarray], atol: float = 2e-5):
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    m = load_onnx(path, input_shapes={k: v.shape for k, v in feeds.items()})
    trace = Pipeline.canonical().run(m.graph)
    assert not [s.error for s in trace.steps if s.error]
    ex = MlxExecutor(LoweringOptions(fast_math=False))
    for g in (m.graph, trace.final):
        for got in (run_reference(g, feeds, m.weights), [np.asarray(o) for o in ex.run(g, feeds, m.weights)]):
            for a, b in zip(got, want, strict=True):
                np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), atol=atol, rtol=0)
    return m, trace


def _save(path: Path, nodes, inputs, outputs, inits) -> None:
    g = helper.make_graph(nodes, "contrib", inputs, outputs, inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]),
              str(path))


def _f(name: str, *shape: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _w(rng, name: str, *shape: int, scale: float = 0.3) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def test_deit_ort_optimizer_output_keeps_its_mlp_and_says_what_was_fused(capsys):
    """Was: each layer "attention only (no MLP)" (ORT's BiasGelu node has no module path), the prefusion unsaid."""
    d = dict(np.load(CASES / "deit.ortopt_io.npz"))
    feeds = {k: v for k, v in d.items() if not k.startswith("out:")}
    m, trace = _check(CASES / "deit.ortopt.onnx", feeds, atol=1e-5)
    for name, got in zip(m.meta["onnx_outputs"], run_reference(trace.final, feeds, m.weights), strict=True):
        np.testing.assert_allclose(got, d[f"out:{name}"], atol=1e-5, rtol=0)
    layers = check_fusion(trace, "deit").layers
    assert [lay.layer for lay in layers] == [0, 1]
    assert all(lay.architecture.kind == "pre_ln" and lay.fused for lay in layers)
    assert any(n.op == Op.FUSED_MATMUL_BIAS_ACT and n.attrs.get("activation") == "gelu" for n in trace.final)
    (line,) = imported_forms(m)
    assert "2 BiasGelu" in line and "4 SkipLayerNormalization" in line
    code, out, _ = run(capsys, "explain", CASES / "deit.ortopt.onnx")
    assert code == 0 and "already fused in the file (ONNX Runtime's optimizer)" in out
    assert "attention only" not in out


def test_deit_ortopt_exported_versions_load_in_onnx_runtime_with_its_numbers(tmp_path):
    """`rlxviz export` of the input and the final version: ONNX Runtime runs each, with the file's numbers."""
    from rlxviz.models.onnx.export import export_onnx

    d = dict(np.load(CASES / "deit.ortopt_io.npz"))
    feeds = {k: v for k, v in d.items() if not k.startswith("out:")}
    m = load_onnx(CASES / "deit.ortopt.onnx", input_shapes={k: v.shape for k, v in feeds.items()})
    for k, g in enumerate((m.graph, Pipeline.canonical().run(m.graph).final)):
        export_onnx(g, m.weights, tmp_path / f"v{k}.onnx")
        got = ort.InferenceSession(str(tmp_path / f"v{k}.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)
        for name, o in zip(m.meta["onnx_outputs"], got, strict=True):
            np.testing.assert_allclose(o, d[f"out:{name}"], atol=1e-5, rtol=0)


ORTOPT = Path(__file__).parent / "fixtures" / "onnx" / "ortopt"  # scripts/make_ortopt_cases.py


ZOO_OF = {"bert": "bert.ts-eager", "distilbert": "distilbert.ts-eager", "gpt2": "gpt2.ts-eager",
          "albert": "albert.ts-eager", "gemma": "gemma.dynamo-eager", "clip-text": "clip-text.dynamo-eager",
          "clip-vision": "clip-vision.dynamo-eager", "falcon": "falcon.dynamo-eager",
          "t5-encoder": "t5-encoder.ts-eager", "whisper-encoder": "whisper-encoder.dynamo-eager"}
"""Each ORT-optimized case and the zoo export it was made from (scripts/make_ortopt_cases.py)."""


@pytest.mark.parametrize("name", sorted(ZOO_OF))
def test_ort_transformer_optimizer_output_of_zoo_models(name):
    """ORT's transformer optimizer on ten zoo exports (TorchScript and dynamo; Attention, EmbedLayerNormalization,
    SkipLayerNormalization, SkipSimplifiedLayerNormalization, BiasGelu, FastGelu, Gelu, QuickGelu): ONNX Runtime's
    numbers on the optimized file, and every layer of the kind the export it came from has (the optimizer's nodes
    carry no module path: read from their values' names, their inputs' producers, ALBERT's per-call numbering),
    with the prefusions named."""
    d = dict(np.load(ORTOPT / f"{name}.ortopt_io.npz"))
    feeds = {k: v for k, v in d.items() if not k.startswith("out:")}
    m, trace = _check(ORTOPT / f"{name}.ortopt.onnx", feeds, atol=1e-5)
    for out, got in zip(m.meta["onnx_outputs"], run_reference(trace.final, feeds, m.weights), strict=True):
        np.testing.assert_allclose(got, d[f"out:{out}"], atol=1e-5, rtol=0)
    shapes = {k: v.shape for k, v in feeds.items()}
    orig = load_onnx(Path(__file__).parent / "fixtures" / "onnx" / "zoo" / f"{ZOO_OF[name]}.onnx", input_shapes=shapes)
    kinds = [lay.architecture.kind for lay in check_fusion(trace, name).layers]
    assert kinds == [lay.architecture.kind for lay in check_fusion(Pipeline.canonical().run(orig.graph), name).layers]
    assert len(kinds) == 2 and "attention_only" not in kinds and "no_attention" not in kinds
    ops = {n.op_type for n in onnx.load(str(ORTOPT / f"{name}.ortopt.onnx")).graph.node if n.domain == MS}
    (line,) = imported_forms(m)
    assert all(op in line for op in ops)


def test_attention_skip_layer_norm_fast_gelu_layer(tmp_path):
    """A BERT layer as ORT's optimizer writes it: Attention (packed QKV, raw 0/1 mask), SkipLayerNormalization with
    the output bias, FastGelu with its bias, SkipLayerNormalization with output 3 (the sum) read too."""
    rng = np.random.default_rng(0)
    inits = [_w(rng, "qkv_w", H, 3 * H), _w(rng, "qkv_b", 3 * H), _w(rng, "o_w", H, H), _w(rng, "o_b", H),
             _w(rng, "g1", H), _w(rng, "b1", H), _w(rng, "f1_w", H, 4 * H), _w(rng, "f1_b", 4 * H),
             _w(rng, "f2_w", 4 * H, H), _w(rng, "f2_b", H), _w(rng, "g2", H), _w(rng, "b2", H)]
    nodes = [helper.make_node("Attention", ["x", "qkv_w", "qkv_b", "mask"], ["a"], domain=MS, num_heads=N),
             helper.make_node("MatMul", ["a", "o_w"], ["o"]),
             helper.make_node("SkipLayerNormalization", ["o", "x", "g1", "b1", "o_b"], ["ln1"], domain=MS,
                              epsilon=1e-5),
             helper.make_node("MatMul", ["ln1", "f1_w"], ["f1"]),
             helper.make_node("FastGelu", ["f1", "f1_b"], ["act"], domain=MS),
             helper.make_node("MatMul", ["act", "f2_w"], ["f2"]),
             helper.make_node("SkipLayerNormalization", ["f2", "ln1", "g2", "b2", "f2_b"], ["y", "", "", "sum"],
                              domain=MS, epsilon=1e-5)]
    _save(tmp_path / "m.onnx", nodes, [_f("x", B, S, H), helper.make_tensor_value_info("mask", TensorProto.INT32,
                                                                                          [B, S])],
          [_f("y", B, S, H), _f("sum", B, S, H)], inits)
    mask = np.ones((B, S), np.int32)
    mask[1, 4:] = 0
    m, trace = _check(tmp_path / "m.onnx", {"x": rng.standard_normal((B, S, H)).astype(np.float32), "mask": mask})
    assert any(n.op == Op.ATTENTION and n.attrs["mask_fill"] == -10000.0 for n in m.graph)
    assert any(n.op == Op.GELU_TANH for n in m.graph)


@pytest.mark.parametrize(("form", "uni", "with_bias"), [
    ("2d", 1, False), ("3d", 0, False), ("3d", 1, False), ("lengths", 1, False), ("2d", 0, True), ("none", 1, True)])
def test_attention_masks_as_onnx_runtime_reads_them(tmp_path, form, uni, with_bias):
    """ORT Attention's mask forms together: a raw [B, T] or [B, S, T] mask, [B] key lengths, unidirectional, an
    attention_bias; each is (1 - mask) * -10000 plus -10000 on future keys plus the bias, as ORT's CPU kernel
    computes (no row fully masked: such a row is ill-conditioned at -10000 in f32)."""
    rng = np.random.default_rng(9)
    masks = {"2d": np.asarray([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]], np.int32),
             "3d": np.ones((B, S, S), np.int32), "lengths": np.asarray([4, 6], np.int32)}
    masks["3d"][0, :, 5] = 0
    masks["3d"][1, 3:, 1] = 0
    ins = [_f("x", B, S, H)]
    names = ["x", "qkv_w", "qkv_b", "", "", ""]
    feeds = {"x": rng.standard_normal((B, S, H)).astype(np.float32)}
    if form != "none":
        names[3] = "mask"
        feeds["mask"] = masks[form]
        ins.append(helper.make_tensor_value_info("mask", TensorProto.INT32, list(masks[form].shape)))
    if with_bias:
        names[5] = "ab"
        feeds["ab"] = rng.standard_normal((1, N, S, S)).astype(np.float32)
        ins.append(_f("ab", 1, N, S, S))
    inits = [_w(rng, "qkv_w", H, 3 * H), _w(rng, "qkv_b", 3 * H)]
    _save(tmp_path / "m.onnx", [helper.make_node("Attention", names, ["y"], domain=MS, num_heads=N,
                                                 unidirectional=uni)], ins, [_f("y", B, S, H)], inits)
    _check(tmp_path / "m.onnx", feeds)


def test_quick_gelu_skip_simplified_layer_norm(tmp_path):
    rng = np.random.default_rng(1)
    inits = [_w(rng, "g", H), _w(rng, "sb", H)]
    nodes = [helper.make_node("QuickGelu", ["x"], ["q"], domain=MS, alpha=1.702),
             helper.make_node("SkipSimplifiedLayerNormalization", ["q", "skip", "g", "sb"], ["y"], domain=MS,
                              epsilon=1e-6),
             helper.make_node("SimplifiedLayerNormalization", ["q", "g"], ["z"], epsilon=1e-6, axis=-1)]
    _save(tmp_path / "m.onnx", nodes, [_f("x", B, S, H), _f("skip", B, S, H)], [_f("y", B, S, H), _f("z", B, S, H)],
          inits)
    _check(tmp_path / "m.onnx", {k: rng.standard_normal((B, S, H)).astype(np.float32) for k in ("x", "skip")})


def test_bias_add_is_x_plus_bias_plus_skip(tmp_path):
    """BiasAdd has only a CUDA kernel in ONNX Runtime: checked against its documented formula."""
    rng = np.random.default_rng(5)
    bias = rng.standard_normal(H).astype(np.float32)
    _save(tmp_path / "m.onnx", [helper.make_node("BiasAdd", ["x", "bias", "skip"], ["y"], domain=MS)],
          [_f("x", B, S, H), _f("skip", B, S, H)], [_f("y", B, S, H)], [numpy_helper.from_array(bias, "bias")])
    feeds = {k: rng.standard_normal((B, S, H)).astype(np.float32) for k in ("x", "skip")}
    m = load_onnx(tmp_path / "m.onnx")
    np.testing.assert_allclose(run_reference(m.graph, feeds, m.weights)[0], feeds["x"] + bias + feeds["skip"],
                               atol=1e-6, rtol=0)


def test_embed_layer_norm_feeds_attention_by_key_lengths(tmp_path):
    """EmbedLayerNormalization (word + position + segment tables, mask -> mask_index lengths) feeding Attention
    with the [batch] mask_index (right padding)."""
    rng = np.random.default_rng(2)
    inits = [_w(rng, "word", 30, H), _w(rng, "pos", 16, H), _w(rng, "seg", 2, H), _w(rng, "g", H), _w(rng, "b", H),
             _w(rng, "qkv_w", H, 3 * H), _w(rng, "qkv_b", 3 * H)]
    nodes = [helper.make_node("EmbedLayerNormalization", ["ids", "segs", "word", "pos", "seg", "g", "b", "mask"],
                              ["e", "mi", "esum"], domain=MS, epsilon=1e-12),
             helper.make_node("Attention", ["e", "qkv_w", "qkv_b", "mi"], ["y"], domain=MS, num_heads=N)]
    ints = [helper.make_tensor_value_info(k, TensorProto.INT32, [B, S]) for k in ("ids", "segs", "mask")]
    _save(tmp_path / "m.onnx", nodes, ints, [_f("y", B, S, H), _f("esum", B, S, H),
                                             helper.make_tensor_value_info("mi", TensorProto.INT32, [B])], inits)
    mask = np.ones((B, S), np.int32)
    mask[0, 3:] = 0
    feeds = {"ids": rng.integers(0, 30, (B, S)).astype(np.int32), "segs": rng.integers(0, 2, (B, S)).astype(np.int32),
             "mask": mask}
    _check(tmp_path / "m.onnx", feeds)


@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_embedding_at_position_ids_then_multi_head_attention(tmp_path, interleaved):
    """RotaryEmbedding on Q and K ([B, S, N*h], position ids per batch row), then MultiHeadAttention with a bias."""
    rng = np.random.default_rng(3)
    hd = H // N
    inv = 1.0 / 10000 ** (np.arange(0, hd, 2) / hd)
    ang = np.arange(32)[:, None] * inv[None, :]
    inits = [numpy_helper.from_array(np.cos(ang).astype(np.float32), "cos"),
             numpy_helper.from_array(np.sin(ang).astype(np.float32), "sin"), _w(rng, "bias", 3 * H)]
    nodes = [helper.make_node("RotaryEmbedding", ["q", "pid", "cos", "sin"], ["qr"], domain=MS,
                              interleaved=interleaved, num_heads=N),
             helper.make_node("RotaryEmbedding", ["k", "pid", "cos", "sin"], ["kr"], domain=MS,
                              interleaved=interleaved, num_heads=N),
             helper.make_node("MultiHeadAttention", ["qr", "kr", "v", "bias"], ["y"], domain=MS, num_heads=N)]
    _save(tmp_path / "m.onnx", nodes, [_f("q", B, S, H), _f("k", B, S, H), _f("v", B, S, H),
                                       helper.make_tensor_value_info("pid", TensorProto.INT64, [B, S])],
          [_f("y", B, S, H)], inits)
    feeds = {k: rng.standard_normal((B, S, H)).astype(np.float32) for k in ("q", "k", "v")}
    feeds["pid"] = np.stack([np.arange(S), np.arange(S) + 7]).astype(np.int64)  # per-row positions
    m, _ = _check(tmp_path / "m.onnx", feeds)
    ropes = [n for n in m.graph if n.op == Op.ROPE]  # the rope op with one cos/sin table per batch row
    assert len(ropes) == 2 and all(m.graph[r.inputs[1]].shape == (B, S, H // N // 2) for r in ropes)


@pytest.mark.parametrize(("packed", "rotary", "interleaved"), [(False, 0, 0), (True, 1, 0), (False, 1, 1)])
def test_group_query_attention_on_a_prompt(tmp_path, packed, rotary, interleaved):
    """GroupQueryAttention (4 query heads, 2 kv heads) on a whole prompt, with its present K/V: separate or packed
    QKV, with and without ORT's rotary (half and interleaved; ORT's rotary needs a head size that is a multiple of
    16)."""
    rng = np.random.default_rng(6)
    nh, kvh, hd = 4, 2, 16
    inits = [numpy_helper.from_array(np.full(B, S - 1, np.int32), "seqlens"),
             numpy_helper.from_array(np.asarray(S, np.int32), "total")]
    ang = np.arange(16)[:, None] / 10000 ** (np.arange(0, hd, 2) / hd)[None, :]
    inits += [numpy_helper.from_array(np.cos(ang).astype(np.float32), "cos"),
              numpy_helper.from_array(np.sin(ang).astype(np.float32), "sin")]
    qkv = ["qkv", "", ""] if packed else ["q", "k", "v"]
    extra = ["cos", "sin"] if rotary else []
    nodes = [helper.make_node("GroupQueryAttention", [*qkv, "", "", "seqlens", "total", *extra], ["y", "pk", "pv"],
                              domain=MS, num_heads=nh, kv_num_heads=kvh, do_rotary=rotary,
                              rotary_interleaved=interleaved)]
    widths = {"qkv": (nh + 2 * kvh) * hd} if packed else {"q": nh * hd, "k": kvh * hd, "v": kvh * hd}
    _save(tmp_path / "m.onnx", nodes, [_f(k, B, S, w) for k, w in widths.items()],
          [_f("y", B, S, nh * hd), _f("pk", B, kvh, S, hd), _f("pv", B, kvh, S, hd)], inits)
    m, trace = _check(tmp_path / "m.onnx", {k: rng.standard_normal((B, S, w)).astype(np.float32)
                                            for k, w in widths.items()})
    (att,) = [n for n in m.graph if n.op == Op.ATTENTION]
    assert att.attrs["num_kv_heads"] == kvh and att.attrs["mask"] == "causal"
    assert sum(n.op == Op.ROPE for n in m.graph) == 2 * rotary


def test_attention_with_past_is_a_kv_cache_step(tmp_path):
    """GPT-2 decoding as ORT's optimizer writes it: Attention with past [2, B, N, P, h], a [B, P + S] mask and
    unidirectional, and its present output; the attention reads the concatenated K/V (a KV cache step)."""
    rng = np.random.default_rng(4)
    p = 3
    nodes = [helper.make_node("Attention", ["x", "w", "wb", "mask", "past"], ["y", "present"], domain=MS,
                              num_heads=N, unidirectional=1, name="attn")]
    _save(tmp_path / "m.onnx", nodes, [_f("x", B, S, H), helper.make_tensor_value_info("mask", TensorProto.INT32,
                                                                                          [B, p + S]),
                                       _f("past", 2, B, N, p, H // N)],
          [_f("y", B, S, H), _f("present", 2, B, N, S + p, H // N)], [_w(rng, "w", H, 3 * H), _w(rng, "wb", 3 * H)])
    mask = np.ones((B, p + S), np.int32)
    mask[1, :2] = 0  # left padding in the cache
    m, _ = _check(tmp_path / "m.onnx", {"x": rng.standard_normal((B, S, H)).astype(np.float32), "mask": mask,
                                        "past": rng.standard_normal((2, B, N, p, H // N)).astype(np.float32)})
    (att,) = [n for n in m.graph if n.op == Op.ATTENTION]
    assert m.graph[att.inputs[1]].shape == (B, p + S, H)


def test_multi_head_attention_with_past_key_and_value(tmp_path):
    """MultiHeadAttention of a decoder step: past_key / past_value [B, N, P, h], a [B, P + S] key padding mask,
    unidirectional, and present_key / present_value."""
    rng = np.random.default_rng(5)
    p, hd = 3, H // N
    nodes = [helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "mask", "", "pk", "pv"], ["y", "ok", "ov"],
                              domain=MS, num_heads=N, unidirectional=1)]
    _save(tmp_path / "m.onnx", nodes, [_f("q", B, S, H), _f("k", B, S, H), _f("v", B, S, H),
                                       helper.make_tensor_value_info("mask", TensorProto.INT32, [B, p + S]),
                                       _f("pk", B, N, p, hd), _f("pv", B, N, p, hd)],
          [_f("y", B, S, H), _f("ok", B, N, p + S, hd), _f("ov", B, N, p + S, hd)], [])
    feeds = {k: rng.standard_normal((B, S, H)).astype(np.float32) for k in "qkv"}
    feeds |= {k: rng.standard_normal((B, N, p, hd)).astype(np.float32) for k in ("pk", "pv")}
    feeds["mask"] = np.ones((B, p + S), np.int32)
    feeds["mask"][0, :1] = 0
    _check(tmp_path / "m.onnx", feeds)


def test_an_unmapped_contrib_form_is_one_line(tmp_path):
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Attention", ["x", "w"], ["y"], domain=MS, num_heads=N, do_rotary=1, name="attn")]
    _save(tmp_path / "m.onnx", nodes, [_f("x", B, S, H)], [_f("y", B, S, H)], [_w(rng, "w", H, 3 * H)])
    with pytest.raises(OnnxImportError, match=r"Attention node 'attn' \(opset 17\): do_rotary"):
        load_onnx(tmp_path / "m.onnx")
