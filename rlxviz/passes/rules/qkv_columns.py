"""A packed QKV projection laid out per head (GPT-NeoX, Pythia, BLOOM, CodeGen) -> Q/K/V as column blocks of the
projection with its weight's columns permuted: the form `fuse_attention_block` reads.

GPT-NeoX projects Q, K and V with one `query_key_value` linear whose `3 * H * d` columns are laid out per head,
`[q_0, k_0, v_0, q_1, k_1, v_1, ...]` (each `d` wide), and reads them as `narrow(transpose(reshape(qkv,
[B, S, H, 3d]), [0, 2, 1, 3]), -1, i*d, d)`; BLOOM views the same layout as `[B, S, H, 3, d]`, CodeGen (GPT-J's
layout in mesh-transformer-jax) as `mp_num` blocks of `[q, v, k]`. After `fuse_sdpa` the attention reads each as a
per-token column selection of the projection (`head_layout.token_columns`: `Q[b, s, c] = qkv[b, s, cols_q[c]]`),
not as the narrows at `0 / H*d / (H+KV)*d` that FusedAttentionBlock's pattern takes (its guard `qkv_packed`), so the
block was refused as a "layout", and the guard after it (the RoPE the block lacks, e.g. GPT-NeoX's partial rotary)
was never reached.

`fuse_attention_block.qkv_columns` (a stage of `fuse_attention_block`) rewrites

    attention(r_q(sel_q(qkv)), r_k(sel_k(qkv)), sel_v(qkv), mask)      qkv = linear(x, W, b)  [B, S, W]
    -> attention(r_q(narrow(qkv', -1, lo, nq)), r_k(narrow(qkv', -1, lo + nq, nk)),
                 narrow(qkv', -1, lo + nq + nk, nv), mask)
       qkv' = linear(x, W[:, full], b[full]),   full[lo + j] = perm[j],  full[c] = c outside [lo, lo + len(perm))
       perm = cols_q ++ cols_k ++ cols_v

where `sel_*` are the movement chains (through a column block `narrow(qkv, -1, a, n)` when `fuse_shared_input_matmul`
merged the QKV projection with another projection of the same input, CodeGen's MLP: then `perm` is that block's), `r_*`
an optional rope op (copied with its tables and attributes), `linear` a `matmul` or a `FusedMatMulBiasAct` (any
activation), and `W[:, full]` is written `transpose(gather(transpose(W), full))` (a bias of one element stays as it
is).

Validity condition (numbers equal for every input): `perm` holds each column of the block `[lo, lo + len(perm))`
once (a permutation of it), and every other reader of `qkv` is a narrow of its last axis outside that block. Then
column `c` of `x @ W[:, full] + b[full]` is `x @ W[:, full[c]] + b[full[c]]`, column `full[c]` of the original
product (the same operands in the same dot product; an elementwise activation maps each element on its own), so the
other readers read the same values (`full[c] = c` there), and `narrow(qkv', -1, lo + a, n)[b, s, j] = qkv[b, s,
perm[a + j]]`, which is the selection's element by the definition of `perm`; the ropes and the attention read the
same values as before. The values are equal in exact arithmetic; in floating point each column is the same dot
product, but a backend may sum it in another order for another memory layout of the weight (NumPy hands the
transposed gather to BLAS as a transposed operand: last-bit differences, about 1e-7 relative), so the stage is
checked within float32 rounding, as `explain` checks every version. Also required, so nothing is computed twice and
the projection costs what it did: the weight rank 2 (a bias `[W]`, `[1]` or a scalar), nothing but the chains, the
ropes and the attention reads the chains and the ropes, and no graph output among them or the projection. Already
the block's form (every operand a narrow of the last axis) is no candidate.

The rule has no refusal of its own (a quiet step): a layout it does not take is named by `qkv_packed`.
"""

from __future__ import annotations

import numpy as np

from ...ir import DType, Graph, Node, Op, Rewriter
from ..engine import rule_pass
from ..guard import Ctx
from ..pattern import P
from ..rule import QUIET, Fail, Rule, reports
from ..trace import Match
from .head_layout import token_columns

