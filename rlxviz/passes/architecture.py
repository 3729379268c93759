"""Per-layer architecture detection: which kind of transformer block a layer is, and so which fusions it expects.

`classify_layer(graph, layer)` reads one layer (nodes whose path names it; `layer=None`: the whole graph) of
the graph after the canonicalization prefix (`canonicalize_norm`, `canonicalize_gelu`, `fuse_sdpa`, run here
on a copy, so decomposed norms, GELUs and Hugging Face attention are seen as ops) and returns a
`LayerArchitecture`:

* `post_ln` (BERT): a residual sum feeds only a LayerNorm (`norm(x + sublayer(x))`).
* `pre_ln` (GPT-2, ViT): a norm reads the residual stream, which also feeds the residual add
  (`x + sublayer(norm(x))`).
* `llama`: pre-norm with RMSNorm and/or SwiGLU (RoPE with a LayerNorm and a plain MLP is `pre_ln`). The kind
  decides what is expected; the words name the layer by its traits (`_llama_words`): `LLaMA` only with RoPE and a
  gated MLP, `T5-style` for RMSNorm with a per-head position bias and no RoPE, else the traits found.
* `parallel` (GPT-J, GPT-NeoX, PaLM, Phi-2): the attention and the MLP read the same residual stream, through
  one norm (GPT-J) or one norm each (GPT-NeoX's `use_parallel_residual`), and the MLP's activation is not
  downstream of the attention.
* `cross_decoder` (BART, T5, Whisper, Marian decoders): a self-attention and a cross-attention (Q from the
  decoder's stream, K/V projected from another input: the encoder's output), post- or pre-norm. Neither
  FusedTransformerLayer nor FusedAttentionBlock can hold the cross-attention (one hidden input projected to
  Q/K/V); what is legal: packed attention for both, FusedAttentionBlock for the self-attention when its mask is
  a keep mask, residual-norm fusions where post-norm, the MLP's fusions.
* `attention_only`: attention and no MLP activation.
* `no_attention`: everything else with no attention (an MLP, an embedding).
* `unknown`: an attention and an MLP whose norm placement was not read (no norm op in the layer, as MobileBERT's
  NoNorm, `x * w + b` after the residual add; or no norm that closes a residual sum or reads the residual stream):
  no kind is guessed (the description says what is missing, the evidence what was found instead,
  `_affine_after_sum`), so no kind's product is expected of it (no FusedTransformerLayer; FusedAttentionBlock where
  its mask is a keep mask, as in any layer).

The kind is a fact about the layer; what a kind is expected to fuse, and which rejections it does not count, is
decided in `passes.why.policy` (`not_expected`), nowhere else.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from ..ir import DType, Graph, Node, Op
from ..ir.identity import DigestCache
from ..ir.ops import BLAS, GATE_ACTIVATIONS, MLP_ACTIVATIONS
from .activations import activation_form
from .declarations import KINDS
from .quant_steps import integer_matmul, origin, readers, without_quant_steps
from .rope_forms import interleaved_rope, rotate_half_rope
from .rules.kv_cache import cached_length, kv_workload
from .score_terms import ALIBI, PER_HEAD, RELATIVE_BIAS, additive_term
from .trace import Rejection, Trace, layer_of
from .why.kinds import POST_NORM, PRE_NORM, LayerArchitecture

_ATTENTION = frozenset({Op.ATTENTION, Op.FUSED_ATTENTION_BLOCK, Op.FUSED_TRANSFORMER_LAYER})
_NORMS = frozenset({Op.LAYER_NORM, Op.RMS_NORM, Op.FUSED_RESIDUAL_LN, Op.FUSED_RESIDUAL_RMS_NORM})
_ACTS = frozenset({*MLP_ACTIVATIONS, Op.FUSED_SWIGLU})
_PREFIX = ("canonicalize_exported", "canonicalize_norm", "canonicalize_gelu", "fuse_sdpa")

DESCRIPTIONS = {
    "post_ln": "post-LN (BERT): attention -> residual add -> LayerNorm",
    "pre_ln": "pre-LN (GPT-2, ViT): norm -> sublayer -> residual add",
    "llama": "LLaMA: pre-norm RMSNorm",
    "parallel": "parallel block (GPT-J, GPT-NeoX, PaLM, Phi-2): attention and MLP read the same residual stream",
    "cross_decoder": "decoder layer with self- and cross-attention (BART, T5, Whisper): cross-attention reads the "
                     "encoder's output",
    "attention_only": "attention only (no MLP)",
    "no_attention": "no attention",
    "unknown": "not one rlxviz recognizes (no LayerNorm or RMSNorm op in the layer, so no norm placement, pre- or "
               "post-norm, to read)",
}
UNREAD_ORDER = ("not one rlxviz recognizes (no norm of the layer closes a residual sum or reads the residual stream, "
                "so its norm placement, pre- or post-norm, is not read)")
"""The `unknown` kind's words for a layer with norms whose placement `_norm_order` did not read."""


