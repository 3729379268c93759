"""A near-miss binds each role to the node that plays it (issue 39: on bart-full.onnx, `rlxviz explain` and the Why
tab said of each decoder layer "fc1 (node 367, decoder.layers.0.encoder_attn.q_proj) is FusedMatMulBiasAct(
activation=None), followed by a separate attention": FusedTransformerLayer's `fc1_is_fused_linear` bound FFN.1 to the
first linear reading h1, which in a decoder layer is the cross-attention's q_proj, and `fc1_activation` then judged
q_proj as an MLP linear).

FFN.1 is the linear reading h1 whose output, past its activation, feeds FFN.2 (`rules.layer.feeds_linear`, the
step's `User.plays`): a user of h1 that fits FFN.1's pattern but feeds anything else (an attention, the graph
outputs) is never bound as fc1. With another that does, that one is bound; with none, the step fails at h1 naming
the users it met (a structure refusal, not a guard about a node in a role it does not have).

Variants of our own: the BART-like encoder-decoder built from primitives (`test_encoder_decoder.encoder_decoder`),
a post-LN layer whose h1 also feeds a linear probe (listed before FFN.1, with and without an activation after it:
its `fc1_activation`, `fc1_single_user` and `fc1_not_output` were reported of the probe), and decoder-only and
one-stack models where every binding of fc1 must still be an MLP linear (LLaMA's block, the tanh-GELU BERT whose
fc1_activation refusal stays as it was).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_encoder_decoder import encoder_decoder

from rlxviz.ir import Graph, Op, parse_ir
from rlxviz.ir.ops import ACTIVATIONS
from rlxviz.models import VARIANTS, load_model
from rlxviz.models.onnx import load_onnx
from rlxviz.passes import Pipeline
from rlxviz.passes.activations import activation_of
from rlxviz.passes.trace import Trace, layer_of

HERE = Path(__file__).parent
LAYER = "fuse_transformer_layer.bert_post_ln"
CONTROL = (HERE / "data" / "cases" / "n4-06c-deepnorm-alpha1-control.rlx").read_text()


def _with_probe(act: str | None) -> Graph:
    """The post-LN control layer with a linear probe on h1 (%42), written before FFN.1 (so h1's first linear user),
    returned as a second output; `act`: an activation after it (not on the epilogue allow-list: kept separate)."""
    probe = ('  %60 = param {name="probe.weight"} : f32[64, 8] @encoder.layer.0\n'
             '  %61 = matmul(%42, %60) : f32[2, 8, 8] @encoder.layer.0\n'
             '  %62 = param {name="probe.bias"} : f32[8] @encoder.layer.0\n'
             '  %63 = add(%61, %62) : f32[2, 8, 8] @encoder.layer.0\n')
    out = "%63"
    if act:
        probe += f"  %64 = {act}(%63) : f32[2, 8, 8] @encoder.layer.0\n"
        out = "%64"
    fc1 = '  %43 = param {name="fc1.weight"}'
    text = CONTROL.replace(fc1, probe + fc1).replace("return %55", f"return %55, {out}")
    assert text.count("probe.weight") == 1 and f"return %55, {out}" in text
    return parse_ir(text)


def _misbound(trace: Trace) -> list[tuple[str, int, str]]:
    """(guard, node, path) of every refusal or match of the layer rule whose fc1 is no MLP linear: a node none of
    whose users is an activation (an op, or one written as primitives) or a linear reading it."""
    out = []
    for s in trace.steps:
        for r in (*s.rejections, *s.matches):
            if r.rule != LAYER or "fc1" not in r.bindings:
                continue
            g, fc1 = s.before, r.bindings["fc1"]
            users = g.users(fc1)
            mlp = (any(u.op in ACTIVATIONS for u in users) or activation_of(g, fc1) is not None
                   or any(u.op in (Op.FUSED_MATMUL_BIAS_ACT, Op.MATMUL) and u.inputs[0] == fc1 for u in users))
            if not mlp:
                out.append((getattr(r, "guard", "matched"), fc1, g[fc1].path))
    return out


def _decoder_refusals(trace: Trace) -> list:
    """The layer rule's headline refusals in decoder layers that got as far as h1 (the candidate anchored at the
    self-attention; the cross-attention's is refused at its anchor)."""
    return [r for r in trace.rejections if r.rule == LAYER and r.headline and "ln1" in r.bindings
            and (lay := layer_of(r.path)) is not None and lay.stack.endswith("decoder")]


def _check_decoder_layers(trace: Trace, n: int) -> None:
    refused = _decoder_refusals(trace)
    assert len(refused) == n, [(r.guard, r.path) for r in trace.rejections if r.rule == LAYER]
    for r in refused:
        assert "fc1" not in r.bindings, (r.guard, r.bindings)  # no node of a decoder layer plays FFN.1 on h1
        assert r.guard == "fc1_is_fused_linear" and r.stage == "structure", (r.guard, r.message)
        q = r.offending[0]
        g = next(s.before for s in trace.steps if r in s.rejections)
        assert "encoder_attn" in g[q].path, g[q].path  # the cross-attention's q_proj
        assert not any(u.op in ACTIVATIONS or u.op is Op.FUSED_MATMUL_BIAS_ACT for u in g.users(q))  # attention
        # the words name what the node met: h1's users, and that the linear reading it is not FFN.1
        assert f"(node {q}, " in r.message and "fits its pattern but is not one that feeds FFN.2" in r.message
        assert "followed by a separate attention" not in r.message
    assert not [r for r in trace.rejections if r.rule == LAYER and r.guard == "fc1_activation"
                and (lay := layer_of(r.path)) is not None and lay.stack.endswith("decoder")]
    assert _misbound(trace) == []


def test_bart_full_decoder_layers_bind_no_cross_attention_as_fc1():
    cases = HERE / "fixtures" / "onnx" / "cases"
    io = np.load(cases / "bart-full_io.npz")
    m = load_onnx(cases / "bart-full.onnx", input_shapes={k: io[k].shape for k in io.files if not k.startswith("out:")})
    trace = Pipeline.canonical().run(m.graph)
    _check_decoder_layers(trace, 2)
    # the encoder layers still fuse: their fc1 is FFN.1
    assert sum(n.op is Op.FUSED_TRANSFORMER_LAYER for n in trace.final) == 2


def test_own_bart_like_decoder_layers_bind_no_cross_attention_as_fc1():
    g = encoder_decoder("bart", n_enc=1, n_dec=2)
    trace = Pipeline.canonical().run(g)
    _check_decoder_layers(trace, 2)


@pytest.mark.parametrize("act", [None, "relu"], ids=["probe", "probe_relu"])
def test_a_linear_probe_on_h1_is_not_bound_as_fc1(act):
    g = _with_probe(act)
    trace = Pipeline.canonical().run(g)
    assert _misbound(trace) == []
    refused = [r for r in trace.rejections if r.rule == LAYER]
    assert refused and refused[0].guard == "h1_user_count", [(r.guard, r.message) for r in refused]
    # FFN.1 is the linear that feeds the GELU's FFN.2, and nothing is said of the probe as fc1
    fc1 = refused[0].bindings["fc1"]
    step = next(s for s in trace.steps if refused[0] in s.rejections)
    assert step.before[fc1].attrs.get("activation") == "gelu", step.before[fc1]
    assert not {r.guard for r in refused} & {"fc1_activation", "fc1_single_user", "fc1_not_output"}


@pytest.mark.parametrize("preset, variant", [("llama-block", None), ("bert-tiny", "tanh_gelu"),
                                             ("bert-tiny", "extra_h1_user"), ("bert-tiny", None)])
def test_every_fc1_binding_is_an_mlp_linear(preset, variant):
    m = load_model(preset, seq=8, variant=VARIANTS[variant] if variant else None)
    trace = Pipeline.canonical().run(m.graph)
    assert _misbound(trace) == []
    if variant == "tanh_gelu":  # the real FFN.1 is still judged by its activation, as before
        r = next(r for r in trace.rejections if r.rule == LAYER and r.headline)
        assert r.guard == "fc1_activation" and "gelu_tanh" in r.message, r.message


def test_feeds_linear_reads_past_an_activation_written_as_primitives():
    """FFN.1 followed by erf GELU as primitives (x * 0.5 * (1 + erf(x / sqrt 2))) still feeds FFN.2."""
    from rlxviz.passes.rules.layer import feeds_linear  # (what this fix adds: the other tests run without it)

    text = CONTROL.replace("  %47 = gelu(%46) : f32[2, 8, 256] @encoder.layer.0\n",
                           "  %70 = const {value=0.7071067811865476} : f32[] @encoder.layer.0\n"
                           "  %71 = mul(%46, %70) : f32[2, 8, 256] @encoder.layer.0\n"
                           "  %72 = erf(%71) : f32[2, 8, 256] @encoder.layer.0\n"
                           "  %73 = const {value=1.0} : f32[] @encoder.layer.0\n"
                           "  %74 = add(%72, %73) : f32[2, 8, 256] @encoder.layer.0\n"
                           "  %75 = mul(%46, %74) : f32[2, 8, 256] @encoder.layer.0\n"
                           "  %76 = const {value=0.5} : f32[] @encoder.layer.0\n"
                           "  %47 = mul(%75, %76) : f32[2, 8, 256] @encoder.layer.0\n")
    g = parse_ir(text)
    assert feeds_linear(g, 46) and not feeds_linear(g, 49)  # fc1's add, and FFN.2's matmul (it feeds the norm)
    assert feeds_linear(parse_ir(CONTROL), 46)
