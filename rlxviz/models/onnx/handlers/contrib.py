"""ONNX Runtime's contrib ops (domain `com.microsoft`, what `onnxruntime.transformers.optimizer` writes), imported with
their meaning (registered into `onnx.context.HANDLERS`; semantics from onnxruntime's docs/ContribOperators.md).

Each op becomes the rlxviz op that computes it (`attention`, `layer_norm`, `rms_norm`, `gelu`, `gelu_tanh`) or its
decomposition into IR primitives, exact under the condition its handler states; any other form is refused in one
line naming the node (never approximated):

| op | IR |
|---|---|
| SkipLayerNormalization, SkipSimplifiedLayerNormalization | `add` (input + skip [+ bias]) -> `layer_norm`/`rms_norm` |
| SimplifiedLayerNormalization | `rms_norm` (zero beta) |
| Gelu, BiasGelu, FastGelu, QuickGelu | `gelu` / `add -> gelu` / `add -> gelu_tanh` / `x * sigmoid(alpha x)` |
| BiasAdd | `add -> add` (X + bias + skip) |
| EmbedLayerNormalization | `gather`s -> `add`s -> `layer_norm` (+ mask_index, embedding_sum) |
| RotaryEmbedding | `gather` of cos/sin at position_ids -> `rope` with one table per batch row |
| Attention, MultiHeadAttention | (QKV `matmul` ->) `attention` (ORT's masks; past -> K/V cache `concat`s) |
| GroupQueryAttention (a whole prompt) | (`rope` ->) causal grouped-query `attention`; present = the new K/V |

**Paths.** ORT names the nodes it makes `SkipLayerNorm_AddBias_0`, `Gelu_AddBias_1`: no module path, so the
layer kind would lose them (a layer read as "attention only (no MLP)"). Such a node takes the module path its
values' names carry (`paths`: a legacy exporter's value name `/layers.0/mlp/act/Mul_output_0`, a parameter
`layers.0.layernorm_after.weight`); SkipLayerNormalization's residual sum takes that of its sum output (or input,
else the layer of its bias: the sum closes the bias's sublayer), its norm that of its output (or gamma); a bias add
(SkipLayerNormalization's too, whose bias ORT took from the previous layer's fc2) that of its bias parameter.
Where no name carries one (a dynamo export's `val_95`, `linear_3`), the path is inferred from what computes its
inputs and claims only what that shows (`inferred_path`): the layer (`model.layers.0`), not the module of its
deepest input (gemma.ortopt's post-attention RMSNorm was said `model.layers.0.self_attn.o_proj`, as if it were the
output projection). A norm whose input goes on past it (the residual stream of a pre-norm model) opens what reads
it: once the graph is read it takes its readers' layer (`place_opening_norms`: gemma.ortopt's layer-1 input norm,
which ORT joined with layer 0's last residual add, was said layer 0's).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ....ir import DType
from ....ir.emitter import Ref
from ....passes.trace import layer_prefix
from ..context import CONTRIB, Value, _const, _Ctx, _last_axis, _zeros_like_gamma, handles
from ..paths import path_of_name

ORT_MASK_FILTER = -10000.0
"""ORT's default `mask_filter_value`: a masked key gets this added to its score."""

def _has_own_path(n: Any) -> bool:
    """The ONNX node names its module itself (torch.onnx name-scope metadata, or a `/a/b/Op` node name)."""
    return (n.name or "").startswith("/") or any(p.key == "pkg.torch.onnx.name_scopes" for p in n.metadata_props)


def _numbered_like(driver: str, mine: str) -> str:
    """`mine` with the call number the driver gave this node's module (`module_calls.number_calls`: ALBERT's one
    layer module called per layer, `a.b.0@1.attention`) when `mine` lies in that module (`a.b.0.attention.LN` ->
    `a.b.0@1.attention.LN`); else `mine`."""
    parts = driver.split(".")
    at = next((i for i, p in enumerate(parts) if "@" in p), None)
    if at is None:
        return mine
    head = ".".join(parts[:at + 1])
    base = ".".join([*parts[:at], parts[at].split("@")[0]])
    return head + mine[len(base):] if mine == base or mine.startswith(base + ".") else mine


