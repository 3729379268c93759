"""Fixes as data: the what-if rewrite behind each fix line a guard can print (issue 38: advice is checked, not written).

A refusal's hint is one of three forms (`fix_form`):

* `statement`: no change is proposed (`none in the model: ...`, `nothing to change in the model: ...`, `keep the
  model's ...`, or a "run P first" that `report.in_context` replaced by what P already said): nothing to apply.
* `pipeline`: a change to the pipeline, not the model: `raise or unset PARAM` (the what-if runs the same graph with
  the parameter unset) or `run P first` for a pass P the run lacks (the what-if inserts P before the refusing pass).
  The graph is the user's, unchanged, so its numbers are too.
* `model`: a change to the user's model. Its what-if is a rewrite `Graph -> Graph` on the run's input graph:
  `remove_dead_readers` (a reader that reaches no graph output: removing it, as `dead_code_elimination` does, keeps
  every number the model returns), or one registered for the refusing guard in `MODEL_WHAT_IFS` (e.g. `default_scale`:
  a non-default attention scale folded into the Q projection, `rules.scale_fold`). A model fix with no what-if cannot
  be checked; `session.advice` never prints it as a fix.

`what_if(trace, step, rejection)` builds the `WhatIf` (the graph and the pipeline to run on it); checking it (the
numbers against the unfused original, and that the fusion then happens, `fused_more`) is the session's job
(`session.advice`), which needs the runtime. This module only rewrites graphs (floor `passes`).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..ir import Graph, GraphError, Node, Op
from ..ir.identity import DigestCache
from ..ir.ops import ACTIVATIONS, EPILOGUE_ACTIVATIONS
from ..ir.rewrite import Rewriter
from .allow_list import allowing, epilogue_allowed
from .engine import attempt
from .guard import ILLEGAL, NO_MODEL_FIX, NOT_PROFITABLE, UNCHECKED_FIX, Ctx, Guard, live_nodes
from .pipeline import PASSES, STAGES, Pipeline
from .rerun_ids import in_shown_ids
from .rule import Fail, Rule
from .rules.scale_fold import folded_graph, scale_fold
from .trace import PassStep, Rejection, Trace

STATEMENT = "statement"
PIPELINE = "pipeline"
MODEL = "model"
FORMS = (STATEMENT, PIPELINE, MODEL)
"""What a fix line proposes (module docstring)."""

_STATEMENTS = (NO_MODEL_FIX, UNCHECKED_FIX, "nothing to change in the model", "keep the model's")
_RAN_BEFORE = re.compile(
    r"\b\w+ ran before (?:and said no here|and did its part (?:here|in this layer)|and matched in this layer|"
    r"but had no candidate here)")
_UNSET = re.compile(r"raise or unset (\w+)")
_RUN_FIRST = re.compile(r"run (\w+) first")


def fix_form(hint: str) -> str:
    """`statement`, `pipeline` or `model`: what the fix line `hint` (as printed, after `report.in_context`) proposes.
    An empty hint is a statement (no fix line is printed)."""
    h = hint.strip()
    if not h or h.startswith(_STATEMENTS) or _RAN_BEFORE.search(h):
        return STATEMENT
    if _UNSET.search(h) or _RUN_FIRST.search(h):
        return PIPELINE
    return MODEL


@dataclass(frozen=True)
class WhatIf:
    """A fix applied: the user's graph after it and the pipeline to run on it.

    Attributes:
        what: one line naming the change, e.g. `remove 2 dead node(s) (dead-code elimination on the model)`.
        graph: the run's input graph with the fix applied (the same object for a pipeline fix).
        pipeline: the pipeline to run on `graph` (the run's own, or it changed by a pipeline fix).
        key: equal for two what-ifs that run the same thing (a checker runs each once).
        exact: the change keeps the numbers by construction (a dead node removed, the pipeline changed), so a check
            that cannot run the numbers may rely on it; False for a change of the computation (an activation).
        rounded: the change keeps the numbers in real arithmetic but its new constants are rounded to the model's
            dtype (a non-default attention scale folded into the Q projection by a ratio that is no power of two):
            the check compares the what-if model's float64 numbers to the same-backend tolerance, not to float64
            rounding (`session.advice.EXACT`).
    """

    what: str
    graph: Graph
    pipeline: Pipeline
    key: tuple[str, ...]
    exact: bool = True
    rounded: bool = False


def run_pipeline_of(trace: Trace) -> Pipeline:
    """The pipeline a trace ran: its passes in order, with the parameters its steps read."""
    params: dict[str, object] = {}
    for s in trace.steps:
        params.update(s.params)
    return Pipeline.of_steps([s.pass_name for s in trace.steps], params, trace.pipeline or "custom")


def remove_dead_readers(g: Graph) -> Graph | None:
    """`g` without the nodes whose value reaches no graph output (inputs kept), or None when every node is live.
    Exact: nothing the model returns reads a removed node."""
    live = live_nodes(g)
    if all(n.id in live for n in g.compute_nodes()):
        return None
    return Pipeline(["dead_code_elimination"], name="what-if").run(g).final


@dataclass(frozen=True)
class Change:
    """A model what-if's change that says its own exactness (`WhatIf.exact`, `WhatIf.rounded`) instead of
    `EXACT_WHAT_IFS`: the fold of an attention scale is exact for a power-of-two ratio only."""

    what: str
    graph: Graph
    exact: bool
    rounded: bool = False


ModelWhatIf = Callable[[Trace, PassStep, Rejection], tuple[str, Graph] | Change | None]
"""A guard's model-side what-if: `(trace, the step that refused, the refusal) -> (what, the user's graph changed)`
(or a `Change`), or None when it does not apply to this refusal."""


def _dead_reader(trace: Trace, step: PassStep, r: Rejection) -> tuple[str, Graph] | None:
    """An illegal refusal whose extra reader (an offending node) is dead in the graph the pass saw: remove the dead
    nodes from the user's graph."""
    if r.kind != ILLEGAL:
        return None
    live = live_nodes(step.before)
    if not any(i in step.before and i not in live for i in r.offending):
        return None
    g = remove_dead_readers(trace.input)
    if g is None:
        return None
    gone = len(trace.input) - len(g)
    return f"remove {gone} dead node(s) of the model (nothing it returns reads them)", g


def _activation_of(step: PassStep, r: Rejection) -> Node | None:
    """The activation node the refusal is about, in the graph the pass saw: its subject, else a bound or offending
    node, else a reader of the subject (one edge or two: through a bias add), that is an activation op."""
    g = step.before
    ids = [i for i in (r.subject, *r.offending, *r.bindings.values()) if i is not None and i in g]
    ids += [u.id for i in ids[:1] for u in g.users(i)]
    ids += [v.id for i in ids[1:] for v in g.users(i) if g[i].op == Op.ADD]
    return next((g[i] for i in ids if g[i].op in ACTIVATIONS), None)


def _in_user_graph(trace: Trace, n: Node) -> tuple[tuple[int, ...], int, int] | None:
    """`(user nodes n stands for, the chain's input, the chain's output)` in the run's input graph: `n` itself when
    it is the user's node, else the nodes a canonicalization absorbed into it (a decomposed GELU)."""
    g = trace.input
    if n.id in g:  # the user's node (its operands read as in the user's graph: a later pass may have remapped them)
        return (n.id,), g[n.id].inputs[0], n.id
    chain = tuple(a for a in n.absorbed if a in g)
    if not chain or len(chain) != len(n.absorbed):
        return None
    inside = set(chain)
    # the chain's input as the user's graph has it (a later pass may have remapped n's operand to a fused node)
    xs = {i for a in chain for i in g[a].inputs if i not in inside and g[i].op not in (Op.CONST, Op.PARAM)}
    outs = [a for a in chain if g.is_output(a) or any(u.id not in inside for u in g.users(a))]
    return (chain, xs.pop(), outs[0]) if len(outs) == 1 and len(xs) == 1 else None


def _switch_activation(trace: Trace, step: PassStep, r: Rejection) -> tuple[str, Graph] | None:
    """The activation fix (`guard.activation_hint`): the model's activation (a tanh-GELU, written out or as one op; a
    ReLU) replaced by one the epilogue takes: exact GELU for a GELU form, else SiLU. It changes what the model
    computes, which the check shows."""
    n = _activation_of(step, r)
    if n is None or n.op in EPILOGUE_ACTIVATIONS:
        return None
    found = _in_user_graph(trace, n)
    if found is None:
        return None
    chain, x, out = found
    target = Op.GELU if n.op.value.startswith("gelu") else Op.SILU
    rw = Rewriter(trace.input, "what-if")
    rw.fuse(target, (x,), {}, absorbed=chain, result=out)
    return f"{_users_activation(trace.input, n, chain, out)} replaced by {target.value}", rw.finish()


def _users_activation(g: Graph, n: Node, chain: tuple[int, ...], out: int) -> str:
    """The activation `n` as the user's graph `g` has it: `the model's gelu_tanh (node 61)` for the user's own node;
    for one a canonicalization made of a written-out chain (`_in_user_graph`), the chain's nodes and its result by
    their own ops, `the model's gelu_tanh (node 129 in the pipeline's graph), written out as your nodes 50, 52, ... 61
    (its result: mul node 61)`: node 61 of the user's graph is a `mul`, not a gelu_tanh."""
    if chain == (n.id,):
        return f"the model's {n.op.value} (node {n.id})"
    ids = ", ".join(str(i) for i in sorted(chain))
    return (f"the model's {n.op.value} (node {n.id} in the pipeline's graph), written out as your nodes {ids} (its "
            f"result: {g[out].op.value} node {out})")


