"""LLaMA-style decoder block: structure (RLX §5.2 order), RoPE tables, and numbers against plain NumPy."""

import numpy as np
import pytest

from rlxviz.ir import Op
from rlxviz.ir.lint import lint
from rlxviz.models import PRESETS, LlamaConfig, build_llama_block, llama_random_weights, load_model, rope_tables
from rlxviz.models.bert import VARIANTS
from rlxviz.runtime import run_reference


def _rms(x, g, eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * g


def _rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], -1)


def numpy_llama(x, w, cfg):
    """Hugging Face LlamaDecoderLayer written directly (rotate_half RoPE, explicit causal softmax)."""
    b, s, h = x.shape
    nh, d = cfg.heads, cfg.head_dim
    inv = cfg.rope_theta ** (-np.arange(0, d, 2) / d)
    ang = np.arange(s)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    for i in range(cfg.layers):
        p = f"layers.{i}."
        n1 = _rms(x, w[p + "input_layernorm.weight"], cfg.eps)

        def heads(t):
            return t.reshape(b, s, nh, d).transpose(0, 2, 1, 3)

        q, k, v = (heads(n1 @ w[p + f"self_attn.{n}_proj.weight"]) for n in "qkv")
        q, k = (t * cos + _rotate_half(t) * sin for t in (q, k))
        sc = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
        sc = np.where(np.tril(np.ones((s, s), bool)), sc, -np.inf)
        pr = np.exp(sc - sc.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        att = (pr @ v).transpose(0, 2, 1, 3).reshape(b, s, h)
        x = x + att @ w[p + "self_attn.o_proj.weight"]
        n2 = _rms(x, w[p + "post_attention_layernorm.weight"], cfg.eps)
        g = n2 @ w[p + "mlp.gate_proj.weight"]
        x = x + (g / (1 + np.exp(-g)) * (n2 @ w[p + "mlp.up_proj.weight"])) @ w[p + "mlp.down_proj.weight"]
    return x


def test_rope_tables_from_positions():
    cos, sin = rope_tables(6, 8, theta=10000.0)
    assert cos.shape == sin.shape == (6, 4) and cos.dtype == np.float32
    assert np.allclose(cos[0], 1) and np.allclose(sin[0], 0)
    assert np.isclose(cos[3, 1], np.cos(3 * 10000 ** (-2 / 8)))
    assert np.isclose(sin[5, 3], np.sin(5 * 10000 ** (-6 / 8)))
    with pytest.raises(ValueError, match="even head_dim"):
        rope_tables(4, 7)


def test_block_structure_follows_rlx_order():
    cfg = LlamaConfig(hidden=32, heads=4, intermediate=48, max_position=16)
    g = build_llama_block(cfg, batch=2, seq=8)
    lint(g, "built")
    assert [n.attrs["name"] for n in g.inputs] == ["hidden_states"]
    assert g[g.outputs[0]].shape == (2, 8, 32)
    params = {p.attrs["name"]: p.shape for p in g.params}
    assert params["rope.cos"] == params["rope.sin"] == (16, 4)
    assert params["zero_beta"] == (32,)
    assert params["layers.0.mlp.gate_proj.weight"] == (32, 48)
    assert params["layers.0.mlp.down_proj.weight"] == (48, 32)
    ops = [n.op for n in g if n.op not in (Op.INPUT, Op.PARAM, Op.CONST)]
    assert ops == [Op.RMS_NORM, Op.MATMUL, Op.MATMUL, Op.MATMUL, Op.ROPE, Op.ROPE, Op.ATTENTION, Op.MATMUL,
                   Op.ADD, Op.RMS_NORM, Op.MATMUL, Op.MATMUL, Op.SILU, Op.MUL, Op.MATMUL, Op.ADD]
    norms = [n for n in g if n.op == Op.RMS_NORM]
    zero = next(p for p in g.params if p.attrs["name"] == "zero_beta")
    assert all(n.inputs[2] == zero.id for n in norms)  # explicit zero beta
    att = next(n for n in g if n.op == Op.ATTENTION)
    assert att.attrs["mask"] == "causal" and len(att.inputs) == 3
    for m in (n for n in g if n.op == Op.MATMUL):  # bias-free: no matmul feeds an add with a param
        assert all(u.op != Op.ADD or g[u.inputs[1]].op != Op.PARAM for u in g.users(m))
    adds = [n for n in g if n.op == Op.ADD]
    assert adds[0].inputs[0] == g.inputs[0].id  # skip first: add(x, attn_out)
    assert adds[1].inputs[0] == adds[0].id  # add(post, ffn)
    mul = next(n for n in g if n.op == Op.MUL)
    assert g[mul.inputs[0]].op == Op.SILU  # mul(silu(gate), up)
    assert g[mul.inputs[1]].path.endswith("mlp.up_proj")


@pytest.mark.parametrize("layers", [1, 2])
def test_block_matches_plain_numpy(layers):
    cfg = LlamaConfig(hidden=32, heads=4, intermediate=48, layers=layers, max_position=16)
    g = build_llama_block(cfg, batch=2, seq=7)
    w = llama_random_weights(g, cfg, seed=3, std=0.2)
    assert not w["zero_beta"].any()
    x = np.random.default_rng(1).standard_normal((2, 7, 32)).astype(np.float32)
    got = run_reference(g, {"hidden_states": x}, w)[0]
    want = numpy_llama(x.astype(np.float64), {k: v.astype(np.float64) for k, v in w.items()}, cfg)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)


def test_block_is_causal():
    m = load_model("llama-block", batch=1, seq=10)
    x = np.random.default_rng(0).standard_normal((1, 10, 64)).astype(np.float32)
    y = x.copy()
    y[0, 6:] += 1.0  # change only the future
    a = run_reference(m.graph, {"hidden_states": x}, m.weights)[0]
    b = run_reference(m.graph, {"hidden_states": y}, m.weights)[0]
    np.testing.assert_array_equal(a[0, :6], b[0, :6])
    assert np.abs(a[0, 6:] - b[0, 6:]).max() > 0.1


def test_llama_preset():
    assert "llama-block" in PRESETS
    m = load_model("llama-block", batch=2, seq=5)
    assert m.graph.inputs[0].shape == (2, 5, 64) and m.config.max_position >= 5
    feeds = m.random_feeds()
    assert set(feeds) == {"hidden_states"} and feeds["hidden_states"].dtype == np.float32
    out = run_reference(m.graph, feeds, m.weights)[0]
    assert out.shape == (2, 5, 64) and np.isfinite(out).all()
    assert np.array_equal(m.weights["rope.cos"], rope_tables(512, 16)[0])
    with pytest.raises(ValueError, match="no teaching variants"):
        load_model("llama-block", variant=VARIANTS["pre_ln"])
