"""FusedAttentionBlock over a half-precision model's RoPE computed in float32 (newcomer run, olmo.fp16): after
`fuse_sdpa.cast_heads`, Q and K reach the attention as `cast(rope(cast(narrow(qkv), f32), cos, sin), f16)`, which
`qkv_packed` did not take, and the refusal was filed "not expected here" (the mask additive only because f16 keeps the
where mask as the model's own term). The block takes the casts as its `rope_dtype`; its decomposition is the matched
chain, so the block step is bit-exact on the NumPy reference; the graph built here is a small LLaMA-style f16 layer,
the zoo's olmo.fp16 the exported one; controls (Q and K rotated in two dtypes) are refused by `rope_dtype`. The same
kind in gpt-bigcode: dead readers rlxviz's own canonicalization left held its block back, filed the same way."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from clirun import run as cli_run

from rlxviz.ir import Builder, DType, Graph, Op, ShapeError, TensorType, infer
from rlxviz.models.onnx_import import load_onnx
from rlxviz.passes import Pipeline, run_passes
from rlxviz.runtime import run_reference
from rlxviz.runtime.executor import run_mlx

ZOO = Path(__file__).parent / "fixtures" / "onnx" / "zoo"
F16_MIN = float(np.finfo(np.float16).min)


def f16_llama_attention(d: int = 8, heads: int = 4, kv: int = 2, S: int = 6, B: int = 2,
                        k_dtype: str = "f32") -> tuple[Graph, dict[str, np.ndarray]]:
    """An f16 LLaMA-style self-attention as Hugging Face exports it: Q/K/V projections of one hidden input, heads
    split, Q and K rotated in f32 (`cast(h) * cos + cast(rotate_half(h)) * sin` with f32 `[1, 1, S, d]` tables) and
    cast back, GQA (kv < heads), a padding mask `where(keep, 0, finfo(f16).min)` added to the f16 scores, the output
    projection. `k_dtype`: the dtype K is rotated in (a control: "f64" rotates Q and K in two dtypes)."""
    b = Builder("f16_llama")
    x = b.input("x", (B, S, heads * d), "f16")
    keep = b.reshape(b.input("keep", (B, S), "bool"), (B, 1, 1, S))
    mask = b.where(keep, b.const(0.0, "f16"), b.const(F16_MIN, "f16"))
    cos, sin = b.param("cos", (1, 1, S, d)), b.param("sin", (1, 1, S, d))

    def split(t: str, nh: int) -> int:
        p = b.matmul(x, b.param(f"{t}_proj", (heads * d, nh * d), "f16"))
        return b.transpose(b.reshape(p, (B, S, nh, d)), (0, 2, 1, 3))

    def rotate(h: int, dt: str) -> int:
        rot = b.concat([b.neg(b.narrow(h, 3, d // 2, d // 2)), b.narrow(h, 3, 0, d // 2)], 3)
        return b.cast(b.add(b.mul(b.cast(h, dt), cos), b.mul(b.cast(rot, dt), sin)), "f16")

    def repeat(h: int) -> int:
        return b.reshape(b.expand(b.reshape(h, (B, kv, 1, S, d)), (B, kv, heads // kv, S, d)), (B, heads, S, d))

    q, k, v = rotate(split("q", heads), "f32"), repeat(rotate(split("k", kv), k_dtype)), repeat(split("v", kv))
    s = b.add(b.mul(b.matmul(q, b.transpose(k, (0, 1, 3, 2))), b.const(1.0 / np.sqrt(d), "f16")), mask)
    o = b.matmul(b.softmax(s, -1), v)
    b.output(b.matmul(b.reshape(b.transpose(o, (0, 2, 1, 3)), (B, S, heads * d)),
                      b.param("o_proj", (heads * d, heads * d), "f16")))
    g = b.build()
    rng = np.random.default_rng(3)
    w = {n.name: (0.3 * rng.standard_normal(n.shape)).astype(n.dtype.numpy) for n in g.params}
    ang = np.arange(S, dtype=np.float32)[:, None] / (10000.0 ** (np.arange(0, d, 2, dtype=np.float32) / d))
    for n, f in (("cos", np.cos), ("sin", np.sin)):
        w[n] = np.concatenate([f(ang), f(ang)], -1).reshape(1, 1, S, d).astype(np.float32)
    return g.with_values({n: w[n] for n in ("cos", "sin")}), w


def _feeds(g: Graph, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    keep = np.ones(g.inputs[1].shape, bool)
    keep[0, :2] = False  # left padding
    keep[1, :] = False  # a fully masked row
    return {"x": rng.standard_normal(g.inputs[0].shape).astype(np.float16), "keep": keep}


def _blocks(g: Graph) -> list:
    return [n for n in g if n.op == Op.FUSED_ATTENTION_BLOCK]


def _block_step(trace):  # noqa: ANN001, ANN202
    """The trace step in which the block formed (its graph before and after)."""
    return next(s for s in trace.steps if any(m.rule == "fuse_attention_block.qkv_attention_out" for m in s.matches))


def test_an_f16_attention_rotated_in_f32_becomes_one_block_whose_step_is_bit_exact():
    g, w = f16_llama_attention()
    t = Pipeline.canonical().run(g)
    (blk,) = _blocks(t.final)
    assert blk.attrs.get("rope_dtype") == "f32" and blk.attrs["has_rope"] and blk.attrs["mask"] == "additive"
    assert not [n for n in t.final if n.op in (Op.ATTENTION, Op.ROPE, Op.SOFTMAX)]
    feeds = _feeds(g)
    step = _block_step(t)
    before, after = step.before, step.after
    assert _blocks(after) and not _blocks(before)
    for a, b in zip(run_reference(before, feeds, w), run_reference(after, feeds, w), strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)  # the decomposition is the chain
    for run in (run_reference, run_mlx):
        for a, b in zip(run(g, feeds, w), run(t.final, feeds, w), strict=True):
            np.testing.assert_allclose(np.asarray(b, np.float64), np.asarray(a, np.float64), rtol=1e-2, atol=1e-2,
                                       err_msg=run.__name__)


def packed_f16_attention(q_dtype: str = "f32", k_dtype: str = "f32", d: int = 8, heads: int = 2, S: int = 4
                         ) -> Graph:
    """The form the block reads, written as IR ops (what `fuse_sdpa` and `fuse_shared_input_matmul` leave): an f16
    packed QKV matmul, Q and K narrowed and rotated between casts in `q_dtype` / `k_dtype` by one f32 table pair, an
    additive-mask attention, the output projection."""
    b = Builder("packed_f16")
    x, mask = b.input("x", (1, S, heads * d), "f16"), b.input("mask", (1, 1, S, S), "f16")
    qkv = b.matmul(x, b.param("qkv_w", (heads * d, 3 * heads * d), "f16"))
    cos, sin = b.param("cos", (S, d // 2)), b.param("sin", (S, d // 2))
    q, k, v = (b.narrow(qkv, 2, i * heads * d, heads * d) for i in range(3))
    q, k = (b.cast(b.rope(b.cast(t, dt), cos, sin, d), "f16") for t, dt in ((q, q_dtype), (k, k_dtype)))
    att = b.attention(q, k, v, mask, num_heads=heads, head_dim=d, mask_kind="additive")
    b.output(b.matmul(att, b.param("o_w", (heads * d, heads * d), "f16")))
    return b.build()


def test_q_and_k_rotated_in_two_dtypes_are_refused_by_rope_dtype():
    t = run_passes(packed_f16_attention(k_dtype="f64"), ["fuse_attention_block"])
    assert not _blocks(t.final)
    (r,) = [r for r in t.rejections if r.rule == "fuse_attention_block.qkv_attention_out"]
    assert r.guard == "rope_dtype", (r.guard, r.message)
    assert "f32" in r.message and "f64" in r.message and "one float dtype" in r.message, r.message
    (blk,) = _blocks(run_passes(packed_f16_attention(), ["fuse_attention_block"]).final)  # the same dtype: a block
    assert blk.attrs["rope_dtype"] == "f32"


def test_the_block_type_rule_wants_has_rope_for_a_rope_dtype():
    h, wq, wo, m = (TensorType(s, DType.f16) for s in ((1, 4, 8), (8, 24), (8, 8), (1, 4)))
    attrs = {"num_heads": 1, "head_dim": 8, "has_bias": False, "mask": "keep", "rope_dtype": "f32"}
    with pytest.raises(ShapeError, match="rope_dtype .* needs has_rope"):
        infer(Op.FUSED_ATTENTION_BLOCK, attrs, (h, wq, wo, m))
    assert infer(Op.FUSED_ATTENTION_BLOCK, {**attrs, "rope_dtype": None}, (h, wq, wo, m)) == h


def test_olmo_fp16_forms_the_block_in_every_layer_with_the_f32_rotation(capsys):
    """The newcomer's run: each layer of olmo.fp16 ends with FusedAttentionBlock(rope_dtype=f32), as olmo's f32
    export does, fused as expected; no `qkv_packed` refusal is left, and none is filed "not expected here"."""
    rc, stdout, _ = cli_run(capsys, "explain", "--json", ZOO / "olmo.fp16.onnx")
    out = json.loads(stdout)
    assert rc == 0 and out["ok"] and out["fused_layers"] == out["checked_layers"] == 2, out["headline"]
    assert out["final_op_counts"].get("FusedAttentionBlock") == 2, out["final_op_counts"]
    text = json.dumps(out)
    assert "qkv_packed" not in text and "expects it only of" not in text
    for layer in out["layers"]:
        assert "FusedAttentionBlock" in layer["expected"], layer["expected"]


# -- the same kind: a node rlxviz's own canonicalization left behind -----------------------------------------------

@pytest.mark.parametrize("stem", ["gpt-bigcode.dynamo-eager", "gpt-bigcode.ortopt"])
def test_gpt_bigcode_s_unit_axis_cut_leaves_no_reader_that_holds_the_block_back(stem):
    """`canonicalize_exported.unit_axis_head_split` / `unit_axis_one_head` re-cut Q, K and V from the c_attn
    projection; the old `[B, 1, S, N]` view and Q's old cut stayed as dead readers of the projection, so the block's
    `qkv_user_count` refused ("its extra reader is dead code") and the refusal was filed "not expected here" for the
    layer's additive mask. They go with their last reader now: each layer forms FusedAttentionBlock."""
    io = np.load(ZOO / f"{stem}.npz")
    m = load_onnx(ZOO / f"{stem}.onnx", input_shapes={k: io[k].shape for k in io.files if not k.startswith("out:")})
    t = Pipeline.canonical().run(m.graph)
    canon = next(s for s in t.steps if s.pass_name == "canonicalize_exported").after
    users = {i: [u.id for u in canon.users(i)] for i in (n.id for n in canon)}
    assert not [n for n in canon if n.op in (Op.NARROW, Op.RESHAPE) and not users[n.id] and not canon.is_output(n.id)]
    assert len(_blocks(t.final)) == 2, [n.op.value for n in t.final]
    assert not [r for r in t.rejections if r.guard == "qkv_user_count"]