_STORE_AS = re.compile(r"\(node (\d+)[^)]*\) as \w+\[([\d, ]*)\]")


def _broadcast_operand(trace: Trace, step: PassStep, r: Rejection) -> tuple[str, Graph] | None:
    """The fused-type fix `engine._build_type_error` prints when an operand differs from what the fused op takes
    only by a broadcast its readers already make (`store BIAS (node 65, ...) as f32[64]: the same numbers`): each
    such operand of the user's graph broadcast (`expand`) to that shape, its readers reading the broadcast. Exact:
    an elementwise reader of a broadcast operand computes the same numbers."""
    pairs = [(int(m[1]), tuple(int(d) for d in m[2].replace(" ", "").split(",") if d))
             for m in _STORE_AS.finditer(r.hint)]
    return _stored_as(trace.input, pairs)


def _bias_vector(trace: Trace, step: PassStep, r: Rejection) -> tuple[str, Graph] | None:
    """The bias fix of `fuse_matmul_bias_act` (`linear.BIAS_VECTOR_HINT`): the refused bias (the subject) stored
    without its leading 1s (`[1, N]` as `[N]`). Exact when its readers broadcast it alike, which the guard checked
    before printing the fix (`linear._bias_vector_why`)."""
    i = r.subject
    if i is None or i not in trace.input:
        return None
    shape = trace.input[i].shape
    s = shape[next((k for k, d in enumerate(shape) if d != 1), len(shape)):]
    return _stored_as(trace.input, [(i, s)]) if s != shape else None


