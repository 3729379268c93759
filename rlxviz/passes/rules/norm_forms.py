"""`canonicalize_norm`: LayerNorm and RMSNorm written as primitives -> `layer_norm` / `rms_norm`.

Exporters (ONNX opset < 17, torch.fx traces, hand-written modules) emit the norms as primitives.
Two rules, each anchored on the first statistic and walking forward through the users:

* `canonicalize_norm.layer_norm`: `mean = reduce_mean(x, [-1])`, `c = x - mean`, `var =
  reduce_mean(c*c | pow(c, 2))`, `normed = c / sqrt(var + eps)` or `c * rsqrt(var + eps)`, then
  optionally `* gamma` and `+ beta` -> `layer_norm(x, gamma, beta, eps)` (a missing gamma/beta becomes a
  constant of ones/zeros). `keepdims=false` statistics count when a reshape restores the `[..., 1]` axis.
* `canonicalize_norm.rms_norm`: `ms = reduce_mean(x*x | pow(x, 2), [-1])`, `x * rsqrt(ms + eps)` or
  `x / sqrt(ms + eps)`, optionally `* gamma` (and `+ beta`) -> `rms_norm(x, gamma[, beta], eps)`.

An identity cast between the normalized value and `* gamma` (Hugging Face's `.to(input_dtype)` in an f32
model) is absorbed too.

Validity (each a named guard; the rewrite changes only rounding, checked against the reference on random
and adversarial inputs in `tests/test_forms.py`):

* `normalized_axis_last`: the statistics reduce exactly the last axis (the norm ops normalize nothing else).
* `mean_keepdims` / `var_keepdims`: each statistic is broadcast back per row (`[..., 1]`); a `keepdims=false`
  statistic subtracted directly broadcasts along the last axis instead (a different function).
* `eps_inside_sqrt`: eps is added to the variance, not to the standard deviation.
* `stats_dtype`: x is f32 (the decomposition's statistics in f16 round differently from the fused kernels,
  which accumulate in f32).
* `gamma_shape` / `beta_shape`: rank-1 `[hidden]` over the normalized axis.

The model's own terms, kept exactly and named (soft, kind "the model's own term"): Gemma's `* (1 + w)` is the
gamma (`c + w`, c a scalar constant): a constant w is folded to `gamma' = 1 + w` computed in the add's dtype (the
value the add produces); a parameter w keeps its `[H]` add outside as the norm's gamma operand (`gamma_computed`).
An eps constant that rounds to 0 in its dtype (an f16 1e-8) is built as eps = 0, as the graph adds it
(`eps_rounds_to_zero`); every eps is read as its dtype holds it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from ...ir import DType, Graph, Node, Op, Rewriter
from ..engine import Pass, PassResult, rule_pass, settle
from ..guard import ILLEGAL, MODEL_TERM, NOT_RECOGNIZED, Ctx, guard
from ..pattern import P, const_value, is_const
from ..rule import QUIET, Fail, Rule, Soft, reports
from .norm_casts import absorb_casts

_AFFINE_LEAVES = (Op.PARAM, Op.CONST)


def _offset_weight(g: Graph, i: int) -> int | None:
    """The weight w when node i is `c + w` (either order; c a scalar constant, w a parameter or constant leaf):
    Gemma's RMSNorm scales by `1 + w`. None otherwise."""
    n = g[i]
    if n.op != Op.ADD or len(n.inputs) != 2:
        return None
    a, b = (g[j] for j in n.inputs)
    for k, w in ((a, b), (b, a)):
        if k.op == Op.CONST and k.shape in ((), (1,)) and w.op in _AFFINE_LEAVES and w.shape == n.shape:
            return w.id
    return None


def typed(node: Node) -> float:
    """A scalar constant's value as its dtype holds it (an f16 1e-8 is 0.0)."""
    with np.errstate(over="ignore", under="ignore"):
        return float(np.asarray(node.attrs.get("value", 0.0)).astype(node.dtype.numpy))