def adopt_path(ctx: _Ctx, n: Any, x: list[Value], outputs: tuple[int, ...] = (0,),
               params: tuple[int, ...] = ()) -> str:
    """The module path for the nodes this handler emits (set on the builder and returned): the node's own when it
    names one; else, for a node ORT made, the path carried by its output names `outputs`, then by the parameters at
    input positions `params` (numbered per call as the driver numbered this node: `_numbered_like`), then by any of
    its values (`paths`, the driver's), else (a dynamo export's `val_95` names carry none) the path inferred
    (`inferred_path`) from the deepest path of the IR nodes computing its inputs."""
    key = (n.name, tuple(n.output))
    stash = getattr(ctx, "_contrib_driver_path", None)
    if stash is None or stash[0] != key:  # the path the driver gave this node, before a handler changed it
        stash = (key, ctx.b.path)
        ctx._contrib_driver_path = stash  # type: ignore[attr-defined]
    driver = stash[1]
    if _has_own_path(n):
        ctx.b.path = driver
        return driver
    names = [n.output[i] for i in outputs if i < len(n.output)] + [n.input[i] for i in params if i < len(n.input)]
    for name in names:
        if p := path_of_name(name):
            ctx.b.path = _numbered_like(driver, p)
            return ctx.b.path
    ctx.b.path = driver
    if not driver:  # a dynamo export's value names (val_95) carry none: the deepest path of what computes its
        # inputs (a residual add of the embeddings and a layer's output projection belongs to the layer)
        ctx.b.path = inferred_path(_deepest_input(ctx, x))
    return ctx.b.path


def _deepest_input(ctx: _Ctx, x: list[Value]) -> str:
    """The deepest module path of the IR nodes computing `x` ('' when none has one); on a tie the later input's
    (ORT puts the sublayer's output after the residual stream it joins)."""
    paths = [ctx.b.lookup(v).path for v in x if isinstance(v, Ref)]
    ranked = max(enumerate(paths), key=lambda kv: (kv[1].count(".") + (1 if kv[1] else 0), kv[0]), default=None)
    return ranked[1] if ranked is not None else ""


def inferred_path(deepest: str) -> str:
    """The module path a node may claim from the deepest path `deepest` of the nodes computing its inputs: the layer
    it lies in (`passes.trace.layer_prefix`: `model.layers.0.self_attn.o_proj` -> `model.layers.0`; a numbered call
    `a.b.0@1.attention` -> `a.b.0@1`), else its parent module (`model.conv1` -> `model`; `model` -> ''). What reads
    a module's output is not that module: gemma.ortopt's residual sum and RMSNorm after `o_proj` are layer 0's, not
    the output projection's; the layer is what is known (the sum closes the layer's attention, the norm opens its
    MLP or the next layer, which `placement` decides by structure)."""
    layer = layer_prefix(deepest)
    return layer if layer is not None else deepest.rpartition(".")[0]


# -- activations ---------------------------------------------------------------------------------------------