def _stored_as(g: Graph, pairs: list[tuple[int, tuple[int, ...]]]) -> tuple[str, Graph] | None:
    """`g` with each node of `pairs` read as the shape given (a broadcast, `expand`, to a larger one; a `reshape`
    to one of as many elements, its leading 1s dropped): every reader rebuilt to read that. None when a node is not
    in `g`, has no reader or is a graph output."""
    if not pairs or any(i not in g or not g.users(i) or g.is_output(i) for i, _ in pairs):
        return None
    rw = Rewriter(g, "what-if")
    for i, shape in pairs:
        with rw.provenance((i,), g[i].path):
            same = math.prod(shape) == math.prod(g[i].shape)
            wide = rw.reshape(i, shape) if same else rw.expand(i, shape)
        for u in g.users(i):
            rw.fuse(u.op, [wide if j == i else j for j in u.inputs], dict(u.attrs), absorbed=(u.id,))
    said = ", ".join(f"node {i} stored as [{', '.join(map(str, s))}]" for i, s in pairs)
    return f"{said} in the model (the same numbers)", rw.finish()


def _fold_scale(trace: Trace, step: PassStep, r: Rejection) -> Change | None:
    """The fix of a non-default attention scale (`default_scale`, `scale_fold.fold_hint`): the ratio to the default
    folded into the Q projection's weight (and bias) of the user's graph, the folded scale node set so the scores are
    scaled by the default 1/sqrt(head_dim) (unscaled scores, T5's: a new scale mul after the scores' matmul).
    Valid when Q is a linear function of the projection (`scale_fold`'s
    docstring: layout moves, RoPE, sums and products by values independent of it), which `scale_fold` checks; exact
    for a power-of-two ratio (barring overflow or underflow), else the same numbers up to rounding (`rounded` when the
    rounded constants do not keep the scores' factor exactly)."""
    k = next((k for k, s in enumerate(trace.steps) if s is step), len(trace.steps))
    fold = scale_fold(trace.input, trace.steps[:k], r)
    if fold is None:
        return None
    what = (f"the scale folded into the Q projection (node {fold.proj}): weight * {fold.ratio:.6g}, scores scaled by "
            f"1/sqrt({fold.head_dim})")
    return Change(what, folded_graph(trace.input, fold), fold.exact, not fold.reals)


