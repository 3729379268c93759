"""Rules: an anchor pattern, ordered steps (structure and guards), and a rewrite.

A rule reads like its pattern::

    Rule("fuse_matmul_bias_act.bias_act",
         anchor=P(Op.ADD, P(Op.MATMUL, P.var("x"), P.var("w"), name="mm"), P.var("bias"), name="add",
                  commutative=True),
         steps=(single_user("mm"), not_output("mm"), rank_le("bias", 1), ...),
         result="add", absorb=("mm", "add"), build=lambda c: (Op.FUSED_MATMUL_BIAS_ACT, ...))

* `anchor` decides *applicability* and is silent: a node that does not have the anchor's shape is
  simply not a candidate (so every residual `add` is not reported as a failed matmul+bias).
* `steps` run in order after the anchor. A failing `Guard` rejects the candidate, but the steps after it
  still run so that *every* failing guard is reported (the first is the headline); a failing
  structure step (`Shape`/`User`, stage `structure`) ends the match, since the roles it would bind
  are missing. A `Soft` step records its rejection but lets the match continue (e.g. "gelu_tanh not
  absorbed, fused without activation").
* every guard declares its kind (`illegal`, `not recognized`, `not profitable`) and the roles it reads;
  a rule whose guard reads a role that no earlier step binds refuses to build (`RuleError`).
* the engine appends one generic guard, `absorbed_escape`: nothing outside the match may read an
  absorbed value other than the result (RLX silently redirects such users, docs/rlx.md §2.1).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..ir import Graph, Node, Op, Rewriter
from ..ir.ops import SPECS
from .guard import (
    ILLEGAL,
    IN_MODEL,
    KINDS,
    NOT_RECOGNIZED,
    Ctx,
    Guard,
    RuleError,
    _dynamic,
    check_literals,
    dead_readers,
    reader_advice,
)
from .merge_costs import MergeCosts
from .pattern import SAME_NODE, Bindings, Miss, P, also_read, describe, op_label, where
from .spelling import close, data_keys, scan


@dataclass(frozen=True)
class Fail:
    """A step's failure: becomes a `Rejection`. `quiet` failures are not recorded (rule not applicable)."""

    stage: str
    guard: str
    message: str
    offending: tuple[int, ...] = ()
    edges: tuple[tuple[int, int], ...] = ()
    hint: str = ""
    quiet: bool = False
    subject: int | None = None  # the node the failed check is about (e.g. h1 for h1_user_count)
    kind: str = ""  # illegal / not recognized / not profitable (guard.KINDS)
    fix: str = ""  # the compiler-side fix, if any
    needed: tuple[str, ...] = ()  # structure failures: what the pattern needed at the failing edge
    found: str = ""  # structure failures: the op found there
    remedy: str = ""  # guard.REMEDIES: IN_MODEL ("" too), COMPILER_ONLY or READ_BY_MODEL (the hint keeps the numbers?)
    roles: tuple[str, ...] = ()  # the roles the failing step reads or binds (`step_roles`); (): not known
    dead: tuple[int, ...] = ()  # a reader refusal's extra readers, all dead code (`readers.dead_readers`, `search`)
    costs: MergeCosts | None = None  # what a cost test's left-out members would cost (`Rejection.costs`)


QUIET = Fail("structure", "", "", quiet=True)


@dataclass(frozen=True)
class Shape:
    """Structure step: `pattern` must match at the node bound to `role` (adds its captures). `hint`: the change to
    the model, `fix`: the compiler fix (one of them declared, `tests/test_fix_declared.py`), `remedy`: its refusal's
    `guard.REMEDIES` (`COMPILER_ONLY`: no change to the model that keeps its numbers makes the match)."""

    name: str
    role: str
    pattern: P
    hint: str = ""
    fix: str = ""
    remedy: str = ""

    def __call__(self, ctx: Ctx) -> Fail | None:
        r = self.pattern.match(ctx.graph, ctx.id(self.role), ctx.bindings, self.role)
        if isinstance(r, Miss):
            return replace(_miss_fail(self.name, ctx, r, self.hint, self.fix), remedy=self.remedy)
        ctx.bindings.update(r)
        return None