@reports("gamma_computed", kind=MODEL_TERM, reads=("gamma", "gamma_w"))
def _gamma_term(c: Ctx) -> Fail | None:
    """Gemma's `gamma = 1 + w` (soft): computed from a parameter, it stays outside as an `[H]` add the norm reads
    as its gamma (named); a constant w is folded (`gamma' = 1 + w` computed in the dtype: exactly the add's value)."""
    g = c.graph
    if "gamma_w" in c:
        add, w = c["gamma"], c["gamma_w"]
        if w.op == Op.CONST and len({g[i].dtype for i in add.inputs} | {add.dtype}) == 1 and \
                len(c.users("gamma")) == 1 and not g.is_output(add.id):
            c.data["gamma_fold"] = True
        else:
            return Fail("guard", "gamma_computed",
                        f"the gamma add (node {add.id}{', ' + add.path if add.path else ''}) = "
                        f"{typed(g[next(i for i in add.inputs if i != w.id)]):g} + {w.op.value} {w.name or ''} "
                        f"(node {w.id}) is computed in the graph (Gemma's 1 + w): the norm reads it as its gamma "
                        f"operand and the [{add.shape[0]}] add stays outside (exact)", (add.id,), (),
                        "nothing to change in the model", subject=add.id, kind=MODEL_TERM,
                        fix="fold 1 + w into the weight when the checkpoint loads (a weight transform)")
    return None


@reports("eps_rounds_to_zero", kind=MODEL_TERM, reads=("eps",))
def _eps_term(c: Ctx) -> Fail | None:
    """An eps constant that rounds to 0 in its dtype (soft): the norm is built with eps = 0, as the graph adds it."""
    e = c["eps"]
    if e.attrs.get("value") and typed(e) == 0.0:
        return Fail("guard", "eps_rounds_to_zero",
                    f"{c.d('eps')} = {e.attrs['value']} is a {e.dtype} constant and rounds to 0 in {e.dtype}: the "
                    f"graph adds 0, so the norm is built with eps=0.0, as the graph computes it (a row of zeros "
                    f"gives NaN in both)", (e.id,), (), "store eps in a dtype that holds it (f32) if 0 was not meant",
                    subject=e.id, kind=MODEL_TERM, fix="")
    return None


def _users(g: Graph, i: int, op: Op | tuple[Op, ...]) -> list[Node]:
    ops = (op,) if isinstance(op, Op) else op
    return [u for u in g.users(i) if u.op in ops]


def _other(n: Node, i: int) -> int | None:
    """The operand of binary `n` that is not `i` (None when both are `i`)."""
    a, b = n.inputs
    return b if a == i else a if b == i else None


def _restored(g: Graph, stat: Node, consumer_ok: Callable[[Node, int], bool]) -> tuple[Node | None, Node | None]:
    """`(broadcast form, consumer)`: the statistic itself or its reshape, and the first user that fits."""
    for u in g.users(stat.id):
        if consumer_ok(u, stat.id):
            return None, u
    for r in _users(g, stat.id, Op.RESHAPE):
        for u in g.users(r.id):
            if consumer_ok(u, r.id):
                return r, u
    return None, None


def _is_square_of(n: Node, g: Graph, x: int) -> bool:
    if n.op == Op.MUL:
        return n.inputs == (x, x)
    return n.op == Op.POW and n.inputs[0] == x and is_const(g[n.inputs[1]]) and const_value(g[n.inputs[1]]) == 2.0


