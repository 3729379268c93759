"""Guards: named, first-class checks whose explanation is built from the actual values.

A `Guard(name, check, explain)` reads a `Ctx` (the graph snapshot, the bindings so far, the
pipeline parameters). When `check` is false the engine records a `Rejection` whose `guard` is the
guard's name and whose message is `explain(ctx)`, e.g. "h1 (node 41, encoder.layer.3...) has 3
users; needs exactly 2: FFN.1 and the ln2 residual". The factories below are the shared guards
(single user, not an output, exact user count, rank, static dim, activation allow-list, operand
order, attribute equality, size threshold, equal shapes). RLX's guards are bare `continue`s
(docs/rlx.md §7.5); these are values the UI lists and the tests name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..ir import Graph, Node
from ..ir.ops import EPILOGUE_ACTIVATIONS as _EPILOGUE_OPS
from .params import ParamError, check_new_param
from .pattern import Bindings, RuleError, describe, op_label
from .readers import (
    KEEP_MATERIALISED,
    RUN_DCE,
    dead_readers,
    extra_readers_why,
    live_nodes,
    reaches_output,
    reader_advice,
)
from .refusal_kinds import (
    COMPILER_ONLY,
    DOES_NOT_PAY,
    ILLEGAL,
    IN_MODEL,
    KINDS,
    MODEL_TERM,
    NO_MODEL_FIX,
    NOT_A_CANDIDATE,
    NOT_NEAR_MISSES,
    NOT_PROFITABLE,
    NOT_RECOGNIZED,
    NOTHING_TO_CHANGE,
    READ_BY_MODEL,
    REMEDIES,
    UNCHECKED_FIX,
    near_miss_kind,
)
from .spelling import close, scan

EPILOGUE_ACTIVATIONS: tuple[str, ...] = tuple(a.value for a in _EPILOGUE_OPS)


def activation_hint(name: str | None) -> str:
    """The model-side fix for an activation off the epilogue allow-list: for a GELU form (tanh-GELU, ...) exact GELU
    only (SiLU is on the allow-list too, but it is another activation, not a form of GELU)."""
    if name and name.startswith("gelu"):
        return "exact GELU (gelu) fuses, but switching the model to it changes its numbers: prefer the compiler fix"
    return (f"an allow-listed activation ({', '.join(EPILOGUE_ACTIVATIONS)}) fuses, but changing the model's "
            "activation changes its numbers: prefer the compiler fix")
"""Names of the activations `fuse_matmul_bias_act` absorbs: RLX's epilogue allow-list (gelu, silu) and squared
ReLU (`relu2`), derived from the one table `ir.ops.EPILOGUE_ACTIVATIONS`. `gelu_tanh` is NOT in it: the fused
epilogue computes exact-erf GELU only, so a tanh-GELU FFN keeps a separate activation node."""


_NAME = re.compile(r"\w+")


def role_name(role: str, label: str) -> str:
    """One name for a bound node in messages and drawings: the role as drawn (`viz.dot` tags the node with it), with
    the pattern's name for it after it when that is another name (`ln1 (role h1)`, `var (role variance)`); a
    descriptive label (`the matmul`, `its bias add`: words, not a name) as it is; the role when they agree. The app's
    search finds a node by either name (the drawing's tooltip lists them, `viz.dot`)."""
    if label == role or not _NAME.fullmatch(label):
        return label
    return f"{role} (role {label})"


@dataclass
class Ctx:
    """What a guard sees: the graph snapshot, role -> node id bindings, pipeline params and role labels."""

    graph: Graph
    bindings: Bindings
    params: Mapping[str, Any] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    scope: tuple[str, frozenset[str]] | None = None
    """While a guard or a `@reports` step runs: (who, the roles it declared); reading any other role, or asking
    whether it is bound, raises RuleError."""

    def _read(self, role: str) -> int:
        if self.scope is not None and role not in self.scope[1] and not _dynamic(role, self.scope[1]):
            raise RuleError(f"[{self.scope[0]}] reads role {role!r}, which it does not declare "
                            f"(declared: {', '.join(sorted(self.scope[1])) or 'none'})")
        return self.bindings[role]

    def __getitem__(self, role: str) -> Node:
        return self.graph[self._read(role)]

    def __contains__(self, role: str) -> bool:
        """Whether `role` is bound. While a guard or step runs, asking about a role it does not declare raises
        `RuleError` (a misspelt `"bais" in c` would otherwise be a silent False)."""
        if self.scope is not None and role not in self.scope[1] and not _dynamic(role, self.scope[1]):
            raise RuleError(f"[{self.scope[0]}] asks for role {role!r}, which it does not declare "
                            f"(declared: {', '.join(sorted(self.scope[1])) or 'none'}){close(role, self.scope[1])}")
        return role in self.bindings

    def id(self, role: str) -> int:
        return self._read(role)

    def label(self, role: str) -> str:
        """The role's name in messages (`role_name`): `ln1 (role h1)` for a node drawn as `ln1` whose pattern
        role is named `h1`."""
        return role_name(role, self.labels.get(role, role))

    def d(self, role: str) -> str:
        """`h1 (node 41, encoder.layer.3.attention.output.LayerNorm)`."""
        return describe(self[role], self.label(role))

    def the(self, what: str, role: str) -> str:
        """`the mean (node 41, ...)`: `what` named once, whether or not the role's label already is that word
        (`the mask mask (node 27, ...)` is what `f"the {what} {c.d(role)}"` would say)."""
        label = self.label(role)
        return f"the {self.d(role)}" if label == what or label.startswith(what + " ") else f"the {what} {self.d(role)}"

    def users(self, role: str) -> tuple[Node, ...]:
        return self.graph.users(self._read(role))

    def role_of(self, node_id: int) -> str | None:
        for r, i in self.bindings.items():
            if i == node_id:
                return r
        return None

    def name_of(self, node_id: int) -> str:
        """A bound node by its role label, any other node by its op: `hidden (node 7, ...)`."""
        r = self.role_of(node_id)
        n = self.graph[node_id]
        return describe(n, self.label(r) if r else f"{n.op.value} {n.name}" if n.name else op_label(n))


def check_literals(who: str, fns: Sequence[Callable[..., Any] | None], roles: Sequence[str]) -> tuple[str, ...]:
    """Every role a guard's (or step's) functions name by literal through the context (`c["bias"]`, `c.id("mm")`,
    `"act" in c`, `c.bindings.get("x")`) is one of `roles` (or of a declared `name*` family), and every pipeline
    parameter they read (`c.params.get(...)`) is a `PipelineParams` field or a new name not close to one
    (`params.check_new_param`). Returns the parameters read.

    Raises:
        RuleError: naming `who`, the undeclared role or the misspelt parameter, and the close match.
    """
    declared = frozenset(roles)
    params: list[str] = []
    for fn in fns:
        u = scan(fn)
        if u is None:
            continue
        for r in sorted(u.roles_read):
            if r not in declared and not _dynamic(r, declared):
                raise RuleError(f"[{who}] {getattr(fn, '__name__', 'a function')} reads role {r!r}, which it does not "
                                f"declare (declared: {', '.join(sorted(declared)) or 'none'}){close(r, declared)}")
        for k in sorted(u.params):
            try:
                params.append(check_new_param(k, who))
            except ParamError as e:
                raise RuleError(f"[{who}] {e}") from None
    return tuple(dict.fromkeys(params))


def _dynamic(role: str, declared: frozenset[str]) -> bool:
    """`mm3` is covered by a declared family `mm*` (roles bound in numbered groups, e.g. the Q/K/V matmuls)."""
    return any(d.endswith("*") and role.startswith(d[:-1]) and role[len(d) - 1:].isdigit() for d in declared)


Highlight = tuple[tuple[int, ...], tuple[tuple[int, int], ...]]


@dataclass(frozen=True)
class Guard:
    """A named check.

    Attributes:
        name: stable identifier used in `Rejection.guard`, tests and the UI (e.g. `h1_user_count`).
        check: `ctx -> bool`, true when the fusion may proceed.
        explain: `ctx -> str`, actual vs required values; called only when `check` is false.
        highlight: `ctx -> (node ids, (producer, consumer) edges)` to emphasize; default: none.
        hint: how to fix the model or the pipeline.
        requires: roles that must be bound for the guard to apply (else it is skipped); the first is the
            guard's subject (the node a rejection marks) unless `subject` says otherwise.
        kind: what kind of "no" it says: `illegal`, `not recognized` or `not profitable` (`KINDS`).
        fix: the compiler-side fix (for the `not recognized` kind: what a rule or pass would need).
        reads: every role the guard may read besides `requires` (optional roles); `name*` covers a
            numbered family (`mm*`: mm0, mm1, ...). A rule refuses to build when one is never bound.
        subject: `ctx -> node id` of the node the failure is about, when it is not `requires[0]`.
        no_model_fix: `ctx -> None` when `hint` is a change to the model that keeps its numbers (the default:
            no function), else `ctx -> why no such change exists` (then the refusal's hint is `none in the
            model: <why>` and its remedy `remedy`; `REMEDIES`).
        remedy: what a refusal is when `no_model_fix` gives a reason: `COMPILER_ONLY`, or `READ_BY_MODEL` when the
            reason is a reader or an output of the model (the reader and output factories).
        optional: roles the guard only reads when bound (`"add" in c`), which a rule need not bind: a guard
            factory shared by rules of which only some bind them.
        params: the pipeline parameters the guard reads (`size_le` gives its own; those its functions read by
            literal, `c.params.get("x")`, are added when it is built). Its pass declares them (`Pass.params`).
        excuses: `(layer trait, why)` pairs (`passes.why.kinds.LayerArchitecture.has`, e.g. `pre_norm`): in a layer
            with the trait a refusal by this guard is the layer's design, not a miss: it does not count there, for
            that why (`excuse_for`: the first pair whose trait the layer has, so a narrower layout, a parallel block
            with a norm per sublayer, is worded apart from the wider one, pre-norm). Set with `excused` (one call
            per wording; `excused_in` lists the traits).
        readers: for a guard that refuses because a value has readers besides the fusion (or is a graph output):
            `ctx -> (the value's role or node id, its extra readers' ids)`, or None when it cannot say. Its remedy and
            hint are then `reader_advice`'s (a model output: none in the model; dead readers: dead-code
            elimination), not `no_model_fix`'s.
        gaps: `(layer trait, op form)` pairs: in a layer with the trait, a refusal by this guard that the layer's kind
            does not expect (`unexpected`) is a gap in rlxviz's own op, the form it lacks, not the model's layout
            (`passes.why.policy.op_gap`): the layer is fused only as far as rlxviz's ops go. The first pair whose
            trait the layer has names the gap, e.g. `("no_mask", "FusedAttentionBlock without a mask operand")`. Set
            with `lacking` (one call per form; `gap_in` lists the traits).
        fix_gaps: `(compiler fix, op form)` pairs: a refusal by this guard whose compiler fix (`Rejection.fix`, set
            by the run where it knows more than the guard, e.g. ESM's Q scaled before its RoPE) starts with the fix
            lacks that form instead of the one `gaps` names (`gap_of_fix`). Set with `lacking_fix`.

    Raises:
        RuleError: `kind` is not one of `KINDS`.
    """

    name: str
    check: Callable[[Ctx], bool]
    explain: Callable[[Ctx], str]
    highlight: Callable[[Ctx], Highlight] | None = None
    hint: str = ""
    requires: tuple[str, ...] = ()
    kind: str = ""
    fix: str = ""
    reads: tuple[str, ...] = ()
    subject: Callable[[Ctx], int | None] | None = None
    no_model_fix: Callable[[Ctx], str | None] | None = None
    remedy: str = COMPILER_ONLY
    optional: tuple[str, ...] = ()
    params: tuple[str, ...] = ()
    excuses: tuple[tuple[str, str], ...] = ()
    readers: Callable[[Ctx], tuple[str | int, Sequence[int]] | None] | None = None
    gaps: tuple[tuple[str, str], ...] = ()
    fix_gaps: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise RuleError(f"[Guard {self.name}] kind must be one of {', '.join(KINDS)}; got {self.kind!r}"
                            f"{close(str(self.kind), KINDS)}")
        read = check_literals(f"Guard {self.name}", (self.check, self.explain, self.highlight, self.subject,
                                                     self.no_model_fix, self.readers), (*self.roles, *self.optional))
        object.__setattr__(self, "params", tuple(dict.fromkeys((*self.params, *read))))

    @property
    def roles(self) -> tuple[str, ...]:
        """Every role the guard may read: `requires` then `reads`."""
        return tuple(dict.fromkeys((*self.requires, *self.reads)))

    def offending(self, ctx: Ctx) -> Highlight:
        return self.highlight(ctx) if self.highlight else ((), ())

    def subject_of(self, ctx: Ctx) -> int | None:
        """The node the failure is about (see `subject`)."""
        if self.subject is not None:
            return self.subject(ctx)
        return ctx.bindings.get(self.requires[0]) if self.requires else None

    def remedy_of(self, ctx: Ctx) -> tuple[str, str]:
        """`(remedy, hint)` of a failure at `ctx`: `(IN_MODEL, hint)`, or `(self.remedy, "none in the model:
        <why>")` when no change to the model that keeps its numbers makes the fusion legal; a reader guard's
        (`readers`) is `reader_advice`'s. A hint that is itself a statement (`NOTHING_TO_CHANGE`: "nothing to change
        in the model: ...") has `self.remedy` too: the remedy is read off the words the fix line prints."""
        got = self.readers(ctx) if self.readers is not None else None
        if got is not None:
            return reader_advice(ctx, got[0], got[1], self.hint)
        why = self.no_model_fix(ctx) if self.no_model_fix is not None else None
        if why is None:
            return (self.remedy if self.hint.startswith(NOTHING_TO_CHANGE) else IN_MODEL), self.hint
        return self.remedy, NO_MODEL_FIX + why

    def dead_of(self, ctx: Ctx) -> tuple[int, ...]:
        """The extra readers of a reader guard's value (`readers`) when every one is dead code (`dead_readers`: the
        compiler fix is then `dead_code_elimination` before the pass, `readers.DCE_FIRST`), else ()."""
        got = self.readers(ctx) if self.readers is not None else None
        return dead_readers(ctx, got[0], got[1]) if got is not None else ()

    def excused(self, where: Sequence[str], why: str) -> Guard:
        """This guard, its refusals not counted in layers with one of the traits `where` (`excuses`), for `why`.
        Chained calls add wordings; an earlier one wins for a layer with traits of both."""
        return replace(self, excuses=(*self.excuses, *((t, why) for t in where)))

    @property
    def excused_in(self) -> tuple[str, ...]:
        """The layer traits where a refusal by this guard does not count (`excuses`)."""
        return tuple(dict.fromkeys(t for t, _ in self.excuses))

    def excuse_for(self, has: Callable[[str], bool]) -> str | None:
        """Why a refusal by this guard does not count in a layer whose traits `has` answers (the first of `excuses`
        it has), or None: it counts there."""
        return next((why for t, why in self.excuses if has(t)), None)

    def lacking(self, where: Sequence[str], what: str) -> Guard:
        """This guard, its refusals in layers with one of the traits `where` a gap in rlxviz's op `what` (`gaps`),
        not the model's layout, where the layer's kind does not expect the product. Chained calls add forms; an
        earlier one wins for a layer with traits of both."""
        return replace(self, gaps=(*self.gaps, *((t, what) for t in where)))

    def lacking_fix(self, fix: str, what: str) -> Guard:
        """This guard, its refusals whose compiler fix starts with `fix` a gap in rlxviz's op `what` (`fix_gaps`)."""
        return replace(self, fix_gaps=(*self.fix_gaps, (fix, what)))

    def gap_of_fix(self, fix: str) -> str | None:
        """The op form a refusal by this guard whose compiler fix is `fix` lacks (`fix_gaps`), or None: the
        guard's own (`gap_for`)."""
        return next((what for f, what in self.fix_gaps if fix.startswith(f)), None)

    @property
    def gap_in(self) -> tuple[str, ...]:
        """The layer traits where a refusal by this guard is a gap in rlxviz's op (`gaps`)."""
        return tuple(dict.fromkeys(t for t, _ in self.gaps))

    def gap_for(self, has: Callable[[str], bool]) -> str | None:
        """The op form rlxviz lacks for a layer whose traits `has` answers (the first of `gaps` it has), or None."""
        return next((what for t, what in self.gaps if has(t)), None)

    def renamed(self, name: str, hint: str | None = None) -> Guard:
        return replace(self, name=name, hint=self.hint if hint is None else hint)


def _outside_readers(c: Ctx, role: str) -> list[int]:
    """The users of `role` that are no bound role of the match (its own consumers are bound), else every user."""
    bound = set(c.bindings.values())
    us = [u.id for u in c.users(role)]
    return [u for u in us if u not in bound] or us


def _outside(role: str) -> Callable[[Ctx], tuple[str, list[int]]]:
    return lambda c: (role, _outside_readers(c, role))


def _also_returns(role: str) -> str:
    """The compiler fix of a value another reader or the caller keeps: the fused op returns it too."""
    return f"a fused op that also returns {role} (a multi-output rewrite, Rule.outputs) for its other readers"


def _output_no_fix(role: str) -> Callable[[Ctx], str | None]:
    return lambda c: extra_readers_why(c, role, ()) if c.graph.is_output(c.id(role)) else None


def use_count(g: Graph, i: int, who: str, name_of: Callable[[int], str]) -> str:
    """Who reads node `i` (`who`: its description, e.g. `attn (node 51)`), in words, graph output included: `attn
    (node 51) is read by no node: it is a graph output (output #0)`, `sum (node 16) has 2 users (norm (node 19), add
    (node 48))`, `h1 (node 41) has 1 user (norm (node 44)) and is a graph output (output #1)` (`name_of` names
    each user). The one wording of every use-count reason (`single_user`, `user_count`, `all_single_use`, the rules'
    own): a value the graph returns and no node reads read "has 0 users (none)", as if nothing used it."""
    us = g.users(i)
    out = f"a graph output (output #{g.outputs.index(i)})" if g.is_output(i) else ""
    if not us:
        return f"{who} is read by no node" + (f": it is {out}" if out else "")
    names = ", ".join(name_of(u.id) for u in us)
    return f"{who} has {len(us)} user{'' if len(us) == 1 else 's'} ({names})" + (f" and is {out}" if out else "")


def _uses(c: Ctx, role: str) -> str:
    """`use_count` of a bound role."""
    return use_count(c.graph, c.id(role), c.d(role), c.name_of)


def _edges_to_users(ctx: Ctx, role: str) -> Highlight:
    i = ctx.id(role)
    us = ctx.users(role)
    return tuple(u.id for u in us), tuple((i, u.id) for u in us)


def _edges_to_outside(ctx: Ctx, role: str) -> Highlight:
    """The offending readers of `role` and their edges: the users no bound role of the match holds (the extra
    readers; `_outside_readers`), never the match's own consumer (the norm a residual fusion would absorb), which
    is marked only when no reader lies outside the match."""
    i = ctx.id(role)
    us = _outside_readers(ctx, role)
    return tuple(us), tuple((i, u) for u in us)


def single_user(role: str, name: str | None = None, hint: str = "", fix: str = "") -> Guard:
    """`role` has exactly one user node (graph outputs are checked by `not_output`)."""
    return Guard(name or f"{role}_single_user", lambda c: len(c.users(role)) == 1,
                 lambda c: f"{_uses(c, role)}; needs exactly 1",
                 lambda c: _edges_to_outside(c, role),
                 hint or f"make {role} single-use (or give the extra reader its own copy)", (role,), ILLEGAL,
                 fix or _also_returns(role), remedy=READ_BY_MODEL, readers=_outside(role))


def not_output(role: str, name: str | None = None, hint: str = "", fix: str = "") -> Guard:
    """`role` is not a graph output (fusing would hide a tensor the caller asked for)."""
    return Guard(name or f"{role}_not_output", lambda c: not c.graph.is_output(c.id(role)),
                 lambda c: f"{c.d(role)} is graph output #{c.graph.outputs.index(c.id(role))}; an absorbed "
                           f"intermediate must not be an output",
                 lambda c: ((c.id(role),), ()),
                 hint or f"do not return {role} from the model (or accept the unfused form)", (role,), ILLEGAL,
                 fix or _also_returns(role), no_model_fix=_output_no_fix(role), remedy=READ_BY_MODEL)


def user_count(role: str, n: int, purpose: str, name: str | None = None, hint: str = "", fix: str = "",
               highlight: Callable[[Ctx], Highlight] | None = None) -> Guard:
    """`role` has exactly `n` user nodes; `purpose` names them ("FFN.1 and the ln2 residual"). `highlight`
    picks the offending users (default: the users outside the match, `_edges_to_outside`)."""
    pick = highlight or (lambda c: _edges_to_outside(c, role))
    return Guard(name or f"{role}_user_count", lambda c: len(c.users(role)) == n,
                 lambda c: f"{_uses(c, role)}; needs exactly {n}: {purpose}",
                 pick, hint or f"make {role} feed only {purpose}", (role,), ILLEGAL, fix or _also_returns(role),
                 remedy=READ_BY_MODEL, readers=lambda c: (role, pick(c)[0]))


def rank_le(role: str, n: int, name: str | None = None, hint: str = "", fix: str = "") -> Guard:
    """`role` has rank <= n."""
    return Guard(name or f"{role}_rank", lambda c: c[role].rank <= n,
                 lambda c: f"{c.d(role)} has rank {c[role].rank} (shape {list(c[role].shape)}); needs rank <= {n}",
                 lambda c: ((c.id(role),), ()), hint, (role,), NOT_RECOGNIZED, fix)


def rank_eq(role: str, n: int, name: str | None = None, hint: str = "", fix: str = "") -> Guard:
    """`role` has rank exactly n."""
    return Guard(name or f"{role}_rank", lambda c: c[role].rank == n,
                 lambda c: f"{c.d(role)} has rank {c[role].rank} (shape {list(c[role].shape)}); needs rank {n}",
                 lambda c: ((c.id(role),), ()), hint, (role,), NOT_RECOGNIZED, fix)


def static_dim(role: str, axis: int, name: str | None = None, hint: str = "", fix: str = "") -> Guard:
    """Dim `axis` of `role` exists and is a known positive size."""
    def ok(c: Ctx) -> bool:
        s = c[role].shape
        return -len(s) <= axis < len(s) and isinstance(s[axis], int) and s[axis] > 0

    return Guard(name or f"{role}_static_dim", ok,
                 lambda c: f"{c.d(role)} has shape {list(c[role].shape)}; needs a static dim at axis {axis}",
                 lambda c: ((c.id(role),), ()), hint, (role,), NOT_RECOGNIZED, fix)


def activation_in(role: str, allowed: Sequence[str] = EPILOGUE_ACTIVATIONS, name: str | None = None,
                  hint: str = "", attr: str | None = None, fix: str = "") -> Guard:
    """The activation of `role` (its op, or attribute `attr`) is in the allow-list."""
    def act(c: Ctx) -> str | None:
        return c[role].attrs.get(attr) if attr else c[role].op.value

    return Guard(name or f"{role}_activation", lambda c: act(c) in allowed,
                 lambda c: f"{c.d(role)} has activation {act(c)}; the allow-list is {', '.join(allowed)}",
                 lambda c: ((c.id(role),), ()),
                 hint or f"use one of {', '.join(allowed)} (tanh-approximated GELU is not fused)", (role,),
                 NOT_RECOGNIZED, fix or "add the activation to the epilogue allow-list (with its fused kernel)")


def operands_are(role: str, expected: Mapping[int, str], names: Sequence[str], name: str | None = None,
                 hint: str = "", fix: str = "", commutative: bool = False) -> Guard:
    """Operand order: operand `i` of `role` is the node bound to `expected[i]`.

    `names` are the operand role names of `role`'s op (e.g. `("x", "residual", "gamma", "beta")`). With
    `commutative`, the expected operands may come in any order among their positions (for an op that
    adds them: float addition is commutative, so either order computes the same numbers).
    """
    def ok(c: Ctx) -> bool:
        ins = c[role].inputs
        if any(i >= len(ins) for i in expected):
            return False
        if commutative:
            return sorted(ins[i] for i in expected) == sorted(c.id(r) for r in expected.values())
        return all(ins[i] == c.id(r) for i, r in expected.items())

    def explain(c: Ctx) -> str:
        ins = c[role].inputs
        have = ", ".join(f"{names[i]}={c.name_of(ins[i])}" for i in expected if i < len(ins))
        if commutative:
            want = (f"{{{', '.join(f'{role}.{names[i]}' for i in expected)}}} == "
                    f"{{{', '.join(c.label(r) for r in expected.values())}}} (in either order)")
        else:
            want = " and ".join(f"{role}.{names[i]} == {c.label(r)}" for i, r in expected.items())
        return f"{c.d(role)} reads {have}; needs {want}"

    def hl(c: Ctx) -> Highlight:
        ins = c[role].inputs
        return (c.id(role),), tuple((ins[i], c.id(role)) for i in expected if i < len(ins))

    return Guard(name or f"{role}_operand_order", ok, explain, hl, hint, (role, *expected.values()), NOT_RECOGNIZED,
                 fix)


def attr_eq(role: str, key: str, value: Any, name: str | None = None, hint: str = "", kind: str = NOT_RECOGNIZED,
            fix: str = "", explain: Callable[[Ctx], str] | None = None) -> Guard:
    """Attribute `key` of `role` equals `value`."""
    return Guard(name or f"{role}_{key}", lambda c: c[role].attrs.get(key) == value,
                 explain or (lambda c: f"{c.d(role)} has {key}={c[role].attrs.get(key)!r}; needs {key}={value!r}"),
                 lambda c: ((c.id(role),), ()), hint, (role,), kind, fix)


def size_le(param: str, measure: Callable[[Ctx], tuple[int, str]], what: str, name: str,
            role: str, hint: str = "", fix: str = "") -> Guard:
    """A size threshold read from pipeline parameter `param` (None = no limit).

    `measure(ctx)` returns `(value, how it was computed)`, e.g. `(128, "1*128")`.

    Raises:
        ParamError: `param` is no `PipelineParams` field but close to one (when the rule module is imported: a
            misspelt name would read as "no limit" and switch the gate off). A new name (a gate of the rule
            author's own) is declared by the guard (`Guard.params`) and accepted by pipelines holding its pass.
    """
    check_new_param(param, f"guard {name}")
    def ok(c: Ctx) -> bool:
        limit = c.params.get(param)
        return limit is None or measure(c)[0] <= limit

    def explain(c: Ctx) -> str:
        v, how = measure(c)
        return f"{c.d(role)} has {what} = {how} = {v}; the gate (pipeline param {param}) allows at most " \
               f"{c.params.get(param)}"

    return Guard(name, ok, explain, lambda c: ((c.id(role),), ()),
                 hint or f"raise or unset {param} (the canonical pipeline has no gate)", (role,), NOT_PROFITABLE, fix,
                 params=(param,))


def same_shape(a: str, b: str, name: str | None = None, hint: str = "", fix: str = "",
               kind: str = NOT_RECOGNIZED) -> Guard:
    """`a` and `b` have the same shape (no broadcasting); `kind` what a refusal says (`NOT_A_CANDIDATE` where a
    broadcast is a different computation, not a form of the fused one)."""
    return Guard(name or f"{a}_{b}_same_shape", lambda c: c[a].shape == c[b].shape,
                 lambda c: f"{c.d(a)} has shape {list(c[a].shape)} but {c.d(b)} has {list(c[b].shape)}; "
                           f"needs equal shapes (no broadcast)",
                 lambda c: ((c.id(a), c.id(b)), ()), hint, (a, b), kind, fix)


def all_single_use(roles: Sequence[str], name: str, hint: str = "", fix: str = "") -> Guard:
    """Every bound role in `roles` has exactly one user and is not a graph output (internal values)."""
    def bad(c: Ctx) -> str | None:
        for r in roles:
            if r in c and (len(c.users(r)) != 1 or c.graph.is_output(c.id(r))):
                return r
        return None

    def explain(c: Ctx) -> str:
        r = bad(c)
        assert r is not None
        return f"{_uses(c, r)}; every intermediate must have exactly 1 user and be no graph output"

    def hl(c: Ctx) -> Highlight:
        r = bad(c)
        return _edges_to_users(c, r) if r else ((), ())

    def subject(c: Ctx) -> int | None:
        r = bad(c)
        return c.id(r) if r else None

    def readers(c: Ctx) -> tuple[str, list[int]] | None:
        r = bad(c)
        return (r, _outside_readers(c, r)) if r else None

    return Guard(name, lambda c: bad(c) is None, explain, hl, hint or "make the intermediates single-use", (),
                 ILLEGAL, fix or _also_returns("the intermediate read elsewhere"), tuple(roles), subject,
                 remedy=READ_BY_MODEL, readers=readers)


def guard(name: str, check: Callable[[Ctx], bool], explain: Callable[[Ctx], str], hint: str = "",
          highlight: Callable[[Ctx], Highlight] | None = None, requires: Sequence[str] = (), *, kind: str,
          fix: str = "", reads: Sequence[str] = (), subject: Callable[[Ctx], int | None] | None = None,
          no_model_fix: Callable[[Ctx], str | None] | None = None, remedy: str = COMPILER_ONLY,
          optional: Sequence[str] = (),
          readers: Callable[[Ctx], tuple[str | int, Sequence[int]] | None] | None = None) -> Guard:
    """A one-off guard (keyword-friendly constructor). `kind` is required: `illegal`, `not recognized` or
    `not profitable`; `requires` (the first is the subject) and `reads` list every role the checks read, `optional`
    the roles they read only when bound (`Guard.optional`);
    `no_model_fix` says why no model change keeping the numbers helps (`Guard.no_model_fix`); `readers` makes it a
    reader guard (`Guard.readers`: its advice is `reader_advice`'s)."""
    return Guard(name, check, explain, highlight, hint, tuple(requires), kind, fix, tuple(reads), subject,
                 no_model_fix, remedy, tuple(optional), readers=readers)


__all__ = ["COMPILER_ONLY", "DOES_NOT_PAY", "EPILOGUE_ACTIVATIONS", "ILLEGAL", "IN_MODEL", "KINDS", "MODEL_TERM",
           "NOT_A_CANDIDATE", "NOT_NEAR_MISSES", "NO_MODEL_FIX", "UNCHECKED_FIX", "near_miss_kind", "READ_BY_MODEL",
           "REMEDIES",
           "NOT_PROFITABLE", "NOT_RECOGNIZED", "Ctx", "Guard",
           "Highlight", "RuleError", "activation_in", "all_single_use", "attr_eq",
           "guard", "not_output", "operands_are", "rank_eq", "rank_le", "reaches_output",
           "extra_readers_why", "live_nodes", "reader_advice", "role_name", "use_count", "KEEP_MATERIALISED",
           "RUN_DCE",
           "same_shape", "single_user", "size_le", "static_dim", "user_count"]