@dataclass(frozen=True)
class User:
    """Structure step: bind `role` to a user of `of` that matches `pattern` (rooted at the user) and plays the role
    (`plays`).

    `what` describes the wanted user for messages ("the post-attention FusedResidualLN").

    `plays`: `(graph, node id) -> bool`, the edge out of the node that makes it the role's node, checked before the
    role is bound (a pattern reads operands only): FFN.1 is the linear reading h1 whose output, past its activation,
    feeds FFN.2; a decoder layer's cross-attention q_proj also reads h1 and fits FFN.1's pattern, but feeds the
    attention. A user that fits `pattern` but does not play the role is never bound: with none that does, the step
    fails at `of` naming those users and `plays_what` (what the role's node leads to), instead of binding one and
    letting later guards judge it in a role it does not have. None: every user that fits the pattern plays it.
    `hint`, `fix` and `remedy` as `Shape`'s.

    Several users may fit and play (two linears reading h1 that each feed a linear): `candidates` lists them by node
    id, and the engine tries each in turn when a later step fails (`search.attempt`, bounded by
    `search.MAX_USER_CANDIDATES`). Run on its own (`run_step`), the step binds the first.
    """

    name: str
    role: str
    of: str
    pattern: P
    what: str = ""
    hint: str = ""
    fix: str = ""
    plays: Callable[[Graph, int], bool] | None = None
    plays_what: str = ""
    remedy: str = ""

    def __call__(self, ctx: Ctx) -> Fail | None:
        found = self.candidates(ctx)
        if isinstance(found, Fail):
            return found
        bind(ctx, self.role, *found[0])
        return None

    def candidates(self, ctx: Ctx) -> list[tuple[int, Bindings]] | Fail:
        """Every user of `of` that fits the pattern and plays the role, as `(node id, the pattern's captures)` in
        node-id order (never empty), or the step's failure when none does."""
        users = ctx.users(self.of)
        misses: list[Miss] = []
        fits: list[Node] = []  # users that fit the pattern but do not play the role
        found: list[tuple[int, Bindings]] = []
        for u in users:
            r = self.pattern.match(ctx.graph, u.id, ctx.bindings, self.role)
            if isinstance(r, Miss):
                misses.append(r)
            elif self.plays is not None and not self.plays(ctx.graph, u.id):
                fits.append(u)
            else:
                found.append((u.id, r))
        if found:
            return sorted(found, key=lambda f: f[0])
        return replace(self._refusal(ctx, users, fits, misses), remedy=self.remedy)

    def _refusal(self, ctx: Ctx, users: Sequence[Node], fits: Sequence[Node], misses: Sequence[Miss]) -> Fail:
        """The step's failure when no user of `of` fits the pattern and plays the role (`candidates`)."""
        if fits:
            return self._not_playing(ctx, users, fits)
        deep = max(misses, key=lambda m: m.depth) if misses else None
        if deep is not None and (deep.depth > 0 or any(u.op in (self.pattern.ops or ()) for u in users)):
            # a user has the wanted op: report how far it got (the deepest partial match)
            return _miss_fail(self.name, ctx, deep, self.hint, self.fix)
        have = ", ".join(describe(u, op_label(u)) for u in users) or "no users"
        want = self.what or self.pattern.describe()
        msg = f"{self.role}: the users of {ctx.d(self.of)} are {have}; needs {want}"
        hint = self.hint or (deep.hint if deep else "")
        if hint:
            msg += f": {hint}"
        return Fail("structure", self.name, msg, tuple(u.id for u in users),
                    tuple((ctx.id(self.of), u.id) for u in users), hint, subject=ctx.id(self.of),
                    kind=NOT_RECOGNIZED, fix=self.fix, needed=(want,),
                    found=", ".join(op_label(u) for u in users))

    def _not_playing(self, ctx: Ctx, users: Sequence[Node], fits: Sequence[Node]) -> Fail:
        """The structure failure when users of `of` fit the pattern but none plays the role (`plays`)."""
        have = ", ".join(describe(u, op_label(u)) for u in users)
        want = f"{self.what or self.pattern.describe()} that {self.plays_what or 'plays the role'}"
        odd = ", ".join(describe(u, op_label(u)) for u in fits)
        one = len(fits) == 1
        msg = (f"{self.role}: the users of {ctx.d(self.of)} are {have}; needs {want}: {odd} "
               f"{'fits' if one else 'fit'} its pattern but {'is not one' if one else 'are not ones'} that "
               f"{self.plays_what or 'plays the role'} (another part of the model than {self.role})")
        return Fail("structure", self.name, msg, tuple(u.id for u in fits),
                    tuple((ctx.id(self.of), u.id) for u in fits), "", subject=ctx.id(self.of), kind=NOT_RECOGNIZED,
                    fix=self.fix, needed=(want,), found=", ".join(op_label(u) for u in users))


