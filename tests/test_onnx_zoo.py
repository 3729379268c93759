"""The ONNX zoo (tests/fixtures/onnx/zoo, written by scripts/make_onnx_zoo.py): tiny random-weight Hugging Face models
exported the ways users export them (torch.onnx dynamo with eager and with sdpa attention, the TorchScript exporter),
each with PyTorch's own output. Every file imports; version 0 and the final version give PyTorch's numbers (NumPy
reference and MLX, 1e-5); attention packs in every file whose scores are plain `QK^T * scale + mask`, and where it does
not, `explain` names what blocks it on the layer's line."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from rlxviz.ir import Op
from rlxviz.models.onnx import load_onnx
from rlxviz.passes import Pipeline
from rlxviz.runtime import run_reference
from rlxviz.runtime.executor import MlxExecutor
from rlxviz.runtime.lowering import LoweringOptions
from rlxviz.session import check_fusion

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"
FILES = sorted(p.stem for p in ZOO.glob("*.onnx"))
TOL = 1e-5
PACKED_OPS = (Op.ATTENTION, Op.FUSED_ATTENTION_BLOCK, Op.FUSED_TRANSFORMER_LAYER)

# Scores that carry a term of the model's own (not `QK^T * scale + mask`): attention stays unpacked there. (T5's
# relative position bias packs: it is one additive operand with the padding mask, canonicalize_exported.bias_then_mask.)
MODEL_TERMS = {
    "deberta-v2.dynamo-eager": "disentangled attention: the content-to-position term reads Q's heads",
}

# What explain must say for a term of the model's own (`passes/score_terms.py`): the term's kind, named.
NAMED_TERMS = {  # the term is the model's own (nothing to change in the model): a gap in rlxviz's ops, named on its
    # gap line (`gap in rlxviz's ops: fuse_sdpa.hf_attention (score_term) @ %N (PATH): score term ...`)
    "gemma2.dynamo-eager": "(score_term) @ %72 (model.layers.0.self_attn): score term soft-cap: tanh(s / 50) * 50",
    "deberta-v2.dynamo-eager": "(score_term) @ %78 (model.encoder.layer.0.attention.self): score term content-position "
                               "term",
    "gpt-oss.dynamo-eager": "(score_term) @ %",
}
MODEL_TERMS.update({"gemma2.dynamo-eager": "attention soft-cap tanh(s / 50) * 50 (Gemma 2)",
                    "gpt-oss.dynamo-eager": "attention sinks: a per-head logit concatenated to the scores"})
# Not plain attention by the file's own design: QDQ rounds Q, K, the scores and V to 8 bits (a packed attention
# would skip those roundings); ConvBERT concatenates its attention heads with span-based convolution heads before
# the head merge.
MODEL_TERMS.update({s: "quantized attention: QuantizeLinear/DequantizeLinear round its operands"
                    for s in ("granite.qdq", "ernie.qdq", "deit.qdq", "convbert.qdq")})
MODEL_TERMS.update({f"convbert.{f}": "ConvBERT: attention heads concatenated with convolution heads"
                    for f in ("dynamo-eager", "optimum", "ortopt", "qdq", "qdyn")})
NAMED_TERMS.update({s: "quantized activations" for s in ("granite.qdq", "ernie.qdq", "deit.qdq", "convbert.qdq")})
# rlxviz's own gaps (plain attention left unpacked) would be listed here, named by the layer's first rejection, so a
# fix flags them (the test fails when one packs). None is left: OLMo in float16 (RoPE in float32 between casts,
# `rope_casts`), Cohere with a cache (an interleaved RoPE at S = 1 or with per-row tables, `rope_pairs`) and T5's
# decoder (position bias plus a folded causal mask table, `bias_then_table_mask`) pack: `test_the_closed_gaps_pack`.
MODEL_TERMS["deepseek-v3.dynamo-eager"] = "multi-head latent attention, q = concat(q_nope, q_rope): named, unpacked"
NAMED_TERMS.update({"deepseek-v3.dynamo-eager": "(latent_heads) @ %93 (model.layers.0.self_attn): multi-head latent"})


DEPLOYED = (".kv", ".fp16", ".qdq", ".qdyn", ".ortopt", ".optimum", ".optimum-past")
"""The deployed-file forms (issue 37; `make_onnx_zoo.DEPLOY_FORMS`, `make_onnx_optimum.py`): a decode step with a
KV cache, float16, QDQ and dynamic quantization, ONNX Runtime's optimizer output, optimum's exports."""


def _form(stem: str) -> str:
    return stem.split(".", 1)[1]


def _tol(stem: str) -> float:
    """float16 files: the half-precision rounding of 2 layers (ONNX Runtime and the reference round alike, not
    identically); every other file 1e-5."""
    return 2e-2 if _form(stem) == "fp16" else TOL


def _as_written(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """ONNX Runtime's outputs on the file with graph optimizations off: the file's own meaning (its optimized session
    fuses QDQ groups into integer kernels whose numbers differ: `session.fidelity.optimized_differs`)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)


