"""`fuse_attention_block` (docs/rlx.md §2.3.2, newer revision): QKV `FusedMatMulBiasAct(None)` ->
narrows at 0/H/2H of the last axis -> `attention(keep | additive)` -> out-projection `FusedMatMulBiasAct(None)`
-> `FusedAttentionBlock`. RLX gates the whole graph on "any input has dim0*dim1 <= 64"; here the
gate is the pipeline parameter `fab_max_tokens`, checked per anchor on that attention's batch*seq,
and the rejection states both numbers. Canonical default: no gate (MLX runtime fusion pays at every
size); the `rlx` profile sets RLX's 64.

The QKV and output projections may each be a `FusedMatMulBiasAct(activation=None)` or a bare `matmul`
(Whisper's K, GPT-style bias-less models): a bare one gets a zero bias operand `expand(0.0, [N])`.

Validity: the block's decomposition (`ir.fused.attention_block`) is the matched chain itself
(linear, narrows at 0/H/2H, attention with the same mask operand, mask kind and `mask_fill`, linear); it
requires the default scale (guard `default_scale`) and a keep or additive mask (guard `mask_kind_keep`; the block's
attribute `mask`, `additive` adds the operand to the scaled scores as the attention does, broadcast to
`[B, heads, S, S]`: a TorchScript sdpa padding mask `[B, 1, S, S]`, a causal table, a band), so it holds for every
input, fully masked rows included (the same op computes them). A zero bias is exact:
`x + 0 == x` for every x (finite, infinite or NaN; -0.0 + 0 gives +0.0, which compares equal).

Q and K rotated in another float dtype between casts, `cast(rope(cast(narrow(qkv), T), cos, sin), D)` (a float16
model whose `apply_rotary_pos_emb` promotes to float32 tables: OLMo; the form `fuse_sdpa.cast_heads` leaves), are the
block's `rope_dtype` T: its decomposition emits the same casts around the same rope, so it is the matched chain
again, exact for every input. Guard `rope_dtype`: Q and K both rotated in one float dtype T, each cast back to the
projection's dtype D (one attribute holds one dtype for both).

A `default_scale` refusal of the default scale applied to Q before its RoPE (ESM: `fuse_sdpa` folds no scale through
a rotation) is another gap, `FusedAttentionBlock with the scale applied to Q before RoPE` (`scale_blame
.pre_rope_scale`: nothing to change in the model, a compiler fix in `fuse_sdpa`).
A `default_scale` refusal (Granite's attention multiplier) is a gap in rlxviz's block (no scale attribute), and its fix
line is a change to the model where one keeps the numbers (`scale_fold`): the ratio to the default folded into the Q
projection's weight (and bias), the scores scaled by the default, when Q is linear in that projection (RoPE, the head
split); exact for a power-of-two ratio. Advice checks it as a what-if (`whatif.MODEL_WHAT_IFS`).
"""


from __future__ import annotations

import math
from collections.abc import Callable

from ...ir import Graph, Node, Op, Rewriter
from ...ir.ops import BLOCK_MASK_KINDS, kv_heads, operand_roles
from ..engine import rule_pass, stage
from ..guard import (
    MODEL_TERM,
    NOT_RECOGNIZED,
    Ctx,
    Guard,
    all_single_use,
    attr_eq,
    guard,
    not_output,
    single_user,
    size_le,
    use_count,
    user_count,
)
from ..pattern import P
from ..rule import Fail, Rule, Shape, User, reports
from ..trace import layer_of
from .kv_cache import cached_length, kv_workload
from .qkv_columns import QKV_COLUMNS_PASS


def tokens(c: Ctx, role: str = "attn") -> tuple[int, str]:
    """batch*seq of the attention bound to `role` (its output is [B, S, H])."""
    b, s = c[role].shape[0], c[role].shape[1]
    return b * s, f"{b}*{s}"


def size_gate(role: str = "attn") -> Guard:
    """The per-anchor batch*seq gate (pipeline param `fab_max_tokens`; None = no gate)."""
    return size_le("fab_max_tokens", lambda c: tokens(c, role), "batch*seq", "attention_size_gate", role,
                   "raise or unset fab_max_tokens (the canonical profile has no gate; the rlx profile uses 64)")


def _widths(c: Ctx) -> tuple[int, int]:
    """(H, KV): the query width and the key/value width of the bound attention (GQA: KV < H)."""
    a = c["attn"].attrs
    return a["num_heads"] * a["head_dim"], kv_heads(a) * a["head_dim"]


def _split_at(c: Ctx) -> bool:
    h, kv = _widths(c)
    rank = c["qkv"].rank
    for r, start, n in (("q", 0, h), ("k", h, kv), ("v", h + kv, kv)):
        a = c[r].attrs
        if a["axis"] not in (-1, rank - 1) or a["start"] != start or a["length"] != n:
            return False
    return c["qkv"].shape[-1] == h + 2 * kv


