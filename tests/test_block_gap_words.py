"""FusedAttentionBlock forms rlxviz's block lacks are gaps in rlxviz's ops, whatever the layer's mask (a newcomer run).

The same missing block read opposite verdicts, with a false excuse: Granite's attention multiplier (scale 0.0625, an
additive mask) was `not expected here ... FusedAttentionBlock is expected only of a post-LN layer or a layer whose
attention has a keep mask; this layer is ... additive mask` and `fused as expected`, as if the additive mask were the
blocker (the block takes one); llama-block's causal mask and Falcon's Q/K rotated by their own cos/sin tables read
the same. Each is a form rlxviz's block lacks (guard declarations, `Guard.lacking`): where the layer's kind does not
expect the block, the layer is `fused as far as rlxviz's ops go` with an `rlxviz's ops lack: ...` line naming the
form, in the text and `--json` alike (`LayerVerdict.op_gaps`), like deit's unmasked attention. Counts and exit codes
stay; where the kind expects the block (a keep mask, post-LN) the refusal still counts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import run as cli_run
from clirun import unplaced

from rlxviz.models import load_model
from rlxviz.models.onnx import load_onnx
from rlxviz.passes import Pipeline
from rlxviz.passes.why import policy
from rlxviz.passes.why.kinds import LayerArchitecture
from rlxviz.passes.why.verdict import RunVerdict

CASES = Path(__file__).parent / "fixtures" / "onnx" / "cases"
SCALE = "FusedAttentionBlock with a non-default scale"
CAUSAL = "FusedAttentionBlock with a causal mask kind"
TABLES = "FusedAttentionBlock with separate cos/sin tables for Q and K"
PARTIAL = "FusedAttentionBlock with partial rotary RoPE"
ONE_ROPE = "FusedAttentionBlock with RoPE on Q or K alone"
INTERLEAVED = "FusedAttentionBlock with interleaved RoPE"
FALSE = "expected only of a post-LN layer or a layer whose attention has a keep mask; this layer is"
WORDS = "fused as far as rlxviz's ops go"
HELD = "held back by rlxviz's ops"


@pytest.mark.parametrize("kind, mask, guard, gap", [
    ("llama", "additive", "default_scale", SCALE),  # granite
    ("parallel", "additive", "default_scale", SCALE),
    ("pre_ln", "causal", "default_scale", SCALE),
    ("llama", "causal", "mask_kind_keep", CAUSAL),  # llama-block
    ("pre_ln", "causal", "mask_kind_keep", CAUSAL),
    ("parallel", "causal", "mask_kind_keep", CAUSAL),
    ("parallel", "additive", "rope_one_table", TABLES),  # falcon
    ("llama", "causal", "rope_one_table", TABLES),
    ("parallel", "additive", "rope_full_rotary", PARTIAL),  # GPT-NeoX / Phi: RoPE over part of each head
    ("llama", "causal", "rope_full_rotary", PARTIAL),
    ("parallel", "additive", "rope_q_and_k", ONE_ROPE),
    ("pre_ln", "causal", "rope_q_and_k", ONE_ROPE),
    ("parallel", "additive", "rope_halves", INTERLEAVED),  # GPT-J
])
def test_a_form_the_block_lacks_is_a_gap_in_every_kind_that_does_not_expect_it(kind, mask, guard, gap):
    arch = LayerArchitecture(kind, f"a {kind} layer; {mask} mask", mask=mask)
    assert policy.op_gap(arch, "fuse_attention_block", guard) == gap
    why = policy.not_expected(arch, "fuse_attention_block", guard)
    assert why is not None and why.startswith(f"not the model's layout but a gap in rlxviz's ops: rlxviz has no {gap}")
    assert "compiler fix: " in why and FALSE not in why, why


@pytest.mark.parametrize("arch", [
    LayerArchitecture("pre_ln", "esm-like; keep mask", mask="keep"),  # the kind expects the block: it counts
    LayerArchitecture("post_ln", "bert-like; additive mask", mask="additive"),
])
@pytest.mark.parametrize("guard", ["default_scale", "rope_one_table", "rope_full_rotary", "rope_q_and_k",
                                   "rope_halves"])
def test_where_the_kind_expects_the_block_the_refusal_still_counts(arch, guard):
    assert policy.op_gap(arch, "fuse_attention_block", guard) is None
    assert policy.not_expected(arch, "fuse_attention_block", guard) is None


@pytest.mark.parametrize("kind, mask", [("parallel", "additive"), ("llama", "additive"), ("pre_ln", "causal")])
def test_a_layout_refusal_says_what_the_block_takes(kind, mask):
    """A refusal that is the model's layout (GPT-NeoX's reshaped Q/K: `qkv_packed`) keeps its excuse, which says
    what the block takes, so the additive mask never reads as the blocker."""
    arch = LayerArchitecture(kind, f"a {kind} layer; {mask} mask", mask=mask)
    assert policy.op_gap(arch, "fuse_attention_block", "qkv_packed") is None
    why = policy.not_expected(arch, "fuse_attention_block", "qkv_packed")
    assert why is not None and "takes a keep or an additive mask" in why and why.endswith(arch.description), why


def _graph(name: str):
    return load_model(name, seq=8).graph if name == "llama-block" else load_onnx(CASES / name, seq=8).graph


@pytest.mark.parametrize("name, guard, gap", [
    ("granite.onnx", "default_scale", SCALE),  # additive mask, attention multiplier 0.0625
    ("llama-block", "mask_kind_keep", CAUSAL),  # causal mask
])
def test_the_layers_say_the_gap_and_keep_their_count(name, guard, gap):
    r = RunVerdict.of(Pipeline.canonical().run(_graph(name)))
    assert r.layers and all(lv.fused for lv in r.layers)  # the count is unchanged: the refusal is still not counted
    for lv in r.layers:
        assert lv.status == WORDS, lv.status
        assert f"{gap} (fuse_attention_block.qkv_attention_out: {guard})" in lv.op_gaps, lv.op_gaps
        (line,) = [x for x in map(unplaced, lv.gap_refusals)  # a gap's own line (issue 39)
                   if x.startswith(f"fuse_attention_block.qkv_attention_out ({guard}): ")]
        assert f"rlxviz has no {gap}" in line and FALSE not in line, line


def test_a_layout_refusal_stays_not_expected_with_a_true_excuse():
    """With the stage that reads its per-head QKV layout as column blocks switched off (`fuse_attention_block/
    qkv_columns`, tests/test_qkv_columns.py), GPT-NeoX's Q/K are reshapes of its packed projection (its own tables do
    not matter there: `rope_one_table` reads Q/K narrows of one projection only): a layout refusal, no gap; the layers
    stay `fused as expected`, and the excuse says what the block takes."""
    pipeline = Pipeline.canonical()
    pipeline.disabled.add("fuse_attention_block/qkv_columns")
    r = RunVerdict.of(pipeline.run(_graph("gpt-neox.legacy-sdpa.onnx")))
    assert r.layers and all(lv.fused and not lv.op_gaps and lv.status == "fused" for lv in r.layers)
    for lv in r.layers:
        (line,) = [x for x in map(unplaced, lv.not_expected)
                   if x.startswith("fuse_attention_block.qkv_attention_out (qkv_packed): ")]
        assert FALSE not in line and "takes a keep or an additive mask" in line, line


def test_granite_text_and_json_agree(capsys):
    code, text, err = cli_run(capsys, "explain", CASES / "granite.onnx")
    assert code == 0 and "Traceback" not in err, err
    jcode, out, _ = cli_run(capsys, "explain", CASES / "granite.onnx", "--json")
    j = json.loads(out)
    n = len(j["layers"])
    assert jcode == code and j["ok"] and n == 2 and j["fused_layers"] == 0 and j["gap_layers"] == n
    head = (f"granite (canonical pipeline): 0/{n} layer(s) fused as expected; {n} {WORDS} (rlxviz lacks {SCALE}: a "
            f"compiler fix; a workaround in the model in {n} of them (their gap lines name it))")
    assert f"\n{head}\nlayer 0: " in text and j["headline"] == head, text
    assert FALSE not in text and FALSE not in out
    for d in j["layers"]:
        assert d["status"] == WORDS and d["op_gaps"] == [f"{SCALE} (fuse_attention_block.qkv_attention_out: "
                                                          "default_scale)"]
        assert f"layer {d['layer']}: {WORDS}: " in text


def _position_biased(**kw) -> str:
    """tests/test_rope_heads.py's RoPE attention with an additive position bias `[1, 1, S, S]` for its padding mask: a
    layer whose kind does not expect the block (an additive mask), and whose mask the block takes."""
    from test_rope_heads import rope_attention
    src = rope_attention(**kw)
    mask = "  %8 = reshape(%7) {shape=[2, 1, 1, 8]} : f32[2, 1, 1, 8]"
    assert mask in src
    return src.replace(mask, '  %8 = param {name="position_bias"} : f32[1, 1, 8, 8]')


@pytest.mark.parametrize("kw, guard, gap, said", [
    ({"n_rot": 8}, "rope_full_rotary", PARTIAL,
     "and k_rope (node 61, model.layers.0.self_attn) rotate 8 of 16 dims per head (partial rotary)"),
    ({"k_only": True}, "rope_q_and_k", ONE_ROPE, "rotates K only"),
])
def test_a_rotation_the_block_lacks_reads_as_a_gap_in_text_and_json(capsys, tmp_path, kw, guard, gap, said):
    """RoPE over part of each head (GPT-NeoX, Phi) or on K alone, refused by FusedAttentionBlock in a layer whose kind
    does not expect the block: rlxviz's op lacks the form, so the layer is fused as far as rlxviz's ops go and names it
    (before, the refusals were steps with no gap declaration, and read as the layer's kind not expecting the block)."""
    path = tmp_path / "g.ir"
    path.write_text(_position_biased(**kw))
    code, text, err = cli_run(capsys, "explain", path)
    jcode, out, _ = cli_run(capsys, "explain", path, "--json")
    assert code == jcode == 0 and "Traceback" not in err, (text, err)
    # only the attention: with its block refused no op of it fuses, so the layer is held back, never "nothing to fuse"
    assert f"0/1 layer(s) fused as expected; 1 {HELD} (rlxviz lacks {gap}: a compiler fix" in text, text
    assert f"layer 0: {HELD}: no fused op\n" in text and said in text, text
    assert FALSE not in text and FALSE not in out
    (d,) = json.loads(out)["layers"]
    assert d["status"] == HELD and d["op_gaps"] == [f"{gap} (fuse_attention_block.qkv_attention_out: {guard})"]


def test_a_full_rotation_of_q_and_k_still_fuses_the_block():
    """The control: the same layer rotating every dim of Q and K forms the block, nothing lacking."""
    from rlxviz.ir import parse_ir
    r = RunVerdict.of(Pipeline.canonical().run(parse_ir(_position_biased())))
    assert [(lv.fused, lv.status, lv.op_gaps) for lv in r.layers] == [(True, "fused", [])]