_Entry = tuple[Graph, Graph, dict[int | None, LayerArchitecture], tuple[Rejection, ...]]
_PREPARED: DigestCache[_Entry] = DigestCache(limit=4)


def _entry(graph: Graph) -> _Entry:
    hit = _PREPARED.get(graph)
    if hit is not None:
        return hit
    from .pipeline import Pipeline  # pipeline imports the rules; keep this module importable on its own

    trace = Pipeline(list(_PREFIX)).run(graph)
    gelus = _refused_gelus(trace)
    entry = _PREPARED[graph] = (graph, trace.final, {}, gelus)
    return entry


def _refused_gelus(trace: Trace) -> tuple[Rejection, ...]:
    """The GELU-shaped chains `canonicalize_gelu` refused for a wrong constant (`_decomposed_gelus` reads them)."""
    return tuple(r for r in trace.rejections if r.pass_name == "canonicalize_gelu" and r.stage == "guard"
                 and r.guard == "gelu_constants" and r.headline)


def prepared(graph: Graph) -> Graph:
    """`graph` after the canonicalization prefix (cached, with its classifications, for the last few graphs)."""
    return _entry(graph)[1]


def _reach(g: Graph, start: int, inside: set[int]) -> set[int]:
    """Node ids reachable from `start` through users, staying inside `inside`."""
    seen: set[int] = set()
    todo = deque([start])
    while todo:
        i = todo.popleft()
        for u in g.users(i):
            if u.id in inside and u.id not in seen:
                seen.add(u.id)
                todo.append(u.id)
    return seen


def _label(n: Node) -> str:
    return f"{n.op.value} %{n.id}"


def _linear_near(g: Graph, i: int, up: bool, depth: int = 3) -> Node | None:
    """The matmul feeding `i` (`up`) or reading it, through at most `depth` bias adds / reshapes / casts."""
    frontier = [g[i]]
    for _ in range(depth):
        nxt: list[Node] = []
        for n in frontier:
            for m in ([g[j] for j in n.inputs] if up else g.users(n.id)):
                if m.op in BLAS:
                    return m
                if m.op in (Op.ADD, Op.RESHAPE, Op.CAST):
                    nxt.append(m)
        frontier = nxt
    return None


def _decomposed_gelus(g: Graph, rejected: tuple[Rejection, ...], ids: set[int]) -> list[tuple[Node, str]]:
    """GELU chains that `canonicalize_gelu` found GELU-shaped but refused (`gelu_constants`: a wrong constant)
    between two linears in `ids`: `(the chain's output node, evidence)`. The layer still has an MLP."""
    out = []
    for r in rejected:
        x, fn, res = r.bindings.get("x"), r.bindings.get("fn"), r.bindings.get("out")
        if x is None or res is None or fn not in ids or x not in g or res not in g:
            continue
        fc1, fc2 = _linear_near(g, x, up=True, depth=2), _linear_near(g, res, up=False)
        if fc1 is None or fc2 is None:
            continue
        out.append((g[res], f"{_label(g[fn])}: a decomposed GELU between {_label(fc1)} and {_label(fc2)} that "
                            f"canonicalize_gelu refused ({r.guard}): the layer has an MLP"))
    return out


def _is_activation(n: Node) -> bool:
    return n.op in _ACTS or (n.op == Op.FUSED_MATMUL_BIAS_ACT and n.attrs.get("activation") is not None)