def bind(ctx: Ctx, role: str, node_id: int, captures: Bindings) -> None:
    """Bind `role` to `node_id` and its pattern's `captures` in `ctx` (a `User` step's chosen candidate)."""
    ctx.bindings.update({**captures, role: node_id})


def reports(*guard_names: str, kind: str = NOT_RECOGNIZED, reads: tuple[str, ...] = (),
            binds: tuple[str, ...] = (), kinds: dict[str, str] | None = None, optional: tuple[str, ...] = ()
            ) -> Callable[[Callable[[Ctx], Fail | None]], Callable[[Ctx], Fail | None]]:
    """Declare what a custom step function does: the guard names it can fail with (none: it only binds
    roles), their kind (`kinds` overrides it per guard name), the roles it reads (each bound before it runs, or the
    rule refuses to build), the roles it binds (`name*`: a numbered family), and `optional` roles it only reads
    when bound (a step shared by rules of which some bind the role: `"one" in c`).

    The step's body is read when it is decorated (`spelling.scan`): every role it names by literal must be in
    `reads` or `binds`, every role it writes (`c.bindings["act"] = ...`) in `binds`, every guard name it builds a
    `Fail` with in `guard_names`, every pipeline parameter a `PipelineParams` field. When it runs, the context is
    scoped to `reads` and `binds` (`Ctx.scope`), and a failure naming an undeclared guard raises.

    Raises:
        RuleError: `kind` is not one of `guard.KINDS`; `kinds` names a guard not in `guard_names`; the body names an
            undeclared role, written role, guard or parameter (each message names the close match).
    """
    per_guard = {g: kind for g in guard_names} | dict(kinds or {})
    if any(k not in KINDS for k in per_guard.values()) or kind not in KINDS:
        bad = next((k for k in (kind, *per_guard.values()) if k not in KINDS), kind)
        raise RuleError(f"[reports] kind must be one of {', '.join(KINDS)}; got {kind!r} / {per_guard}"
                        f"{close(str(bad), KINDS)}")
    stray = [g for g in (kinds or {}) if g not in guard_names]
    if stray:
        raise RuleError(f"[reports] kinds= names guard {stray[0]!r}, which is not among the guards the step reports "
                        f"({', '.join(guard_names) or 'none'}){close(stray[0], guard_names)}")

    def mark(fn: Callable[[Ctx], Fail | None]) -> Callable[[Ctx], Fail | None]:
        _check_step(fn, guard_names, (*reads, *optional), binds)
        fn.guard_names = guard_names  # type: ignore[attr-defined]
        fn.kind = kind  # type: ignore[attr-defined]
        fn.kinds = per_guard  # type: ignore[attr-defined]
        fn.reads = reads  # type: ignore[attr-defined]
        fn.binds = binds  # type: ignore[attr-defined]
        fn.optional = optional  # type: ignore[attr-defined]
        return fn

    return mark


def _check_step(fn: Callable[..., Any], guard_names: Sequence[str], reads: Sequence[str], binds: Sequence[str]
                ) -> None:
    """`reports`' check of a step's body (see there)."""
    who = f"@reports step {getattr(fn, '__name__', fn)}"
    fn.params = check_literals(who, (fn,), (*reads, *binds))  # type: ignore[attr-defined]
    u = scan(fn)
    if u is None:
        return
    declared = frozenset(binds)
    for r in sorted(u.roles_written):
        if r not in declared and not _dynamic(r, declared):
            raise RuleError(f"[{who}] binds role {r!r}, which it does not declare in binds= "
                            f"({', '.join(binds) or 'none'}){close(r, binds)}")
    for g in sorted(u.fail_guards - set(guard_names)):
        raise RuleError(f"[{who}] can fail with guard {g!r}, which it does not report (declared: "
                        f"{', '.join(guard_names) or 'none'}){close(g, guard_names)}")


@dataclass(frozen=True)
class Soft:
    """Run `step`; on failure record its rejection and continue the match."""

    step: Any


Step = Shape | User | Guard | Soft | Callable[[Ctx], "Fail | None"]