def _tail(c: Ctx, stat_role: str, num: int) -> bool:
    """From the bound statistic (variance or mean square) to `normed` and the optional affine; binds roles.

    `num` is the numerator (centered x, or x for RMSNorm). Returns False when the chain is not a norm.
    """
    g, b = c.graph, c.bindings
    stat = c[stat_role]

    def eps_add(u: Node, src: int) -> bool:
        o = _other(u, src) if u.op == Op.ADD else None
        return o is not None and is_const(g[o])

    def root_of(u: Node, src: int) -> bool:
        return u.op in (Op.SQRT, Op.RSQRT)

    r, add = _restored(g, stat, eps_add)
    if add is not None:
        if r is not None:
            b[f"{stat_role}_r"] = r.id
        b["eps_add"], b["eps"] = add.id, _other(add, (r or stat).id)
        roots = _users(g, add.id, (Op.SQRT, Op.RSQRT))
        if not roots:
            return False
        b["root"] = roots[0].id
        root = roots[0]
    else:  # eps after the sqrt: sqrt(var) + eps (refused by eps_inside_sqrt)
        r, root = _restored(g, stat, root_of)
        if root is None or root.op != Op.SQRT:
            return False
        if r is not None:
            b[f"{stat_role}_r"] = r.id
        adds = [u for u in _users(g, root.id, Op.ADD) if eps_add(u, root.id)]
        if not adds:
            return False
        b["root"], b["eps_add"], b["eps"] = root.id, adds[0].id, _other(adds[0], root.id)
        c.data["eps_outside"] = True
        root = adds[0]
    want = Op.DIV if root.op in (Op.SQRT, Op.ADD) else Op.MUL
    normed = next((u for u in _users(g, num, want) if (u.inputs == (num, root.id) if want == Op.DIV
                                                        else set(u.inputs) == {num, root.id})), None)
    if normed is None:
        return False
    b["normed"] = normed.id
    casts = _users(g, normed.id, Op.CAST)
    if len(g.users(normed.id)) == 1 and casts and casts[0].dtype == normed.dtype:  # HF's .to(input_dtype), f32
        b["normed_cast"] = casts[0].id
        normed = casts[0]
    scales = _users(g, normed.id, Op.MUL)
    if len(g.users(normed.id)) == 1 and scales:
        gam = _other(scales[0], normed.id)
        offset = _offset_weight(g, gam) if gam is not None else None
        if gam is not None and (g[gam].op in _AFFINE_LEAVES or offset is not None):
            b["scale"], b["gamma"] = scales[0].id, gam
            if offset is not None:  # Gemma's (1 + w)
                b["gamma_w"] = offset
            shifts = _users(g, scales[0].id, Op.ADD)
            if len(g.users(scales[0].id)) == 1 and shifts:
                bet = _other(shifts[0], scales[0].id)
                if bet is not None and g[bet].op in _AFFINE_LEAVES:
                    b["shift"], b["beta"] = shifts[0].id, bet
    return True


_TAIL_ROLES = ("var_r", "eps_add", "eps", "root", "normed", "normed_cast", "scale", "gamma", "gamma_w", "shift",
               "beta")
"""The roles `_tail` binds."""


@reports(reads=("x", "mean"), binds=("mean_r", "centered", "sq", "var", *_TAIL_ROLES))
def _layer_norm_chain(c: Ctx) -> Fail | None:
    """Bind the LayerNorm chain from `mean` (quiet when the users do not continue it)."""
    g, x = c.graph, c.id("x")
    mean = c["mean"]

    def centered(u: Node, src: int) -> bool:
        return u.op == Op.SUB and u.inputs == (x, src)

    r, sub = _restored(g, mean, centered)
    if sub is None:
        return QUIET
    if r is not None:
        c.bindings["mean_r"] = r.id
    c.bindings["centered"] = sub.id
    sq = next((u for u in g.users(sub.id) if _is_square_of(u, g, sub.id)), None)
    if sq is None:
        return QUIET
    var = next((u for u in _users(g, sq.id, Op.REDUCE_MEAN)), None)
    if var is None:
        return QUIET
    c.bindings.update(sq=sq.id, var=var.id)
    return None if _tail(c, "var", sub.id) else QUIET


def _centered_value(g: Graph, n: Node) -> bool:
    """`n` is `x - reduce_mean(x)` (possibly through a reshape): LayerNorm's territory, not RMSNorm's."""
    if n.op != Op.SUB:
        return False
    m = g[n.inputs[1]]
    m = g[m.inputs[0]] if m.op == Op.RESHAPE else m
    return m.op == Op.REDUCE_MEAN and m.inputs[0] == n.inputs[0]


@reports(reads=("sq",), binds=("x", "var", *_TAIL_ROLES))
def _rms_norm_chain(c: Ctx) -> Fail | None:
    """Bind the RMSNorm chain from `sq` (quiet when it is not one)."""
    g, sq = c.graph, c["sq"]
    x = sq.inputs[0]
    if not _is_square_of(sq, g, x) or _centered_value(g, g[x]):
        return QUIET
    c.bindings["x"] = x
    ms = next((u for u in _users(g, sq.id, Op.REDUCE_MEAN)), None)
    if ms is None:
        return QUIET
    c.bindings["var"] = ms.id
    return None if _tail(c, "var", x) else QUIET


