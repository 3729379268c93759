"""Issue 37, the files engineers deploy (the zoo's deployed forms, `scripts/make_onnx_zoo.py` DEPLOY_FORMS and
`scripts/make_onnx_optimum.py`): the faults found running the product on them, each fixed as a kind.

* A QDQ file (`quantize_static`): ONNX Runtime's default session fuses its QDQ groups into integer kernels whose
  numbers differ from the file's own meaning; version 0 equals the file as written (graph optimizations off), and
  the check says so instead of "DIFFERS ... the import changed the numbers" (exit 1).
* Its Q/DQ nodes carry no module path: they take the path of the value they quantize, so a layer sees its
  quantized activations and its verdict names them (not "attention only (no MLP)", not a GELU rule to write).
* GPT-BigCode's multi-query attention as the dynamo exporter writes it (the unit head axis inserted before the
  c_attn split) packs, with and without a KV cache.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlxviz.ir import Graph, Op, parse_ir
from rlxviz.models.onnx_import import load_onnx
from rlxviz.passes import Pipeline
from rlxviz.runtime import run_reference

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"
CASES = Path(__file__).parent / "data" / "cases"
QDQ = sorted(p.stem for p in ZOO.glob("*.qdq.onnx"))


def _io(stem: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    d = dict(np.load(ZOO / f"{stem}.npz"))
    return ({k: v for k, v in d.items() if not k.startswith("out:")},
            {k[4:]: v for k, v in d.items() if k.startswith("out:")})


def test_the_zoo_has_each_deployed_form_for_three_architectures():
    for form in ("kv", "fp16", "qdq", "qdyn", "ortopt", "optimum", "optimum-past"):
        assert len(list(ZOO.glob(f"*.{form}.onnx"))) >= 3, form


@pytest.mark.parametrize("stem", QDQ[:2])
def test_a_qdq_file_is_judged_as_written_and_the_line_says_why(stem, capsys):
    from clirun import run

    feeds, _ = _io(stem)
    code, out, _ = run(capsys, "explain", ZOO / f"{stem}.onnx", "--inputs", ZOO / f"{stem}.npz")
    assert code == 0, out
    lines = [ln for ln in out.splitlines() if ln.startswith("version 0")]
    assert len(lines) == 2 and all("equals the ONNX model as written" in ln and "QDQ fusions" in ln
                                   for ln in lines), lines
    assert "DIFFERS" not in out


def test_expected_outputs_that_are_wrong_still_differ(tmp_path):
    """The excuse needs the stored outputs to equal ONNX Runtime's optimized session: outputs moved by 0.5 are
    not that session's, so version 0 DIFFERS from them."""
    from rlxviz.session.fidelity import against_expected

    stem = QDQ[0]
    feeds, want = _io(stem)
    m = load_onnx(ZOO / f"{stem}.onnx", input_shapes={k: v.shape for k, v in feeds.items()})
    bad = {k: v + 0.5 for k, v in want.items()}
    assert not against_expected(m, feeds, bad, "bad.npz").ok
    assert against_expected(m, feeds, want, "good.npz").ok


@pytest.mark.parametrize("stem", QDQ[:2])
def test_quantized_activations_belong_to_their_layer_and_name_its_verdict(stem):
    from rlxviz.session import check_fusion

    feeds, _ = _io(stem)
    m = load_onnx(ZOO / f"{stem}.onnx", input_shapes={k: v.shape for k, v in feeds.items()})
    quant = [n for n in m.graph if n.op == Op.CAST and n.dtype.value in ("u8", "i8")]
    assert quant and all(n.path for n in quant)  # every quantization step in a module (was: none)
    text = check_fusion(Pipeline.canonical().run(m.graph), m.name).render()
    assert "quantized activations" in text and "attention only (no MLP)" not in text, text
    # a GELU with rounded intermediates is no GELU to write: its lookalike is only quoted as not expected here
    said = [ln.strip() for ln in text.splitlines() if "no rule made it a candidate" in ln]
    assert all(ln.startswith("not expected here: ") and "activations are quantized" in ln for ln in said), said


