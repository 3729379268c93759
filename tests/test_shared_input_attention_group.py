"""`fuse_shared_input_matmul` keeps an attention's Q/K/V apart from the other projections of their input, however Q
and K reach the attention (directly, through a head split, through RoPE) and however many matmuls make them (three,
or one packed projection).

GPT-J's, Phi's and CodeGen's parallel blocks read one normed input for Q/K/V and the MLP's fc_in. The cost test kept
a Q/K/V group apart only when the three fed the attention directly, so with RoPE between them the pass packed fc_in
into Q/K/V: the projection came out wider than Q/K/V and `fuse_attention_block` refused it (`qkv_split`,
`qkv_user_count`), a refusal rlxviz made for itself. Now the members that feed one attention's Q, K and V
(`shared_input._attention_triple`, followed as `_first_readers` follows a merged slice) are merged alone, and the
others are named in `merge_keeps_fusions` (not profitable: rlxviz's own rule declined; no near-miss).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_fusion_cases import run_and_compare

from rlxviz.ir import Builder, Graph, Op
from rlxviz.models.onnx import load_onnx
from rlxviz.passes import Pipeline

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"
H, HEADS, D = 64, 4, 16


def parallel_block(qk: str, packed: bool, fc_act: str | None) -> Graph:
    """A parallel block (GPT-J style) on `x` [1, 8, 64]: attention and an MLP both read `x`.

    qk: how Q and K reach the attention: `direct`, `split` (a reshape to heads and back) or `rope` (a head split and
    a rotation, `interleaved` GPT-J pairs). packed: Q/K/V as narrows of one `[64, 192]` projection, else three.
    fc_act: the MLP's activation after its biased fc_in (`gelu_tanh`: off the epilogue allow-list, so the cost test
    keeps no epilogue for it; None: a plain linear)."""
    b = Builder(f"parallel_{qk}_{packed}_{fc_act}")
    x = b.input("x", (1, 8, H))
    with b.scope("model.h.0.attn"):
        if packed:
            qkv = b.matmul(x, b.param("qkv.weight", (H, 3 * H)))
            q, k, v = (b.narrow(qkv, -1, i * H, H) for i in range(3))
        else:
            q, k, v = (b.matmul(x, b.param(f"{n}.weight", (H, H))) for n in "qkv")
        if qk in ("split", "rope"):
            q, k = (b.reshape(b.reshape(t, (1, 8, HEADS, D)), (1, 8, H)) for t in (q, k))
        if qk == "rope":
            cos, sin = b.param("rope.cos", (8, D // 2)), b.param("rope.sin", (8, D // 2))
            q, k = (b.rope(t, cos, sin, head_dim=D, interleaved=True) for t in (q, k))
        att = b.attention(q, k, v, num_heads=HEADS, head_dim=D, mask_kind="causal")
        out = b.matmul(att, b.param("o.weight", (H, H)))
    with b.scope("model.h.0.mlp"):
        h = b.add(b.matmul(x, b.param("fc_in.weight", (H, 2 * H))), b.param("fc_in.bias", (2 * H,)))
        if fc_act:
            h = b.emit(Op(fc_act), (h,))
        mlp = b.matmul(h, b.param("fc_out.weight", (2 * H, H)))
    b.output(b.add(b.add(out, mlp), x))
    return b.build()


@pytest.mark.parametrize("fc_act", [None, "gelu_tanh"])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("qk", ["direct", "split", "rope"])
def test_qkv_is_merged_alone_however_q_and_k_reach_the_attention(qk, packed, fc_act):
    g = parallel_block(qk, packed, fc_act)
    t = run_and_compare(g, Pipeline(["fuse_shared_input_matmul"]))  # the numbers equal the unfused graph's
    s = t.steps[0]
    fc_in = next(n.id for n in g if n.op == Op.MATMUL and g[n.inputs[1]].name == "fc_in.weight")
    refused = [r for r in s.rejections if r.guard == "merge_keeps_fusions"]
    assert len(refused) == 1 and fc_in in refused[0].offending, s.rejections
    assert "would cost the attention block" in refused[0].message and refused[0].near_miss is False, refused[0]
    merged = [s.after[m.fused] for m in s.matches]
    if packed:  # Q/K/V are one projection already: nothing is left to merge it with
        assert not merged and "fewer than 2 matmuls would be left" in refused[0].message, s
    else:  # the three merged, in Q/K/V order, fc_in not among them: 3 * 64 wide
        assert [n.shape[-1] for n in merged] == [3 * H], merged
        widths = [u.attrs["length"] for u in s.after.users(merged[0].id) if u.op == Op.NARROW]
        assert widths == [H, H, H], widths


def test_without_the_cost_test_fc_in_is_merged_too():
    """The control: `merge_cost_test=False` packs all four (what the canonical run did before with RoPE between),
    so the assertion above can fail."""
    t = run_and_compare(parallel_block("rope", False, "gelu_tanh"),
                        Pipeline(["fuse_shared_input_matmul"], {"merge_cost_test": False}))
    s = t.steps[0]
    assert [s.after[m.fused].shape[-1] for m in s.matches] == [3 * H + 2 * H]


@pytest.mark.parametrize("name", ["gptj", "phi", "codegen"])
def test_parallel_block_exports_keep_their_qkv_packable(name):
    """On the exports: fc_in (fc1) is refused for the attention's sake, and `fuse_attention_block` is no longer
    refused for a packing rlxviz made (`qkv_split`, `qkv_user_count`); what holds the block back is the RoPE form
    (`rope_full_rotary`), a gap in rlxviz's ops."""
    io = dict(np.load(ZOO / f"{name}.dynamo-eager.npz"))
    feeds = {k: v for k, v in io.items() if not k.startswith("out:")}
    m = load_onnx(ZOO / f"{name}.dynamo-eager.onnx", input_shapes={k: v.shape for k, v in feeds.items()})
    t = Pipeline.canonical().run(m.graph)
    guards = {r.guard for s in t.steps for r in s.rejections}
    assert "merge_keeps_fusions" in guards and not guards & {"qkv_split", "qkv_user_count"}, guards
    assert "rope_full_rotary" in guards, guards
    keep = [r for s in t.steps for r in s.rejections if r.guard == "merge_keeps_fusions"]
    assert keep and all("the attention block" in r.message for r in keep), [r.message for r in keep]