@handles("Gelu", domain=CONTRIB)
def gelu(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """ORT Gelu(X) = erf-GELU(X)."""
    adopt_path(ctx, n, x)
    return [ctx.b.gelu(ctx.ref(x[0]))]


@handles("BiasGelu", domain=CONTRIB)
def bias_gelu(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """ORT BiasGelu(A, B) = erf-GELU(A + B): the bias add takes the path of the bias parameter (the linear's), the
    GELU that of the output."""
    b = ctx.b
    out = adopt_path(ctx, n, x, params=(1,))
    if not _has_own_path(n) and (p := path_of_name(n.input[1])):
        b.path = _numbered_like(ctx._contrib_driver_path[1], p)  # type: ignore[attr-defined] # the bias's linear
    s = b.add(ctx.ref(x[0]), ctx.ref(x[1]))
    b.path = out
    return [b.gelu(s)]


@handles("FastGelu", domain=CONTRIB)
def fast_gelu(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """ORT FastGelu(X[, bias]) = tanh-GELU(X + bias): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    out = adopt_path(ctx, n, x, params=(1,))
    y = ctx.ref(x[0])
    if len(x) > 1 and x[1] is not None:
        if not _has_own_path(n) and (p := path_of_name(n.input[1])):
            ctx.b.path = _numbered_like(ctx._contrib_driver_path[1], p)  # type: ignore[attr-defined]
        y = ctx.b.add(y, ctx.ref(x[1]))
        ctx.b.path = out
    return [ctx.b.gelu_tanh(y)]


@handles("QuickGelu", domain=CONTRIB)
def quick_gelu(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """ORT QuickGelu(X) = X * sigmoid(alpha X) (alpha default 1.702, CLIP's QuickGELU; 1.0 is SiLU)."""
    adopt_path(ctx, n, x)
    b = ctx.b
    v = ctx.ref(x[0])
    alpha = float(a.get("alpha", 1.702))
    if alpha == 1.0:
        return [b.silu(v)]
    return [b.mul(v, b.sigmoid(b.mul(v, ctx.ref(np.asarray(alpha, dtype=ctx.dtype(v).numpy)))))]


@handles("BiasAdd", domain=CONTRIB)
def bias_add(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """ORT BiasAdd(X, bias, skip) = (X + bias) + skip."""
    adopt_path(ctx, n, x)
    b = ctx.b
    return [b.add(b.add(ctx.ref(x[0]), ctx.ref(x[1])), ctx.ref(x[2]))]


# -- normalisation -----------------------------------------------------------------------------------------

@handles("SimplifiedLayerNormalization")
@handles("SimplifiedLayerNormalization", domain=CONTRIB)
def simplified_ln(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """ORT RMSNorm: x / sqrt(mean(x^2) + eps) * scale over the last axis (IR rms_norm with a zero beta). The
    inv_std_var output is not supported. A norm ORT made whose input goes on past it opens what reads it
    (`place_opening_norms`: gemma.ortopt's layer-0 input norm was said `model`)."""
    adopt_path(ctx, n, x, params=(1,))
    _last_axis(ctx, x[0], int(a.get("axis", -1)))
    if len(n.output) > 1 and any(n.output[1:]):
        raise ctx.unsupported("the inv_std_var output is not supported")
    out = ctx.b.rms_norm(ctx.ref(x[0]), ctx.ref(x[1]), _zeros_like_gamma(ctx, x[1]), float(a.get("epsilon", 1e-5)))
    if not _has_own_path(n):
        ctx.opening_norms = [*getattr(ctx, "opening_norms", ()), (int(out), int(ctx.ref(x[0])))]  # type: ignore[attr-defined]
    return [out]


@handles("SkipLayerNormalization", "SkipSimplifiedLayerNormalization", domain=CONTRIB)
def skip_ln(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """ORT SkipLayerNormalization(input, skip, gamma[, beta][, bias]): s = input + skip (+ bias);
    output 0 = LayerNorm(s) (RMSNorm for the simplified form, whose inputs are input, skip, gamma[, bias]),
    output 3 = s. The mean / inv_std_var outputs (1, 2) are not supported. The sum takes the module path of
    output 3 (the residual add ORT fused), else of input 0's name, else the layer of the bias parameter's path (the
    sum closes the sublayer whose linear the bias is: whisper.ortopt's fc2 bias of layer 0 sits in the node of layer
    1's `self_attn_layer_norm`), else, with no bias, the layer of its deepest input (`_deepest_input`: the sublayer
    output it closes; falcon.ortopt's sum closing layer 0 had gamma's `model.h.1.input_layernorm`); the bias add
    that of the bias (`_numbered_like` the driver); the norm that of output 0, else of gamma; where no name or
    driver path gives one, they take the path inferred from what computes the inputs (`adopt_path`,
    `inferred_path`: their layer)."""
    b = ctx.b
    simplified = n.op_type.startswith("SkipSimplified")
    if any(o for i, o in enumerate(n.output) if i in (1, 2)):
        raise ctx.unsupported("the mean / inv_std_var outputs are not supported")
    own = _has_own_path(n)
    bias_at = 3 if simplified else 4
    has_bias = len(x) > bias_at and x[bias_at] is not None
    bias = ""  # the bias parameter's module path, numbered like the driver's
    if not own:
        adopt_path(ctx, n, x, outputs=(3,), params=(0,))
        named = any(path_of_name(v) for v in [*n.output[3:4], n.input[0]])  # the sum names a path of its own
        if has_bias and (p := path_of_name(n.input[bias_at])):
            bias = _numbered_like(ctx._contrib_driver_path[1], p)  # type: ignore[attr-defined]
            if not named:
                b.path = inferred_path(bias)
        elif not named and (deepest := _deepest_input(ctx, x[:2])):
            b.path = inferred_path(deepest)  # the layer of the sublayer output it closes, not gamma's next layer
    s = b.add(ctx.ref(x[0]), ctx.ref(x[1]))
    if has_bias:
        if bias:
            b.path = bias
        s = b.add(s, ctx.ref(x[bias_at]))
    if not own:
        adopt_path(ctx, n, x, outputs=(0,), params=(2,))
    eps = float(a.get("epsilon", 1e-12))
    if simplified:
        out = b.rms_norm(s, ctx.ref(x[2]), _zeros_like_gamma(ctx, x[2]), eps)
    else:
        beta = ctx.ref(x[3]) if len(x) > 3 and x[3] is not None else _zeros_like_gamma(ctx, x[2])
        out = b.layer_norm(s, ctx.ref(x[2]), beta, eps)
    if not own and len(n.output) > 3 and n.output[3]:  # the sum goes on: maybe a split (`place_opening_norms`)
        ctx.opening_norms = [*getattr(ctx, "opening_norms", ()), (int(out), int(s))]  # type: ignore[attr-defined]
    outs: list[Value] = [out, None, None, s]
    return outs[:len(n.output)]


def place_opening_norms(b: Any, pairs: Any) -> None:
    """Re-path each norm ORT made (`pairs`: `(norm, normalized)` IR ids: a split SkipLayerNormalization's norm and
    sum, a SimplifiedLayerNormalization and its input) to the layer of its readers, on the builder `b` before it
    builds. ORT joins layer N's residual add and layer N+1's input norm in one node; where the normalized value goes
    on past the norm (pre-norm: it has readers besides the norm) the norm opens whatever reads it, so it lies in its
    readers' layer when they all lie in one (`layer_prefix`): gemma.ortopt's norm read by layer 1's Q/K/V was said
    layer 0's, the layer of its deepest input (`inferred_path`). Its gamma and beta go with it when it alone reads
    them. A norm whose input ends at it (post-norm: it closes its layer; an embeddings' norm), one a graph output
    reads, or one read from several layers or none, stays. Raises nothing."""
    nodes = b._created
    users: dict[int, list[int]] = {}
    for node in nodes.values():
        for i in node.inputs:
            users.setdefault(i, []).append(node.id)
    for norm, total in pairs:
        if norm not in nodes or set(users.get(total, ())) <= {norm} or norm in b._outputs:
            continue  # the sum ends at the norm: a post-norm layer's closing norm, not a split
        layers = {layer_prefix(nodes[u].path) for u in users.get(norm, ())}
        old = nodes[norm].path
        if len(layers) != 1 or None in layers or (new := layers.pop()) == layer_prefix(old):
            continue
        for i in (norm, *nodes[norm].inputs[1:]):
            if i == norm or (users.get(i) == [norm] and nodes[i].path == old):
                nodes[i] = nodes[i].replace(path=new)


@handles("EmbedLayerNormalization", domain=CONTRIB)
def embed_layer_norm(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """ORT EmbedLayerNormalization(input_ids, segment_ids?, word_embedding, position_embedding,
    segment_embedding?, gamma, beta, mask?, position_ids?): e = word[ids] + position[position_ids or 0..S-1]
    (+ segment[segment_ids]); output 0 = LayerNorm(e), output 1 (mask_index, i32 [B]) = the number of mask entries
    equal to 1 per row (ORT's CPU kernel), 0 without a mask; output 2 = e."""
    def opt(i: int) -> Value:
        return x[i] if len(x) > i else None

    b = ctx.b
    adopt_path(ctx, n, x, params=(2,))
    ids = ctx.ref(x[0])
    bsz, seq = ctx.shape(ids)
    e = b.gather(ctx.ref(x[2]), ids)
    pos = opt(8)
    if pos is None:
        pos = np.arange(seq, dtype=np.int64).reshape(1, seq)
    pe = b.gather(ctx.ref(x[3]), ctx.ref(pos))
    e = b.add(e, pe)
    if opt(1) is not None and opt(4) is not None:
        e = b.add(e, b.gather(ctx.ref(x[4]), ctx.ref(x[1])))
    out = b.layer_norm(e, ctx.ref(x[5]), ctx.ref(x[6]), float(a.get("epsilon", 1e-12)))
    mask = opt(7)
    if mask is not None:
        mi = b.reduce_sum(b.cast(b.eq(ctx.ref(mask), ctx.ref(np.asarray(1, dtype=ctx.dtype(mask).numpy))),
                                 DType.i32), (1,))
    else:
        mi = ctx.ref(np.zeros(bsz, np.int32))
    outs: list[Value] = [out, mi, e]
    return outs[:len(n.output)]


# -- rotary embedding --------------------------------------------------------------------------------------

@handles("RotaryEmbedding", domain=CONTRIB)
def rotary_embedding(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """ORT RotaryEmbedding(input, position_ids, cos_cache, sin_cache): input [B, S, N*H] (num_heads given, or
    the head size read from the cache when rotary_embedding_dim is 0) or [B, N, S, H]; position_ids [B, S], or
    [1] (an offset: positions offset..offset+S-1); the caches [max_pos, R/2]. The first R = 2 * cache width
    features of each head rotate, the rest pass: the IR's `rope` op on the packed `[B, S, N*H]` tensor with the
    cos/sin rows gathered at position_ids (`[B or 1, S, R/2]`, one table per batch row): NeoX halves, or
    interleaved pairs `(x[2i], x[2i+1])`; exactly ORT's rotation. is_packed_batching and a scale other than 1 are
    refused."""
    adopt_path(ctx, n, x)
    b = ctx.b
    if int(a.get("is_packed_batching", 0)):
        raise ctx.fail("is_packed_batching=1 is not supported")
    if float(a.get("scale", 1.0)) != 1.0:
        raise ctx.fail("a scale other than 1.0 is not supported")
    inp, pids, cos, sin = x[:4]
    s = ctx.shape(inp)
    half = ctx.shape(cos)[-1]
    rot = 2 * half
    heads = int(a.get("num_heads", 0))
    if len(s) == 3:
        bsz, seq, hidden = s
        if not heads:
            heads = hidden // rot
        hd = hidden // heads
        v = b.reshape(ctx.ref(inp), (bsz, seq, heads, hd))
        seq_axis = 1
    elif len(s) == 4:
        bsz, heads, seq, hd = s
        v = ctx.ref(inp)
        seq_axis = 2
    else:
        raise ctx.fail(f"input of rank {len(s)}: 3 ([B, S, N*H]) or 4 ([B, N, S, H]) needed")
    if int(a.get("rotary_embedding_dim", 0)) not in (0, rot):
        raise ctx.fail(f"rotary_embedding_dim {a['rotary_embedding_dim']} differs from the cache's {rot} (2 x width)")
    if rot > hd or (len(s) == 3 and s[2] % heads):
        raise ctx.fail(f"cos/sin cache width {half} does not fit head size {hd}")
    ps = ctx.shape(pids)
    if ps == (1,) or ps == ():
        off = _const(pids)
        if off is None:
            raise ctx.fail("a computed position offset ([1] position_ids) is not supported")
        pos = ctx.ref((np.arange(seq, dtype=np.int64) + int(np.asarray(off).reshape(-1)[0])).reshape(1, seq))
    elif ps == (bsz, seq):
        pos = ctx.ref(pids)
    else:
        raise ctx.fail(f"position_ids {list(ps)}: [batch, seq] or [1] needed")
    c = b.gather(ctx.ref(cos), pos)  # [pb, S, R/2]: one table per batch row (pb = 1: shared)
    sn = b.gather(ctx.ref(sin), pos)
    packed = v if seq_axis == 1 else b.transpose(v, (0, 2, 1, 3))  # [B, S, N, H]
    flat = b.reshape(packed, (bsz, seq, heads * hd))
    y = b.rope(flat, c, sn, hd, n_rot=rot, interleaved=bool(int(a.get("interleaved", 0))))
    if len(s) == 3:
        return [y]
    return [b.transpose(b.reshape(y, (bsz, seq, heads, hd)), (0, 2, 1, 3))]


# -- attention ---------------------------------------------------------------------------------------------

def _key_mask(ctx: _Ctx, m: Value, batch: int, kv: int) -> Ref:
    """A keep mask `[batch, kv]` f32 from ORT's key mask forms: raw 0/1 `[B, T]`, or `[B]` key lengths (right
    padding: key j kept when j < length)."""
    b = ctx.b
    if ctx.shape(m) == (batch, kv):
        return b.cast(ctx.ref(m), DType.f32)
    lens = b.reshape(b.cast(ctx.ref(m), DType.i64), (batch, 1))
    return b.cast(b.lt(ctx.ref(np.arange(kv, dtype=np.int64).reshape(1, kv)), lens), DType.f32)


def _sdpa(ctx: _Ctx, a: dict[str, Any], q: Ref, k: Ref, v: Ref, heads: int, m: Value, bias: Value) -> Ref:
    """ORT's attention (its CPU kernel's reading, checked against it): softmax(q k^T * scale + mask) v with scale
    default 1/sqrt(head size) and mask the sum of `(1 - m) * mask_filter_value` for the mask input m (raw 0/1
    `[B, T]` or `[B, S, T]`, or `[B]` key lengths), `mask_filter_value` on every future key when unidirectional
    (key j of query i past `i + T - S`: bottom-right aligned), and attention_bias. A `[B, T]` / `[B]` mask alone is
    the IR's keep mask with that fill, no mask and unidirectional its causal kind; any other combination an
    additive `[B or 1, 1 or heads, S, T]` operand."""
    b = ctx.b
    causal = bool(a.get("unidirectional", 0))
    bsz, sq, hidden = ctx.shape(q)
    kv = ctx.shape(k)[1]
    hd = hidden // heads
    kv_heads = ctx.shape(k)[-1] // hd
    kvh = None if kv_heads == heads else kv_heads
    scale = float(a.get("scale", 0.0) or 0.0) or None
    fill = float(a.get("mask_filter_value", ORT_MASK_FILTER))
    ms = ctx.shape(m) if m is not None else None
    if ms is not None and ms not in ((bsz, kv), (bsz,), (bsz, sq, kv)):
        raise ctx.fail(f"mask shape {list(ms)}: a raw [batch, kv_len] or [batch, seq, kv_len] 0/1 mask, or [batch] key "
                       f"lengths, is supported")
    if bias is None and (m is None or (not causal and ms != (bsz, sq, kv))):
        kind = "keep" if m is not None else "causal" if causal else "none"
        return b.attention(q, k, v, None if m is None else _key_mask(ctx, m, bsz, kv), num_heads=heads, head_dim=hd,
                           mask_kind=kind, scale=scale, num_kv_heads=kvh, mask_fill=fill if m is not None else None)
    terms: list[Ref] = []
    f = ctx.ref(np.asarray(fill, np.float32))
    if m is not None:
        keep = b.cast(ctx.ref(m), DType.f32) if ms == (bsz, sq, kv) else _key_mask(ctx, m, bsz, kv)
        pad = b.mul(b.sub(ctx.ref(np.asarray(1.0, np.float32)), keep), f)
        terms.append(b.reshape(pad, (bsz, 1, sq, kv) if ms == (bsz, sq, kv) else (bsz, 1, 1, kv)))
    if causal:
        future = np.triu(np.ones((sq, kv), np.float32), kv - sq + 1) * np.float32(fill)
        terms.append(ctx.ref(future.reshape(1, 1, sq, kv)))
    if bias is not None:
        terms.append(ctx.ref(bias))
    add = terms[0]
    for t in terms[1:]:
        add = b.add(add, t)
    return b.attention(q, k, v, add, num_heads=heads, head_dim=hd, mask_kind="additive", scale=scale,
                       num_kv_heads=kvh)


@handles("Attention", domain=CONTRIB)
def ort_attention(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """ORT Attention(input, weights [Hin, Hq + Hk + Hv], bias?, mask_index?, past?, attention_bias?): the packed
    QKV projection, split by qkv_hidden_sizes (default three equal parts), then attention. With past
    `[2, B, N, P, h]` (GPT-2 decoding), K and V are the past ones followed by this step's (the keys a KV cache
    reads: `[B, P + S, N*h]`, the mask over all P + S keys), and present is `[2, B, N, P + S, h]` of them.
    do_rotary, past_present_share_buffer and past_sequence_length are refused."""
    if int(a.get("do_rotary", 0)) or int(a.get("past_present_share_buffer", 0)) or len(x) > 6 and x[6] is not None:
        raise ctx.fail("do_rotary / past_present_share_buffer / past_sequence_length are not supported")
    past = x[4] if len(x) > 4 else None
    if len(n.output) > 1 and n.output[1] and past is None:
        raise ctx.fail("a present output without a past input is not supported")
    adopt_path(ctx, n, x, params=(1,))
    b = ctx.b
    heads = int(a["num_heads"])
    qkv = b.matmul(ctx.ref(x[0]), ctx.ref(x[1]))
    if len(x) > 2 and x[2] is not None:
        qkv = b.add(qkv, ctx.ref(x[2]))
    width = ctx.shape(qkv)[-1]
    sizes = [int(v) for v in a.get("qkv_hidden_sizes", [])] or [width // 3] * 3
    if len(sizes) != 3 or sum(sizes) != width or any(s % heads for s in sizes):
        raise ctx.fail(f"qkv_hidden_sizes {sizes} do not split the {width} projected features into 3 multiples of "
                       f"num_heads {heads}")
    rank = len(ctx.shape(qkv)) - 1
    q, k, v = (b.narrow(qkv, rank, sum(sizes[:i]), sizes[i]) for i in range(3))
    outs: list[Value] = []
    if past is not None:
        bsz, seq = ctx.shape(x[0])[:2]
        hd = sizes[0] // heads
        ps = ctx.shape(past)
        if len(set(sizes)) != 1 or len(ps) != 5 or ps[:3] != (2, bsz, heads) or ps[4] != hd:
            raise ctx.fail(f"past {list(ps)}: [2, batch, num_heads, past_len, head_size] with equal Q/K/V sizes needed")
        p = ps[3]
        cached = []
        for i, new in ((0, k), (1, v)):
            old = b.reshape(b.narrow(ctx.ref(past), 0, i, 1), (bsz, heads, p, hd))
            cached.append(b.concat([b.reshape(b.transpose(old, (0, 2, 1, 3)), (bsz, p, heads * hd)), new], 1))
        k, v = cached
        heads_of = [b.reshape(b.transpose(b.reshape(t, (bsz, p + seq, heads, hd)), (0, 2, 1, 3)),
                              (1, bsz, heads, p + seq, hd)) for t in (k, v)]
        outs.append(b.concat(heads_of, 0))
    y = _sdpa(ctx, a, q, k, v, heads, x[3] if len(x) > 3 else None, x[5] if len(x) > 5 else None)
    return ([y, *outs])[:len(n.output)]


@handles("MultiHeadAttention", domain=CONTRIB)
def ort_mha(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """ORT MultiHeadAttention(query, key?, value?, bias?, key_padding_mask?, attention_bias?, past_key?,
    past_value?): separate query, key, value [B, S, H] each, or packed QKV [B, S, N, 3, h] in query alone; bias
    [Hq + Hk + Hv] added to each. With past_key / past_value [B, N, P, h] (a decoder step), K and V are the past ones
    followed by this step's, and present_key / present_value [B, N, P + S, h] are them. The buffer-sharing and beam
    inputs (past_sequence_length, cache_indirection) and the qk output are refused."""
    def opt(i: int) -> Value:
        return x[i] if len(x) > i else None

    if opt(8) is not None or opt(9) is not None or len(n.output) > 3 and n.output[3]:
        raise ctx.fail("past_sequence_length, cache_indirection and the qk output are not supported")
    if (opt(6) is None) != (opt(7) is None) or (opt(6) is None and any(o for o in n.output[1:3])):
        raise ctx.fail("past_key and past_value go together, and present_key / present_value need them")
    adopt_path(ctx, n, x)
    b = ctx.b
    heads = int(a["num_heads"])
    qs = ctx.shape(x[0])
    key = x[1] if len(x) > 1 else None
    if len(qs) == 5 and key is None:  # packed QKV [B, S, N, 3, h]
        bsz, seq, nh, three, hd = qs
        if three != 3 or nh != heads:
            raise ctx.fail(f"packed QKV {list(qs)}: [batch, seq, num_heads, 3, head_size] needed")
        q, k, v = (b.reshape(b.narrow(ctx.ref(x[0]), 3, i, 1), (bsz, seq, nh * hd)) for i in range(3))
    elif len(qs) == 3 and key is not None and len(x) > 2 and x[2] is not None and len(ctx.shape(key)) == 3:
        q, k, v = (ctx.ref(t) for t in x[:3])
    else:
        raise ctx.fail("only separate query, key and value [batch, seq, hidden] or packed QKV [batch, seq, heads, 3, "
                       "head] are supported")
    if len(x) > 3 and x[3] is not None:
        bias = _const(x[3])
        if bias is None:
            raise ctx.fail("the bias must be a constant")
        widths = [ctx.shape(t)[-1] for t in (q, k, v)]
        if sum(widths) != bias.shape[0]:
            raise ctx.fail(f"bias of {bias.shape[0]} values for Q/K/V widths {widths}")
        starts = np.cumsum([0, *widths])
        q, k, v = (b.add(t, ctx.ref(np.ascontiguousarray(bias[starts[i]:starts[i + 1]])))
                   for i, t in enumerate((q, k, v)))
    presents: list[Value] = []
    if opt(6) is not None:
        bsz, seq = ctx.shape(q)[:2]
        cached = []
        for old, new in ((opt(6), k), (opt(7), v)):
            ps = ctx.shape(old)
            hd = ctx.shape(new)[-1] // heads
            if len(ps) != 4 or ps[:2] != (bsz, heads) or ps[3] != hd:
                raise ctx.fail(f"past {list(ps)}: [batch, num_heads, past_len, head_size] needed")
            packed = b.reshape(b.transpose(ctx.ref(old), (0, 2, 1, 3)), (bsz, ps[2], heads * hd))
            cached.append(b.concat([packed, new], 1))
        k, v = cached
        for t in (k, v):
            total, width = ctx.shape(t)[1:]
            presents.append(b.transpose(b.reshape(t, (bsz, total, heads, width // heads)), (0, 2, 1, 3)))
    y = _sdpa(ctx, a, q, k, v, heads, opt(4), opt(5))
    return ([y, *presents])[:len(n.output)]


@handles("GroupQueryAttention", domain=CONTRIB)
def group_query_attention(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """ORT GroupQueryAttention on a whole prompt: query [B, S, N*h] with key and value [B, S, Nkv*h] (or packed QKV
    [B, S, (N + 2 Nkv) h] in query alone), no past state, seqlens_k a constant S - 1 for every row and
    total_sequence_length S (every token valid): causal (or, with causal=0, full) grouped-query attention; with
    do_rotary, Q and K rotated by the rope op at positions 0..S-1 of cos_cache / sin_cache (rotary_interleaved:
    neighbour pairs). present_key / present_value are the (rotated) new K / V as [B, Nkv, S, h]. A KV cache step
    (past_key / past_value), padded rows (another seqlens_k), position_ids, attention_bias, head_sink, quantized or
    normed caches, softcap, a local window and smooth softmax are refused."""
    def opt(i: int) -> Value:
        return x[i] if len(x) > i else None

    if opt(3) is not None or opt(4) is not None:
        raise ctx.fail("past_key / past_value (a KV cache step) are not supported; a whole prompt without past is")
    if any(opt(i) is not None for i in range(9, 17)):
        raise ctx.fail("position_ids, attention_bias, head_sink, k/v scales, q/k norm weights and query_seqlens are "
                       "not supported")
    if float(a.get("softcap", 0.0) or 0.0) or int(a.get("local_window_size", -1)) != -1 \
            or int(a.get("smooth_softmax", -1)) == 1 or int(a.get("sliding_window_cache", 0)) \
            or int(a.get("qk_output", 0)) or len(n.output) > 3 and n.output[3]:
        raise ctx.fail("softcap, local_window_size, smooth_softmax, sliding_window_cache and qk_output are not "
                       "supported")
    adopt_path(ctx, n, x)
    b = ctx.b
    heads, kvh = int(a["num_heads"]), int(a["kv_num_heads"])
    if heads % kvh:
        raise ctx.fail(f"num_heads {heads} is not a multiple of kv_num_heads {kvh}")
    qs = ctx.shape(x[0])
    if len(qs) != 3:
        raise ctx.fail(f"query {list(qs)}: [batch, seq, hidden] needed")
    bsz, seq, width = qs
    if opt(1) is None:  # packed QKV
        if width % (heads + 2 * kvh):
            raise ctx.fail(f"packed QKV width {width} is not (num_heads + 2 kv_num_heads) * head_size")
        hd = width // (heads + 2 * kvh)
        q = b.narrow(ctx.ref(x[0]), 2, 0, heads * hd)
        k = b.narrow(ctx.ref(x[0]), 2, heads * hd, kvh * hd)
        v = b.narrow(ctx.ref(x[0]), 2, (heads + kvh) * hd, kvh * hd)
    else:
        if opt(2) is None or ctx.shape(x[1])[:2] != (bsz, seq) or ctx.shape(x[2]) != ctx.shape(x[1]):
            raise ctx.fail("key and value must both be [batch, seq, kv_hidden] of the query's batch and seq")
        hd = width // heads
        q, k, v = (ctx.ref(t) for t in x[:3])
        if ctx.shape(k)[2] != kvh * hd:
            raise ctx.fail(f"key width {ctx.shape(k)[2]} is not kv_num_heads {kvh} * head_size {hd}")
    lens, total = _const(opt(5)), _const(opt(6))
    if lens is None or total is None or np.asarray(lens).reshape(-1).tolist() != [seq - 1] * bsz \
            or int(np.asarray(total).reshape(-1)[0]) != seq:
        raise ctx.fail(f"seqlens_k must be the constant {seq - 1} for each of the {bsz} rows and "
                       f"total_sequence_length {seq} (a whole prompt, every token valid)")
    if int(a.get("do_rotary", 0)):
        cos, sin = opt(7), opt(8)
        if cos is None or sin is None or len(ctx.shape(cos)) != 2 or ctx.shape(cos)[0] < seq:
            raise ctx.fail("do_rotary needs cos_cache / sin_cache [max_seq >= seq, rotary_dim / 2]")
        rot = 2 * ctx.shape(cos)[1]
        if rot > hd:
            raise ctx.fail(f"cos_cache width {rot // 2} does not fit head size {hd}")
        inter = bool(int(a.get("rotary_interleaved", 0)))
        q = b.rope(q, ctx.ref(cos), ctx.ref(sin), hd, n_rot=rot, interleaved=inter)
        k = b.rope(k, ctx.ref(cos), ctx.ref(sin), hd, n_rot=rot, interleaved=inter)
    scale = float(a.get("scale", 0.0) or 0.0) or None
    causal = int(a.get("causal", 1))
    y = b.attention(q, k, v, None, num_heads=heads, head_dim=hd, mask_kind="causal" if causal else "none",
                    scale=scale, num_kv_heads=None if kvh == heads else kvh)
    outs: list[Value] = [y]
    for t in (k, v):
        outs.append(b.transpose(b.reshape(t, (bsz, seq, kvh, hd)), (0, 2, 1, 3)))
    return outs[:len(n.output)]


CONTRIB_OPS = ("Attention", "BiasAdd", "BiasGelu", "EmbedLayerNormalization", "FastGelu", "Gelu",
               "GroupQueryAttention", "MultiHeadAttention", "QuickGelu", "RotaryEmbedding",
               "SimplifiedLayerNormalization", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization")
"""The com.microsoft ops this module maps."""

__all__ = ["CONTRIB_OPS", "ORT_MASK_FILTER", "adopt_path", "inferred_path", "place_opening_norms"]