MODEL_WHAT_IFS: dict[str, ModelWhatIf] = {"epilogue_activation": _switch_activation,
                                          "fc1_activation": _switch_activation,
                                          "fused_types": _broadcast_operand, "bias_rank": _bias_vector,
                                          "bias_length": _bias_vector, "default_scale": _fold_scale}
"""Guard name -> its model-side what-if, for fixes that are not a dead reader's removal (tried first)."""
GENERIC_WHAT_IFS: tuple[ModelWhatIf, ...] = (_dead_reader,)
"""What-ifs tried for any guard (after `MODEL_WHAT_IFS`)."""
EXACT_WHAT_IFS: frozenset[ModelWhatIf] = frozenset({_dead_reader, _broadcast_operand, _bias_vector})
"""The model what-ifs that keep the numbers by construction (`WhatIf.exact`)."""


def what_if(trace: Trace, step: int, r: Rejection, hint: str | None = None) -> WhatIf | None:
    """The what-if of refusal `r` (recorded by `trace.steps[step]`) whose printed fix line is `hint` (default
    `r.hint`): None for a statement, and for a pipeline or model fix no what-if applies to."""
    hint = r.hint if hint is None else hint
    form = fix_form(hint)
    if form == STATEMENT:
        return None
    base = run_pipeline_of(trace)
    if form == PIPELINE:
        if (m := _UNSET.search(hint)) is not None and m.group(1) in base.effective_params:
            params = {**base.params, m.group(1): None}
            return WhatIf(f"the pipeline with {m.group(1)} unset", trace.input,
                          Pipeline(list(base.passes), params, base.name), ("unset", m.group(1)))
        if (m := _RUN_FIRST.search(hint)) is not None and m.group(1) in PASSES:
            names = [s.pass_name for s in trace.steps]
            names.insert(step, m.group(1))
            return WhatIf(f"the pipeline with {m.group(1)} run before {r.pass_name}", trace.input,
                          Pipeline.of_steps(names, dict(base.params), base.name), ("run", m.group(1), str(step)))
        return None
    at = trace.steps[step]
    for f in (*([MODEL_WHAT_IFS[r.guard]] if r.guard in MODEL_WHAT_IFS else []), *GENERIC_WHAT_IFS):
        try:
            got = f(trace, at, r)
        except GraphError:  # the rewrite does not apply to this graph (a form it does not take): no what-if
            got = None
        if isinstance(got, Change):
            return WhatIf(got.what, got.graph, base, ("model", r.guard, getattr(f, "__name__", "f"), got.what),
                          got.exact, got.rounded)
        if got is not None:
            what, g = got
            return WhatIf(what, g, base, ("model", r.guard, getattr(f, "__name__", "f"), what), f in EXACT_WHAT_IFS)
    return None


Blocker = tuple[str, str, str]
"""A failure that stands in a fusion's way: `(guard, kind, message)`."""


def _passes(c: Ctx) -> bool:
    return True


