"""QK-norm is a gap in rlxviz's ops: no FusedAttentionBlock of rlxviz's has a norm of Q and K (a newcomer's run).

n3-04b (OLMo-2's QK-norm over the projection width) read `layer 0: NOT fused`, exit 1, first rejection
`fuse_attention_block` `qkv_packed`, with neither a fix line nor a compiler fix (`--json` op_gaps []), though the
README promises every refusal a fix or "none exists". The block reads Q/K as narrows of its QKV projection, so a norm
between them and the attention (OLMo-2 over the width, Qwen3 per head; RMSNorm or LayerNorm) has no form in it:
a layer trait `qk_norm` read from the graph (`architecture.qk_norm`) and the pass's `lacks` make the refusal a gap,
and the layer reads "fused as far as rlxviz's ops go" with an "rlxviz's ops lack:" line and its compiler fix. The
same layer without the norm still fuses the block, so the trait is no blanket excuse.

A newcomer then read n3-04b's "1/1 layer(s) fused as expected" and "layer 0: fused as far as rlxviz's ops go: nothing
to fuse" over a layer with no fused op at all: the layer now reads "held back by rlxviz's ops: no fused op", and the
headline counts it apart from the layers fused as expected, naming what rlxviz lacks (exit 0: nothing in the model to
change).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import run as cli_run

from rlxviz.ir import Op, parse_ir
from rlxviz.passes import Pipeline
from rlxviz.passes.architecture import classify_layer
from rlxviz.passes.rules.block import QK_NORM_FIX, QK_NORM_GAP
from rlxviz.passes.why import policy
from rlxviz.passes.why.kinds import LayerArchitecture
from rlxviz.passes.why.text import UNCHECKED_ALONE
from rlxviz.passes.why.verdict import RunVerdict

CASE = Path(__file__).parent / "data" / "cases" / "n3-04b-qk-norm-full-width.rlx"
WORDS = "held back by rlxviz's ops"
LACK = f"{QK_NORM_GAP} (fuse_attention_block.qkv_attention_out: its Q and K normalized before the attention (qk_norm))"


def qk_norm_layer(norm: str = "rms", where: str = "full", on: str = "QK") -> str:
    """A one-layer attention (hidden 64, 4 heads of 16, HF keep mask) whose Q and/or K (`on`) is normalized after
    its projection: `rms_norm` or `layer_norm` (`norm`) over the projection width (`full`, OLMo-2) or per head over
    head_dim on `[B, S, H, d]` (`head`, Qwen3); `on=""`: no norm (the control)."""
    at = " @model.layers.0.self_attn"
    lines = ['  %0 = input {name="hidden_states"} : f32[2, 8, 64]', '  %1 = input {name="attention_mask"} : i64[2, 8]',
             f'  %2 = cast(%1) {{dtype="f32"}} : f32[2, 8]{at}', f"  %3 = const {{value=1.0}} : f32[]{at}",
             f"  %4 = sub(%3, %2) : f32[2, 8]{at}", f"  %5 = const {{value=-3.4028234663852886e+38}} : f32[]{at}",
             f"  %6 = mul(%4, %5) : f32[2, 8]{at}", f"  %7 = reshape(%6) {{shape=[2, 1, 1, 8]}} : f32[2, 1, 1, 8]{at}"]

    def emit(text: str) -> int:
        i = len(lines)
        lines.append(f"  %{i} = {text}{at}")
        return i

    def normed(x: int, tag: str, shape: str, width: int) -> int:
        gamma = emit(f'param {{name="{tag}_norm.weight"}} : f32[{width}]')
        if norm == "rms":
            return emit(f"rms_norm(%{x}, %{gamma}) {{eps=1e-06, axis=-1}} : f32[{shape}]")
        beta = emit(f'param {{name="{tag}_norm.bias"}} : f32[{width}]')
        return emit(f"layer_norm(%{x}, %{gamma}, %{beta}) {{eps=1e-05, axis=-1}} : f32[{shape}]")

    def heads(tag: str) -> int:
        w = emit(f'param {{name="{tag}_proj.weight"}} : f32[64, 64]')
        x = emit(f"matmul(%0, %{w}) : f32[2, 8, 64]")
        if tag.upper() in on and where == "full":
            x = normed(x, tag, "2, 8, 64", 64)
        x = emit(f"reshape(%{x}) {{shape=[2, 8, 4, 16]}} : f32[2, 8, 4, 16]")
        if tag.upper() in on and where == "head":
            x = normed(x, tag, "2, 8, 4, 16", 16)
        return emit(f"transpose(%{x}) {{perm=[0, 2, 1, 3]}} : f32[2, 4, 8, 16]")

    q, k, v = heads("q"), heads("k"), heads("v")
    kt = emit(f"transpose(%{k}) {{perm=[0, 1, 3, 2]}} : f32[2, 4, 16, 8]")
    s = emit(f"matmul(%{q}, %{kt}) : f32[2, 4, 8, 8]")
    s = emit(f"div(%{s}, %{emit('const {value=4.0} : f32[]')}) : f32[2, 4, 8, 8]")
    p = emit(f"softmax(%{emit(f'add(%{s}, %7) : f32[2, 4, 8, 8]')}) {{axis=-1}} : f32[2, 4, 8, 8]")
    o = emit(f"transpose(%{emit(f'matmul(%{p}, %{v}) : f32[2, 4, 8, 16]')}) {{perm=[0, 2, 1, 3]}} : f32[2, 8, 4, 16]")
    o = emit(f"reshape(%{o}) {{shape=[2, 8, 64]}} : f32[2, 8, 64]")
    w = emit('param {name="o_proj.weight"} : f32[64, 64]')
    out = emit(f"matmul(%{o}, %{w}) : f32[2, 8, 64]")
    return "graph qk_norm {\n" + "\n".join(lines) + f"\n  return %{out}\n}}\n"


@pytest.mark.parametrize("norm", ["rms", "layer"])
@pytest.mark.parametrize("where", ["full", "head"])
@pytest.mark.parametrize("on", ["QK", "K"])
def test_every_qk_norm_form_is_read_as_the_trait(norm, where, on):
    arch = classify_layer(parse_ir(qk_norm_layer(norm, where, on)), 0)
    assert arch.has("qk_norm") and arch.mask == "keep" and "QK-norm" in arch.description
    (ev,) = [e for e in arch.evidence if "QK-norm" in e]
    assert f"{' and '.join(on)} normalized between the projection and the attention" in ev
    assert ("per head" if where == "head" else "over the projection width") in ev, ev


@pytest.mark.parametrize("norm", ["rms", "layer"])
@pytest.mark.parametrize("where", ["full", "head"])
@pytest.mark.parametrize("on", ["QK", "K"])
def test_a_qk_norm_layer_is_held_back_by_rlxvizs_ops(norm, where, on):
    r = RunVerdict.of(Pipeline.canonical().run(parse_ir(qk_norm_layer(norm, where, on))))
    (lv,) = r.layers
    assert r.ok and r.exit_status == 0
    assert lv.fused and lv.first is None and lv.status == WORDS, lv.status
    assert lv.op_gaps == [LACK] and "FusedAttentionBlock" not in lv.expected
    assert not lv.done and lv.fused_node is None and r.fused_layers == 0 and r.gap_layers == 1


def test_the_control_without_a_norm_still_fuses_the_block():
    g = parse_ir(qk_norm_layer(on=""))
    assert not classify_layer(g, 0).has("qk_norm")
    trace = Pipeline.canonical().run(g)
    assert any(n.op == Op.FUSED_ATTENTION_BLOCK for n in trace.final)
    (lv,) = RunVerdict.of(trace).layers
    assert lv.fused and not lv.op_gaps and "FusedAttentionBlock" in lv.expected


def test_the_gap_is_the_passs_whatever_the_kind_expects():
    arch = LayerArchitecture("attention_only", "attention only; keep mask", mask="keep", qk_norm=True)
    assert policy.op_gaps(arch, "fuse_attention_block", "qkv_packed") == [QK_NORM_GAP]
    why = policy.not_expected(arch, "fuse_attention_block", "qkv_packed") or ""
    assert why.startswith(f"not the model's layout but a gap in rlxviz's ops: rlxviz has no {QK_NORM_GAP}")
    assert f"(compiler fix: {QK_NORM_FIX})" in why
    plain = LayerArchitecture("attention_only", "attention only; keep mask", mask="keep")
    assert policy.not_expected(plain, "fuse_attention_block", "qkv_packed") is None  # it counts without the norm


def test_case_04b_text_and_json_agree_and_name_the_compiler_fix(capsys):
    code, text, err = cli_run(capsys, "explain", CASE)
    jcode, out, _ = cli_run(capsys, "explain", CASE, "--json")
    j = json.loads(out)
    assert code == jcode == 0 and "Traceback" not in err, text
    head = (f"qk_norm_full_width (canonical pipeline): 0/1 layer(s) fused as expected; 1 {WORDS} (rlxviz lacks "
            f"{QK_NORM_GAP}: a compiler fix, nothing in the model to change; {UNCHECKED_ALONE.format(n=1)})")
    assert text.splitlines()[:2] == [head, f"layer 0: {WORDS}: no fused op"], text
    assert "NOT fused" not in text and "nothing to fuse" not in text and "fused as expected:" not in text
    assert f"  rlxviz's ops lack: {LACK}" in text and f"compiler fix: {QK_NORM_FIX}" in text
    (lv,) = j["layers"]
    assert j["ok"] and lv["status"] == WORDS and lv["first"] is None and lv["op_gaps"] == [LACK]
    assert j["headline"] == head and j["headline_notes"] == [] and j["fused_layers"] == 0 and j["gap_layers"] == 1
    assert j["gap_forms"] == [QK_NORM_GAP]