def _miss_fail(name: str, ctx: Ctx, m: Miss, hint: str, fix: str = "") -> Fail:
    """A structure failure from the deepest partial match: the edge that failed, found vs needed. A capture that met
    another node than the one it is bound to says its own hint where it has one (`P.var(hint=)`): the step's hint
    is about the structure as a whole (Q and K, narrows of one QKV but rotated by two cos tables, were told
    to run fuse_shared_input_matmul)."""
    hint = m.hint if m.hint and m.expected.startswith(SAME_NODE) else (hint or m.hint)
    msg = f"{where(m, ctx.label)} is {m.found}; needs {m.expected}{also_read(m)}" + (f": {hint}" if hint else "")
    edges = ((m.node, m.parent),) if m.node is not None and m.parent is not None else ()
    return Fail("structure", name, msg, (m.node,) if m.node is not None else (), edges, hint, subject=m.node,
                kind=NOT_RECOGNIZED, fix=fix, needed=m.needed, found=m.found_op)


def step_roles(step: Step) -> tuple[str, ...]:
    """The roles a step reads or binds, as it declares them (a guard's `requires`, `reads` and `optional`; a `Shape`'s
    role and its pattern's captures; a `User`'s `of`, role and captures; a `@reports` step's `reads`, `binds` and
    `optional`; `name*` stands for a numbered family): what its failure is about, so that a node bound to another role
    of the candidate is not told of it (`Rejection.roles`). () for a step that declares none."""
    if isinstance(step, Soft):
        return step_roles(step.step)
    if isinstance(step, Guard):
        return tuple(dict.fromkeys((*step.roles, *step.optional)))
    if isinstance(step, Shape):
        return tuple(dict.fromkeys((step.role, *step.pattern.roles())))
    if isinstance(step, User):
        return tuple(dict.fromkeys((step.of, step.role, *step.pattern.roles())))
    return tuple(dict.fromkeys((*getattr(step, "reads", ()), *getattr(step, "binds", ()),
                                *getattr(step, "optional", ()))))


def run_step(step: Step, ctx: Ctx) -> Fail | None:
    """Run one step against `ctx` (which it may extend); returns its failure or None, its `roles` the step's
    (`step_roles`) unless the failure names its own."""
    f = _run_step(step, ctx)
    if f is not None and not f.quiet and not f.roles:
        f = replace(f, roles=step_roles(step))
    return f


def _run_step(step: Step, ctx: Ctx) -> Fail | None:
    if isinstance(step, Soft):
        f = run_step(step.step, ctx)
        if f is not None and not f.quiet:
            ctx.data.setdefault("soft", []).append(f)
        return None
    if isinstance(step, Guard):
        if any(r not in ctx for r in step.requires):
            return None
        outer = ctx.scope
        ctx.scope = (f"Guard {step.name}", frozenset((*step.roles, *step.optional)))
        try:
            if step.check(ctx):
                return None
            nodes, edges = step.offending(ctx)
            remedy, hint = step.remedy_of(ctx)
            return Fail("guard", step.name, step.explain(ctx), tuple(nodes), tuple(edges), hint,
                        subject=step.subject_of(ctx), kind=step.kind, fix=step.fix, remedy=remedy,
                        dead=step.dead_of(ctx))
        finally:
            ctx.scope = outer
    if hasattr(step, "binds"):  # a @reports step: it reads and asks only about the roles it declares
        outer = ctx.scope
        declared = frozenset((*step.reads, *step.binds, *getattr(step, "optional", ())))
        ctx.scope = (f"@reports step {getattr(step, '__name__', 'step')}", declared)
        try:
            f = step(ctx)
        finally:
            ctx.scope = outer
        if f is not None and not f.quiet and f.guard not in step.guard_names:
            raise RuleError(f"[@reports step {getattr(step, '__name__', 'step')}] failed with guard {f.guard!r}, "
                            f"which it does not report (declared: {', '.join(step.guard_names) or 'none'})"
                            f"{close(f.guard, step.guard_names)}")
    else:
        f = step(ctx)
    if f is not None and not f.quiet and not f.kind:
        f = replace(f, kind=getattr(step, "kind", NOT_RECOGNIZED))
    return f


Build = Callable[[Ctx], tuple[Op, Sequence[int], dict[str, Any]]]