RULE = "fuse_attention_block.qkv_columns"
_LINEAR = (Op.MATMUL, Op.FUSED_MATMUL_BIAS_ACT)


def _operand(g: Graph, i: int, rotated: bool) -> tuple[Node | None, int]:
    """`(rope, value)`: the rope op operand `i` is (Q, K: `rotated`) and the value it rotates, or `(None, i)`."""
    n = g[i]
    return (n, n.inputs[0]) if rotated and n.op == Op.ROPE else (None, i)


def _block_form(g: Graph, i: int) -> bool:
    n = g[i]
    return n.op == Op.NARROW and n.attrs["axis"] in (-1, 2)


def _linear_ok(g: Graph, p: Node) -> bool:
    """A projection whose columns can be permuted through its weight: `matmul(x, W)` / `FusedMatMulBiasAct(x, W, b)`
    with W rank 2 `[K, W]` and b `[W]`, `[1]` or a scalar."""
    if p.op not in _LINEAR or p.rank != 3 or g[p.inputs[1]].shape != (g[p.inputs[0]].shape[-1], p.shape[-1]):
        return False
    return p.op == Op.MATMUL or g[p.inputs[2]].shape in ((), (1,), (p.shape[-1],))


def _through_block(g: Graph, root: int, cols: np.ndarray, chain: tuple[int, ...]
                   ) -> tuple[int, np.ndarray, tuple[int, ...]]:
    """A selection of a column block `narrow(p, -1, a, n)` of a rank-3 value p (a QKV projection that
    `fuse_shared_input_matmul` merged with another projection of the same input: CodeGen's MLP) read as a selection
    of p: its columns shifted by a, the narrow first in its chain."""
    n = g[root]
    while n.op == Op.NARROW and n.attrs["axis"] in (-1, 2) and g[n.inputs[0]].rank == 3:
        cols, chain, n = cols + n.attrs["start"], (n.id, *chain), g[n.inputs[0]]
    return n.id, cols, chain


def _other_columns_ok(g: Graph, p: Node, inside: set[int], lo: int, hi: int) -> bool:
    """Every reader of the projection p outside the rewrite (`inside`) is a narrow of its last axis that reads no
    column of `[lo, hi)` (the block the rewrite permutes), so it reads the same columns of the new projection."""
    for u in g.users(p.id):
        if u.id in inside:
            continue
        if u.op != Op.NARROW or u.attrs["axis"] not in (-1, 2):
            return False
        a, n = u.attrs["start"], u.attrs["length"]
        if a < hi and lo < a + n:
            return False
    return True


def columns(g: Graph, attn: Node) -> tuple[int, np.ndarray, int, list[int], dict[str, int]] | None:
    """`(projection, perm, lo, nodes, ropes)` when the packed attention `attn` reads Q, K (each optionally through a
    rope op) and V as per-token column selections of one projection that the rewrite takes (module doc): `perm` the
    columns of the block `[lo, lo + len(perm))` of the projection it reads, in Q, K, V order, `nodes` every node the
    rewrite removes (the chains, the ropes), `ropes` `{"q_rope": id, "k_rope": id}` of the rotated ones. None
    otherwise."""
    if attn.op != Op.ATTENTION or len(attn.inputs) < 3:
        return None
    found, ropes, nodes = [], {}, []
    for k, (who, i) in enumerate(zip("qkv", attn.inputs[:3], strict=True)):
        rope, x = _operand(g, i, k < 2)
        sel = token_columns(g, x)
        if sel is None:
            return None
        found.append((_through_block(g, *sel), x))
        if rope is not None:
            ropes[f"{who}_rope"] = rope.id
            nodes.append(rope.id)
    roots = {sel[0] for sel, _ in found}
    if len(roots) != 1 or all(_block_form(g, x) for _, x in found):
        return None
    root = g[roots.pop()]
    perm = np.concatenate([sel[1] for sel, _ in found])
    lo = int(perm.min())
    if not _linear_ok(g, root) or not np.array_equal(np.sort(perm), np.arange(lo, lo + perm.size)):
        return None
    nodes += dict.fromkeys(i for sel, _ in found for i in sel[2])
    inside = {*nodes, attn.id}
    if any(g.is_output(i) or any(u.id not in inside for u in g.users(i)) for i in nodes) or g.is_output(root.id) \
            or not _other_columns_ok(g, root, inside, lo, lo + perm.size):
        return None
    return root.id, perm, lo, nodes, ropes