@cache
def _load(stem: str):
    """(model, feeds, the wanted outputs in the model's output order, canonical trace). The wanted outputs are the
    npz's `out:NAME` (PyTorch's, or ONNX Runtime's on the file for derived forms), a QDQ file's those of the file as
    written (`_as_written`)."""
    io = dict(np.load(ZOO / f"{stem}.npz"))
    feeds = {k: v for k, v in io.items() if not k.startswith("out:")}
    m = load_onnx(ZOO / f"{stem}.onnx", input_shapes={k: v.shape for k, v in feeds.items()})
    names = m.meta["onnx_outputs"]
    want = _as_written(ZOO / f"{stem}.onnx", feeds) if _form(stem) == "qdq" else [io[f"out:{k}"] for k in names]
    return m, feeds, want, Pipeline.canonical().run(m.graph)


def _err(got: list, want: list) -> float:
    assert [np.shape(g) for g in got] == [np.shape(w) for w in want]
    return max(float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64)))) for g, w in
               zip(got, want, strict=True))


def test_the_zoo_covers_the_architectures_and_forms_the_issue_names():
    arch = {s.split(".")[0] for s in FILES}
    need = {"bert", "roberta", "distilbert", "deberta-v2", "modernbert", "t5-encoder", "bart-encoder",
            "whisper-encoder", "clip-text", "clip-vision", "vit", "gpt2", "gpt-neox", "falcon", "llama", "qwen2",
            "mistral", "phi3", "gemma", "bloom"}
    assert need <= arch
    assert {"qwen3", "gemma2", "albert", "mpnet", "olmo2", "qwen2-moe", "swin", "gpt-oss"} <= arch  # QK-norm, caps, MoE
    assert len({s for s in FILES if s.endswith(".ts-eager")}) >= 6
    assert len({s for s in FILES if s.endswith(".dynamo-sdpa")}) >= 15
    assert sum((ZOO / f"{s}.onnx").stat().st_size for s in FILES) < 50e6  # 42 MB with the deployed forms
    record = json.loads((ZOO / "zoo.json").read_text())
    assert set(record["files"]) == set(FILES)  # every file is recorded with its config and versions