def _passed(step: Any, guard: str) -> Any:
    """`step` with its failure at `guard` taken as passed: a plain `Guard` whose check always holds, or a `@reports`
    step (its declarations kept, `functools.wraps`) whose `Fail` at `guard` is dropped; the same step otherwise."""
    if isinstance(step, Guard):
        return replace(step, check=_passes) if step.name == guard else step
    if guard not in getattr(step, "guard_names", ()):
        return step

    @functools.wraps(step)
    def passed(c: Ctx) -> Any:
        f = step(c)
        return None if f is not None and getattr(f, "guard", "") == guard else f

    return passed


Attempt = tuple[Rule, Ctx, list[Blocker], list[Fail], bool]
"""`_fixed_attempt`'s answer: `(the rule as tried, its bound context, the failures that remain, the same as the
engine's Fails, whether it comes from a re-run of the pipeline: its ids are then that run's, not the step's)`."""

_ALLOW_FIX = re.compile(r"add (\w+) to the epilogue allow-list\b")
_RERUNS: DigestCache[dict[tuple[int, str], Trace | None]] = DigestCache(limit=4)
"""Per trace (by its digest): (step, activation) -> `_allowed_run`'s run."""
"""`(id(trace), step, activation) -> (trace, its re-run)` for `_allowed_run`: kept while the trace is (a few)."""


def allow_list_fix(r: Rejection) -> str | None:
    """The activation (an op name) that `r`'s compiler fix adds to the epilogue allow-list (`add gelu_tanh to the
    epilogue allow-list (...)`), or None when the fix is no such extension (another fix; an activation that is no op
    of rlxviz, `add quick_gelu ..., with an op for it`; one the list already holds)."""
    m = _ALLOW_FIX.match(r.fix or "")
    name = m.group(1) if m is not None else None
    return name if name in {a.value for a in ACTIVATIONS} and name not in epilogue_allowed() else None


def _allowed_run(trace: Trace, step: int, name: str) -> Trace | None:
    """The run's passes up to `trace.steps[step]`'s, with its parameters, on its input graph, with `name` on the
    epilogue allow-list (`allow_list.allowing`, scoped to this run); None when that run fails. Made once per trace,
    step and activation."""
    runs = _RERUNS.get_or_compute(trace, dict)
    if (step, name) in runs:
        return runs[step, name]
    base = run_pipeline_of(trace)
    try:
        with allowing(name):
            after: Trace | None = Pipeline.of_steps([s.pass_name for s in trace.steps[:step + 1]], dict(base.params),
                                                    base.name).run(trace.input)
    except Exception:  # noqa: BLE001 - a pass that breaks on the what-if graph: nothing is known
        after = None
    runs[step, name] = after
    return after


def _allowed_attempt(trace: Trace, step: int, r: Rejection, name: str) -> Attempt | None:
    """`r`'s compiler fix made for real where it extends the epilogue allow-list (`allow_list_fix`): the pipeline
    re-run with `name` allow-listed (`_allowed_run`: `fuse_matmul_bias_act` takes the activation into fc1's epilogue,
    so no failure about the still separate activation, `fc2_is_fused_linear` at fc1, hides what comes next), and
    `r`'s rule tried at its candidate of `r`'s layer there (the refusal at `r`'s anchor, else the layer's first).
    `(.., [], [], True)` when the rule fused in that layer; None when nothing is known (the run failed, the rule has
    no candidate there, or `r.guard` refuses it again: the fix does not reach it, as for a bias-less fc1)."""
    after = _allowed_run(trace, step, name)
    if after is None or len(after.steps) <= step or after.steps[step].pass_name != trace.steps[step].pass_name:
        return None
    s = after.steps[step]
    rule = _rule(s.pass_name, r.rule)
    if rule is None:
        return None
    _, hit = _layer_refusal([(step, x) for x in s.rejections], r) or (step, None)
    if hit is None:
        fused = any(m.rule == r.rule and m.layer == r.layer for m in s.matches)
        return (rule, Ctx(s.after, {}), [], [], True) if fused else None
    if hit.guard == r.guard:
        return None
    try:
        with allowing(name):
            ctx, fails = attempt(rule, s.before, hit.anchor, s.params)
    except Exception:  # noqa: BLE001 - a step that raises: nothing is known of what follows
        return None
    kept = [f for f in fails if not f.quiet]
    shown = trace.steps[step].before  # the re-run's ids said as the graph `r`'s pass saw has them
    left = [(g, k, in_shown_ids(m, s.before, shown))
            for g, k, m in [(f.guard, f.kind, f.message) for f in kept] or [(hit.guard, hit.kind, hit.message)]]
    return rule, ctx, left, kept, True


