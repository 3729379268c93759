"""`fuse_shared_input_matmul`'s cost test protects an attention block only where one can form (a newcomer run on
cohere.optimum-past).

There the cost test declined to merge the MLP's matmul (%346) with Q/K/V: "it would cost the attention block at
attention (node 343)". But `fuse_attention_block` refuses that attention for the model's own term (`kv_cache`: the
prefill reads a KV cache, which the block cannot hold), so the `○ does not pay` protected a fusion that never
happens. Now the cost test asks the block's own model-term steps (`block.model_refusal`: `self_attention`,
`kv_cache`) first: where one refuses, there is no block to protect and the members merge as any other shared-input
group (PaLM-style QKV+FC1 in one GEMM). A block held back only by a gap in rlxviz's ops (cohere.dynamo-eager's
interleaved RoPE, `rope_halves`) is still protected: its compiler fix would form it, and a merge wider than Q/K/V
would then cost it.

Validity of the merge (unchanged, `rules.shared_input`): `x @ concat(w_i)` narrowed back to each `[.., N_i]` is the
same dot product per column, for rank-2 weights of one dtype; numbers are checked against the unfused graph.

The chip's `○` tooltip named the refusal's place alone (the anchor, `model.layers.0.self_attn.q_proj`); its item now
names the node left out beside it (`matmul with W (node 238, model.layers.0.mlp) is not merged: ...`).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from test_fusion_cases import run_and_compare

from rlxviz import session
from rlxviz.app.panels import not_near_miss_mark
from rlxviz.ir import Builder, Graph, Op
from rlxviz.passes import Pipeline
from rlxviz.passes.guard import DOES_NOT_PAY
from rlxviz.passes.rules.block import model_refusal
from rlxviz.passes.trace import Trace, place_label
from rlxviz.passes.why.places import places

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"
H, HEADS, D = 64, 4, 16


def cached_parallel_block(cache_kv: bool) -> Graph:
    """A parallel block on `x` [1, 8, 64]: Q/K/V and an MLP fc_in [64, 128] read `x`; with `cache_kv`, K and V are
    `concat(past, this step's)` along the sequence (a prefill of 8 tokens after 8 cached: 16 keys)."""
    b = Builder(f"parallel_cache_{cache_kv}")
    x = b.input("x", (1, 8, H))
    with b.scope("model.h.0.attn"):
        q, k, v = (b.matmul(x, b.param(f"{n}.weight", (H, H))) for n in "qkv")
        if cache_kv:
            k = b.concat([b.input("past_key", (1, 8, H)), k], axis=1)
            v = b.concat([b.input("past_value", (1, 8, H)), v], axis=1)
        att = b.attention(q, k, v, num_heads=HEADS, head_dim=D)
        out = b.matmul(att, b.param("o.weight", (H, H)))
    with b.scope("model.h.0.mlp"):
        mlp = b.matmul(b.emit(Op.RELU, (b.matmul(x, b.param("fc_in.weight", (H, 2 * H))),)),
                       b.param("fc_out.weight", (2 * H, H)))
    b.output(b.add(b.add(out, mlp), x))
    return b.build()


def _merged_widths(t: Trace) -> list[int]:
    s = next(s for s in t.steps if s.pass_name == "fuse_shared_input_matmul")
    return [s.after[m.fused].shape[-1] for m in s.matches]


def _declined(t: Trace) -> list:
    return [r for s in t.steps for r in s.rejections if r.guard == "merge_keeps_fusions"]


def test_a_block_the_model_refuses_is_not_protected():
    """With a KV cache the block cannot form (`kv_cache`): fc_in merges with Q/K/V, and the numbers hold."""
    g = cached_parallel_block(True)
    attn = next(n.id for n in g if n.op == Op.ATTENTION)
    assert model_refusal(g, attn).guard == "kv_cache"
    t = run_and_compare(g, Pipeline(["fuse_shared_input_matmul"]))
    assert _merged_widths(t) == [3 * H + 2 * H] and not _declined(t), t.steps[0].rejections


def test_without_the_cache_qkv_is_still_merged_alone():
    """The control: the same block without a cache can form, so fc_in is declined for its sake."""
    g = cached_parallel_block(False)
    assert model_refusal(g, next(n.id for n in g if n.op == Op.ATTENTION)) is None
    t = run_and_compare(g, Pipeline(["fuse_shared_input_matmul"]))
    assert _merged_widths(t) == [3 * H] and len(_declined(t)) == 1, t.steps[0].rejections
    assert "would cost the attention block" in _declined(t)[0].message


@cache
def _zoo(name: str) -> Trace:
    return Pipeline.canonical().run(session.load(str(ZOO / f"{name}.onnx")).graph)


def test_cohere_with_past_merges_its_mlp_matmul_into_the_qkv_projection():
    t = _zoo("cohere.optimum-past")
    assert not _declined(t), [r.message for r in _declined(t)]
    s = next(s for s in t.steps if s.pass_name == "fuse_shared_input_matmul")
    assert _merged_widths(t) == [192, 192]  # Q/K/V (64) and the gate|up matmul (128), per layer
    for m in s.matches:  # four slices: q, k, v and the MLP's
        assert len([u for u in s.after.users(m.fused) if u.op == Op.NARROW]) == 4
    block = [r for r in t.rejections if r.rule == "fuse_attention_block.qkv_attention_out"]
    assert block and all(r.guard == "kv_cache" for r in block)  # what holds the block back: the model's own term


def test_a_gap_refused_block_is_still_protected_and_its_chip_names_the_node_left_out():
    t = _zoo("cohere.dynamo-eager")  # held back by interleaved RoPE, a gap in rlxviz's ops: a compiler fix forms it
    declined = _declined(t)
    assert len(declined) == 2 and all("would cost the attention block" in r.message for r in declined)
    k = next(k for k, s in enumerate(t.steps) if s.pass_name == "fuse_shared_input_matmul")
    p = places(t, k)
    items = p.faded[DOES_NOT_PAY]
    for r, item in zip(declined, items, strict=True):
        (mlp,) = r.offending
        node = t.steps[k].before[mlp]
        place = place_label(r.anchor, r.path, with_node=True)  # `%ANCHOR (PATH)`, as every chip item names it
        assert node.path.endswith(".mlp") and item.startswith(f"{place}: "), item  # the place, then who
        assert f"(node {mlp}, {node.path}) is not merged: it would cost the attention block at " in item, item
    tip = not_near_miss_mark(p.faded, p.faded_at)
    assert all(f"(node {r.offending[0]}, {t.steps[k].before[r.offending[0]].path}) is not merged" in tip
               for r in declined), tip