def test_quant_paths_takes_the_quantized_values_path_and_leaves_other_nodes():
    import onnx
    from onnx import helper

    from rlxviz.models.onnx.handlers.quant import quant_paths

    nodes = [helper.make_node("DequantizeLinear", ["w_q", "s", "z"], ["w"], name="w_DequantizeLinear"),
             helper.make_node("MatMul", ["x", "w"], ["y"], name="/l.0/fc/MatMul"),
             helper.make_node("QuantizeLinear", ["y", "s", "z"], ["y_q"], name="y_QuantizeLinear"),
             helper.make_node("DequantizeLinear", ["y_q", "s", "z"], ["y_dq"], name="y_DequantizeLinear"),
             helper.make_node("Relu", ["y_dq"], ["r"], name="relu_at_root")]
    assert isinstance(nodes[0], onnx.NodeProto)
    got = quant_paths(nodes, ["", "l.0.fc", "", "", ""])
    assert got == ["l.0.fc", "l.0.fc", "l.0.fc", "l.0.fc", ""]  # the root's Relu keeps no path


def _weights(graph: Graph) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {n.attrs["name"]: (rng.standard_normal(n.shape) / np.sqrt(n.shape[0])).astype(np.float32)
            for n in graph if n.op == Op.PARAM}


@pytest.mark.parametrize("name", ["mqa-unit-axis-split", "mqa-unit-axis-split-kv-cache"])
def test_multi_query_split_after_a_unit_head_axis_packs_with_one_kv_head(name):
    g = parse_ir((CASES / f"{name}.rlx").read_text())
    trace = Pipeline.canonical().run(g)
    attn = [n for n in trace.final if n.op == Op.ATTENTION]
    assert len(attn) == 1 and attn[0].attrs["num_kv_heads"] == 1 and attn[0].attrs["num_heads"] == 4
    rules = {mt.rule for s in trace.steps for mt in s.matches}
    assert {"canonicalize_exported.unit_axis_head_split", "canonicalize_exported.unit_axis_one_head"} <= rules
    w = _weights(g)
    for seed in (1, 2):
        rng = np.random.default_rng(seed)
        feeds = {n.attrs["name"]: rng.standard_normal(n.shape).astype(np.float32) for n in g if n.op == Op.INPUT}
        for got, want in zip(run_reference(trace.final, feeds, w), run_reference(g, feeds, w), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_narrow_after_another_reshape_is_left_alone():
    """Control: the unit axis inserted at position 2 (`[B, S, 1, N]`) is another layout; neither rule fires."""
    text = (CASES / "mqa-unit-axis-split.rlx").read_text()
    text = text.replace("%3 = reshape(%2) {shape=[2, 1, 8, 48]} : f32[2, 1, 8, 48]",
                        "%3 = reshape(%2) {shape=[2, 8, 1, 48]} : f32[2, 8, 1, 48]")
    text = text.replace("f32[2, 1, 8, 32] @h.0.attn", "f32[2, 8, 1, 32] @h.0.attn")
    text = text.replace("f32[2, 1, 8, 8] @h.0.attn\n  %6", "f32[2, 8, 1, 8] @h.0.attn\n  %6")
    text = text.replace("%6 = narrow(%3) {axis=3, start=40, length=8} : f32[2, 1, 8, 8]",
                        "%6 = narrow(%3) {axis=3, start=40, length=8} : f32[2, 8, 1, 8]")
    text = text.replace("%9 = reshape(%5) {shape=[2, 1, 1, 8, 8]}", "%9 = reshape(%5) {shape=[2, 1, 1, 8, 8]}")
    g = parse_ir(text)
    trace = Pipeline.canonical().run(g)
    rules = {mt.rule for s in trace.steps for mt in s.matches}
    assert not rules & {"canonicalize_exported.unit_axis_head_split", "canonicalize_exported.unit_axis_one_head"}


@pytest.mark.parametrize("stem", ["ernie.fp16", "deit.fp16"])
def test_a_float16_scale_as_float16_rounds_1_over_sqrt_d_is_the_default(stem):
    """The exporter writes 1/sqrt(8) as float16 (0.353515625): the scores are scaled in float16 by that same number
    whether the attention holds it or its default, so the attention's scale is the default and the layer's block
    forms (ERNIE in half precision: FusedTransformerLayer, was refused at `default_scale`); numbers within float16's
    rounding of the file's."""
    from rlxviz.session import check_fusion

    feeds, want = _io(stem)
    m = load_onnx(ZOO / f"{stem}.onnx", input_shapes={k: v.shape for k, v in feeds.items()})
    trace = Pipeline.canonical().run(m.graph)
    blocks = [n for n in trace.final if n.op in (Op.FUSED_TRANSFORMER_LAYER, Op.FUSED_ATTENTION_BLOCK, Op.ATTENTION)]
    assert len(blocks) == 2 and all(n.attrs.get("scale") is None for n in blocks)
    assert all(layer.fused for layer in check_fusion(trace, m.name).layers)
    got = run_reference(trace.final, feeds, m.weights)[0]
    assert np.max(np.abs(got.astype(np.float32) - want["last_hidden_state"].astype(np.float32))) <= 2e-2


def test_a_score_term_is_no_linear_bias():
    """T5's decoder adds its position bias `[1, h, S, S]` to `q @ k^T`: attention scores and a score term, not a
    linear layer and its bias; fuse_matmul_bias_act made it a candidate and its `bias_rank` refusal was the decoder
    layers' first rejection. Now quiet; the layer names the attention's own blocker. A linear's 2-D bias
    (`x @ W + b[S, N]`, W a param) is still a named near-miss."""
    from rlxviz.passes.trace import layer_of

    stem = "t5.encdec"
    feeds, _ = _io(stem)
    m = load_onnx(ZOO / f"{stem}.onnx", input_shapes={k: v.shape for k, v in feeds.items()})
    trace = Pipeline.canonical().run(m.graph)
    score_bias = [r for s in trace.steps for r in s.rejections
                  if r.rule == "fuse_matmul_bias_act.bias_act" and r.guard == "bias_rank"]
    assert score_bias == [], [r.message for r in score_bias]
    assert any(layer_of(n.path) is not None for n in m.graph)
    g = parse_ir("""graph linear_2d_bias {
  %0 = input {name="x"} : f32[2, 8, 16]
  %1 = param {name="w"} : f32[16, 16] @fc
  %2 = matmul(%0, %1) : f32[2, 8, 16] @fc
  %3 = param {name="b"} : f32[8, 16] @fc
  %4 = add(%2, %3) : f32[2, 8, 16] @fc
  return %4
}""")
    refused = [r.guard for s in Pipeline.canonical().run(g).steps for r in s.rejections
               if r.rule == "fuse_matmul_bias_act.bias_act"]
    assert "bias_rank" in refused


@pytest.mark.parametrize("stem,named", [("deepseek-v3.dynamo-eager", True), ("phi.dynamo-eager", False),
                                        ("glm.dynamo-eager", False)])
def test_multi_head_latent_attention_is_named_and_a_partial_rotary_is_not_taken_for_it(stem, named):
    """DeepSeek's MLA (`q = concat(q_nope, q_rope)` along head_dim, the rotated part second) stays unpacked and is
    named `latent_heads` with its kind; a partial rotary (`concat(rotated, pass)`, Phi, GLM) is not that form (it
    packs, no such refusal)."""
    feeds, _ = _io(stem)
    m = load_onnx(ZOO / f"{stem}.onnx", input_shapes={k: v.shape for k, v in feeds.items()})
    trace = Pipeline.canonical().run(m.graph)
    latent = [r for s in trace.steps for r in s.rejections if r.guard == "latent_heads"]
    assert bool(latent) == named, [r.message for r in latent]
    if named:
        assert "multi-head latent attention" in latent[0].message
        assert not any(n.op == Op.ATTENTION for n in trace.final)
    else:
        assert any(n.op == Op.ATTENTION for n in trace.final)