@dataclass(frozen=True)
class Rule:
    """One fusion rule.

    Attributes:
        name: `pass.rule`, e.g. `fuse_transformer_layer.bert_post_ln`.
        anchor: silent applicability pattern; its root ops select candidate nodes.
        steps: ordered structure steps and guards.
        result: the role whose value the fused node replaces (a tuple: the first bound role, e.g.
            `("act", "add")` when the activation is optional).
        absorb: roles replaced by the rewrite (the result included); a numbered family `name*` stands for every
            bound `name0`, `name1`, ... (`Rule.absorbed`).
        build: `ctx -> (op, operand ids, attrs)` for a one-node rewrite, or
        rewrite: `(ctx, rewriter) -> new id` for anything else (None: no node stands for the match, e.g. a moved
            path of plain ops; its `Match.fused` is None).
        outputs: further absorbed roles whose values the fused node also produces (a multi-output rewrite, e.g.
            a residual norm that returns the sum too). Their readers outside the match are allowed (the engine's
            `absorbed_escape` exempts them); with `build`, the fused node's value is the result's and the
            outputs' values packed in that order on the last axis and each is read back by a `narrow`
            (`Rewriter.fuse_packed`); a custom `rewrite` must `replace` each itself.
        shared: absorbed roles the match may share with readers outside it: layout views of an operand the fused
            node reads in its unsplit form (the K/V head split a second layer also reads, cross-layer KV sharing).
            `absorbed_escape` and the overlap of two matches skip them; the rewrite must keep such a node (and
            what it reads) while anything outside still reads it. Numbers are unchanged: the kept node computes
            the value it computed before, for the readers it had.
        labels: role -> display name in messages (e.g. `ln1 -> h1`).
        doc: one line for the UI.
        form: what one match makes, in a few words, for a pass whose product is the forms its rules rewrite
            (`canonicalize_exported`: `silu`, `where mask`): a layer's expected list names its pass's product with
            the forms of the rules that matched in that layer (`why.policy.product`), never every form the pass
            knows. "": the pass's product alone.
        taken_later: roles whose node, fused by a later pass into its product (not an ElementwiseRegion), settles a
            refusal of the rule: no standing miss (`report.missed_fusions`). The matmul of a bias added after the
            residual, which FusedAttentionBlock takes as its output projection.
        core: roles of the candidate's core op, first first (a linear's `mm`, then its weight `w`): a refusal of the
            rule is filed in the first bound one's layer, not its anchor's (`trace.REFUSAL_LAYER_RULE`). (): anchor's.
    """

    name: str
    anchor: P
    steps: tuple[Step, ...]
    result: str | tuple[str, ...]
    absorb: tuple[str, ...]
    build: Build | None = None
    rewrite: Callable[[Ctx, Rewriter], int | None] | None = None
    outputs: tuple[str, ...] = ()
    shared: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    doc: str = ""
    form: str = ""
    taken_later: tuple[str, ...] = ()
    core: tuple[str, ...] = ()
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.source:
            fr = sys._getframe(2)  # the rule's definition (inspect.stack() read every frame's source: 1 s per import)
            object.__setattr__(self, "source", f"{fr.f_code.co_filename}:{fr.f_lineno}")
        check_roles(self)

    @property
    def guard_names(self) -> list[str]:
        """Names of every structure step and guard, in order (for the UI and docs)."""
        out: list[str] = []
        for s in self.steps:
            s = s.step if isinstance(s, Soft) else s
            if hasattr(s, "guard_names"):  # a custom step: the guard names it can report (none if it only binds)
                out.extend(s.guard_names)
            else:
                out.append(getattr(s, "name", getattr(s, "__name__", "step")))
        return [*out, "absorbed_escape"]

    @property
    def guard_kinds(self) -> dict[str, str]:
        """Guard name -> the kind of "no" it says (`illegal`, `not recognized`, `not profitable`); structure
        steps are pattern limits (`not recognized`)."""
        out: dict[str, str] = {}
        for s in self.steps:
            s = s.step if isinstance(s, Soft) else s
            if isinstance(s, Guard):
                out.setdefault(s.name, s.kind)
            elif hasattr(s, "guard_names"):
                for g in s.guard_names:
                    out.setdefault(g, s.kinds.get(g, s.kind))
            else:
                out.setdefault(s.name, NOT_RECOGNIZED)
        out["absorbed_escape"] = ILLEGAL
        return out

    def result_role(self, ctx: Ctx) -> str:
        if isinstance(self.result, str):
            return self.result
        return next(r for r in self.result if r in ctx)

    def absorbed(self, ctx: Ctx) -> list[str]:
        """The bound absorbed roles, in `absorb` order; a numbered family `name*` stands for each bound `name0`,
        `name1`, ... (a chain of any length, e.g. the movement ops of an interleaved rotation)."""
        out: list[str] = []
        for r in self.absorb:
            if r.endswith("*"):
                out += [k for k in ctx.bindings if _dynamic(k, frozenset((r,)))]
            elif r in ctx:
                out.append(r)
        return out

    def anchors(self, node: Node) -> bool:
        return self.anchor.ops is None or node.op in self.anchor.ops

    def apply(self, ctx: Ctx, rw: Rewriter) -> int | None:
        if self.rewrite is not None:
            new = self.rewrite(ctx, rw)
            missing = [r for r in self.outputs if r in ctx and not rw.replaced(ctx.id(r))]
            if missing:
                raise RuleError(f"[Rule {self.name}] its rewrite did not replace the outputs {missing}: a "
                                f"multi-output rewrite gives each output's readers its new value (rw.replace)")
            return new
        assert self.build is not None
        op, inputs, attrs = self.build(ctx)
        absorbed = [ctx.id(r) for r in self.absorbed(ctx)]
        if self.outputs:
            return rw.fuse_packed(op, list(inputs), attrs, absorbed=absorbed,
                                  results=[ctx.id(r) for r in (self.result_role(ctx), *self.outputs)])
        return rw.fuse(op, list(inputs), attrs, absorbed=absorbed, result=ctx.id(self.result_role(ctx)))