def _explain_block_scale(c: Ctx) -> str:
    a = c["attn"].attrs
    d = a["head_dim"]
    return (f"{c.d('attn')} has scale={a.get('scale')!r}; the block computes the default 1/sqrt(head_dim) = "
            f"1/sqrt({d}) = {1 / math.sqrt(d):.6g}")


def _explain_split(c: Ctx) -> str:
    h, kv = _widths(c)
    got = ", ".join(f"{r}=narrow(axis {c[r].attrs['axis']}, start {c[r].attrs['start']}, len {c[r].attrs['length']})"
                    for r in ("q", "k", "v"))
    width = c["qkv"].shape[-1]
    if width != h + 2 * kv:
        qkv = {c.id(r) for r in ("q", "k", "v")}
        others = [u for u in c.users("qkv") if u.id not in qkv]
        extra = ", ".join(f"{u.op.value} (node {u.id}" + (f", start {u.attrs['start']}, len {u.attrs['length']})"
                                                          if u.op == Op.NARROW else ")") for u in others)
        why = (f": it also feeds {extra}, another projection of the same input merged into it (by "
               f"fuse_shared_input_matmul)" if others else "")
        return (f"{got} of {c.d('qkv')}: the packed projection is {width} wide, not {h}+2*{kv} = {h + 2 * kv}{why}; "
                f"needs exactly Q, K and V at 0/{h}/{h + kv}")
    lens = f"length {h}" if kv == h else f"lengths {h}/{kv}/{kv} (grouped-query)"
    return f"{got} of {c.d('qkv')} {list(c['qkv'].shape)}; needs starts 0/{h}/{h + kv} with {lens} on the last axis"


def _unfused_bias(c: Ctx) -> Node | None:
    """A bare-matmul output projection's bias add that `fuse_matmul_bias_act` did not take (the matmul has
    other readers): the block would compute the product without it, so it is not taken as bias-less."""
    out = c["out"]
    if out.op != Op.MATMUL:
        return None
    g = c.graph
    for u in c.users("out"):
        if u.op == Op.ADD and u.inputs.count(out.id) == 1:
            other = g[next(i for i in u.inputs if i != out.id)]
            if other.shape in ((), (1,), (out.shape[-1],)):
                return u
    return None


def _explain_unfused_bias(c: Ctx) -> str:
    add = _unfused_bias(c)
    assert add is not None
    return (f"the output projection {c.d('out')} is a bare matmul, but its bias add {add.op.value} (node {add.id}) "
            f"was not fused into it ({use_count(c.graph, c.id('out'), c.d('out'), c.name_of)}); the block would "
            f"leave the bias outside")


_ABSORBED = ("qkv", "q", "k", "q_up", "k_up", "q_rope", "k_rope", "q_down", "k_down", "v", "attn", "out")


def _block_rewrite(c: Ctx, rw: Rewriter) -> int:
    """The FusedAttentionBlock; a projection that is a bare matmul (no bias) gets a zero bias
    `expand(0.0, [N])` as its bias operand: `x @ w + 0 == x @ w` for every input, so the block computes
    the matched chain exactly."""
    attn = c["attn"].attrs
    attrs = {"num_heads": attn["num_heads"], "head_dim": attn["head_dim"], "has_bias": True,
             "has_rope": "q_rope" in c, "num_kv_heads": attn.get("num_kv_heads"), "mask_fill": attn.get("mask_fill")}
    attrs["mask"] = attn["mask"]  # keep or additive (guard mask_kind_keep): the attention's operand, as it is
    if "q_up" in c:  # Q and K rotated in this dtype between casts (guard rope_dtype)
        attrs["rope_dtype"] = c["q_up"].dtype.value
    absorbed = [c.id(r) for r in _ABSORBED if r in c]
    ins = []
    with rw.provenance(absorbed):
        for r in operand_roles(Op.FUSED_ATTENTION_BLOCK, attrs, 0):
            if r in c:
                ins.append(c.id(r))
            else:  # qkv_b / out_b of a bare matmul projection
                proj = c[r[:-2]]
                ins.append(rw.expand(rw.const(0.0, proj.dtype), (proj.shape[-1],)))
    return rw.fuse(Op.FUSED_ATTENTION_BLOCK, ins, attrs, absorbed=absorbed, result=c.id("out"))


def _projected_from(g: Graph, i: int) -> int | None:
    """The input a Q/K/V operand is projected from: `x` of `matmul(x, w)` / `FusedMatMulBiasAct(x, ...)`, through
    a bias add and a narrow of a packed projection; None when it is not a projection (a norm, a rotation)."""
    for _ in range(4):
        n = g[i]
        if n.op in (Op.MATMUL, Op.FUSED_MATMUL_BIAS_ACT):
            return n.inputs[0]
        if n.op == Op.NARROW:
            i = n.inputs[0]
        elif n.op == Op.ADD:
            mm = [j for j in n.inputs if g[j].op == Op.MATMUL]
            if len(mm) != 1:
                return None
            i = mm[0]
        else:
            return None
    return None


