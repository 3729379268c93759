"""BERT encoder graphs in two styles, with teaching variants that break one layer on purpose.

* `style="rlx"`: RLX's canonical layer (docs/rlx.md §5.1): one QKV matmul `[H, 3H]` + bias, narrows
  at 0/H/2H on axis 2, packed `attention` with a binary keep mask, branch-first residual adds.
* `style="hf"`: Hugging Face `BertModel` as traced: separate Q/K/V linears, head reshape/transpose,
  `matmul -> div(sqrt d) -> add(additive mask) -> softmax -> matmul`, merge heads.

Weights are float32 and `[in, out]` (Hugging Face `Linear` weights transposed on load).
Graph inputs: `input_ids` and `attention_mask`, int64 `[batch, seq]` (1 = token, 0 = padding);
output: `last_hidden_state`, float32 `[batch, seq, hidden]`. Token type ids are taken as all 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from ..ir import Builder, DType, Graph, Node
from ..ir.emitter import Ref


class VariantLayerError(ValueError):
    """A teaching variant asked of a layer the model does not have (`layer` outside 0..`last`): the session
    words it for the user, naming the model (`session.VariantLayerError`)."""

    def __init__(self, layer: int, last: int) -> None:
        super().__init__(f"variant layer {layer}: the model has layers 0-{last}")
        self.layer, self.last = layer, last


@dataclass(frozen=True)
class BertConfig:
    """Sizes of a BERT encoder (names as in Hugging Face `BertConfig`)."""

    vocab_size: int = 30522
    hidden: int = 384
    heads: int = 12
    intermediate: int = 1536
    layers: int = 6
    max_position: int = 512
    type_vocab: int = 2
    eps: float = 1e-12
    activation: str = "gelu"

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @classmethod
    def from_hf(cls, cfg: dict) -> BertConfig:
        """From a Hugging Face `config.json` dict. Raises ValueError for a non-BERT or unsupported config."""
        try:
            act = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu",
                   "silu": "silu"}[cfg.get("hidden_act", "gelu")]
            return cls(vocab_size=int(cfg["vocab_size"]), hidden=int(cfg["hidden_size"]),
                       heads=int(cfg["num_attention_heads"]), intermediate=int(cfg["intermediate_size"]),
                       layers=int(cfg["num_hidden_layers"]), max_position=int(cfg.get("max_position_embeddings", 512)),
                       type_vocab=int(cfg.get("type_vocab_size", 2)), eps=float(cfg.get("layer_norm_eps", 1e-12)),
                       activation=act)
        except KeyError as e:
            raise ValueError(f"config.json lacks {e.args[0]!r}, which a BERT config needs") from None


@dataclass(frozen=True)
class Variant:
    """A deliberate change to one layer (or to the input size), used to teach why a fusion is rejected.

    Attributes:
        layer: which encoder layer to change.
        output_intermediate: also return h1 (the post-attention LayerNorm) as a graph output.
        extra_h1_user: add a third user of h1 (a `reduce_mean` returned as an extra output).
        dead_h1_user: add a third user of h1 that reaches no output (a `reduce_mean` nothing reads: dead code).
        tanh_gelu: the FFN uses tanh-approximated GELU instead of erf GELU.
        pre_ln: pre-LayerNorm ordering (`x + attn(LN(x))`), as in GPT-2 / LLaMA.
        swapped_residual: residual adds written skip-first, `add(x, branch)`.
        over_threshold: not a graph change: the session raises batch*seq above the attention-fusion gate
            (RLX's 64 tokens when no gate is set), so the size guard rejects attention fusion.
        label: a few words for menus. doc: one line on what the variant changes.
        breaks: what the variant is meant to show: True, a fusion the layer had is refused (a guard says why);
            False, the rules still fuse the layer (a form they accept, e.g. either operand order of an add).
    """

    layer: int = 0
    output_intermediate: bool = False
    extra_h1_user: bool = False
    dead_h1_user: bool = False
    tanh_gelu: bool = False
    pre_ln: bool = False
    swapped_residual: bool = False
    over_threshold: bool = False
    label: str = field(default="", compare=False)
    doc: str = field(default="", compare=False)
    breaks: bool = field(default=True, compare=False)

    def active(self, i: int) -> Variant | None:
        return self if i == self.layer else None

    @property
    def changes_graph(self) -> bool:
        """True when the variant rewrites a layer of the built graph (False for `none` and `over_threshold`)."""
        return any((self.output_intermediate, self.extra_h1_user, self.dead_h1_user, self.tanh_gelu, self.pre_ln,
                    self.swapped_residual))


VARIANTS: dict[str, Variant] = {
    "none": Variant(label="none (as built)", doc="the model as built", breaks=False),
    "output_intermediate": Variant(output_intermediate=True, label="intermediate h1 as a graph output",
                                   doc="h1 (the post-attention LayerNorm) is also returned as a graph output"),
    "extra_h1_user": Variant(extra_h1_user=True, label="extra user of h1",
                             doc="a third reader of h1 (a probe `reduce_mean` returned as an extra output)"),
    "dead_h1_user": Variant(dead_h1_user=True, label="dead extra user of h1",
                            doc="a third reader of h1 that reaches no output (a probe `reduce_mean`: dead code)"),
    "tanh_gelu": Variant(tanh_gelu=True, label="tanh-GELU in the FFN",
                         doc="the FFN uses tanh-approximated GELU instead of exact (erf) GELU"),
    "pre_ln": Variant(pre_ln=True, label="pre-LN ordering",
                      doc="pre-LayerNorm ordering x + attn(LN(x)), as in GPT-2 / LLaMA"),
    "swapped_residual": Variant(swapped_residual=True, label="swapped residual operands",
                                doc="residual adds written skip-first: add(hidden, branch)", breaks=False),
    "over_threshold": Variant(over_threshold=True, label="batch*seq over the attention threshold",
                              doc="batch*seq above RLX's attention-fusion gate of 64 tokens (rlx profile)"),
}
"""The one list of teaching variants (the CLI, the notebooks and the app all read it). Each applies to
`Variant.layer` (default 0; use `dataclasses.replace` to move it)."""


@dataclass
class _Extras:
    outputs: list[int] = field(default_factory=list)


def _embeddings(b: Builder, cfg: BertConfig, ids: Ref, seq: int) -> Ref:
    with b.scope("embeddings"):
        word = b.param("embeddings.word_embeddings.weight", (cfg.vocab_size, cfg.hidden))
        pos = b.param("embeddings.position_embeddings.weight", (cfg.max_position, cfg.hidden))
        tt = b.param("embeddings.token_type_embeddings.weight", (cfg.type_vocab, cfg.hidden))
        x = b.add(b.add(b.gather(word, ids), b.narrow(pos, 0, 0, seq)), b.narrow(tt, 0, 0, 1))
        with b.scope("LayerNorm"):
            return b.layer_norm(x, b.param("embeddings.LayerNorm.weight", (cfg.hidden,)),
                                b.param("embeddings.LayerNorm.bias", (cfg.hidden,)), cfg.eps)


def _linear(b: Builder, x: Ref, prefix: str, n_in: int, n_out: int) -> Ref:
    return b.linear(x, b.param(f"{prefix}.weight", (n_in, n_out)), b.param(f"{prefix}.bias", (n_out,)))


def _ln(b: Builder, x: Ref, prefix: str, cfg: BertConfig) -> Ref:
    return b.layer_norm(x, b.param(f"{prefix}.weight", (cfg.hidden,)), b.param(f"{prefix}.bias", (cfg.hidden,)),
                        cfg.eps)


def _residual(b: Builder, branch: Ref, skip: Ref, v: Variant | None) -> Ref:
    return b.add(skip, branch) if v and v.swapped_residual else b.add(branch, skip)


def _attention_rlx(b: Builder, cfg: BertConfig, x: Ref, mask: Ref, lp: str) -> Ref:
    h = cfg.hidden
    with b.scope("attention.self"):
        qkv = _linear(b, x, f"{lp}.attention.qkv", h, 3 * h)
        q, k, v = (b.narrow(qkv, 2, i * h, h) for i in range(3))
        att = b.attention(q, k, v, mask, num_heads=cfg.heads, head_dim=cfg.head_dim, mask_kind="keep")
    with b.scope("attention.output.dense"):
        return _linear(b, att, f"{lp}.attention.output.dense", h, h)


def _attention_hf(b: Builder, cfg: BertConfig, x: Ref, ext_mask: Ref, lp: str, batch: int, seq: int) -> Ref:
    h, nh, dh = cfg.hidden, cfg.heads, cfg.head_dim
    with b.scope("attention.self"):
        def heads(name: str) -> Ref:
            with b.scope(name):
                t = _linear(b, x, f"{lp}.attention.self.{name}", h, h)
                return b.transpose(b.reshape(t, (batch, seq, nh, dh)), (0, 2, 1, 3))

        q, k, v = heads("query"), heads("key"), heads("value")
        scores = b.div(b.matmul(q, b.transpose(k, (0, 1, 3, 2))), math.sqrt(dh))
        probs = b.softmax(b.add(scores, ext_mask), axis=-1)
        ctx = b.reshape(b.transpose(b.matmul(probs, v), (0, 2, 1, 3)), (batch, seq, h))
    with b.scope("attention.output.dense"):
        return _linear(b, ctx, f"{lp}.attention.output.dense", h, h)


def _layer(b: Builder, cfg: BertConfig, x: Ref, attend: object, lp: str, v: Variant | None, extras: _Extras) -> Ref:
    act = "gelu_tanh" if v and v.tanh_gelu else cfg.activation

    def attention(inp: Ref) -> Ref:
        return attend(inp)  # type: ignore[operator]

    def ffn(inp: Ref) -> Ref:
        with b.scope("intermediate.dense"):
            mid = b.unary(act, _linear(b, inp, f"{lp}.intermediate.dense", cfg.hidden, cfg.intermediate))
        with b.scope("output.dense"):
            return _linear(b, mid, f"{lp}.output.dense", cfg.intermediate, cfg.hidden)

    if v and v.pre_ln:
        with b.scope("attention.output.LayerNorm"):
            n1 = _ln(b, x, f"{lp}.attention.output.LayerNorm", cfg)
        h1 = _residual(b, attention(n1), x, v)
        with b.scope("output.LayerNorm"):
            n2 = _ln(b, h1, f"{lp}.output.LayerNorm", cfg)
        out = _residual(b, ffn(n2), h1, v)
    else:
        att = attention(x)
        with b.scope("attention.output.LayerNorm"):
            h1 = _ln(b, _residual(b, att, x, v), f"{lp}.attention.output.LayerNorm", cfg)
        f = ffn(h1)
        with b.scope("output.LayerNorm"):
            out = _ln(b, _residual(b, f, h1, v), f"{lp}.output.LayerNorm", cfg)
    if v and v.output_intermediate:
        extras.outputs.append(h1)
    if v and v.extra_h1_user:
        with b.scope("probe"):
            extras.outputs.append(b.reduce_mean(h1, (-1,), keepdims=True))
    if v and v.dead_h1_user:
        with b.scope("probe"):
            b.reduce_mean(h1, (-1,), keepdims=True)  # read by nothing: dead code
    return out


def build_bert(cfg: BertConfig, batch: int = 1, seq: int = 128, style: str = "rlx",
               variant: Variant | None = None, name: str | None = None) -> Graph:
    """A BERT encoder graph (embeddings + `cfg.layers` post-norm layers).

    Args:
        cfg: sizes.
        batch, seq: static input shape `[batch, seq]`.
        style: `"rlx"` (fused QKV, packed attention) or `"hf"` (Hugging Face primitives).
        variant: an optional teaching variant applied to `variant.layer`.

    Returns:
        Graph with inputs `input_ids`, `attention_mask` (int64 `[batch, seq]`) and output
        `last_hidden_state` (float32 `[batch, seq, hidden]`), followed by any variant outputs.

    Raises:
        ValueError: unknown style, `hidden % heads != 0`, `seq > max_position`; VariantLayerError (a ValueError): a
            variant layer out of range.
    """
    if style not in ("rlx", "hf"):
        raise ValueError(f"[build_bert] style must be 'rlx' or 'hf', got {style!r}")
    if cfg.hidden % cfg.heads:
        raise ValueError(f"[build_bert] hidden {cfg.hidden} is not divisible by heads {cfg.heads}")
    if seq > cfg.max_position:
        raise ValueError(f"[build_bert] seq {seq} exceeds max_position {cfg.max_position}")
    if variant is not None and not 0 <= variant.layer < cfg.layers:
        raise VariantLayerError(variant.layer, cfg.layers - 1)
    b = Builder(name or f"bert_{style}_{cfg.layers}x{cfg.hidden}")
    ids = b.input("input_ids", (batch, seq), DType.i64)
    mask_i = b.input("attention_mask", (batch, seq), DType.i64)
    x = _embeddings(b, cfg, ids, seq)
    with b.scope("mask"):
        mask = b.cast(mask_i, DType.f32)
        if style == "hf":
            neg = float(np.finfo(np.float32).min)
            ext = b.reshape(b.mul(b.sub(1.0, mask), neg), (batch, 1, 1, seq))
    extras = _Extras()
    for i in range(cfg.layers):
        lp = f"encoder.layer.{i}"
        v = variant.active(i) if variant else None
        with b.scope(lp):
            if style == "rlx":
                def attend(t: Ref, lp: str = lp) -> Ref:
                    return _attention_rlx(b, cfg, t, mask, lp)
            else:
                def attend(t: Ref, lp: str = lp) -> Ref:
                    return _attention_hf(b, cfg, t, ext, lp, batch, seq)
            x = _layer(b, cfg, x, attend, lp, v, extras)
    b.output(x, *extras.outputs)
    return b.build()


def random_weights(graph: Graph, seed: int = 0, std: float = 0.05) -> dict[str, np.ndarray]:
    """Seeded random float32 weights for every param of `graph`: LayerNorm gammas near 1, betas and
    biases small, matrices `N(0, std)`. Names and shapes come from the graph's params."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for p in graph.params:
        name = p.attrs["name"]
        out[name] = _random_array(rng, p, name, std)
    return out


_CHUNK = 1 << 20
"""Elements drawn per step by `_random_array`: the float64 draw never exceeds 8 MiB."""


def _random_array(rng: np.random.Generator, p: Node, name: str, std: float) -> np.ndarray:
    """One param's random value, allocated once at its own dtype (plus at most one 8 MiB float64 chunk):
    floats `loc + scale * N(0, 1)` drawn in chunks (the same numbers as one draw), bool/int params 0/1."""
    dt = p.dtype.numpy
    out = np.empty(p.shape, dtype=dt)
    flat = out.reshape(-1)
    if not p.dtype.is_float:
        for i in range(0, flat.size, _CHUNK):
            flat[i:i + _CHUNK] = rng.integers(0, 2, size=min(_CHUNK, flat.size - i), dtype=np.uint8)
        return out
    if name.endswith("LayerNorm.weight"):
        loc, scale = 1.0, 0.1
    elif p.rank == 1:
        loc, scale = 0.0, 0.02
    else:
        loc, scale = 0.0, std
    buf = np.empty(min(_CHUNK, flat.size))  # one float64 chunk, reused: the same numbers as one big draw
    for i in range(0, flat.size, _CHUNK):
        x = buf[:min(_CHUNK, flat.size - i)]
        rng.standard_normal(out=x)
        x *= scale
        if loc:
            x += loc
        flat[i:i + _CHUNK] = x
    return out


def rlx_weights_from_hf(weights: dict[str, np.ndarray], cfg: BertConfig) -> dict[str, np.ndarray]:
    """RLX-style weights from Hugging Face style (`[in, out]`) ones: Q|K|V concatenated into
    `attention.qkv.weight` `[H, 3H]` and `attention.qkv.bias` `[3H]` per layer (docs/rlx.md §5.1)."""
    out = dict(weights)
    for i in range(cfg.layers):
        p = f"encoder.layer.{i}.attention"
        for kind, axis in (("weight", 1), ("bias", 0)):
            parts = [out.pop(f"{p}.self.{n}.{kind}") for n in ("query", "key", "value")]
            out[f"{p}.qkv.{kind}"] = np.concatenate(parts, axis=axis)
    return out


def random_feeds(batch: int, seq: int, vocab: int, seed: int = 0, pad: bool = True) -> dict[str, np.ndarray]:
    """Random `input_ids` and an `attention_mask` (int64 `[batch, seq]`); with `pad`, row r>0 has r*seq//(2*batch)
    padded positions at the end, so masks are exercised."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, size=(batch, seq), dtype=np.int64)
    mask = np.ones((batch, seq), dtype=np.int64)
    if pad:
        for r in range(1, batch):
            n = r * seq // (2 * batch)
            if n:
                mask[r, seq - n:] = 0
    return {"input_ids": ids, "attention_mask": mask}


__all__ = ["BertConfig", "VARIANTS", "Variant", "VariantLayerError", "build_bert", "random_feeds", "random_weights",
           "rlx_weights_from_hf", "replace"]