def _bound(role: str, bound: set[str]) -> bool:
    return role in bound or _dynamic(role, frozenset(bound))


def check_roles(rule: Rule) -> None:
    """Every role a step or guard reads is bound by the anchor or an earlier step; so are `result`,
    `absorb` and `labels`.

    Raises:
        RuleError: naming the rule, the step and the unbound role (a misspelt role would otherwise
            switch its guard off silently: an unbound required role skips the guard).
    """
    bound = set(rule.anchor.roles())

    def need(roles: Sequence[str], step: str) -> None:
        for r in roles:
            if not _bound(r, bound):
                raise RuleError(f"[Rule {rule.name}] step {step!r} reads role {r!r}, which neither the anchor nor "
                                f"an earlier step binds (bound so far: {', '.join(sorted(bound))}){close(r, bound)}")

    for s in rule.steps:
        s = s.step if isinstance(s, Soft) else s
        if isinstance(s, Guard):
            need(s.roles, s.name)
        elif isinstance(s, Shape):
            need((s.role,), s.name)
            bound |= set(s.pattern.roles())
        elif isinstance(s, User):
            need((s.of,), s.name)
            bound |= {s.role, *s.pattern.roles()}
        elif hasattr(s, "binds"):
            need(s.reads, getattr(s, "__name__", "step"))
            bound |= set(s.binds)
        else:
            raise RuleError(f"[Rule {rule.name}] custom step {getattr(s, '__name__', s)!r} must declare what it "
                            f"reads, binds and reports with @reports(...)")
    results = (rule.result,) if isinstance(rule.result, str) else rule.result
    need([*results, *rule.absorb, *rule.outputs, *rule.labels], "result/absorb/outputs/labels")
    if any(o not in rule.absorb for o in rule.shared):
        raise RuleError(f"[Rule {rule.name}] shared {list(rule.shared)} must be absorbed roles (absorb="
                        f"{list(rule.absorb)})")
    for fn in (rule.build, rule.rewrite):
        u = scan(fn)
        if u is None:
            continue
        need(sorted(u.roles_read), "build" if fn is rule.build else "rewrite")
        for op_name, keys in u.attrs_built.items():
            spec = SPECS.get(getattr(Op, op_name, None))  # type: ignore[arg-type]
            bad = sorted(keys - set(spec.attrs)) if spec is not None else []
            if bad:
                raise RuleError(f"[Rule {rule.name}] its build gives {op_name} the attribute {bad[0]!r}, which the "
                                f"op does not have (attributes: {', '.join(spec.attrs) or 'none'})"
                                f"{close(bad[0], spec.attrs)}")
    _check_data(rule)
    _check_attrs_read(rule)
    if any(o not in rule.absorb for o in rule.outputs):
        raise RuleError(f"[Rule {rule.name}] outputs {list(rule.outputs)} must be absorbed roles (absorb="
                        f"{list(rule.absorb)}): the fused node produces their values")