def _axis_last(c: Ctx, stat: str) -> bool:
    n, rank = c[stat], c["x"].rank
    return len(n.attrs["axes"]) == 1 and n.attrs["axes"][0] in (-1, rank - 1)


def _row_shape(c: Ctx) -> tuple[int, ...]:
    return (*c["x"].shape[:-1], 1)


def _bcast(stat: str) -> str:
    return f"{stat}_r"


def _broadcast_ok(c: Ctx, stat: str) -> bool:
    node = c[_bcast(stat)] if _bcast(stat) in c else c[stat]
    return node.shape == _row_shape(c)


def _keepdims_guard(stat: str, name: str, what: str) -> object:
    def explain(c: Ctx) -> str:
        node = c[_bcast(stat)] if _bcast(stat) in c else c[stat]
        return (f"{c.the(what, stat)} reaches its user with shape {list(node.shape)} (keepdims="
                f"{str(c[stat].attrs.get('keepdims')).lower()}); it broadcasts along the last axis of x "
                f"{list(c['x'].shape)} instead of per row; needs {list(_row_shape(c))}")
    return guard(name, lambda c: _broadcast_ok(c, stat), explain,
                 f"reduce with keepdims=true (or reshape the {what} to [..., 1]) before using it",
                 requires=(stat,), reads=("x", _bcast(stat)), kind=ILLEGAL)


def _affine_guard(role: str) -> object:
    def ok(c: Ctx) -> bool:
        return c[role].shape == (c["x"].shape[-1],)

    return guard(f"{role}_shape", ok,
                 lambda c: f"{c.d(role)} has shape {list(c[role].shape)}; needs rank 1 [{c['x'].shape[-1]}] "
                           f"over the normalized (last) axis of x {list(c['x'].shape)}",
                 f"store {role} as a [hidden] vector", requires=(role,), reads=("x",), kind=NOT_RECOGNIZED,
                 fix=f"none: the norm op takes a rank-1 {role} over the last axis")


def _common_guards(family: str, stats: tuple[str, ...]) -> tuple:
    return (
        guard("normalized_axis_last", lambda c: all(_axis_last(c, s) for s in stats),
              lambda c: f"{c.d(stats[0])} reduces axes {list(c[stats[0]].attrs['axes'])} of x {list(c['x'].shape)}; "
                        f"{family} normalizes the last axis only",
              "normalize over the last axis (transpose first)", requires=stats, reads=("x",), kind=NOT_RECOGNIZED,
              fix=f"an axis attribute on {family} (it normalizes the last axis only)"),
        *(_keepdims_guard(s, f"{'mean' if s == 'mean' else 'var'}_keepdims",
                          "mean" if s == "mean" else "variance" if family == "layer_norm" else "mean square")
          for s in stats),
        guard("eps_inside_sqrt", lambda c: not c.data.get("eps_outside"),
              lambda c: f"{c.d('eps')} is added after the sqrt ({c.d('eps_add')}: std + eps); {family} adds "
                        f"it to the variance (sqrt(var + eps)): the numbers differ",
              "write sqrt(var + eps)", requires=("eps_add",), reads=("eps",), kind=ILLEGAL,
              fix="std + eps (eps outside the sqrt) as a norm op (and its fused kernels)",
              no_model_fix=lambda c: "sqrt(var) + eps is another normalization than sqrt(var + eps): rewriting the "
                                     "model to the latter changes its numbers"),
        guard("eps_scalar", lambda c: (const_value(c["eps"]) or 0.0) >= 0.0,
              lambda c: f"{c.d('eps')} = {const_value(c['eps'])}; needs a scalar >= 0", requires=("eps",),
              kind=NOT_RECOGNIZED, fix="none: a negative eps is not a norm"),
        guard("stats_dtype", lambda c: c["x"].dtype == DType.f32,
              lambda c: f"{c.d('x')} is {c['x'].dtype}: the statistics are computed in {c['x'].dtype}, while the "
                        f"{family} kernels accumulate in f32; the numbers differ",
              "cast x to f32 before the statistics (as Hugging Face's LlamaRMSNorm does)", requires=("x",),
              kind=ILLEGAL),
        _affine_guard("gamma"),
        _affine_guard("beta"),
        Soft(_gamma_term),
        Soft(_eps_term),
    )