@pytest.mark.parametrize("stem", sorted(p.stem for p in ZOO.glob("*.fp16.onnx")))
def test_no_f16_export_files_a_block_refusal_as_not_expected_of_its_kind(stem, capsys):
    """Every float16 export of the zoo (OLMo, Granite, StarCoder2, ERNIE, DeiT): the block forms, or its refusal is
    a gap in rlxviz's ops (Granite's scale, DeiT's unmasked attention) or the layer's own op (ERNIE's
    FusedTransformerLayer); none is put down to the layer's kind while rlxviz's own rewrite held it back."""
    rc, stdout, _ = cli_run(capsys, "explain", "--json", ZOO / f"{stem}.onnx")
    out = json.loads(stdout)
    assert rc == 0, out["headline"]
    lines = [x for layer in out["layers"] for x in layer["not_expected"]]
    assert not [x for x in lines if x.startswith("fuse_attention_block")], lines


@pytest.mark.parametrize("kind, mask", [("llama", "additive"), ("pre_ln", "causal"), ("parallel", "additive")])
def test_q_and_k_in_two_dtypes_is_a_gap_in_rlxviz_s_block_not_the_layer_s_kind(kind, mask):
    """Like the block's other RoPE forms (`test_block_gap_words`): a layer whose kind does not expect the block
    reads the refusal as the form rlxviz's block lacks, never as its mask kind."""
    from rlxviz.passes.why import policy
    from rlxviz.passes.why.kinds import LayerArchitecture

    arch = LayerArchitecture(kind, f"a {kind} layer; {mask} mask", mask=mask)
    gap = "FusedAttentionBlock with Q and K rotated in two dtypes"
    assert policy.op_gap(arch, "fuse_attention_block", "rope_dtype") == gap
    why = policy.not_expected(arch, "fuse_attention_block", "rope_dtype")
    assert why is not None and why.startswith(f"not the model's layout but a gap in rlxviz's ops: rlxviz has no {gap}")
    assert "has a keep mask" not in why, why