def _role_ops(p: P, out: dict[str, set[Op] | None]) -> dict[str, set[Op] | None]:
    """Role -> the ops its captures allow (None: some capture allows any op), over a pattern and its alternatives."""
    if p.name:
        have = out.get(p.name, set())
        out[p.name] = None if p.ops is None or have is None else have | set(p.ops)
    for q in (*p.alts, *(p.inputs or ())):
        _role_ops(q, out)
    return out


def _check_attrs_read(rule: Rule) -> None:
    """Every attribute a step, guard or rewrite reads by literal from a bound role (`c["norm"].attrs["eps"]`) is an
    attribute of an op the role's pattern allows (`SPECS`), so a misspelt key (a silent None) fails at import."""
    ops: dict[str, set[Op] | None] = _role_ops(rule.anchor, {})
    fns: list[Any] = [rule.build, rule.rewrite]
    for s in rule.steps:
        s = s.step if isinstance(s, Soft) else s
        if isinstance(s, Shape | User):
            _role_ops(s.pattern, ops)
        else:
            fns += [s.check, s.explain, s.highlight, s.subject] if isinstance(s, Guard) else [s]
    for fn in fns:
        u = scan(fn)
        for role, key in sorted(u.attrs_read if u else ()):
            allowed = ops.get(role)
            if not allowed or any(o not in SPECS for o in allowed):
                continue
            known = sorted({k for o in allowed for k in SPECS[o].attrs})
            if key not in known:
                raise RuleError(f"[Rule {rule.name}] {getattr(fn, '__name__', 'a step')} reads attribute {key!r} "
                                f"of {role} ({', '.join(sorted(o.value for o in allowed))}), which it does not have "
                                f"(attributes: {', '.join(known) or 'none'}){close(key, known)}")


def _check_data(rule: Rule) -> None:
    """Every `c.data` key read in the modules that define the rule's steps, guards and rewrite is written there
    too (`spelling.data_keys`; `soft` is the engine's), so a misspelt state field (`c.data.get("fil")`, a silent
    None) fails when the rule module is imported."""
    fns: list[Any] = [rule.build, rule.rewrite]
    for s in rule.steps:
        s = s.step if isinstance(s, Soft) else s
        if not isinstance(s, Shape | User):
            fns += [s.check, s.explain, s.highlight, s.subject] if isinstance(s, Guard) else [s]
    written, read = data_keys([f for f in fns if f is not None])
    for k in sorted(read - written - {"soft"}):
        raise RuleError(f"[Rule {rule.name}] its module reads the state field c.data[{k!r}], which nothing there "
                        f"writes{close(k, written)}")


def escape_check(rule: Rule, ctx: Ctx) -> Fail | None:
    """Absorbed values other than the result must be read only inside the match and not be outputs."""
    absorbed = {ctx.id(r) for r in rule.absorbed(ctx)}
    result = ctx.id(rule.result_role(ctx))
    produced = {result, *(ctx.id(r) for r in rule.outputs if r in ctx)}  # the fused node gives these values
    for r in rule.absorbed(ctx):
        if ctx.id(r) in produced or r in rule.shared:
            continue
        i = ctx.id(r)
        outside = [u for u in ctx.graph.users(i) if u.id not in absorbed]
        if outside or ctx.graph.is_output(i):
            who = ", ".join(ctx.name_of(u.id) for u in outside) or "the graph outputs"
            remedy, hint = reader_advice(ctx, r, [u.id for u in outside], f"make {ctx.label(r)} single-use "
                                                                              f"(remove the dead reader)")
            return Fail("guard", "absorbed_escape",
                        f"{ctx.d(r)} would be absorbed but is also read by {who}; needs to be used only inside "
                        f"the fused pattern", tuple(u.id for u in outside), tuple((i, u.id) for u in outside),
                        hint, subject=i, kind=ILLEGAL,
                        fix=f"a fused op that also returns {ctx.label(r)} (Rule.outputs)",
                        remedy="" if remedy == IN_MODEL else remedy, roles=(r,),
                        dead=dead_readers(ctx, r, [u.id for u in outside]))
    return None


__all__ = ["QUIET", "Fail", "Rule", "Shape", "Soft", "Step", "User", "bind", "check_roles", "escape_check",
           "reports", "run_step", "step_roles"]