def qkv_sharing(q: int, k: int, v: int) -> str:
    """Which of an attention's Q, K and V share the input they are projected from (node ids `q`, `k`, `v`):
    `self` (one input), `cross` (K and V one input, Q another: a decoder's cross-attention), `qk` (Q and K one input,
    V another: MobileBERT's bottleneck), `qv` (Q and V one input, K another) or `apart` (three inputs)."""
    if q == k == v:
        return "self"
    return "cross" if k == v else "qk" if q == k else "qv" if q == v else "apart"


_NOT_CROSS = "not cross-attention: K and V do not share an input"
SHARING_WORDS: dict[str, tuple[str, str, str]] = {
    "cross": ("Q and K/V come from different inputs: Q is projected from {q}, K and V from {k} (cross-attention)",
              "cross-attention keeps its packed attention",
              "a cross-attention block (a Q projection and a packed K/V projection)"),
    "qk": ("V is projected from another input than Q and K: Q and K from {q}, V from {v} (self-attention with a "
           f"separate V input, as in MobileBERT's bottleneck; {_NOT_CROSS})",
           "V read from another input than Q and K is the model's own structure, and the attention stays packed",
           "a block with a packed QK projection and a separate V projection (Q and K of one input, V of another)"),
    "qv": ("K is projected from another input than Q and V: Q and V from {q}, K from {k} "
           f"(self-attention with a separate K input; {_NOT_CROSS})",
           "K read from another input than Q and V is the model's own structure, and the attention stays packed",
           "a block with a packed QV projection and a separate K projection (Q and V of one input, K of another)"),
    "apart": (f"Q, K and V are projected from three different inputs: Q from {{q}}, K from {{k}}, V from {{v}} "
              f"({_NOT_CROSS})",
              "three inputs to one attention are the model's own structure, and the attention stays packed",
              "a block with three separate projections (Q, K and V each of its own input)"),
}
"""`qkv_sharing` form (all but `self`) -> (what the attention reads, `{q}`/`{k}`/`{v}` naming each projection's
input; what stays the model's own, after `nothing to change in the model: `; the compiler fix: a block that would
take the form): the words of `self_attention`'s refusal, one entry per form, so only K and V from one input other than
Q's is called cross-attention."""


@reports("self_attention", kind=MODEL_TERM, reads=("attn",))
def _self_attention(c: Ctx) -> Fail | None:
    """Q, K and V projected from one input (self-attention). Any other sharing (`qkv_sharing`: cross-attention, Q
    from the decoder and K/V from the encoder; MobileBERT's V from another input than Q and K) is the model's own
    structure: the block, one QKV projection of one hidden input, cannot hold it (`SHARING_WORDS` words each)."""
    g, attn = c.graph, c["attn"]
    q, k, v = (_projected_from(g, i) for i in attn.inputs[:3])
    if q is None or k is None or v is None or (form := qkv_sharing(q, k, v)) == "self":
        return None
    kv = k if k == v else None
    what = (f"K and V from {c.name_of(kv)}" if kv is not None
            else f"K from {c.name_of(k)} and V from {c.name_of(v)}")
    mine, theirs = layer_of(attn.path), {layer_of(g[i].path) for i in attn.inputs[1:3]}
    if mine is not None and None not in theirs and mine not in theirs:  # cross-layer KV sharing (Gemma 3n, CLA)
        owner = ", ".join(map(str, sorted(theirs)))
        return Fail("guard", "self_attention",
                    f"layer {mine}'s attention {c.d('attn')} reads K and V projected in layer {owner} ({what}): "
                    f"cross-layer KV sharing; FusedAttentionBlock projects the K/V of its own layer (one QKV "
                    f"projection)", (), (), "nothing to change in the model: sharing K/V is the model's own "
                    "structure, and the attention stays packed over the shared K/V",
                    subject=attn.inputs[1], kind=MODEL_TERM,
                    fix="the block would need a KV input it does not own: a block variant that takes K/V as "
                        "operands (its own Q projection, another layer's K/V)")
    reads, own, fix = SHARING_WORDS[form]
    return Fail("guard", "self_attention",
                f"{reads.format(q=c.name_of(q), k=c.name_of(k), v=c.name_of(v))}; FusedAttentionBlock is the "
                f"self-attention of one hidden input (one QKV projection)", (), (),
                f"nothing to change in the model: {own}", subject=q, kind=MODEL_TERM, fix=fix)


