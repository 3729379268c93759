"""Semantics of every fused op, written once as a decomposition into primitive ops.

Each function takes an `Emitter` and the fused node's operands and emits the primitives. With the
reference interpreter's NumPy emitter it *computes* the fused op; with a `Rewriter` it *expands*
the node (the `unfuse` pass). One definition, so the oracle and unfuse cannot disagree.
Layouts follow RLX (docs/rlx.md §1.5, §3.2); RLX's known deviations are fixed here: RmsNorm adds
its beta, FusedSwiGLU honours `gate_first` (and takes a GELU gate, GeGLU, as `activation`), the block's attention
mask is the keep mask, binary or with Hugging Face's additive fill (`mask_fill`, so an all-zero mask row means what
it means unfused), or (attribute `mask="additive"`) any additive bias the attention takes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .emitter import Emitter
from .infer import parse_step
from .ops import Op, kv_heads, unpack
from .registry import registrar

V = TypeVar("V")
Decomposition = Callable[[Emitter[Any], dict[str, Any], Sequence[Any]], Any]
DECOMPOSITIONS: dict[Op, Decomposition] = {}


decomposition = registrar(DECOMPOSITIONS)
"""`@decomposition(op)`: register the primitive decomposition of fused op `op`."""


def expand(e: Emitter[V], op: Op, attrs: dict[str, Any], operands: Sequence[V]) -> V:
    """Emit the primitive decomposition of fused op `op` on `operands`; returns the result value."""
    return DECOMPOSITIONS[op](e, attrs, operands)


@decomposition(Op.FUSED_MATMUL_BIAS_ACT)
def matmul_bias_act(e: Emitter[V], a: dict[str, Any], x: Sequence[V]) -> V:
    """`act(x @ w + bias)`, bias rank <= 1 broadcast over rows (`Emitter.linear`: matmul, then add)."""
    r = unpack(Op.FUSED_MATMUL_BIAS_ACT, a, x)
    return e.linear_act(r["x"], r["w"], r["bias"], a.get("activation"))


def _residual(e: Emitter[V], op: Op, a: dict[str, Any], x: Sequence[V], kind: str) -> V:
    """`norm(x + residual [+ bias])` (`Emitter.residual_norm`: one pass where a backend has the kernel); with
    `with_sum`, the sum is an output too: the two adds, the norm, and `[y, s]` packed (`_with_sum`)."""
    r = unpack(op, a, x)
    if not a.get("with_sum", False):
        return e.residual_norm(r["x"], r["residual"], r.get("bias"), r["gamma"], r["beta"], a["eps"], kind)
    s = e.add(r["x"], r["residual"])
    if "bias" in r:
        s = e.add(s, r["bias"])
    norm = e.layer_norm if kind == "layer_norm" else e.rms_norm
    return _with_sum(e, a, norm(s, r["gamma"], r["beta"], a["eps"]), s)  # type: ignore[operator]


def _with_sum(e: Emitter[V], a: dict[str, Any], y: V, s: V) -> V:
    """`with_sum`: the two outputs packed on the last axis, `concat([y, s], -1)` (`[..., 2H]`); else `y`. The IR
    holds one value per node, so a two-output op packs its outputs and `narrow`s read them (as a merged QKV
    matmul's outputs are read); an executor may keep them apart."""
    if not a.get("with_sum", False):
        return y
    return e.concat([y, s], len(e.shape_of(s)) - 1)


@decomposition(Op.FUSED_RESIDUAL_LN)
def residual_ln(e: Emitter[V], a: dict[str, Any], x: Sequence[V]) -> V:
    """`LayerNorm(x + residual [+ bias])` over the last axis; with `with_sum`, `[LayerNorm(s), s]` packed."""
    return _residual(e, Op.FUSED_RESIDUAL_LN, a, x, "layer_norm")


@decomposition(Op.FUSED_RESIDUAL_RMS_NORM)
def residual_rms_norm(e: Emitter[V], a: dict[str, Any], x: Sequence[V]) -> V:
    """`RmsNorm(x + residual [+ bias]) * gamma + beta` over the last axis; with `with_sum`, `[y, s]` packed."""
    return _residual(e, Op.FUSED_RESIDUAL_RMS_NORM, a, x, "rms_norm")


@decomposition(Op.FUSED_SWIGLU)
def swiglu(e: Emitter[V], a: dict[str, Any], x: Sequence[V]) -> V:
    """`act(gate) * up` from packed `[..., 2N]` -> `[..., N]`; up is the low half unless `gate_first`; `act` the
    `activation` (`silu`: SwiGLU; `gelu` / `gelu_tanh`: GeGLU), emitted as that unary op."""
    shape = e.shape_of(x[0])
    axis, n = len(shape) - 1, shape[-1] // 2
    lo, hi = e.narrow(x[0], axis, 0, n), e.narrow(x[0], axis, n, n)
    up, gate = (hi, lo) if a.get("gate_first", False) else (lo, hi)
    return e.mul(e.unary(a.get("activation") or "silu", gate), up)


def attention_block(e: Emitter[V], heads: int, head_dim: int, hidden: V, qkv_w: V, out_w: V, mask: V,
                    qkv_b: V | None = None, out_b: V | None = None,
                    rope: tuple[V, V] | None = None, kv: int | None = None, mask_fill: float | None = None,
                    mask_kind: str = "keep", rope_dtype: str | None = None) -> V:
    """QKV projection, split Q|K|V on the last axis (widths H, KV, KV with H = heads*head_dim and
    KV = kv*head_dim; MHA when `kv` is None: 0/H/2H), [RoPE on q, k], masked SDPA (grouped-query
    when kv < heads), output projection.

    `mask_kind` (`ops.BLOCK_MASK_KINDS`): `keep`, a `[B, S]` keep mask, with `mask_fill` None = binary and a
    float = Hugging Face's `(1 - mask) * fill`; `additive`, a bias broadcastable to `[B, heads, S, S]` added to
    the scaled scores as it is (see `ops.MASK_KINDS`). `rope_dtype` (with `rope`): the dtype Q and K are rotated in,
    cast to it before the rope and back to the projection's dtype after (`cast(rope(cast(q, f32)), f16)`: a float16
    model whose rotation promotes to float32 tables, as `fuse_sdpa.cast_heads` leaves it); None: the projection's."""
    qkv = e.linear(hidden, qkv_w, qkv_b)
    width, kv_width = heads * head_dim, (kv or heads) * head_dim
    axis = len(e.shape_of(qkv)) - 1
    q = e.narrow(qkv, axis, 0, width)
    k = e.narrow(qkv, axis, width, kv_width)
    v = e.narrow(qkv, axis, width + kv_width, kv_width)
    if rope is not None and rope_dtype is not None:
        dt = e.dtype_of(q)
        q, k = (e.cast(e.rope(e.cast(t, rope_dtype), *rope, head_dim), dt) for t in (q, k))
    elif rope is not None:
        q, k = e.rope(q, *rope, head_dim), e.rope(k, *rope, head_dim)
    att = e.attention(q, k, v, mask, num_heads=heads, head_dim=head_dim, mask_kind=mask_kind,
                      num_kv_heads=None if kv in (None, heads) else kv, mask_fill=mask_fill)
    return e.linear(att, out_w, out_b)


@decomposition(Op.FUSED_ATTENTION_BLOCK)
def fused_attention_block(e: Emitter[V], a: dict[str, Any], x: Sequence[V]) -> V:
    """Operands by role (`ops.operand_roles`): hidden, qkv_w, out_w, mask, [qkv_b, out_b], [rope_cos,
    rope_sin] -> attention output `[B, S, H]`; `qkv_w` is `[hidden, (num_heads + 2*num_kv_heads)*head_dim]`; Q and K
    rotated in `rope_dtype` when set (`attention_block`)."""
    r = unpack(Op.FUSED_ATTENTION_BLOCK, a, x)
    rope = (r["rope_cos"], r["rope_sin"]) if "rope_cos" in r else None
    return attention_block(e, a["num_heads"], a["head_dim"], r["hidden"], r["qkv_w"], r["out_w"], r["mask"],
                           r.get("qkv_b"), r.get("out_b"), rope, kv_heads(a), a.get("mask_fill"), a.get("mask", "keep"),
                           a.get("rope_dtype"))


@decomposition(Op.FUSED_TRANSFORMER_LAYER)
def transformer_layer(e: Emitter[V], a: dict[str, Any], x: Sequence[V]) -> V:
    """Post-norm BERT layer (14-input layout, seed `transformer_layer.rs`):
    `h1 = LN1(attn(hidden) + hidden)`, `out = LN2(fc2(act(fc1(h1))) + h1)`."""
    r = unpack(Op.FUSED_TRANSFORMER_LAYER, a, x)
    hidden = r["hidden"]
    att = attention_block(e, a["num_heads"], a["head_dim"], hidden, r["qkv_w"], r["out_w"], r["mask"],
                          r["qkv_b"], r["out_b"], mask_fill=a.get("mask_fill"), mask_kind=a.get("mask", "keep"))
    h1 = e.residual_norm(att, hidden, None, r["ln1_g"], r["ln1_b"], a["eps1"])
    mid = e.linear_act(h1, r["fc1_w"], r["fc1_b"], a["activation"])
    return e.residual_norm(e.linear(mid, r["fc2_w"], r["fc2_b"]), h1, None, r["ln2_g"], r["ln2_b"], a["eps2"])


@decomposition(Op.ELEMENTWISE_REGION)
def elementwise_region(e: Emitter[V], a: dict[str, Any], x: Sequence[V]) -> V:
    """Replay the chain: step k reads external inputs `iK` and earlier steps `sK`; the last step is the result."""
    steps: list[V] = []
    for step in a["chain"]:
        op, step_attrs, refs = parse_step(step)
        operands = [x[int(r[1:])] if r[0] == "i" else steps[int(r[1:])] for r in refs]
        steps.append(e.emit(op, operands, **step_attrs))
    return steps[-1]
