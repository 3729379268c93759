"""A layer's kind is read through QDQ quantization steps and float casts (issue 37, item 3: a true verdict).

`quantize_static` puts a QuantizeLinear -> DequantizeLinear step on each activation: between a post-LN layer's
residual add and its LayerNorm, inside a decomposed RMSNorm, after a SiLU. The classifier must read the float model's
structure through them (`passes/quant_steps.py`), for every kind; the variants here are built the way the importer
writes the steps (`round_half_even` is the importer's own), and the zoo's QDQ and dynamically quantized files must get
the kind of their float export.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from rlxviz.ir import Builder, DType, Graph
from rlxviz.models.onnx import load_onnx
from rlxviz.models.onnx.handlers.quant import round_half_even
from rlxviz.passes import Pipeline
from rlxviz.passes.architecture import classify_layer
from rlxviz.passes.quant_steps import origin, readers, step_source, without_quant_steps
from rlxviz.passes.why.facts import layer_indices
from rlxviz.passes.why.text import fused_list
from rlxviz.passes.why.verdict import RunVerdict

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"


def qdq(b: Builder, x: int, scale: float = 0.05, zp: float = 128.0) -> int:
    """`DequantizeLinear(QuantizeLinear(x))` (u8, per tensor) as the importer writes it."""
    r = round_half_even(SimpleNamespace(b=b), b.div(x, scale))
    q = b.cast(b.minimum(b.maximum(b.add(r, zp), 0.0), 255.0), DType.u8)
    return b.mul(b.sub(b.cast(q, DType.f32), zp), scale)


def _id(b: Builder, x: int) -> int:
    return x


def layer_model(kind: str, step=qdq, layers: int = 2, h: int = 32) -> Graph:
    """Two layers of `kind`, with `step` (a QDQ step, a cast round trip) on every activation a quantizer rounds:

    * `post_ln` (BERT): `ln(x + attn(x))`, `ln(h + mlp(h))`, the step between each residual add and its norm;
    * `pre_ln` (GPT-2): `x + attn(ln(x))`, `x + mlp(ln(x))`, the step after each norm and on the residual stream
      (the next norm and the next residual add read the dequantized sum);
    * `llama`: decomposed RMSNorms with the step after `x * x` and after the mean, a SwiGLU MLP with the step after
      the SiLU and the product."""
    b = Builder(f"{kind}_steps")
    x = b.input("x", (2, 6, h))
    for i in range(layers):
        with b.scope(f"layer.{i}"):
            def p(name, *shape, i=i):
                return b.param(f"layer.{i}.{name}", shape)

            def lin(t, name, n_in, n_out):
                return b.linear(t, p(f"{name}.weight", n_in, n_out), p(f"{name}.bias", n_out))

            def ln(t, name):
                return b.layer_norm(t, p(f"{name}.weight", h), p(f"{name}.bias", h), 1e-5)

            def rms(t, name):
                ms = step(b, b.reduce_mean(step(b, b.mul(t, t)), (-1,), keepdims=True))
                return b.mul(b.mul(t, b.rsqrt(b.add(ms, 1e-6))), p(f"{name}.weight", h))

            def attn(t):
                qkv = step(b, lin(t, "qkv", h, 3 * h))
                q, k, v = (b.narrow(qkv, 2, j * h, h) for j in range(3))
                a = b.attention(q, k, v, num_heads=4, head_dim=h // 4, mask_kind="none")
                return step(b, lin(step(b, a), "o", h, h))

            if kind == "post_ln":
                x = ln(step(b, b.add(x, attn(x))), "ln_1")
                m = step(b, b.gelu(step(b, lin(x, "fc1", h, 4 * h))))
                x = ln(step(b, b.add(x, step(b, lin(m, "fc2", 4 * h, h)))), "ln_2")
            elif kind == "pre_ln":
                x = step(b, b.add(x, attn(step(b, ln(x, "ln_1")))))
                m = step(b, b.gelu(step(b, lin(step(b, ln(x, "ln_2")), "fc1", h, 4 * h))))
                x = step(b, b.add(x, step(b, lin(m, "fc2", 4 * h, h))))
            else:
                x = step(b, b.add(x, attn(step(b, rms(x, "norm_1")))))
                n = step(b, rms(x, "norm_2"))
                g = step(b, b.mul(step(b, b.silu(lin(n, "gate", h, 2 * h))), lin(n, "up", h, 2 * h)))
                x = step(b, b.add(x, step(b, lin(g, "down", 2 * h, h))))
    b.output(x)
    return b.build()


@pytest.mark.parametrize("kind", ["post_ln", "pre_ln", "llama"])
def test_a_layer_with_qdq_steps_has_the_kind_of_its_float_layer(kind):
    float_g, quant_g = layer_model(kind, _id), layer_model(kind)
    for layer in (0, 1):
        want, got = classify_layer(float_g, layer), classify_layer(quant_g, layer)
        assert want.kind == kind, want
        assert got.kind == kind, got
        assert got.norm == want.norm and got.swiglu == want.swiglu, got
        assert want.quantized == 0 and got.quantized > 0, got
        assert "quantized activations" in got.description


def test_a_cast_round_trip_between_the_residual_add_and_its_norm_keeps_post_ln():
    def round_trip(b: Builder, x: int) -> int:
        return b.cast(b.cast(x, DType.f16), DType.f32)

    g = layer_model("post_ln", round_trip)
    arch = classify_layer(g, 0)
    assert arch.kind == "post_ln" and arch.quantized == 0, arch
    assert any("feeds only layer_norm" in e and "through cast" in e for e in arch.evidence), arch.evidence


def test_a_quantized_sum_read_elsewhere_too_is_no_post_ln_sum():
    """The step is seen through, not dropped: a residual sum whose dequantized copy a second add also reads is the
    pre-LN residual stream."""
    b = Builder("stream")
    x, w = b.input("x", (2, 4, 8)), b.param("w", (8, 8))
    with b.scope("layer.0"):
        s = b.add(x, b.matmul(x, w))
        d = qdq(b, s)
        n = b.layer_norm(d, b.param("g", (8,)), b.param("bb", (8,)), 1e-5)
        y = b.add(d, b.matmul(n, w))
    b.output(y)
    g = b.build()
    assert step_source(g, g[d]) == s and origin(g, d) == s
    read, output = readers(g, s)
    assert {u.id for u in read} == {n, y}
    assert not output
    view = without_quant_steps(g)
    assert view is not None and not any(m.op.value == "cast" for m in view)
    assert view[n].inputs[0] == s and view[y].inputs[0] == s


def test_a_graph_without_steps_has_no_view():
    assert without_quant_steps(layer_model("post_ln", _id)) is None


def test_repeated_fused_ops_of_one_pass_are_one_item():
    done = ["matmul %7 (fuse_shared_input_matmul)"] + [f"ElementwiseRegion %{i} (mark_elementwise_regions)"
                                                       for i in range(20, 77)] + ["gelu %90 (canonicalize_gelu)"]
    line = fused_list(done)
    assert line == ("matmul %7 (fuse_shared_input_matmul), ElementwiseRegion x57 (mark_elementwise_regions; %20 ... "
                    "%76), gelu %90 (canonicalize_gelu)")
    few = done[:4]  # 3 of a kind: listed
    assert fused_list(few) == ", ".join(few)


def _kinds(path: Path) -> list[str]:
    io = np.load(path.with_suffix(".npz"))
    g = load_onnx(path, input_shapes={k: io[k].shape for k in io.files if not k.startswith("out:")}).graph
    return [classify_layer(g, k).kind for k in layer_indices(g)]


def test_ernie_qdq_is_post_ln_and_its_verdict_names_the_quantization():
    io = np.load(ZOO / "ernie.qdq.npz")
    g = load_onnx(ZOO / "ernie.qdq.onnx", input_shapes={k: io[k].shape for k in io.files
                                                           if not k.startswith("out:")}).graph
    v = RunVerdict.of(Pipeline.canonical().run(g))
    assert v.ok
    for lv in v.layers:
        assert lv.architecture.kind == "post_ln" and lv.architecture.quantized > 0
        assert not lv.bert_style  # FusedTransformerLayer is not expected of a quantized layer: its parts are
        assert any(x.startswith("FusedTransformerLayer (fuse_transformer_layer): the layer's activations are "
                                "quantized") for x in lv.not_expected), lv.not_expected
        text = lv.render()
        assert "layer kind: post-LN" in text and "FusedTransformerLayer is not legal for this layer" in text
        assert "ElementwiseRegion x" in text.splitlines()[0]
        verbose = lv.render(verbose=True)  # the app's Why tab: the same grouped line, then each rule's outcome
        assert verbose.splitlines()[0] == text.splitlines()[0] and len(verbose) > len(text)


@pytest.mark.slow
@pytest.mark.sweep  # only computes: `make test` runs it on every core
@pytest.mark.parametrize("stem", sorted({p.name.split(".")[0] for p in ZOO.glob("*.q*.onnx")}))
def test_zoo_quantized_files_have_the_kind_of_their_float_export(stem):
    want = _kinds(ZOO / f"{stem}.dynamo-eager.onnx")
    for form in ("qdq", "qdyn"):
        if (ZOO / f"{stem}.{form}.onnx").exists():
            assert _kinds(ZOO / f"{stem}.{form}.onnx") == want, (stem, form)