def _rotated(tag: str) -> P:
    """Q or K of the block: a narrow of the packed QKV projection, or that narrow rotated by the rope op (the
    block's `has_rope`: one cos/sin table pair for Q and K), or rotated in another float dtype between two casts,
    `cast(rope(cast(narrow, T)), D)` (the block's `rope_dtype` T: a float16 model whose rotation promotes to float32
    tables, the form `fuse_sdpa.cast_heads` leaves; guard `rope_dtype`)."""
    narrow = P(Op.NARROW, P.var("qkv"), name=tag)
    one = ("Q and K must be rotated by one cos/sin table pair (the same nodes): here each reads its own; if the two "
           "hold the same values, compute the table once in the model")

    def rope(x: P) -> P:
        return P(Op.ROPE, x, P.var("rope_cos", hint=one), P.var("rope_sin", hint=one), name=f"{tag}_rope")

    return rope(narrow) | narrow | P(Op.CAST, rope(P(Op.CAST, narrow, name=f"{tag}_up")), name=f"{tag}_down")


_CASTS = ("q_up", "k_up", "q_down", "k_down")
ROPE_DTYPES_GAP = "FusedAttentionBlock with Q and K rotated in two dtypes"
"""What rlxviz's block lacks for Q and K rotated in different dtypes (`rope_dtype` holds one for both)."""


def _rope_dtype_fault(c: Ctx) -> tuple[str, str] | None:
    """`(role, why)` when the casts around Q's and K's rotations are no `rope_dtype` of one block (the role of the
    cast at fault), None when they are one, or when neither rotation has them: both rotations between casts, into
    one float dtype T and back to the projection's dtype."""
    ups = [r for r in ("q_up", "k_up") if r in c]
    if not ups:
        return None
    if len(ups) == 1:
        other = "k_rope" if ups[0] == "q_up" else "q_rope"
        return ups[0], (f"{c.d(ups[0])} casts {ups[0][0].upper()} to {c[ups[0]].dtype} for its rotation and "
                        f"{c.d(other)} rotates in {c[other].dtype} without a cast; FusedAttentionBlock rotates Q "
                        f"and K in one dtype (rope_dtype)")
    if c["q_up"].dtype != c["k_up"].dtype or not c["q_up"].dtype.is_float:
        return "k_up", (f"{c.d('q_up')} casts Q to {c['q_up'].dtype} and {c.d('k_up')} casts K to "
                        f"{c['k_up'].dtype} for their rotations; FusedAttentionBlock rotates Q and K in one float "
                        f"dtype (rope_dtype)")
    back = [r for r in ("q_down", "k_down") if c[r].dtype != c["qkv"].dtype]
    if back:
        return back[0], (f"{c.d(back[0])} casts the rotation to {c[back[0]].dtype}, not back to the projection's "
                         f"{c['qkv'].dtype}; FusedAttentionBlock casts its rotated Q and K back to the projection's "
                         f"dtype")
    return None


def _fault(c: Ctx) -> tuple[str, str]:
    """`_rope_dtype_fault` of a refused match (the guard's explanation and subject)."""
    found = _rope_dtype_fault(c)
    assert found is not None
    return found


ROPE_ONE_OPERAND_GAP = "FusedAttentionBlock with RoPE on Q or K alone"
"""What rlxviz's block lacks for an attention whose Q or K alone is rotated: its RoPE (`has_rope`) rotates both."""
PARTIAL_ROTARY_GAP = "FusedAttentionBlock with partial rotary RoPE"
"""What rlxviz's block lacks for a rotation of part of each head (GPT-NeoX, Phi: `n_rot < head_dim`): its RoPE rotates
every dim."""
INTERLEAVED_ROPE_GAP = "FusedAttentionBlock with interleaved RoPE"
"""What rlxviz's block lacks for a rotation of interleaved pairs (GPT-J's rotate_every_two): its RoPE rotates the NeoX
halves."""
_ROPES = ("q_rope", "k_rope")


def _lone_rope(c: Ctx) -> tuple[str, ...]:
    """The role of the one rotation when the block's Q or K alone is rotated (`(q_rope,)` or `(k_rope,)`), else ()."""
    ropes = tuple(r for r in _ROPES if r in c)
    return ropes if len(ropes) == 1 else ()


def _partial_ropes(c: Ctx) -> tuple[str, ...]:
    """The roles of every rotation of Q and K that does not rotate every dim of the attention's heads (`n_rot` or its
    `head_dim` is not the attention's head_dim: partial rotary): GPT-NeoX's `(q_rope, k_rope)`; () for none."""
    d = c["attn"].attrs["head_dim"]
    return tuple(r for r in _ROPES if r in c and (c[r].attrs["head_dim"] != d or c[r].attrs["n_rot"] != d))


def _interleaved_ropes(c: Ctx) -> tuple[str, ...]:
    """The roles of every rotation of Q and K that rotates interleaved pairs (GPT-J); () for none."""
    return tuple(r for r in _ROPES if r in c and c[r].attrs.get("interleaved", False))