def _rule(pass_name: str, name: str) -> Rule | None:
    """The rule `name` of the pass or stage `pass_name` (`STAGES`, `PASSES`), or None when it has none of that name."""
    p = STAGES.get(pass_name) or PASSES.get(pass_name)
    return next((x for x in (p.rules if p is not None else ()) if x.name == name), None)


def _fixed_attempt(trace: Trace, step: int, r: Rejection) -> Attempt | None:
    """`r`'s rule tried again at `r.anchor` with `r`'s guard taken as passed (`without_guard`'s what-if at its rule
    alone): an `Attempt`, or None when nothing is known. A fix that extends the epilogue allow-list is made for real
    instead (`_allowed_attempt`: passing the guard alone leaves the activation a separate node, whose consequences
    would hide what fails next), falling back to passing the guard when that says nothing."""
    if r.soft or r.stage != "guard":
        return None
    name = allow_list_fix(r)
    if name is not None and (got := _allowed_attempt(trace, step, r, name)) is not None:
        return got
    s = trace.steps[step]
    rule = _rule(s.pass_name, r.rule)
    if rule is None:
        return None
    steps = tuple(_passed(st, r.guard) for st in rule.steps)
    if all(a is b for a, b in zip(steps, rule.steps, strict=True)):
        return None
    fixed = replace(rule, steps=steps, source=rule.source)
    try:
        ctx, fails = attempt(fixed, s.before, r.anchor, s.params)
    except Exception:  # noqa: BLE001 - a step that raises past the guard: nothing is known of what follows
        return None
    if fails and fails[0].quiet:
        return None
    # a further failure about the same node is the same value's (h1 returned: `h1_not_output`, then the engine's
    # `absorbed_escape` of h1; DeepNorm's `alpha * x` refused as scaled, then as the norm's operand): the compiler
    # fix for that value covers it; so does it a further failure whose compiler fix is the same line (DeepNorm's second
    # residual: one residual scale on the layer op is both norms' fix)
    # -- except a failure that names a gap of its own (another op form rlxviz lacks, with another fix: gptj's
    # interleaved RoPE `rope_halves` behind its partial rotary `rope_full_rotary`, both about q_rope)
    covered = {r.subject} - {None}
    own_gap = {st.name for st in rule.steps if isinstance(st, Guard) and st.gaps}
    left: list[Blocker] = []
    kept: list[Fail] = []
    for f in fails:
        about = {f.subject, *(i for e in f.edges for i in e)} - {None}
        if f.quiet or (about & covered and not (f.guard in own_gap and f.fix and f.fix != r.fix)):
            continue
        if r.fix and f.fix == r.fix:  # the same fix at another node: that node's consequences are covered too
            covered |= {f.subject} - {None}
            continue
        left.append((f.guard, f.kind, f.message))
        kept.append(f)
    return fixed, ctx, left, kept, False


