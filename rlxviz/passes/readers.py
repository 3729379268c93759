"""Who else reads a value a fusion would absorb, and what that means for the advice: the graph outputs a reader
reaches (`reaches_output`, over `live_nodes`), why no change to the model frees the value (`extra_readers_why`: it is
returned, or read on to an output), and the one advice every reader guard and the engine's escape check give
(`reader_advice`): dead-code elimination only for readers that reach no output, never for a value the model returns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..ir import Graph, Op
from ..ir.identity import DigestCache
from .refusal_kinds import IN_MODEL, NO_MODEL_FIX, READ_BY_MODEL

if TYPE_CHECKING:
    from .guard import Ctx

REACH_LIMIT = 2_000
"""Nodes `reaches_output` visits at most to name the output a live reader reaches (liveness itself is one reverse
walk per graph, `live_nodes`); past it the output goes unnamed."""

_LIVE: DigestCache[frozenset[int]] = DigestCache(limit=4)


def live_nodes(g: Graph) -> frozenset[int]:
    """The ids of the nodes whose value reaches a graph output (one reverse walk from the outputs, cached for the
    last few graphs): a node outside it is dead, and removing it keeps every number the model returns."""
    hit = _LIVE.get(g)
    if hit is None:
        seen, todo = set(g.outputs), list(g.outputs)
        while todo:
            for j in g[todo.pop()].inputs:
                if j not in seen:
                    seen.add(j)
                    todo.append(j)
        hit = _LIVE[g] = frozenset(seen)
    return hit


def reaches_output(g: Graph, i: int, limit: int = REACH_LIMIT) -> int | None:
    """The id of a graph output that node `i`'s value reaches through its users (`i` itself when it is an output, or
    when the output lies more than `limit` nodes away), or None when it reaches none: a dead reader, whose removal
    keeps every number the model returns."""
    live = live_nodes(g)
    if i not in live:
        return None
    seen, todo = {i}, [i]
    while todo and len(seen) <= limit:
        j = todo.pop()
        if g.is_output(j):
            return j
        for u in g.users(j):
            if u.id in live and u.id not in seen:
                seen.add(u.id)
                todo.append(u.id)
    return i


KEEP_MATERIALISED = "a fusion would have to keep {value} materialised"
"""What a value the model returns (or one read on to an output) means for a fusion that would absorb it."""

RUN_DCE = "dead_code_elimination run on the model removes {it} and keeps every output"
"""The advice for readers that reach no graph output: the one place a refusal's model-side fix proposes dead-code
elimination (`reader_advice`; its compiler-side counterpart is `DCE_FIRST`); never for a value the model returns or
one read on to an output. A change to the model, checked by `passes.whatif`'s dead-reader what-if (the dead nodes
removed from the user's graph, before every pass: the dead reader may also have blocked an earlier fusion the refused
one builds on, a residual norm under the layer op)."""


_RESIDUAL_SUM_RULE = {Op.FUSED_RESIDUAL_LN: "fuse_residual_ln", Op.FUSED_RESIDUAL_RMS_NORM: "fuse_residual_rms_norm"}
_RESIDUAL_SUM_PRECEDENT = {
    Op.FUSED_RESIDUAL_LN: "ONNX Runtime's SkipLayerNormalization returns the sum as an optional output",
    Op.FUSED_RESIDUAL_RMS_NORM: "vLLM's fused_add_rms_norm returns the sum too, written back in place"}


def residual_sum_fix(fused: Op) -> str:
    """The compiler fix for a residual sum that the residual norm `fused` would hide (the next residual add reads it):
    a rule that builds `fused` with `with_sum=true`. The op's two-output form exists (`ir.ops`, `ir.fused._with_sum`);
    what rlxviz lacks is a rule that builds it, so the words name the rule, not a new op, and a precedent of the
    same norm kind (LayerNorm: ORT's SkipLayerNormalization; RMSNorm: vLLM's fused_add_rms_norm)."""
    return (f"a {_RESIDUAL_SUM_RULE[fused]} rule that builds {fused.value}(with_sum=true), the two-output form the op "
            f"already has; precedent: {_RESIDUAL_SUM_PRECEDENT[fused]}")


def single_output_why(fused: Op) -> str:
    """Why a residual norm `fused` cannot take a sum that has other readers, as it is true of rlxviz: its rule builds
    the single-output form only (the op has a `with_sum` form no rule builds, `residual_sum_fix`)."""
    return f"rlxviz's {_RESIDUAL_SUM_RULE[fused]} builds only the single-output {fused.value}, which returns the " \
           f"normalized value, not the sum"


RESIDUAL_STREAM = ("{who} reads {value}: the residual stream continues past the norm; a fusion would have to return "
                   "{value} too, and {why} (compiler fix: {fix})")
"""What an extra reader that is the next residual add means (`extra_readers_why`): a pre-norm layout, whose residual
sum feeds both the norm and the next sublayer's residual add; no probe, and nothing in the model to change. `why` is
`single_output_why`, `fix` `residual_sum_fix`."""

RESIDUAL_STREAM_NORMS = ("{who} read {value}: a parallel block, whose sublayers' norms both read the residual stream, "
                         "which continues past them; a fusion would have to return {value} too, and {why} (compiler "
                         "fix: {fix}; it takes the add into one of the norms only)")
"""`RESIDUAL_STREAM` where another norm reads the sum too (GPT-NeoX's parallel block: the sum feeds the attention's
norm, the MLP's norm and the next residual add): the other norm is named beside the add, and the compiler fix says
what it leaves (one fused op absorbs the add once, `passes.whatif.without_guard`'s `already_fused`)."""

_FUSED_OF_NORM = {Op.LAYER_NORM: Op.FUSED_RESIDUAL_LN, Op.RMS_NORM: Op.FUSED_RESIDUAL_RMS_NORM}


def continues_residual(g: Graph, i: int, u: int, limit: int = REACH_LIMIT) -> bool:
    """Whether reader `u` of node `i` is a residual add continuing the stream `i` is on: an `add` with `i` as one
    operand and, as another, a value computed from `i` (a later sublayer's output: `add(x, f(x))`, `f` reached
    within `limit` nodes). False for any other reader (a probe, a second model output)."""
    n = g.get(u)
    if n is None or n.op is not Op.ADD or i not in n.inputs:
        return False
    todo = [j for j in n.inputs if j != i]
    seen = set(todo)
    while todo and len(seen) <= limit:
        j = todo.pop()
        if j == i:
            return True
        for k in g[j].inputs:
            if k not in seen:
                seen.add(k)
                todo.append(k)
    return False


def residual_stream_why(g: Graph, i: int, extra: Sequence[int], name_of: Callable[[int], str], value: str
                        ) -> str | None:
    """`RESIDUAL_STREAM` worded for node `i` (a residual sum read by a norm) whose first extra reader continuing the
    residual stream (`continues_residual`) is among `extra` (`RESIDUAL_STREAM_NORMS` when a norm is among them too),
    or None when none does or no norm reads `i` (then the sum is no norm's residual, and the reader is worded as any
    other)."""
    norms = [_FUSED_OF_NORM[u.op] for u in g.users(i) if u.op in _FUSED_OF_NORM]
    nxt = next((u for u in extra if continues_residual(g, i, u)), None)
    if not norms or nxt is None:
        return None
    other = next((u for u in extra if u in g and g[u].op in _FUSED_OF_NORM), None)
    words = {"why": single_output_why(norms[0]), "fix": residual_sum_fix(norms[0])}
    if other is not None:  # a second norm of the same sum (a parallel block with a norm per sublayer)
        return RESIDUAL_STREAM_NORMS.format(who=f"the other norm, {name_of(other)}, and the next residual add, "
                                                f"{name_of(nxt)},", value=value, **words)
    return RESIDUAL_STREAM.format(who=f"the next residual add, {name_of(nxt)},", value=value, **words)


def extra_readers_why(c: Ctx, role: str | int, extra: Sequence[int]) -> str | None:
    """Why no change to the model frees `role` (a bound role, or a node id) of its `extra` readers, or None when
    every one of them is dead (then removing it, as `dead_code_elimination` does, keeps the model's numbers): the
    value is a graph output, or a reader is read on to one, so it is part of what the model returns (a probe, a
    second layer reading shared K/V) and a fusion would have to keep the value materialised."""
    g = c.graph
    i = c.id(role) if isinstance(role, str) else role
    name, short = (c.d(role), c.label(role)) if isinstance(role, str) else (c.name_of(i), c.name_of(i))
    if g.is_output(i):
        keep = KEEP_MATERIALISED.format(value="it")
        return f"{name} is graph output #{g.outputs.index(i)}, which the caller asked for: {keep}; hiding it " \
               f"changes what the model returns"
    live = [(u, o) for u in extra if (o := reaches_output(g, u)) is not None]
    if not live:
        return None
    # the sum's other reader is the next sublayer's residual add (a pre-norm layout): no probe, say so
    stream = residual_stream_why(g, i, [u for u, _ in live], c.name_of, short)
    if stream is not None:
        return stream
    u, o = live[0]
    # the output number sits beside the node it numbers: "reduce_mean (node 43), graph output #1, reads h1" (it read
    # "reads h1 (graph output #1)", as if h1 were the output)
    if o == u and g.is_output(o):
        who, to = f"{c.name_of(u)}, graph output #{g.outputs.index(o)},", ""
    else:
        out = f"graph output #{g.outputs.index(o)}, {c.name_of(o)}" if g.is_output(o) else "the graph outputs"
        who, to = c.name_of(u), f", and its result flows on to {out}"
    more = f" (and {len(live) - 1} more reader(s))" if len(live) > 1 else ""
    return (f"{who} reads {short}{to}{more}: it is part of what the model computes and returns, so "
            f"{KEEP_MATERIALISED.format(value=short)} for it; removing or rerouting it changes the model's outputs")


DCE_FIRST = ("dead_code_elimination before {pass_name}: {who} {verb} no graph output (dead code), so removing {it} "
             "first keeps every output and leaves the fusion nothing to drop")
"""The compiler fix of a reader refusal whose extra readers are all dead (`dead_readers`): the refusal is `illegal` as
the graph stands (the rewrite would drop a value a node reads), but the node reads it for nothing, so running
dead-code elimination before the refusing pass, not a multi-output op, makes the fusion legal. The canonical pipeline
runs `dead_code_elimination` only after the fusions (`pipeline` step 9), so the refusal stands there."""


def dead_readers(c: Ctx, role: str | int, extra: Sequence[int]) -> tuple[int, ...]:
    """The ids of `extra` (readers of `role`, a bound role or a node id, besides the fusion) when every one reaches no
    graph output and `role` is none (`extra_readers_why` is None), else (): the readers `DCE_FIRST` names."""
    if extra_readers_why(c, role, extra) is not None:
        return ()
    return tuple(u for u in extra if u in c.graph)


def dce_first(pass_name: str, names: Sequence[str]) -> str:
    """`DCE_FIRST` for the pass `pass_name` and its dead readers' `names` (at least one; the first three named)."""
    who = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    one = len(names) == 1
    return DCE_FIRST.format(pass_name=pass_name, who=who, verb="reaches" if one else "reach",
                            it="it" if one else "them")


def reader_advice(c: Ctx, role: str | int, extra: Sequence[int], hint: str) -> tuple[str, str]:
    """`(remedy, hint)` of a refusal because `role` (a bound role, or a node id) has `extra` readers besides the
    fusion, or is a graph output: the one rule every reader guard and the engine's escape check word their advice
    with, so `explain`'s text, `--json` and the app's Why tab say the same.

    * the value is a graph output, or a reader is read on to one: `(READ_BY_MODEL, "none in the model: ...")`
      (`extra_readers_why`: a fusion would have to keep the value materialised; no dead-code elimination, which
      cannot remove what the model returns);
    * every extra reader is dead (reaches no graph output): `(IN_MODEL, "HINT: READERS reach(es) no graph output
      (dead code): dead_code_elimination run on the model removes it ...")` (`RUN_DCE`), the fix `passes.whatif` checks.
    """
    why = extra_readers_why(c, role, extra)
    if why is not None:
        return READ_BY_MODEL, NO_MODEL_FIX + why
    dead = [c.name_of(u) for u in extra if u in c.graph]
    if not dead:  # nothing to remove (no reader named): the guard's own hint
        return IN_MODEL, hint
    who = ", ".join(dead[:3]) + (f" and {len(dead) - 3} more" if len(dead) > 3 else "")
    verb = "reaches" if len(dead) == 1 else "reach"
    rm = RUN_DCE.format(it="it" if len(dead) == 1 else "them")
    return IN_MODEL, f"{hint}: {who} {verb} no graph output (dead code): {rm}"


__all__ = ["REACH_LIMIT", "live_nodes", "reaches_output", "KEEP_MATERIALISED", "RESIDUAL_STREAM",
           "RESIDUAL_STREAM_NORMS", "RUN_DCE", "DCE_FIRST", "continues_residual", "dce_first", "dead_readers",
           "extra_readers_why", "reader_advice",
           "residual_stream_why", "residual_sum_fix", "single_output_why"]