def _rotations(c: Ctx, roles: tuple[str, ...], what: Callable[[Ctx, str], str]) -> str:
    """The rotations `roles` and what each does (`what`), as one refusal names them: `q_rope (node 245, P) and k_rope
    (node 247, P) rotate 4 of 16 dims per head` when they do the same, else each with its own words joined by `;`."""
    said = [what(c, r) for r in roles]
    if len(set(said)) == 1 and len(roles) > 1:
        verb, _, rest = said[0].partition(" ")
        return f"{' and '.join(c.d(r) for r in roles)} {verb.removesuffix('s')} {rest}"
    return "; ".join(f"{c.d(r)} {s}" for r, s in zip(roles, said, strict=True))


def _rope_guard(name: str, find: Callable[[Ctx], tuple[str, ...]], what: Callable[[Ctx, str], str],
                tail: Callable[[Ctx], str], hint: str, fix: str, gap: str) -> Guard:
    """A check of the block's RoPE (`has_rope`: Q and K rotated by one cos/sin pair, every dim of each head, NeoX
    halves) on the rotations the attention reads, `find` naming every one it cannot take (Q's and K's both, when both
    fail: the message and the offending nodes name each, the first is the subject); `what` says what one rotation does
    (`rotates 4 of 16 dims per head`), `tail` what the block does instead. A rotation it lacks a form for (`gap`,
    `Guard.lacking`) stays outside, the attention packed reading it. Each rotation is a rope op (the structure step
    `qkv_packed` binds `q_rope`/`k_rope` when Q/K is rotated)."""
    def subject(c: Ctx) -> int | None:
        found = find(c)
        return c.id(found[0]) if found else None

    return guard(name, lambda c: not find(c), lambda c: f"{_rotations(c, find(c), what)}{tail(c)}", hint,
                 lambda c: (tuple(c.id(r) for r in find(c)), ()), requires=("attn",),
                 optional=_ROPES, kind=NOT_RECOGNIZED, subject=subject, fix=fix).lacking(("attention",), gap)


ROPE_GUARDS = (
    _rope_guard("rope_q_and_k", _lone_rope, lambda c, r: f"rotates {r[0].upper()} only",
                lambda c: "; FusedAttentionBlock's RoPE rotates Q and K with one cos/sin table pair",
                "nothing to change in the model: the packed attention keeps the rotation as its operand",
                "a block RoPE applied to Q or K alone", ROPE_ONE_OPERAND_GAP),
    _rope_guard("rope_full_rotary", _partial_ropes,
                lambda c, r: f"rotates {c[r].attrs['n_rot']} of {c[r].attrs['head_dim']} dims per head (partial "
                             f"rotary)",
                lambda c: f" on heads of {c['attn'].attrs['head_dim']}; FusedAttentionBlock's RoPE rotates every dim "
                          f"of each head",
                "nothing to change in the model: partial rotary keeps its packed attention",
                "an n_rot attribute on FusedAttentionBlock", PARTIAL_ROTARY_GAP),
    _rope_guard("rope_halves", _interleaved_ropes, lambda c, r: "rotates interleaved pairs (GPT-J, rotate_every_two)",
                lambda c: "; FusedAttentionBlock's RoPE rotates the NeoX halves",
                "nothing to change in the model: the interleaved rotation keeps its packed attention",
                "an interleaved attribute on FusedAttentionBlock", INTERLEAVED_ROPE_GAP),
)
"""The block's RoPE checks, in the order a refusal names them: Q and K both rotated, every dim, NeoX halves."""


@reports("kv_cache", kind=MODEL_TERM, reads=("attn",))
def _kv_cache(c: Ctx) -> Fail | None:
    """K or V read through a KV cache (`concat(past, this step's K)`, `kv_cache.pack_cache`; a decode step or a
    prefill, `kv_cache.kv_workload`): the block projects K and V from the hidden states only, so it cannot hold the
    cache (the model's own structure)."""
    g, attn = c.graph, c["attn"]
    for who, i in (("K", attn.inputs[1]), ("V", attn.inputs[2])):
        n = g[i]
        if n.op == Op.CONCAT and len(n.inputs) == 2 and n.attrs["axis"] in (1, -2):
            past = g[g[n.inputs[0]].inputs[0]] if g[n.inputs[0]].op == Op.RESHAPE else g[n.inputs[0]]
            past = g[past.inputs[0]] if past.op == Op.TRANSPOSE else past
            workload = kv_workload(attn.shape[1], cached_length(g, n.id))
            return Fail("guard", "kv_cache",
                        f"{who} is {c.name_of(n.id)}: the cache {c.name_of(past.id)} and this step's {who} (a "
                        f"{workload} with a KV cache, {attn.shape[1]} quer{'y' if attn.shape[1] == 1 else 'ies'} "
                        f"against {n.shape[1]} keys); FusedAttentionBlock projects K and V from the hidden states, "
                        f"so the cache stays outside the packed attention's block", (n.id,), (),
                        f"nothing to change in the model: the {workload.split(' of ')[0]} keeps its packed "
                        "attention",
                        subject=n.id, kind=MODEL_TERM, fix="a block that appends this step's K/V to a cache operand")
    return None