def _gates(g: Graph, n: Node) -> bool:
    """`n` gates a product (a gated MLP, `FusedSwiGLU`'s form): a silu read by a mul (SwiGLU), or a GELU read by a
    mul of a computed value, not a constant (GeGLU)."""
    if n.op not in GATE_ACTIVATIONS:
        return False
    muls = [u for u in g.users(n.id) if u.op == Op.MUL]
    if n.op == Op.SILU:
        return bool(muls)
    return any(g[i].op != Op.CONST for u in muls for i in u.inputs if i != n.id)


def _fake_quant(g: Graph, n: Node) -> bool:
    """`n` quantizes a computed value that is dequantized for float ops (QDQ's QuantizeLinear -> DequantizeLinear:
    `cast(u8/i8)` of a computed value, read back as `cast(f32) [- zero point] * scale`), not an operand of an
    integer matmul (`quantize_dynamic`'s MatMulInteger reads the centered values without a scale)."""
    if n.op != Op.CAST or n.dtype not in (DType.u8, DType.i8) or g[n.inputs[0]].op in (Op.PARAM, Op.CONST):
        return False
    for u in g.users(n.id):
        if u.op != Op.CAST or u.dtype != DType.f32:
            continue
        nxt = list(g.users(u.id))
        nxt += [w for v in nxt if v.op == Op.SUB for w in g.users(v.id)]
        if any(v.op == Op.MUL for v in nxt):
            return True
    return False


_POSITION_WORDS = {RELATIVE_BIAS: "relative-position bias", ALIBI: "ALiBi",
                   PER_HEAD: "per-head position bias"}
"""score-term kind -> the position encoding it is, as a layer's description names it (`_llama_words`)."""


def _position_term(g: Graph, a: Node) -> str | None:
    """The kind of position bias the attention `a` adds to its scores (`score_terms.additive_term`: relative
    position bias, ALiBi, or a per-head term such as T5's bias precomputed for a static length), or None (no
    additive operand, a padding mask, a band)."""
    if a.op != Op.ATTENTION or a.attrs.get("mask") != "additive" or len(a.inputs) < 4:
        return None
    term = additive_term(g, a.inputs[3], int(a.attrs.get("num_heads") or 0))
    return term.kind if term is not None and term.kind in _POSITION_WORDS else None


def _llama_words(norm: str, rope: bool, gated: str | None, position: str | None) -> str:
    """The words for a `llama`-kind layer, true to its traits: `LLaMA` names only a layer with LLaMA's defining
    traits (RoPE and a gated MLP, `gated`: `SwiGLU` / `GeGLU` / None); RMSNorm with a per-head position bias and no
    RoPE is `T5-style`; any other layer is named by what it has and lacks (an undetected form of RoPE or gate is
    "not recognized", never claimed absent)."""
    pre = f"pre-norm {norm}" if norm != "none" else "no norm"
    if rope and gated:
        return DESCRIPTIONS["llama"] if norm == "RMSNorm" else f"LLaMA-style (RoPE, {gated}) with {pre}"
    mlp = f"{gated} MLP" if gated else "no gated MLP"
    if not rope and position in (RELATIVE_BIAS, PER_HEAD) and norm == "RMSNorm":
        return f"T5-style: {pre}, {_POSITION_WORDS[position]} in the additive mask, no RoPE, {mlp}"
    has = [*(["RoPE"] if rope else []), *([_POSITION_WORDS[position]] if position else []), *([mlp] if gated else [])]
    lacks = " or ".join(t for t, ok in (("RoPE", rope), ("gated MLP", gated)) if not ok)  # one at least: not both
    return f"{pre}{''.join(', ' + h for h in has)} (no {lacks} recognized, so not named LLaMA)"


def classify_layer(graph: Graph, layer: int | None) -> LayerArchitecture:
    """The `LayerArchitecture` of `layer` (None: the whole graph) in `graph` (the unfused input graph)."""
    _, g, known, gelus = _entry(graph)
    if layer not in known:
        view = without_quant_steps(graph)
        if view is None:
            known[layer] = _classify(g, layer, gelus)
        else:
            known.update(_through_quant_steps(view, g, layer))
    return known[layer]