_ABSORB = ("mean", "mean_r", "centered", "sq", "var", "var_r", "eps_add", "root", "normed", "normed_cast", "scale",
           "shift")
_RESULT = ("shift", "scale", "normed_cast", "normed")


def _rewrite(op: Op) -> object:
    def rewrite(c: Ctx, rw: Rewriter) -> int:
        absorbed = [c.id(r) for r in _ABSORB if r in c]
        x = c["x"]
        h = x.shape[-1]
        if c.data.get("gamma_fold"):
            absorbed.append(c.id("gamma"))
        with rw.provenance(absorbed):
            with rw.absorbing():  # a unit gamma or zero beta replaces nothing: only the norm does
                gamma = c.id("gamma") if "gamma" in c else rw.const((1.0,) * h, x.dtype)
                beta = rw.const((0.0,) * h, x.dtype) if "beta" not in c and op == Op.LAYER_NORM else None
            if c.data.get("gamma_fold"):  # 1 + w of a constant w, in the add's dtype: the value the add computes
                add = c["gamma"]
                a, b = (np.asarray(c.graph[i].attrs["value"], c.graph[i].dtype.numpy) for i in add.inputs)
                gamma = rw.const(tuple((a + b).astype(add.dtype.numpy).tolist()), add.dtype)
            ins = [c.id("x"), gamma]
            if "beta" in c:
                ins.append(c.id("beta"))
            elif beta is not None:
                ins.append(beta)
            new = rw.emit(op, ins, eps=typed(c["eps"]), axis=-1)
        result = next(c.id(r) for r in _RESULT if r in c)
        rw.remove([a for a in absorbed if a != result])
        rw.replace(result, new)
        return new
    return rewrite


LAYER_NORM = Rule(
    "canonicalize_norm.layer_norm",
    P(Op.REDUCE_MEAN, P.var("x"), name="mean"),
    steps=(_layer_norm_chain, *_common_guards("layer_norm", ("mean", "var"))),
    result=_RESULT, absorb=_ABSORB, rewrite=_rewrite(Op.LAYER_NORM),
    labels={"mean": "mean", "var": "variance", "normed": "normalized x", "eps_add": "the eps add", "root": "sqrt"},
    doc="(x - mean) / sqrt(var + eps) [* gamma] [+ beta] as primitives -> layer_norm", form="layer_norm")

RMS_NORM = Rule(
    "canonicalize_norm.rms_norm",
    P((Op.MUL, Op.POW), name="sq"),
    steps=(_rms_norm_chain, *_common_guards("rms_norm", ("var",))),
    result=_RESULT, absorb=tuple(r for r in _ABSORB if r not in ("mean", "mean_r", "centered")),
    rewrite=_rewrite(Op.RMS_NORM),
    labels={"var": "mean square", "normed": "normalized x"},
    doc="x * rsqrt(mean(x^2) + eps) [* gamma] as primitives -> rms_norm", form="rms_norm")

_norm_rules = rule_pass("canonicalize_norm", [LAYER_NORM, RMS_NORM], "")


def _canonicalize_norm(graph: Graph, params: Mapping[str, Any]) -> PassResult:
    """The norm rules, then the casts around a recognized half-precision RMSNorm absorbed
    (`norm_casts.absorb_casts`: `gamma * cast(rms_norm(cast(x, f32)), f16)` -> `rms_norm(x, gamma)`)."""
    r = _norm_rules(graph, params)
    g, matches, refused = absorb_casts(r.graph)
    moved = {m.bindings["norm"]: m.fused for m in matches}  # a recognized norm whose casts were absorbed
    first = [replace(m, fused=moved.get(m.fused, m.fused)) for m in r.matches]
    casts = [replace(m, fused=None) for m in matches]  # the norm's own match names the product once
    return settle(graph, PassResult(g, first + casts, r.rejections + refused), [r.graph])


canonicalize_norm = Pass("canonicalize_norm", _canonicalize_norm, (LAYER_NORM, RMS_NORM),
                         doc="LayerNorm / RMSNorm written as primitives -> layer_norm / rms_norm (an f16 RMSNorm's "
                             "f32 casts absorbed)", product="layer_norm / rms_norm", recognizes_families=("norm",))

__all__ = ["LAYER_NORM", "RMS_NORM", "canonicalize_norm"]