NO_MASK_GAP = "FusedAttentionBlock without a mask operand"
"""What rlxviz's block lacks for an unmasked attention (`Guard.lacking`): a ViT layer's attention has no mask, the
simplest form, and was called "not expected" to form the block, which hid a gap in rlxviz's own op."""
NO_MASK_FIX = ("a FusedAttentionBlock without a mask operand, or one fed a zero additive mask; a causal kind for a "
               "causal mask")
CAUSAL_GAP = "FusedAttentionBlock with a causal mask kind"
"""What rlxviz's block lacks for a causal attention (mask kind `causal`, no operand): it takes a keep or an additive
mask operand only (a LLaMA block's attention was called "not expected" while its own compiler fix named the gap)."""
SCALE_GAP = "FusedAttentionBlock with a non-default scale"
"""What rlxviz's block lacks for an attention whose scale is not 1/sqrt(head_dim) (Granite's attention multiplier):
the block computes the default scale only."""
PRE_ROPE_SCALE_GAP = "FusedAttentionBlock with the scale applied to Q before RoPE"
"""What rlxviz lacks for an attention whose default 1/sqrt(head_dim) scale is applied to Q before its RoPE (ESM):
`fuse_sdpa` folds no scale through a rotation, so the packed attention keeps scale 1.0 and the block, which computes
the default, refuses it (`default_scale`). Not a non-default scale: the scale is the default, only placed earlier."""
PRE_ROPE_SCALE_FIX = ("fold a Q pre-scale through RoPE in fuse_sdpa (exact for a power-of-two scale; up to rounding "
                      "otherwise)")
"""The compiler fix of `PRE_ROPE_SCALE_GAP`: RoPE is linear, so `rope(q * s) == rope(q) * s` in real arithmetic, and
in the model's dtype too when `s` is a power of two."""

ROPE_TABLES_GAP = "FusedAttentionBlock with separate cos/sin tables for Q and K"
"""What rlxviz's block lacks for Q and K rotated by a cos/sin table pair each (two different tables, not two copies
of one computation, `same_computation`): the block's RoPE reads one pair for both."""
ROPE_TABLES_FIX = "a FusedAttentionBlock RoPE that takes a cos/sin pair for Q and another for K"
INTEGER_QKV_GAP = "FusedAttentionBlock over integer-matmul Q/K/V projections (dynamic quantization)"
"""What rlxviz's block lacks for an attention whose Q/K/V are projected by integer matmuls (`quantize_dynamic`'s
MatMulInteger, trait `integer_qkv`): the block and the float-matmul fusions it needs first (the shared-input QKV merge,
FusedMatMulBiasAct) take float matmuls only, so no change to the model that keeps its numbers makes the block."""
INTEGER_QKV_FIX = ("a FusedAttentionBlock over int8 Q/K/V weights with their scales, quantizing its input as the "
                   "graph does (and a shared-input merge of integer matmuls)")
QK_NORM_GAP = "FusedAttentionBlock with QK-norm"
"""What rlxviz's block lacks for an attention whose Q and K are normalized after their projection (OLMo-2 over the
projection width, Qwen3 per head; trait `qk_norm`): the block reads Q/K as narrows of its QKV projection, with no norm
between, so no change to the model that keeps its numbers makes the block."""
QK_NORM_FIX = ("give FusedAttentionBlock per-head norms of Q and K (their weights and eps, RMSNorm or LayerNorm, per "
               "head or over the projection width), as in OLMo-2/Qwen3 QK-norm")


def _own_tables(c: Ctx) -> tuple[Node, Node] | None:
    """`(q rope, k rope)` when the attention's Q and K are each rotated by the rope op, each of a narrow of one packed
    projection (the block's Q/K form, guard `qkv_packed`), and the two read different cos/sin tables (not one value:
    two identical narrows of one table are one table, `same_computation`), else None: the block's RoPE (`has_rope`)
    reads one pair for both, so it has no form for them. Q/K in another layout (a reshape of the packed projection)
    is left to `qkv_packed`."""
    g, attn = c.graph, c["attn"]
    q, k = (_uncast(g, g[i]) for i in attn.inputs[:2])
    if q.op != Op.ROPE or k.op != Op.ROPE or all(same_computation(g, a, b) for a, b in zip(q.inputs[1:3],
                                                                                           k.inputs[1:3],
                                                                                           strict=True)):
        return None
    qn, kn = _uncast(g, g[q.inputs[0]]), _uncast(g, g[k.inputs[0]])
    if qn.op == kn.op == Op.NARROW and qn.inputs[0] == kn.inputs[0]:
        return q, k
    return None