@reports(reads=("attn",), binds=("qkv", "q_rope", "k_rope"))
def _find_columns(c: Ctx) -> Fail | None:
    """Bind the projection (`qkv`) and the ropes the attention's Q/K/V are read through, when they are per-token
    column selections of it the rewrite takes (`columns`); quiet otherwise (no candidate)."""
    found = columns(c.graph, c["attn"])
    if found is None:
        return QUIET
    c.bindings["qkv"] = found[0]
    for role in ("q_rope", "k_rope"):
        if role in found[4]:
            c.bindings[role] = found[4][role]
    return None


def _rewrite(c: Ctx, rw: Rewriter) -> int:
    """The projection with its weight's (and bias's) columns of the attention's block in Q/K/V order (the others
    where they were), Q/K/V its narrows, the ropes and the attention on them; the old projection replaced (its other
    readers, narrows of other columns, read the new one), the chains and ropes removed (`columns` checked nothing
    else reads them). The attention (`Match.fused`) records the match; the new projection and each new rope the
    old node it re-makes, so each names its own ONNX nodes (`app.onnxorigin.onnx_claims`)."""
    g, attn = c.graph, c["attn"]
    found = columns(g, attn)
    assert found is not None, "bound by _find_columns"
    root_id, perm, lo, nodes, _ = found
    root = g[root_id]
    full = np.arange(root.shape[-1])
    full[lo:lo + perm.size] = perm
    with rw.provenance([*nodes, root_id, attn.id]):
        ins = list(root.inputs)
        if not np.array_equal(full, np.arange(full.size)):
            idx = rw.const(tuple(int(p) for p in full), DType.i64)
            ins[1] = rw.transpose(rw.gather(rw.transpose(ins[1], (1, 0)), idx), (1, 0))
            if root.op == Op.FUSED_MATMUL_BIAS_ACT and g[ins[2]].shape == (full.size,):
                ins[2] = rw.gather(ins[2], idx)
        with rw.absorbing([root_id]):  # each node re-made replaces its old one (the attention: the whole match)
            qkv = rw.emit(root.op, ins, **dict(root.attrs))
        new, at = [], lo
        for k, i in enumerate(attn.inputs[:3]):
            rope, _ = _operand(g, i, k < 2)
            width = g[i].shape[-1]
            x = rw.narrow(qkv, 2, at, width)
            at += width
            if rope is None:
                new.append(x)
                continue
            with rw.absorbing([rope.id]):
                new.append(rw.emit(Op.ROPE, [x, *rope.inputs[1:]], **dict(rope.attrs)))
        out = rw.emit(Op.ATTENTION, [*new, *attn.inputs[3:]], **dict(attn.attrs))
    rw.replace(attn.id, out)
    rw.replace(root_id, qkv)
    rw.remove(nodes)
    return out


QKV_COLUMNS = Rule(RULE, P(Op.ATTENTION, name="attn"), steps=(_find_columns,), result="attn", absorb=("attn",),
                   rewrite=_rewrite, labels={"attn": "attention", "qkv": "QKV projection"},
                   doc="Q/K/V read per head from a packed projection -> narrows of the projection with its weight's "
                       "columns in Q/K/V order (equal values)")

QKV_COLUMNS_PASS = rule_pass("fuse_attention_block", [QKV_COLUMNS], "Q/K/V laid out per head in a packed projection "
                             "read as its column blocks")
"""The rule as a stage of `fuse_attention_block` (`engine.compose`)."""


def qkv_columns(g: Graph) -> tuple[Graph, list[Match]]:
    """`g` with every packed attention whose Q/K/V are per-token column selections of one projection rewritten to
    narrows of that projection with its weight's columns permuted (module doc): the `QKV_COLUMNS` rule run by the
    engine."""
    return QKV_COLUMNS_PASS.rewrite(g)


__all__ = ["QKV_COLUMNS", "QKV_COLUMNS_PASS", "RULE", "columns", "qkv_columns"]
