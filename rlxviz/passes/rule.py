"""Rules: an anchor pattern, ordered steps (structure and guards), and a rewrite.

A rule reads like its pattern::

    Rule("fuse_matmul_bias_act.bias_act",
         anchor=P(Op.ADD, P(Op.MATMUL, P.var("x"), P.var("w"), name="mm"), P.var("bias"), name="add",
                  commutative=True),
         steps=(single_user("mm"), not_output("mm"), rank_le("bias", 1), ...),
         result="add", absorb=("mm", "add"), build=lambda c: (Op.FUSED_MATMUL_BIAS_ACT, ...))

* `anchor` decides *applicability* and is silent: a node that does not have the anchor's shape is
  simply not a candidate (so every residual `add` is not reported as a failed matmul+bias).
* `steps` run in order after the anchor; the first failing one ends the match with a `Rejection`:
  `Shape`/`User` steps fail at stage `structure`, `Guard`s at stage `guard`. A `Soft` step records
  its rejection but lets the match continue (e.g. "gelu_tanh not absorbed, fused without activation").
* the engine appends one generic guard, `absorbed_escape`: nothing outside the match may read an
  absorbed value other than the result (RLX silently redirects such users, rlx-notes §2.1).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..ir import Node, Op, Rewriter
from .guard import Ctx, Guard
from .pattern import Miss, P, describe, op_label


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


QUIET = Fail("structure", "", "", quiet=True)


@dataclass(frozen=True)
class Shape:
    """Structure step: `pattern` must match at the node bound to `role` (adds its captures)."""

    name: str
    role: str
    pattern: P
    hint: str = ""

    def __call__(self, ctx: Ctx) -> Fail | None:
        r = self.pattern.match(ctx.graph, ctx.id(self.role), ctx.bindings, self.role)
        if isinstance(r, Miss):
            return _miss_fail(self.name, ctx, r, self.hint)
        ctx.bindings.update(r)
        return None


@dataclass(frozen=True)
class User:
    """Structure step: bind `role` to the first user of `of` that matches `pattern` (rooted at the user).

    `what` describes the wanted user for messages ("the post-attention FusedResidualLN").
    """

    name: str
    role: str
    of: str
    pattern: P
    what: str = ""
    hint: str = ""

    def __call__(self, ctx: Ctx) -> Fail | None:
        users = ctx.users(self.of)
        first: Miss | None = None
        for u in users:
            r = self.pattern.match(ctx.graph, u.id, ctx.bindings, self.role)
            if not isinstance(r, Miss):
                ctx.bindings.update({**r, self.role: u.id})
                return None
            first = first or r
        have = ", ".join(describe(u, op_label(u)) for u in users) or "no users"
        want = self.what or self.pattern.describe()
        msg = f"{self.role}: the users of {ctx.d(self.of)} are {have}; needs {want}"
        hint = self.hint or (first.hint if first else "")
        if hint:
            msg += f": {hint}"
        return Fail("structure", self.name, msg, tuple(u.id for u in users),
                    tuple((ctx.id(self.of), u.id) for u in users), hint, subject=ctx.id(self.of))


def reports(*guard_names: str) -> Callable[[Callable[[Ctx], Fail | None]], Callable[[Ctx], Fail | None]]:
    """Declare the guard names a custom step function can fail with (none: it only binds roles)."""

    def mark(fn: Callable[[Ctx], Fail | None]) -> Callable[[Ctx], Fail | None]:
        fn.guard_names = guard_names  # type: ignore[attr-defined]
        return fn

    return mark


@dataclass(frozen=True)
class Soft:
    """Run `step`; on failure record its rejection and continue the match."""

    step: Any


Step = Shape | User | Guard | Soft | Callable[[Ctx], "Fail | None"]


def _miss_fail(name: str, ctx: Ctx, m: Miss, hint: str) -> Fail:
    hint = hint or m.hint
    label = ctx.label(m.role)
    msg = f"{label} is {m.found}; needs {m.expected}" + (f": {hint}" if hint else "")
    return Fail("structure", name, msg, (m.node,) if m.node is not None else (), (), hint, subject=m.node)


def run_step(step: Step, ctx: Ctx) -> Fail | None:
    """Run one step against `ctx` (which it may extend); returns its failure or None."""
    if isinstance(step, Soft):
        f = run_step(step.step, ctx)
        if f is not None and not f.quiet:
            ctx.data.setdefault("soft", []).append(f)
        return None
    if isinstance(step, Guard):
        if any(r not in ctx for r in step.requires):
            return None
        if step.check(ctx):
            return None
        nodes, edges = step.offending(ctx)
        subject = ctx.id(step.requires[0]) if step.requires and step.requires[0] in ctx else None
        return Fail("guard", step.name, step.explain(ctx), tuple(nodes), tuple(edges), step.hint, subject=subject)
    return step(ctx)


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
        absorb: roles replaced by the rewrite (the result included).
        build: `ctx -> (op, operand ids, attrs)` for a one-node rewrite, or
        rewrite: `(ctx, rewriter) -> new id` for anything else.
        labels: role -> display name in messages (e.g. `ln1 -> h1`).
        doc: one line for the UI.
    """

    name: str
    anchor: P
    steps: tuple[Step, ...]
    result: str | tuple[str, ...]
    absorb: tuple[str, ...]
    build: Build | None = None
    rewrite: Callable[[Ctx, Rewriter], int] | None = None
    labels: dict[str, str] = field(default_factory=dict)
    doc: str = ""
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.source:
            fr = inspect.stack()[2]
            object.__setattr__(self, "source", f"{fr.filename}:{fr.lineno}")

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

    def result_role(self, ctx: Ctx) -> str:
        if isinstance(self.result, str):
            return self.result
        return next(r for r in self.result if r in ctx)

    def anchors(self, node: Node) -> bool:
        return self.anchor.ops is None or node.op in self.anchor.ops

    def apply(self, ctx: Ctx, rw: Rewriter) -> int:
        if self.rewrite is not None:
            return self.rewrite(ctx, rw)
        assert self.build is not None
        op, inputs, attrs = self.build(ctx)
        return rw.fuse(op, list(inputs), attrs, absorbed=[ctx.id(r) for r in self.absorb if r in ctx],
                       result=ctx.id(self.result_role(ctx)))


def escape_check(rule: Rule, ctx: Ctx) -> Fail | None:
    """Absorbed values other than the result must be read only inside the match and not be outputs."""
    absorbed = {ctx.id(r) for r in rule.absorb if r in ctx}
    result = ctx.id(rule.result_role(ctx))
    for r in rule.absorb:
        if r not in ctx or ctx.id(r) == result:
            continue
        i = ctx.id(r)
        outside = [u for u in ctx.graph.users(i) if u.id not in absorbed]
        if outside or ctx.graph.is_output(i):
            who = ", ".join(ctx.name_of(u.id) for u in outside) or "the graph outputs"
            return Fail("guard", "absorbed_escape",
                        f"{ctx.d(r)} would be absorbed but is also read by {who}; needs to be used only inside "
                        f"the fused pattern", tuple(u.id for u in outside), tuple((i, u.id) for u in outside),
                        f"make {ctx.label(r)} single-use")
    return None


__all__ = ["QUIET", "Fail", "Rule", "Shape", "Soft", "Step", "User", "escape_check", "run_step"]