def _uncast(g: Graph, n: Node) -> Node:
    """The node a cast reads (a rotation computed in another dtype, `cast(rope(cast(narrow)))`), else `n`."""
    return g[n.inputs[0]] if n.op == Op.CAST else n


def same_computation(g: Graph, a: int, b: int, depth: int = 16) -> bool:
    """Nodes a and b are one value: the same node, or the same op with the same attributes on operands that are one
    value each (two identical narrows of one table), followed at most `depth` ops deep. Leaves (inputs, params,
    constants) are one value only as the same node (or a constant of one value)."""
    if a == b:
        return True
    na, nb = g[a], g[b]
    if depth == 0 or na.op != nb.op or na.attrs != nb.attrs or na.type != nb.type or len(na.inputs) != len(nb.inputs):
        return False
    if not na.inputs:
        return na.op == Op.CONST
    return all(same_computation(g, x, y, depth - 1) for x, y in zip(na.inputs, nb.inputs, strict=True))


def _explain_own_tables(c: Ctx) -> str:
    pair = _own_tables(c)
    assert pair is not None
    q, k = pair
    tables = lambda n: f"{c.name_of(n.inputs[1])}/{c.name_of(n.inputs[2])}"  # noqa: E731
    return (f"{c.d('attn')} reads Q as rope (node {q.id}) with cos/sin {tables(q)} and K as rope (node {k.id}) with "
            f"cos/sin {tables(k)}: each is rotated by its own table pair; rlxviz's FusedAttentionBlock rotates Q and K "
            f"with one pair")


def _explain_mask_kind(c: Ctx) -> str:
    """Guard `mask_kind_keep`'s reason: the attention's mask kind and the two the block takes (keep or additive, either
    one: the guard's name says keep for history); an attention with no mask is said to have no operand, which the
    block has no form without."""
    kind = c["attn"].attrs.get("mask", "none")
    if kind == "none":
        return (f"{c.d('attn')} has mask='none' (no mask operand); rlxviz's FusedAttentionBlock has no form without "
                f"one: it takes a keep or an additive mask operand")
    return f"{c.d('attn')} has mask={kind!r}; FusedAttentionBlock takes a keep or an additive mask operand"


BLOCK = Rule(
    "fuse_attention_block.qkv_attention_out", P(Op.ATTENTION, name="attn"),
    steps=(
        size_gate(),
        guard("mask_kind_keep", lambda c: c["attn"].attrs.get("mask", "none") in BLOCK_MASK_KINDS, _explain_mask_kind,
              "the block takes a keep mask or an additive one; a causal or absent mask has no operand for it",
              requires=("attn",), kind=NOT_RECOGNIZED, subject=lambda c: c.id("attn"),
              fix=NO_MASK_FIX).lacking(("no_mask",), NO_MASK_GAP).lacking(("causal_mask",), CAUSAL_GAP),
        attr_eq("attn", "scale", None, "default_scale", "the block uses 1/sqrt(head_dim)",
                fix="give FusedAttentionBlock a scale attribute", explain=_explain_block_scale
                ).lacking(("attention",), SCALE_GAP).lacking_fix(PRE_ROPE_SCALE_FIX, PRE_ROPE_SCALE_GAP),
        _self_attention,
        _kv_cache,
        guard("rope_one_table", lambda c: _own_tables(c) is None, _explain_own_tables,
              "nothing to change in the model when the two tables differ; if they hold the same values, compute "
              "the table once", requires=("attn",), kind=NOT_RECOGNIZED, subject=lambda c: c.id("attn"),
              fix=ROPE_TABLES_FIX).lacking(("attention",), ROPE_TABLES_GAP),
        Shape("qkv_packed", "attn", P(Op.ATTENTION, _rotated("q"), _rotated("k"), P(Op.NARROW, P.var("qkv"), name="v"),
                                      P.var("mask"), name="attn"),
              "q, k and v must be narrows of one QKV projection (q and k may be rotated by one rope, in another "
              "float dtype between casts): run fuse_shared_input_matmul first"),
        *ROPE_GUARDS,
        guard("rope_dtype", lambda c: _rope_dtype_fault(c) is None, lambda c: _fault(c)[1],
              "rotate Q and K in one dtype", requires=("attn", "qkv"), optional=(*_CASTS, *_ROPES),
              kind=NOT_RECOGNIZED, subject=lambda c: c.id(_fault(c)[0]),
              fix="a FusedAttentionBlock rope_dtype for Q and one for K").lacking(("attention",), ROPE_DTYPES_GAP),
        guard("qkv_split", _split_at, _explain_split, "split Q/K/V at 0/H/2H of the last axis",
              requires=("qkv", "attn", "q", "k", "v"), kind=NOT_RECOGNIZED,
              fix="permute the packed weight's columns to Q/K/V order, or slice the extra width off"),
        all_single_use(("q", "k", "v"), "qkv_narrows_single_use",
                       fix="a FusedAttentionBlock that also returns the Q/K/V it projects (Rule.outputs), for their "
                           "other reader (a later layer sharing this layer's K/V)"),
        Shape("qkv_is_fused_linear", "qkv",
              P(Op.FUSED_MATMUL_BIAS_ACT, P.var("hidden"), P.var("qkv_w"), P.var("qkv_b"), name="qkv",
                attrs={"activation": None}, what="FusedMatMulBiasAct(activation=None)")
              | P(Op.MATMUL, P.var("hidden"), P.var("qkv_w"), name="qkv", what="a bias-less matmul"),
              "run fuse_matmul_bias_act first"),
        user_count("qkv", 3, "the q, k and v narrows", "qkv_user_count"),
        not_output("qkv", "qkv_not_output"),
        single_user("attn", "attn_single_user"),
        not_output("attn", "attn_not_output"),
        User("out_is_fused_linear", "out", "attn",
             P(Op.FUSED_MATMUL_BIAS_ACT, P.var("attn"), P.var("out_w"), P.var("out_b"), name="out",
               attrs={"activation": None})
             | P(Op.MATMUL, P.var("attn"), P.var("out_w"), name="out"),
             "the output projection FusedMatMulBiasAct(activation=None) or a bias-less matmul",
             "run fuse_matmul_bias_act first"),
        guard("out_bias_absorbed", lambda c: _unfused_bias(c) is None, _explain_unfused_bias,
              "let the output projection feed only its bias add, so fuse_matmul_bias_act fuses them",
              requires=("out",), kind=NOT_RECOGNIZED, subject=lambda c: c.id("out"),
              fix="take the bias add into the block when the raw product has other readers"),
    ),
    result="out", absorb=_ABSORBED, rewrite=_block_rewrite,
    doc="QKV linear -> narrows -> attention(keep|additive) -> out linear -> FusedAttentionBlock (a bias-less QKV or "
        "output projection gets a zero bias: exact)")