def _through_quant_steps(view: Graph, real: Graph, layer: int | None) -> dict[int | None, LayerArchitecture]:
    """Every layer's kind (and `layer`'s) of a graph with QDQ steps of computed values, read from `view` (the graph
    without them, `quant_steps.without_quant_steps`) after the canonicalization prefix: the steps sit between the
    residual add and its norm, inside a decomposed norm, GELU or SiLU, and would hide the float model's structure
    (a post-LN BERT layer read as pre-LN). What the quantization changes is read from `real` (the graph as written,
    after the prefix): the steps' count and the attention's mask (`unknown` when the attention stayed primitives),
    so what the layer is expected to fuse is judged on the graph that runs. All layers at once: the view is made
    and prepared once per graph."""
    from .pipeline import Pipeline

    trace = Pipeline(list(_PREFIX)).run(view)
    seen, gelus = trace.final, _refused_gelus(trace)
    keys = {layer, None, *(layer_of(n.path) for n in seen)}
    return {k: _classify(seen, k, gelus, real) for k in keys}


def attention_softmax(g: Graph, n: Node) -> bool:
    """A softmax of attention weights: rank 4 (`[B, H, Sq, Sk]`), or rank 3 or more and read (through reshapes,
    casts) as the left operand of a matmul (`P @ V`; heads folded into the batch: `[B*H, Sq, Sk]`)."""
    if n.op != Op.SOFTMAX:
        return False
    if n.rank == 4:
        return True
    todo = [n.id] if n.rank >= 3 else []
    while todo:
        v = todo.pop()
        for u in g.users(v):
            if u.op == Op.MATMUL and u.inputs[0] == v:
                return True
            if u.op in (Op.RESHAPE, Op.CAST):
                todo.append(u.id)
    return False


_BY_LAYER: DigestCache[dict[int | None, list[Node]]] = DigestCache(limit=4)


def _layer_nodes(g: Graph, layer: int | None) -> list[Node]:
    """The compute nodes of `layer` (None: all), from one pass over `g` shared by every layer's classification."""
    index = _BY_LAYER.get(g)
    if index is None:
        index = {None: []}
        for n in g:
            if n.op not in (Op.INPUT, Op.PARAM, Op.CONST):
                index[None].append(n)
                if (k := layer_of(n.path)) is not None:
                    index.setdefault(k, []).append(n)
        _BY_LAYER[g] = index
    return index.get(layer, [])


_THROUGH = frozenset({Op.RESHAPE, Op.TRANSPOSE, Op.NARROW, Op.ROPE, Op.CAST, Op.EXPAND})


def _read_through(g: Graph, i: int) -> Iterator[Node]:
    """The nodes a Q/K/V operand `i` is read through, nearest first: itself, then up through head reshapes,
    transposes, narrows, a rope, casts (`_THROUGH`), the i32 sum of an integer matmul's chunks
    (`quant_steps.integer_matmul`), and a bias add or a scale (the one computed operand of its rank); it stops at a
    node it cannot see through, or after 12 (rope, head split and merge, a scale, a bias, a dequantizing scale and
    cast: 10 in ESM)."""
    for _ in range(12):
        n = g[i]
        yield n
        if n.op in _THROUGH or (n.op == Op.ADD and n.dtype == DType.i32):
            i = n.inputs[0]
        elif n.op in (Op.ADD, Op.MUL, Op.DIV):
            proj = [j for j in n.inputs if g[j].op not in (Op.PARAM, Op.CONST) and g[j].rank == n.rank]
            if len(proj) != 1:
                return
            i = proj[0]
        else:
            return


def _projection(g: Graph, i: int) -> Node | None:
    """The projection a Q/K/V operand comes from (`matmul(x, w)`, `FusedMatMulBiasAct(x, ...)`), read through
    `_read_through`'s ops; None when it is no projection within a few steps."""
    return next((n for n in _read_through(g, i) if n.op in (Op.MATMUL, Op.FUSED_MATMUL_BIAS_ACT)), None)


def _projected_input(g: Graph, i: int) -> int | None:
    """The input `x` a Q/K/V operand is projected from (`_projection`'s first operand), or None."""
    p = _projection(g, i)
    return None if p is None else p.inputs[0]