@pytest.mark.parametrize("stem", FILES)
def test_every_zoo_version_gives_pytorchs_numbers_on_the_reference_mlx_and_onnx_runtime(stem):
    """The input graph and the canonical pipeline's final version, each run by the reference interpreter, by MLX
    (the exact lowering) and by ONNX Runtime on the version exported back to ONNX, give the file's expected outputs.
    One test per file, so the file is imported and its pipeline run once (`_load`)."""
    import onnxruntime as ort

    from rlxviz.models.onnx.export import export_onnx

    m, feeds, want, trace = _load(stem)
    for version in (m.graph, trace.final):
        which = "input" if version is m.graph else "final"
        got = run_reference(version, feeds, m.weights)
        assert _err(got, want) <= _tol(stem), (stem, which, "reference")
        got = [np.asarray(o) for o in MlxExecutor(LoweringOptions(fast_math=False)).run(version, feeds, m.weights)]
        assert _err(got, want) <= _tol(stem), (stem, which, "MLX")
        sess = ort.InferenceSession(export_onnx(version, m.weights).SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        names = {i.name for i in sess.get_inputs()}
        got = sess.run(None, {k: v for k, v in feeds.items() if k in names})
        assert _err(got, want) <= max(1e-4, _tol(stem)), (stem, which, "ONNX Runtime on the export")


@pytest.mark.parametrize("stem", FILES)
def test_attention_packs_where_the_scores_are_plain_and_explain_names_the_block_elsewhere(stem):
    m, _, _, trace = _load(stem)
    packed = any(n.op in PACKED_OPS for n in trace.final)
    if stem not in MODEL_TERMS:
        assert packed, stem
        return
    assert not packed, f"{stem} packs now: move it out of MODEL_TERMS"
    check = check_fusion(trace, m.name)
    text = check.render()
    assert any(f"{w}:" in text for w in ("first rejection", "also unrecognized", "not expected here",
                                         "gap in rlxviz's ops")), text  # named (a gap under its own heading)
    assert NAMED_TERMS.get(stem, "") in text, text


CLOSED_GAPS = {"olmo.fp16": ("fuse_sdpa.cast_rotation", "fuse_sdpa.cast_heads", "fuse_sdpa.rope_heads"),
               "cohere.kv": ("fuse_sdpa.rope_pairs",), "cohere.optimum-past": ("fuse_sdpa.rope_pairs",),
               "t5.encdec": ("canonicalize_exported.bias_then_table_mask",)}
"""The gaps issue 37's zoo found (plain attention left unpacked), each closed by exact canonicalizations: the
rules that now run on the file."""


@pytest.mark.parametrize("stem", sorted(CLOSED_GAPS))
def test_the_closed_gaps_pack_every_attention_with_their_canonicalizations(stem):
    """Every softmax of the file is inside a packed attention (T5: encoder, decoder self- and cross-attention), the
    canonicalizations that close the gap matched, and every layer is fused as expected."""
    m, _, _, trace = _load(stem)
    assert not [n for n in trace.final if n.op == Op.SOFTMAX], stem
    rules = {x.rule for s in trace.steps for x in s.matches}
    assert set(CLOSED_GAPS[stem]) <= rules, rules
    check = check_fusion(trace, m.name)
    assert check.ok, check.render()


# Additive score terms that pack as the attention's operand, named by kind on the kept-operand line.
KEPT_TERMS = {"bloom.dynamo-eager": "score term ALiBi: per-head slopes"}


@pytest.mark.parametrize("stem", sorted(KEPT_TERMS))
def test_an_additive_score_term_that_packs_is_named_by_its_kind(stem):
    _, _, _, trace = _load(stem)
    kept = [r.message for s in trace.steps for r in s.rejections
            if r.guard in ("mask_model_term", "where_mask_additive") and "score term" in r.message]
    assert kept and all(KEPT_TERMS[stem] in m for m in kept), kept


@pytest.mark.parametrize("stem", [s for s in FILES if s.startswith("swin")])
def test_swins_window_padding_is_an_ir_pad_that_runs_on_mlx(stem):
    """Swin pads its feature map to whole windows with ONNX Pad: an IR `pad` (no host node left; zero pads are no
    node at all), with PyTorch's numbers on MLX (checked for every file above). `swin-pad` (windows of 3 on 8x8 and
    4x4 maps) pads in both stages."""
    m, _, _, trace = _load(stem)
    assert not [n for n in m.graph if n.op == Op.ONNX_OP] and not [n for n in trace.final if n.op == Op.ONNX_OP]
    if stem.startswith("swin-pad."):
        assert sum(1 for n in m.graph if n.op == Op.PAD) >= 2, stem


@pytest.mark.parametrize("stem", [s for s in FILES if s.startswith("albert.")])
def test_albert_s_one_layer_module_called_twice_is_two_layers_that_each_fuse(stem):
    """ALBERT calls one layer module per layer and the exporter gives each call the same path: the k-th call is
    numbered layer k (`albert_layers.0@k`, models/module_calls.py), so explain answers per layer: layers 0 and 1,
    each with its attention packed and its own fused ops, and the same named guard on both (tanh-GELU, a gap in
    rlxviz's ops)."""
    from rlxviz.passes.trace import layer_of
    from rlxviz.session.loading import layer_indices

    m, _, _, trace = _load(stem)
    assert layer_indices(m.graph) == (0, 1)
    for k in (0, 1):
        fused = {n.op for n in trace.final if layer_of(n.path) == k}
        assert fused & set(PACKED_OPS) and Op.FUSED_MATMUL_BIAS_ACT in fused, (k, fused)
    text = check_fusion(trace, m.name).render()
    assert "no node path names a layer" not in text
    # tanh-GELU: a gap in rlxviz's ops on both layers, named on each layer's gap line
    assert text.count("(fc1_activation) @ %") == 2 and "layer 0:" in text and "layer 1:" in text, text