MODEL_TERM_STEPS = tuple(s for s in BLOCK.steps if getattr(s, "kind", None) == MODEL_TERM
                         and getattr(s, "reads", None) == ("attn",) and hasattr(s, "guard_names"))
"""`BLOCK`'s steps that refuse for the model's own structure (`@reports(kind=MODEL_TERM)`), read by
`model_refusal`."""


def model_refusal(g: Graph, attn: int) -> Fail | None:
    """The block's first refusal for the model's own structure at attention node `attn` (its `MODEL_TERM` steps, in
    order: `self_attention`, `kv_cache`), else None: where one refuses, no block forms here whatever rlxviz's ops
    gain, so `fuse_shared_input_matmul`'s cost test has no block to protect (cohere.optimum-past's prefill reads a KV
    cache). A gap in rlxviz's ops (a `lacking` guard, e.g. interleaved RoPE) is no such refusal: its compiler fix
    would form the block, so the cost test keeps protecting it."""
    c = Ctx(g, {"attn": attn})
    return next((f for f in (step(c) for step in MODEL_TERM_STEPS) if f is not None), None)


fuse_attention_block = rule_pass("fuse_attention_block", [BLOCK], "QKV + attention + out-projection -> "
                                 "FusedAttentionBlock", requires=("fuse_matmul_bias_act",),
                                 product="FusedAttentionBlock", expected_of=("post_ln", "keep_mask"),
                                 excused_by=(("kv_cache", "FusedAttentionBlock projects K and V from the hidden "
                                              "states; this layer's attention reads a KV cache"),),
                                 unexpected="rlxviz's {product} takes a keep or an additive mask, and rlxviz "
                                            "expects it only of {expected}; this layer is {description}",
                                 quantization=("attention", "FusedAttentionBlock computes the attention in float: "
                                                            "the scores a quantized layer rounds would not be"),
                                 lacks=(("integer_qkv", INTEGER_QKV_GAP, INTEGER_QKV_FIX),
                                        ("qk_norm", QK_NORM_GAP, QK_NORM_FIX)),
                                 stages=(stage("fuse_attention_block", "qkv_columns", QKV_COLUMNS_PASS),))
"""Its stage `fuse_attention_block/qkv_columns` (`rules.qkv_columns`) reads a QKV projection laid out per head
(GPT-NeoX, BLOOM, CodeGen) as the column blocks the pattern takes (the same values), before `BLOCK` runs."""


__all__ = ["BLOCK", "INTEGER_QKV_FIX", "INTEGER_QKV_GAP", "PRE_ROPE_SCALE_FIX", "PRE_ROPE_SCALE_GAP", "QK_NORM_FIX",
           "QK_NORM_GAP", "SHARING_WORDS", "fuse_attention_block", "model_refusal", "qkv_sharing",
           "size_gate", "tokens"]