_SCORE_STEPS = _THROUGH | {Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.WHERE}
"""What lies between an attention's scores matmul and its softmax: a scale, a mask (added, or a `where`), casts."""


def _scores_matmul(g: Graph, i: int) -> Node | None:
    """The matmul `Q @ K^T` value `i` (a softmax's input) is computed from through `_SCORE_STEPS`, breadth first over
    computed operands (the scores before a mask), within 16 nodes; None when there is none."""
    todo, seen = deque([i]), {i}
    while todo and len(seen) <= 16:
        n = g[todo.popleft()]
        if n.op == Op.MATMUL:
            return n
        if n.op in _SCORE_STEPS:
            for j in n.inputs:
                if j not in seen and g[j].op not in (Op.PARAM, Op.CONST, Op.INPUT):
                    seen.add(j)
                    todo.append(j)
    return None


def _qkv_operands(g: Graph, a: Node) -> tuple[int, int, int] | None:
    """The Q, K and V operands of attention `a`: an `attention` node's first three inputs, or, for an attention left
    as primitives (`attention_softmax`: ConvBERT, whose head merge no `fuse_sdpa` form takes), the operands of the
    scores matmul `Q @ K^T` the softmax reads (through a scale, a mask, casts or reshapes) and the `V` of the matmul
    reading its weights; None when `a` is neither or a matmul is not found within a few steps."""
    if a.op == Op.ATTENTION and len(a.inputs) >= 3:
        return a.inputs[0], a.inputs[1], a.inputs[2]
    if not attention_softmax(g, a):
        return None
    scores = _scores_matmul(g, a.inputs[0])
    todo, v = [a.id], None
    for _ in range(8):  # the weights' readers through reshapes and casts: `attention_softmax`'s `P @ V`
        if not todo or v is not None:
            break
        u = todo.pop()
        v = next((n.inputs[1] for n in g.users(u) if n.op == Op.MATMUL and n.inputs[0] == u), None)
        todo += [n.id for n in g.users(u) if n.op in (Op.RESHAPE, Op.CAST)]
    return None if scores is None or v is None else (scores.inputs[0], scores.inputs[1], v)


def integer_qkv(g: Graph, a: Node) -> str | None:
    """Evidence that the attention `a`'s Q, K or V is projected by an integer matmul (`quant_steps.integer_matmul`:
    ONNX's MatMulInteger, as `quantize_dynamic` writes every projection), else None: no float-matmul fusion merges
    or fuses those projections, so no FusedAttentionBlock can hold them (a gap in rlxviz's ops, `policy.op_gaps`).
    `a` is an `attention` node or an attention left as primitives (its softmax, `_qkv_operands`)."""
    qkv = _qkv_operands(g, a)
    if qkv is None:
        return None
    found = [(who, p) for who, i in zip("QKV", qkv, strict=True)
             if (p := _projection(g, i)) is not None and integer_matmul(g, p)]
    if not found:
        return None
    return (f"{_label(a)}: {', '.join(who for who, _ in found)} projected by integer matmuls "
            f"({', '.join(_label(p) for _, p in found)}: int8/uint8 operands, an i32 product, then a scale; dynamic "
            f"quantization's MatMulInteger)")


def _norm_on(g: Graph, i: int) -> Node | None:
    """The norm (`layer_norm` / `rms_norm`) a Q/K operand is read through between its projection and the attention
    (QK-norm), read through `_read_through`'s ops; None when the walk meets the projection first, or a norm with no
    projection behind it."""
    for n in _read_through(g, i):
        if n.op in (Op.LAYER_NORM, Op.RMS_NORM):
            return n if _projection(g, n.inputs[0]) is not None else None
        if n.op in (Op.MATMUL, Op.FUSED_MATMUL_BIAS_ACT):
            return None
    return None