def _taken(trace: Trace, step: int, r: Rejection, rule: Rule, ctx: Ctx) -> Blocker | None:
    """The engine's `already_fused` (`engine.find`) for `r`'s match made by its compiler fix: the same fix at the
    step's other refused places, in graph order, makes their matches first, and a node one of them absorbs is one
    `r`'s match absorbs too (GPT-NeoX's parallel block: the residual sum feeds both sublayers' norms, and a
    two-output FusedResidualLN takes the add into the first norm, so the second norm's match finds it taken). None
    when no earlier match of the fix takes a node of `r`'s."""
    s = trace.steps[step]
    order = {n.id: k for k, n in enumerate(s.before)}
    at = order.get(r.anchor)
    if at is None:
        return None
    mine = {ctx.id(x) for x in rule.absorbed(ctx) if x not in rule.shared}
    earlier = {o.anchor: o for o in s.rejections if o.headline and o.guard == r.guard and o.fix == r.fix
               and order.get(o.anchor, at) < at}
    rules = {x.name: x for x in (STAGES.get(s.pass_name) or PASSES[s.pass_name]).rules}

    def absorbs(o: Rejection) -> set[int]:  # what the refusal's match would absorb, from the roles it bound
        x = rules.get(o.rule)
        if x is None:
            return set()
        fam = tuple(k[:-1] for k in x.absorb if k.endswith("*"))  # a numbered family: mm* binds mm0, mm1, ...
        return {i for k, i in o.bindings.items() if k not in x.shared
                and (k in x.absorb or any(k.startswith(f) and k[len(f):].isdigit() for f in fam))}

    # only places linked to this one through nodes their matches would absorb can compete (tried in graph order, as
    # `engine.find` claims): a 32-layer stack's other residual norms are never tried
    near, todo = set(), set(mine)
    while todo:
        linked = {a for a, o in earlier.items() if a not in near and todo & absorbs(o)}
        near |= linked
        todo = {i for a in linked for i in absorbs(earlier[a])}
    claimed: dict[int, Rejection] = {}
    for o in sorted((earlier[a] for a in near), key=lambda o: order[o.anchor]):
        got = _fixed_attempt(trace, step, o)
        if got is None or got[2] or got[4]:  # a re-run's ids are not the step's
            continue
        theirs = {got[1].id(x) for x in got[0].absorbed(got[1]) if x not in got[0].shared}
        if not theirs & claimed.keys():
            claimed |= dict.fromkeys(theirs, o)
    both = sorted(mine & claimed.keys())
    if not both:
        return None
    o = claimed[both[0]]
    names = ", ".join(ctx.d(role) if (role := next((k for k, v in ctx.bindings.items() if v == i), None))
                      else ctx.name_of(i) for i in both)
    return ("already_fused", NOT_PROFITABLE, f"{names} is absorbed first by the same fix's match at %{o.anchor} "
                                             f"({o.path or '-'}): a node goes into one fused op only")


def without_guard(trace: Trace, step: int, r: Rejection) -> list[Blocker] | None:
    """The compiler fix of refusal `r` (recorded by `trace.steps[step]`) applied as a what-if: `r`'s rule tried again
    at `r.anchor` on the graph its pass saw, with `r`'s guard taken as passed (what a compiler fix that makes that
    guard pass gives; `_passed`). Returns the failures that then remain, in step order ([]: the rule matches there;
    a failure whose subject or highlighted edges hold `r`'s subject node is the same value's, and one whose compiler
    fix is `r`'s, is covered by that fix and not counted); where the rule matches, the engine's `already_fused` when
    the same fix at an earlier refused place of the step takes a node this match needs (`_taken`: two norms of one
    residual sum), as `engine.find` would record it,
    or None when the guard is no step of the rule that can be passed (a structure miss, a soft guard), a step raises
    past it, or the candidate is then no candidate at all: nothing is known."""
    got = _fixed_attempt(trace, step, r)
    if got is None:
        return None
    rule, ctx, left, _, rerun = got
    if not left and not rerun and (taken := _taken(trace, step, r, rule, ctx)) is not None:
        left.append(taken)
    return left


def fix_alone_blocker(trace: Trace, step: int, r: Rejection) -> Blocker | None:
    """What still stands when `r`'s compiler fix is checked at its rule alone (`without_guard`): the first failure
    left, or None when the rule then matches or nothing is known. The one check behind every caveat on a compiler fix
    (`explain -v`'s `checked at this rule alone`, a not-expected line's `alone it is not enough`)."""
    left = without_guard(trace, step, r)
    return left[0] if left else None


def fix_alone_fail(trace: Trace, step: int, r: Rejection) -> Fail | None:
    """The first failure left by `r`'s compiler fix at its rule alone (`fix_alone_blocker`) as the engine's `Fail`,
    its remedy, fix line and compiler fix with it (what `why.policy.op_gaps` reads for a refusal whose one fix is the
    compiler's: albert's `fc1_activation`, a gelu_tanh epilogue, behind `ln1_no_bias`); None when nothing stands or
    nothing is known."""
    got = _fixed_attempt(trace, step, r)
    return got[3][0] if got is not None and got[3] else None


