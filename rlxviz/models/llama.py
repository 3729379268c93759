"""A LLaMA-style pre-norm decoder block, written the way RLX's builder writes it (docs/rlx.md §5.2).

Per layer (`x` float32 `[B, S, H]`, weights `[in, out]`, no biases):

1. `n1 = rms_norm(x, ln1_g, zero_beta)`
2. `q, k, v = n1 @ q_w, n1 @ k_w, n1 @ v_w` (three separate bias-free matmuls)
3. `qr, kr = rope(q), rope(k)` on packed `[B, S, heads*head_dim]` (NeoX half split),
   tables `rope.cos`/`rope.sin` `[max_position, head_dim/2]`
4. `attn = attention(qr, kr, v, causal)`; `a_o = attn @ o_w`
5. `post = add(x, a_o)` (skip first)
6. `n2 = rms_norm(post, ln2_g, zero_beta)`
7. SwiGLU FFN: `m = mul(silu(n2 @ gate_w), n2 @ up_w)`; `f = m @ down_w`
8. `out = add(post, f)`

The RmsNorm betas are one explicit all-zero param `zero_beta` `[H]`, as RLX's zero-beta stage makes
them. Param names follow Hugging Face `LlamaModel` (`layers.{i}.self_attn.q_proj.weight`, ...).
Graph input: `hidden_states` float32 `[batch, seq, hidden]`; output: the block output, same shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir import Builder, DType, Graph
from ..ir.emitter import Ref
from .bert import Variant
from .presets import Model, preset


@dataclass(frozen=True)
class LlamaConfig:
    """Sizes of a LLaMA-style decoder (names as in Hugging Face `LlamaConfig` where they exist).

    Attributes:
        hidden: model width H.
        heads: attention heads (no grouped-query attention: kv heads = heads).
        intermediate: SwiGLU width.
        layers: decoder blocks stacked.
        max_position: rows of the RoPE tables (longest sequence).
        eps: RmsNorm epsilon.
        rope_theta: RoPE base; frequency i is `rope_theta ** (-2i / head_dim)`.
    """

    hidden: int = 64
    heads: int = 4
    intermediate: int = 176
    layers: int = 1
    max_position: int = 512
    eps: float = 1e-6
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def rope_tables(max_position: int, head_dim: int, theta: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """RoPE tables `cos[p, i] = cos(p * theta^(-2i/head_dim))` and the matching `sin`, float32
    `[max_position, head_dim/2]` (Su et al. 2021; the NeoX/Hugging Face frequency layout).

    Raises:
        ValueError: odd `head_dim` or non-positive sizes.
    """
    if head_dim <= 0 or head_dim % 2 or max_position <= 0:
        raise ValueError(f"rope_tables: need an even head_dim > 0 and max_position > 0, got {head_dim}, "
                         f"{max_position}")
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arange(max_position, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _layer(b: Builder, cfg: LlamaConfig, x: Ref, zero: Ref, cos: Ref, sin: Ref, lp: str) -> Ref:
    h, i_sz, dh = cfg.hidden, cfg.intermediate, cfg.head_dim

    def w(name: str, n_in: int, n_out: int) -> Ref:
        return b.param(f"{lp}.{name}.weight", (n_in, n_out))

    with b.scope("input_layernorm"):
        n1 = b.rms_norm(x, b.param(f"{lp}.input_layernorm.weight", (h,)), zero, cfg.eps)
    with b.scope("self_attn"):
        proj = {}
        for p in ("q_proj", "k_proj", "v_proj"):
            with b.scope(p):
                proj[p] = b.matmul(n1, w(f"self_attn.{p}", h, h))
        with b.scope("rotary"):
            q = b.rope(proj["q_proj"], cos, sin, head_dim=dh)
            k = b.rope(proj["k_proj"], cos, sin, head_dim=dh)
        att = b.attention(q, k, proj["v_proj"], num_heads=cfg.heads, head_dim=dh, mask_kind="causal")
        with b.scope("o_proj"):
            a_o = b.matmul(att, w("self_attn.o_proj", h, h))
    post = b.add(x, a_o)
    with b.scope("post_attention_layernorm"):
        n2 = b.rms_norm(post, b.param(f"{lp}.post_attention_layernorm.weight", (h,)), zero, cfg.eps)
    with b.scope("mlp"):
        with b.scope("gate_proj"):
            gate = b.matmul(n2, w("mlp.gate_proj", h, i_sz))
        with b.scope("up_proj"):
            up = b.matmul(n2, w("mlp.up_proj", h, i_sz))
        m = b.mul(b.silu(gate), up)
        with b.scope("down_proj"):
            f = b.matmul(m, w("mlp.down_proj", i_sz, h))
    return b.add(post, f)


def build_llama_block(cfg: LlamaConfig, batch: int = 1, seq: int = 128, name: str | None = None) -> Graph:
    """A stack of `cfg.layers` LLaMA-style decoder blocks (see the module docstring for the op sequence).

    Args:
        cfg: sizes.
        batch, seq: static input shape.

    Returns:
        Graph with input `hidden_states` float32 `[batch, seq, hidden]` and one output of the same shape;
        params `zero_beta` `[H]`, `rope.cos`/`rope.sin` `[max_position, head_dim/2]` and per layer
        `layers.{i}.{input_layernorm,post_attention_layernorm}.weight` `[H]`,
        `layers.{i}.self_attn.{q,k,v,o}_proj.weight` `[H, H]`, `layers.{i}.mlp.{gate,up}_proj.weight`
        `[H, I]`, `layers.{i}.mlp.down_proj.weight` `[I, H]`.

    Raises:
        ValueError: `hidden % heads != 0`, odd head_dim, `seq > max_position` or non-positive sizes.
    """
    if cfg.hidden % cfg.heads or cfg.head_dim % 2:
        raise ValueError(f"[build_llama_block] hidden {cfg.hidden} / heads {cfg.heads} must give an even head_dim")
    if not 0 < seq <= cfg.max_position or batch <= 0 or cfg.layers <= 0:
        raise ValueError(f"[build_llama_block] need batch > 0, layers > 0 and 0 < seq <= max_position "
                         f"{cfg.max_position}; got batch {batch}, seq {seq}, layers {cfg.layers}")
    b = Builder(name or f"llama_{cfg.layers}x{cfg.hidden}")
    x = b.input("hidden_states", (batch, seq, cfg.hidden), DType.f32)
    zero = b.param("zero_beta", (cfg.hidden,))
    with b.scope("rotary_emb"):
        cos = b.param("rope.cos", (cfg.max_position, cfg.head_dim // 2))
        sin = b.param("rope.sin", (cfg.max_position, cfg.head_dim // 2))
    for i in range(cfg.layers):
        lp = f"layers.{i}"
        with b.scope(lp):
            x = _layer(b, cfg, x, zero, cos, sin, lp)
    b.output(x)
    return b.build()


def llama_random_weights(graph: Graph, cfg: LlamaConfig, seed: int = 0, std: float = 0.05) -> dict[str, np.ndarray]:
    """Seeded weights for a `build_llama_block` graph: norm gammas near 1, `zero_beta` all zero,
    RoPE tables computed from positions (`rope_tables`), matrices `N(0, std)`; float32."""
    rng = np.random.default_rng(seed)
    cos, sin = rope_tables(cfg.max_position, cfg.head_dim, cfg.rope_theta)
    out: dict[str, np.ndarray] = {}
    for p in graph.params:
        name = p.attrs["name"]
        if name == "zero_beta":
            arr = np.zeros(p.shape)
        elif name == "rope.cos":
            arr = cos
        elif name == "rope.sin":
            arr = sin
        elif name.endswith("layernorm.weight"):
            arr = 1.0 + 0.1 * rng.standard_normal(p.shape)
        else:
            arr = std * rng.standard_normal(p.shape)
        out[name] = np.asarray(arr, dtype=np.float32)
    return out


LLAMA_BLOCK = LlamaConfig()
_DESCRIPTION = "1 LLaMA-style decoder block (hidden 64, 4 heads, SwiGLU 176, RoPE, causal), seeded random weights"


@preset("llama-block", _DESCRIPTION)
def llama_block(batch: int = 1, seq: int = 128, style: str = "rlx", variant: Variant | None = None) -> Model:
    """The `llama-block` preset. `style` is ignored (there is one form); teaching variants are BERT-only.

    Raises:
        ValueError: a non-trivial `variant`.
    """
    if variant is not None and variant != Variant(layer=variant.layer):
        raise ValueError("llama-block has no teaching variants (they change BERT layers)")
    g = build_llama_block(LLAMA_BLOCK, batch, min(seq, LLAMA_BLOCK.max_position), name="llama_block")
    return Model("llama-block", g, llama_random_weights(g, LLAMA_BLOCK, seed=0), LLAMA_BLOCK, _DESCRIPTION)


__all__ = ["LLAMA_BLOCK", "LlamaConfig", "build_llama_block", "llama_block", "llama_random_weights", "rope_tables"]
