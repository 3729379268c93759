"""One rule tried at one anchor: its steps in order, backtracking over the users a `User` step may bind.

A `User` step binds a role to a user of a value; a value can have several users that fit the step (h1 read by two
linears that each feed a linear: a decoder's cross-attention projection and FFN.1). Binding the first and never the
second missed a real match when the first failed later. `attempt` tries each candidate in node-id order, until one
matches; the work stays bounded: at most `MAX_USER_CANDIDATES` candidates a step, at most `MAX_BRANCHES` tried
alternatives an attempt (past it, a step binds its first candidate, as without backtracking).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..ir import Graph
from .guard import Ctx
from .merged import merged_advice
from .pattern import Bindings
from .readers import dce_first
from .rule import QUIET, Fail, Rule, User, bind, escape_check, run_step, step_roles

MAX_USER_CANDIDATES = 8
"""At most this many users of a value are tried by one `User` step (in node-id order)."""
MAX_BRANCHES = 32
"""At most this many alternative candidates (past each step's first) are tried in one attempt."""


@dataclass
class _Branch:
    """The outcome of the steps from one point on: the context they bound, their failures in step order, and how far
    they got (`rank`, the larger the further)."""

    ctx: Ctx
    fails: list[Fail]
    reach: int
    """The index of the step of the headline failure: the step count for the engine's `absorbed_escape` (or a
    match), -1 for a quiet failure (the rule is not applicable there)."""
    end: int
    """The index of the step at which the run stopped (a structure failure, a quiet one, a step that raised); the step
    count when every step ran."""

    @property
    def rank(self) -> tuple[int, int, int]:
        """How far the candidate got: its headline failure's step, then where its run stopped, then fewer failures."""
        return self.reach, self.end, -len(self.fails)


@dataclass
class _Search:
    """One attempt's search over `User` candidates: the rule and the alternatives it may still try."""

    rule: Rule
    budget: int = MAX_BRANCHES

    def run(self, ctx: Ctx, start: int, fails: list[Fail], reach: int) -> _Branch:
        """Run the rule's steps from `start` with the failures so far (their headline at step `reach`; `attempt` says
        what ends a run)."""
        steps = self.rule.steps
        for i in range(start, len(steps)):
            step = steps[i]
            try:
                if not isinstance(step, User):
                    f = run_step(step, ctx)
                elif isinstance(found := step.candidates(ctx), Fail):
                    f = found if found.roles else replace(found, roles=step_roles(step))
                elif len(found) > 1 and self.budget > 0:
                    return self.branch(ctx, i, step, found, fails, reach)
                else:
                    bind(ctx, step.role, *found[0])
                    continue
            except Exception:
                if fails:
                    return _Branch(ctx, fails, reach, i)
                raise
            if f is None:
                continue
            if f.quiet:
                return _Branch(ctx, [f], -1, i) if not fails else _Branch(ctx, fails, reach, i)
            if not fails:
                reach = i
            if f.stage == "structure":
                if not fails:  # after a failing guard, a structure miss is usually its consequence: not reported
                    fails.append(f)
                return _Branch(ctx, fails, reach, i)
            fails.append(f)
        if not fails:
            f = escape_check(self.rule, ctx)
            if f is None:
                return _Branch(ctx, [], len(steps), len(steps))
            fails.append(f)
            reach = len(steps)
        return _Branch(ctx, fails, reach, len(steps))

    def branch(self, ctx: Ctx, i: int, step: User, found: list[tuple[int, Bindings]], fails: list[Fail],
               reach: int) -> _Branch:
        """Try each candidate of `step` (the rule's step `i`) with the steps after it: the first that matches, else
        the one that got furthest (`_Branch.rank`; the first by node id at an equal rank). The first candidate's
        steps raise as any step does; a later candidate whose steps raise is dropped (the others still say what they
        found)."""
        best: _Branch | None = None
        for k, (node_id, captures) in enumerate(found[:MAX_USER_CANDIDATES]):
            if k:
                if self.budget <= 0:
                    break
                self.budget -= 1
            sub = Ctx(ctx.graph, dict(ctx.bindings), ctx.params, ctx.labels, _copied(ctx.data))
            bind(sub, step.role, node_id, captures)
            try:
                got = self.run(sub, i + 1, list(fails), reach)
            except Exception:
                if not k:
                    raise
                continue
            if not got.fails:
                return got
            if best is None or got.rank > best.rank:
                best = got
        assert best is not None
        return best


def _copied(data: dict[str, Any]) -> dict[str, Any]:
    """A step state for one candidate: its lists, dicts and sets copied, so one candidate's steps do not write
    another's."""
    return {k: type(v)(v) if isinstance(v, list | dict | set) else v for k, v in data.items()}


def attempt(rule: Rule, graph: Graph, anchor: int, params: Mapping[str, Any]) -> tuple[Ctx, list[Fail]]:
    """Run `rule` at `anchor`: the context it bound, and every failure in step order (empty: a match).

    After a failing guard the remaining steps still run, so every failing guard is reported (the first
    is the headline). A structure failure ends the attempt (later steps need the roles it would bind);
    it is reported only as the headline (after a failing guard it is usually that guard's consequence,
    e.g. no FFN.2 after an unabsorbed activation). A step that raises after an earlier failure also ends
    the attempt (it read what the failure left unchecked).
    A quiet failure before any other means the rule is not applicable: `[QUIET]`.

    A `User` step with several candidates (`User.candidates`, node-id order) backtracks: each is bound in turn and
    the steps after it run, until one matches. When every candidate fails, the attempt reports the candidate that got
    furthest (`_Branch.rank`): whose headline failure is at the latest step (the engine's `absorbed_escape` counts as
    past the last step); then whose run went on furthest before a structure failure stopped it; then with fewer
    failures; at an equal rank the first by node id. A candidate under which the rule is not applicable (a quiet
    failure) reaches nowhere, so a real near miss of another candidate is reported before it. After a failing guard
    (the candidate is refused already) the candidates are still tried, so the failures reported after the headline
    are about the user that fits best (h1 read by a probe linear besides FFN.1: `h1_user_count`, then nothing about
    the probe as FFN.1). Bounded by `MAX_USER_CANDIDATES` and `MAX_BRANCHES`: past them a step binds its first
    candidate.
    """
    r = rule.anchor.match(graph, anchor)
    ctx = Ctx(graph, r if isinstance(r, dict) else {}, params, rule.labels)
    if not isinstance(r, dict):
        return ctx, [QUIET]
    got = _Search(rule).run(ctx, 0, [], 0)
    return got.ctx, [_merged_fix(rule, got.ctx, _dead_fix(rule, got.ctx, f)) for f in got.fails]


def _dead_fix(rule: Rule, ctx: Ctx, f: Fail) -> Fail:
    """`f`, its compiler fix `dead_code_elimination before PASS` when its extra readers are all dead code (`Fail.dead`,
    `readers.DCE_FIRST`): no multi-output op is needed for a value only dead nodes read. PASS: the rule's pass (its
    name's part before the dot)."""
    if not f.dead:
        return f
    return replace(f, fix=dce_first(rule.name.partition(".")[0], [ctx.name_of(u) for u in f.dead]))


def _merged_fix(rule: Rule, ctx: Ctx, f: Fail) -> Fail:
    """`f` worded as rlxviz's own doing (`merged.merged_advice`: nothing to change in the model, the compiler fix names
    `fuse_shared_input_matmul`'s merge) when what it blames are slices that merge made: its offending nodes, or, for a
    guard that marks none (`qkv_split`: the packed projection is too wide), the readers of its subject that the match
    does not bind. A guard failure only (a structure step's subject is where the pattern stopped), never one whose
    readers are dead code (`_dead_fix`: removing them is the fix)."""
    if f.stage != "guard" or f.dead:
        return f
    readers: tuple[int, ...] = tuple(f.offending)
    if not readers and f.subject is not None and f.subject in ctx.graph:
        bound = set(ctx.bindings.values())
        readers = tuple(u.id for u in ctx.graph.users(f.subject) if u.id not in bound)
    got = merged_advice(ctx.graph, readers, ctx.name_of, rule.name.partition(".")[0])
    if got is None:
        return f
    remedy, hint, fix = got
    return replace(f, remedy=remedy, hint=hint, fix=fix)


__all__ = ["MAX_BRANCHES", "MAX_USER_CANDIDATES", "attempt"]