def fix_alone_readers(trace: Trace, step: int, r: Rejection) -> tuple[int, ...]:
    """The readers outside the match that the first failure left by `r`'s compiler fix at its rule alone
    (`fix_alone_blocker`) highlights (its edges' far ends, e.g. the two nodes besides the output projection that read
    an attention output: `attn_single_user`), in the graph `r`'s pass saw; () when nothing stands, nothing is known
    or the failure highlights no reader. What `why.caveat.fix_blocker` says reads the value there."""
    got = _fixed_attempt(trace, step, r)
    if got is None or not got[3] or got[4]:  # a re-run's ids are not those of the graph `r`'s pass saw
        return ()
    f = got[3][0]
    return tuple(dict.fromkeys(b for a, b in f.edges if a == f.subject or f.subject is None))


def _layer_refusal(found: list[tuple[int, Rejection]], r: Rejection) -> tuple[int, Rejection] | None:
    """Of `(step, rejection)` pairs, the first headline hard refusal of `r`'s rule in `r`'s layer at `r`'s anchor,
    else the first in that layer; None when there is none."""
    hits = [(k, x) for k, x in found if x.rule == r.rule and x.headline and not x.soft and x.layer == r.layer]
    return next(((k, x) for k, x in hits if x.anchor == r.anchor), hits[0] if hits else None)


def still_refused(after: Trace, r: Rejection, shown: Trace | None = None) -> Blocker | None:
    """What refuses `r`'s rule in `r`'s layer of the what-if run `after` (its headline refusal at `r`'s anchor,
    else the first in the layer), or None when nothing does (the rule fused, or never saw a candidate). With the
    `shown` run, the message names nodes by their ids there (`rerun_ids.in_shown_ids`, at the same step)."""
    found = _layer_refusal([(k, x) for k, s in enumerate(after.steps) for x in s.rejections], r)
    if found is None:
        return None
    k, hit = found
    message = hit.message
    if shown is not None and k < len(shown.steps) and shown.steps[k].pass_name == after.steps[k].pass_name:
        message = in_shown_ids(message, after.steps[k].before, shown.steps[k].before)
    return hit.guard, hit.kind, message


def blocker_words(fixed: str, b: Blocker) -> str:
    """`then GUARD (KIND) fails: MESSAGE`, or `GUARD still fails` when `b` is the guard the fix was for (`fixed`)."""
    guard, kind, message = b
    if guard == fixed:
        return f"{guard} still fails: {message}"
    return f"then {guard} ({kind}) fails: {message}"


def fused_count(trace: Trace, rule: str, layer: int | None) -> int:
    """How many fusions `rule` made in `layer` (None: anywhere outside a layer) over the run."""
    return sum(1 for s in trace.steps for m in s.matches if m.rule == rule and m.layer == layer)


def refused_count(trace: Trace, rule: str, guard: str, layer: int | None) -> int:
    """How many times `guard` refused (or, soft, left something out of) a fusion of `rule` in `layer` over the run."""
    return sum(1 for s in trace.steps for r in s.rejections if r.rule == rule and r.guard == guard and r.layer == layer)


def fused_more(before: Trace, after: Trace, r: Rejection) -> bool:
    """Whether the what-if run `after` made the fusion `r` refused in `before`: `r.rule` fused more often in `r`'s
    layer than in `before`; for a soft refusal (the rule fused, leaving something out, e.g. the activation), it fused
    as often or more and `r.guard` left something out fewer times."""
    layer = r.layer
    made = fused_count(after, r.rule, layer) - fused_count(before, r.rule, layer)
    if r.soft:
        fewer = refused_count(after, r.rule, r.guard, layer) < refused_count(before, r.rule, r.guard, layer)
        return made >= 0 and fewer
    return made > 0


__all__ = ["Attempt", "Blocker", "Change", "EXACT_WHAT_IFS", "FORMS", "GENERIC_WHAT_IFS", "MODEL", "MODEL_WHAT_IFS",
           "PIPELINE", "STATEMENT", "WhatIf", "allow_list_fix", "blocker_words", "fix_alone_blocker", "fix_alone_fail",
           "fix_alone_readers", "fix_form", "fused_count", "fused_more", "refused_count", "remove_dead_readers",
           "run_pipeline_of", "still_refused", "what_if", "without_guard"]