def qk_norm(g: Graph, a: Node) -> str | None:
    """Evidence that the attention `a`'s Q or K is normalized between its projection and the attention (QK-norm:
    OLMo-2 over the full projection width, Qwen3 per head), else None: FusedAttentionBlock reads Q/K as narrows of
    its QKV projection, with no norm between, so no block of rlxviz's holds them (a gap in rlxviz's ops,
    `policy.op_gaps`)."""
    if a.op != Op.ATTENTION or len(a.inputs) < 3:
        return None
    found = [(who, n) for who, i in zip("QK", a.inputs[:2], strict=True) if (n := _norm_on(g, i)) is not None]
    if not found:
        return None
    d = a.attrs.get("head_dim")
    width = "per head" if all(n.shape and n.shape[-1] == d for _, n in found) else "over the projection width"
    return (f"{_label(a)}: {' and '.join(who for who, _ in found)} normalized between the projection and the "
            f"attention ({', '.join(_label(n) for _, n in found)}, {width}: QK-norm)")


def cross_attention(g: Graph, a: Node) -> str | None:
    """Evidence that the packed attention `a` is a cross-attention: its Q and its K/V are projected from different
    inputs (a decoder's stream and the encoder's output); None for a self-attention or an operand that is no plain
    projection."""
    if a.op != Op.ATTENTION or len(a.inputs) < 3:
        return None
    q, k, v = (_projected_input(g, i) for i in a.inputs[:3])
    if q is None or k is None or q == k or k != v:
        return None
    return (f"{_label(a)}: cross-attention: Q projected from {_label(g[q])}, K and V from {_label(g[k])}"
            + (f" ({g[k].path})" if g[k].path else ""))


def _attention(g: Graph, nodes: list[Node]) -> list[Node]:
    return [n for n in nodes if n.op in _ATTENTION or attention_softmax(g, n)]


def _mask(a: Node) -> str:
    """The mask kind of attention node `a` (`unknown` for a softmax of attention weights left primitive)."""
    return (a.attrs.get("mask", "none") if a.op == Op.ATTENTION else a.attrs.get("mask", "keep")
            if a.op in _ATTENTION else "unknown")


def _norm_order(g: Graph, n: Node) -> tuple[str, str] | None:
    """Whether norm `n` sits after its residual add (`("post", evidence)`: the sum feeds only the norm) or on the
    residual stream (`("pre", evidence)`: the value it normalizes also feeds a residual add), or None. The value
    is read in kind, through float casts and QDQ steps (`quant_steps.origin` / `readers`): a sum quantized before its
    norm is still the norm's residual sum."""
    if n.op in (Op.FUSED_RESIDUAL_LN, Op.FUSED_RESIDUAL_RMS_NORM):
        if n.attrs.get("with_sum", False):  # the sum is also returned: it has other readers
            return "pre", f"{_label(n)}: a residual sum fused into its norm and returned too {PRE_NORM}"
        return "post", f"{_label(n)}: a residual sum fused into its norm {POST_NORM}"
    s = g[origin(g, n.inputs[0])]
    read, output = readers(g, s.id)
    others = [u for u in read if u.id != n.id]
    via = "" if s.id == n.inputs[0] else f" (through {_label(g[n.inputs[0]])}: casts / quantization steps)"
    if s.op == Op.ADD and not others and not output:
        return "post", f"residual sum {_label(s)} feeds only {_label(n)}{via} {POST_NORM}"
    add = next((u for u in others if u.op == Op.ADD), None)
    if add is not None:
        return "pre", (f"{_label(n)} reads {_label(s)}{via}, which also feeds residual add {_label(add)} "
                       f"{PRE_NORM}")
    return None


def _affine_after_sum(g: Graph, nodes: list[Node]) -> list[str]:
    """Evidence of each residual sum of `nodes` closed by a per-channel scale and shift with no normalization (`x * w
    + b`, `w` and `b` weights of the last dim: MobileBERT's NoNorm): the sum (an add of two computed values of one
    shape) feeds only the mul, which feeds only the add. [] when there is none."""
    def weight(i: int, n: Node) -> bool:
        return g[i].op in (Op.PARAM, Op.CONST) and tuple(g[i].shape) == tuple(n.shape[-1:])

    out = []
    for s in nodes:
        if s.op != Op.ADD or any(g[i].op in (Op.PARAM, Op.CONST) or g[i].shape != s.shape for i in s.inputs):
            continue
        read, _ = readers(g, s.id)
        if len(read) != 1 or (m := read[0]).op != Op.MUL or not any(weight(i, m) for i in m.inputs):
            continue
        b = list(g.users(m.id))
        if len(b) == 1 and b[0].op == Op.ADD and any(weight(i, b[0]) for i in b[0].inputs):
            out.append(f"residual sum {_label(s)} feeds only {_label(m)} -> {_label(b[0])}: a per-channel scale and "
                       f"shift (x * w + b) with no normalization (MobileBERT's NoNorm)")
    return out


def _classify(g: Graph, layer: int | None, gelus: tuple[Rejection, ...] = (), real: Graph | None = None
              ) -> LayerArchitecture:
    """`layer`'s kind in `g` (prepared). `real`: the prepared graph as written when `g` is its view without QDQ
    steps; its quantization steps and its attention's mask are the layer's (`_through_quant_steps`)."""
    nodes = _layer_nodes(g, layer)
    ids = {n.id for n in nodes}
    attn = _attention(g, nodes)
    written = g if real is None else real
    real_nodes = nodes if real is None else _layer_nodes(real, layer)
    norms = [n for n in nodes if n.op in _NORMS]
    acts = [n for n in nodes if _is_activation(n)]
    evidence: list[str] = []
    for n, why in _decomposed_gelus(g, gelus, ids):
        if n not in acts:
            acts.append(n)
            evidence.append(why)
    forms = []
    for n in nodes:  # QuickGELU, Swish, squared ReLU as primitives: a recognized family is never dropped
        if (f := activation_form(g, n)) is not None and n not in acts:
            acts.append(n)
            forms.append(f.name)
            evidence.append(f"{_label(n)}: {f.describe()}, an activation: the layer has an MLP")
    norm = ("RMSNorm" if any(n.op in (Op.RMS_NORM, Op.FUSED_RESIDUAL_RMS_NORM) for n in norms)
            else "LayerNorm" if norms else "none")
    gated = [n for n in nodes if n.op == Op.FUSED_SWIGLU or _gates(g, n)]
    swiglu = bool(gated)  # SwiGLU or GeGLU: FusedSwiGLU is expected
    geglu = any(n.attrs.get("activation", "silu") != "silu" if n.op == Op.FUSED_SWIGLU else n.op != Op.SILU
                for n in gated)
    rope = any(n.op == Op.ROPE or rotate_half_rope(g, n) is not None or interleaved_rope(g, n) is not None
               for n in nodes) or any(
        n.op == Op.FUSED_ATTENTION_BLOCK and n.attrs.get("has_rope") for n in nodes)
    quant = [n for n in real_nodes if _fake_quant(written, n)]
    if quant:
        evidence.append(f"{len(quant)} quantization step(s) of computed values ({_label(quant[0])}, ...): "
                        f"quantized activations" + ("; the layer's structure read through them (each dequantized "
                                                    "value as the value it quantizes)" if real is not None else ""))
        if not acts and any(n.op in (Op.ERF, Op.TANH) for n in nodes):  # a GELU with quantized intermediates
            acts.append(next(n for n in nodes if n.op in (Op.ERF, Op.TANH)))
            forms.append("GELU with quantized intermediates")
    mask: str | None = None
    position: str | None = None
    kv_cache = False
    workload = ""
    if attn:
        a = attn[0]
        mask = _mask(a)
        position = _position_term(g, a)
        if real is not None:  # the mask of the attention that runs: `unknown` when quantization kept it primitive
            mask = _mask(next(iter(_attention(real, real_nodes)), a))
        if a.op == Op.ATTENTION and (cat := next((i for i in a.inputs[1:3] if g[i].op == Op.CONCAT), None)):
            kv_cache = True
            workload = kv_workload(a.shape[1], cached_length(g, cat))
            evidence.append(f"{_label(a)}: K/V read through a KV cache, a {workload} ({a.shape[1]} "
                            f"quer{'y' if a.shape[1] == 1 else 'ies'} against {g[a.inputs[1]].shape[1]} keys)")
        if a.op == Op.ATTENTION and a.attrs.get("num_kv_heads") not in (None, a.attrs.get("num_heads")):
            evidence.append(f"{_label(a)}: grouped-query ({a.attrs['num_heads']} query heads, "
                            f"{a.attrs['num_kv_heads']} kv heads)")
    crossed = [(a, why) for a in attn if (why := cross_attention(g, a)) is not None]
    evidence += [why for _, why in crossed]
    integer = integer_qkv(g, attn[0]) if attn else None
    if integer is not None:
        evidence.append(integer)
    qk = qk_norm(g, attn[0]) if attn else None
    if qk is not None:
        evidence.append(qk)
    post = pre = False
    for n in norms:
        if (order := _norm_order(g, n)) is not None:
            post, pre = post or order[0] == "post", pre or order[0] == "pre"
            evidence.append(order[1])
    if any(n.op == Op.FUSED_TRANSFORMER_LAYER for n in nodes):
        post = True
        evidence.append("a FusedTransformerLayer (post-LN BERT)")
    parallel = 0  # the residual stream's norms the parallel block's sublayers read (`LayerArchitecture.parallel_norms`)
    if attn and acts:
        a_reach = _reach(g, attn[0].id, ids) | {attn[0].id}
        reach = {n.id: _reach(g, n.id, ids) for n in norms}
        # (the attention's norm, the MLP's norm, its activation): one norm (GPT-J, PaLM), or two of the same residual
        # stream (GPT-NeoX), with the activation not downstream of the attention
        hit = next(((n, m, x) for n in norms if attn[0].id in reach[n.id]
                    for m in (n, *(o for o in norms if o is not n and origin(g, o.inputs[0]) == origin(g, n.inputs[0])))
                    for x in acts if x.id in reach[m.id] and x.id not in a_reach), None)
        if hit is not None:
            n, m, act = hit
            parallel = 1 if m is n else 2
            via = (f"{_label(n)} feeds both {_label(attn[0])} and {_label(act)}" if m is n else
                   f"{_label(n)} feeds {_label(attn[0])} and {_label(m)}, of the same input "
                   f"{_label(g[n.inputs[0]])}, feeds {_label(act)}")
            evidence.append(f"{via}, which does not depend on the attention (parallel block)")
    if not attn:
        kind = "no_attention"
    elif crossed and len(attn) > len(crossed):  # a self-attention and a cross-attention: a decoder layer
        kind = "cross_decoder"
        if pre:
            evidence.append("pre-norm residual")
    elif not acts:
        kind = "attention_only"
        if pre:
            evidence.append("pre-norm residual")
    elif parallel:
        kind = "parallel"
    elif post and not pre and norm == "LayerNorm":
        kind = "post_ln"
    elif norm == "RMSNorm" or (swiglu and not geglu):  # RoPE alone is GPT-NeoX's and Phi's too: pre-LN with RoPE
        kind = "llama"
    elif pre:
        kind = "pre_ln"
    else:  # no norm placement read: no kind is guessed (MobileBERT's NoNorm layers)
        kind = "unknown"
        evidence += _affine_after_sum(g, nodes)
    extras = [norm if norm != "none" else "no norm"] + (["RoPE"] if rope else []) + (
        [("GeGLU" if geglu else "SwiGLU")] if swiglu else [])
    extras += list(dict.fromkeys(forms))
    if mask is not None:
        extras.append(f"{mask} mask" if mask != "none" else "no mask")
    if kv_cache:
        extras.append(f"KV cache ({workload})")
    if quant:
        extras.append(f"quantized activations ({len(quant)} QuantizeLinear -> DequantizeLinear steps)")
    if integer is not None:
        extras.append("integer-matmul Q/K/V projections (dynamic quantization)")
    if qk is not None:
        extras.append("QK-norm")
    words = _llama_words(norm, rope, ("GeGLU" if geglu else "SwiGLU") if swiglu else None, position) \
        if kind == "llama" else UNREAD_ORDER if kind == "unknown" and norms else DESCRIPTIONS[kind]
    return LayerArchitecture(kind, f"{words}; {', '.join(extras)}", norm, mask, rope, swiglu,
                             tuple(evidence), kv_cache, len(quant), integer is not None, qk is not None,
                             parallel if kind == "parallel" else 0)


__all__ = ["DESCRIPTIONS", "KINDS", "LayerArchitecture", "attention_softmax", "classify_layer",
           "cross_attention", "integer_qkv", "interleaved_rope", "prepared", "qk_norm", "rotate_half_rope"]
