"""Misspellings in rule code, found when the rule module is imported: what a step or guard body names by literal.

A guard or a `@reports` step reads roles through its context (`c["bias"]`, `c.id("mm")`, `"act" in c`), writes
roles (`c.bindings["act"] = ...`), keeps per-match state (`c.data["n"]`), reads pipeline parameters
(`c.params.get("fab_max_tokens")`) and refuses with `Fail(stage, "guard_name", ...)`. Each of these is a string, and
before this module a misspelt one ran silently: `"bais" in c` made a guard always refuse, `c.data.get("fil")` made
an attribute None, a step's undeclared guard name never reached `NEAR_MISSES`. `scan(fn)` reads the function's own
source (its `ast`, found through `fn.__code__`) and lists those literals; `guard.Guard`, `rule.reports` and
`rule.check_roles` compare them with what the guard or step declares and raise `RuleError` at import.

Only literals are seen: `c[f"mm{i}"]` or a role held in a variable is the factories' business (`single_user(role)`
checks `role` against the rule's bindings already). A function whose source cannot be read (built by `exec`, a C
function, a `functools.partial`) is not checked. The context is the function's first parameter; a nested lambda or
helper that takes the context under the same name is read with it.
"""

from __future__ import annotations

import ast
import difflib
import linecache
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

CTX_READS = frozenset({"id", "d", "users", "label"})
"""`Ctx` methods whose first argument is a role."""

CTX_NAMES = frozenset({"c", "ctx"})
"""Names a context goes by in module-wide scans (`data_keys`)."""


@dataclass
class Uses:
    """The literals a function names through its context `ctx` (each a set of strings)."""

    roles_read: set[str] = field(default_factory=set)
    roles_written: set[str] = field(default_factory=set)
    data_read: set[str] = field(default_factory=set)
    data_written: set[str] = field(default_factory=set)
    params: set[str] = field(default_factory=set)
    fail_guards: set[str] = field(default_factory=set)
    attrs_built: dict[str, set[str]] = field(default_factory=dict)
    """`(Op.NAME, operands, {"key": ...})` returned by a build: op member name -> attribute keys."""
    attrs_read: set[tuple[str, str]] = field(default_factory=set)
    """`c["role"].attrs["key"]` / `.attrs.get("key")`: (role, key)."""


_TREES: dict[str, tuple[str, ast.Module, dict[int, list[ast.AST]]]] = {}
"""filename -> (source, its tree, line -> the lambdas and defs on it), reparsed when the source changes."""


def _parsed(filename: str) -> tuple[str, ast.Module, dict[int, list[ast.AST]]] | None:
    lines = linecache.getlines(filename)
    if not lines:
        return None
    text = "".join(lines)
    got = _TREES.get(filename)
    if got is None or got[0] != text:
        try:
            tree = ast.parse(text, filename)
        except SyntaxError:
            return None
        at: dict[int, list[ast.AST]] = {}
        for n in ast.walk(tree):
            if isinstance(n, ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef):
                at.setdefault(n.lineno, []).append(n)
                if not isinstance(n, ast.Lambda) and n.decorator_list:
                    at.setdefault(n.decorator_list[0].lineno, []).append(n)
        got = _TREES[filename] = (text, tree, at)
    return got


def _node_of(fn: Any) -> ast.Lambda | ast.FunctionDef | None:
    """The `ast` node that defines `fn` (a lambda or a def), or None when its source is not at hand."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    got = _parsed(code.co_filename)
    if got is None:
        return None
    first = code.co_firstlineno
    here = got[2].get(first, [])
    if code.co_name == "<lambda>":
        cols = [p[2] for p in code.co_positions()  # RESUME and the like span nothing (col 0 to 0)
                if p[0] == first and p[2] is not None and p[3] is not None and p[3] > p[2]]
        lams = [n for n in here if isinstance(n, ast.Lambda) and len(n.args.args) == code.co_argcount]
        if cols:  # the innermost lambda that starts before the body's first instruction
            before = [n for n in lams if n.col_offset <= min(cols)]
            lams = sorted(before, key=lambda n: n.col_offset)[-1:] or lams
        return lams[0] if len(lams) == 1 else None
    defs = [n for n in here if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == code.co_name]
    return defs[0] if len(defs) == 1 else None  # type: ignore[return-value]


def _str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _is(node: ast.AST, names: Iterable[str]) -> bool:
    return isinstance(node, ast.Name) and node.id in names


def _field(node: ast.AST, names: Iterable[str], attr: str) -> bool:
    """`node` is `<ctx>.attr` (`c.bindings`, `c.data`, `c.params`)."""
    return isinstance(node, ast.Attribute) and node.attr == attr and _is(node.value, names)


def _dict_keys(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Dict):
        return [k for k in map(_str, node.keys) if k is not None]
    return []


def _attrs_of(node: ast.AST, names: frozenset[str]) -> str | None:
    """The role in `c["role"].attrs` (or `c[...]` spelt through `c.bindings`), else None."""
    if not (isinstance(node, ast.Attribute) and node.attr == "attrs" and isinstance(node.value, ast.Subscript)):
        return None
    return _str(node.value.slice) if _is(node.value.value, names) else None


def _walk(body: ast.AST, names: frozenset[str], out: Uses) -> None:
    for n in ast.walk(body):
        if isinstance(n, ast.Subscript) and (key := _str(n.slice)) is not None:
            store = isinstance(n.ctx, ast.Store | ast.Del)
            if (role := _attrs_of(n.value, names)) is not None:
                out.attrs_read.add((role, key))
            elif _is(n.value, names):
                out.roles_read.add(key)
            elif _field(n.value, names, "bindings"):
                (out.roles_written if store else out.roles_read).add(key)
            elif _field(n.value, names, "data"):
                (out.data_written if store else out.data_read).add(key)
            elif _field(n.value, names, "params"):
                out.params.add(key)
        elif isinstance(n, ast.Compare) and len(n.ops) == 1 and isinstance(n.ops[0], ast.In | ast.NotIn):
            key, right = _str(n.left), n.comparators[0]
            if key is None:
                continue
            if _is(right, names) or _field(right, names, "bindings"):
                out.roles_read.add(key)
            elif _field(right, names, "data"):
                out.data_read.add(key)
            elif _field(right, names, "params"):
                out.params.add(key)
        elif isinstance(n, ast.Call):
            _call(n, names, out)
        elif isinstance(n, ast.Return | ast.Lambda) and isinstance(n.body if isinstance(n, ast.Lambda) else n.value,
                                                                    ast.Tuple):
            _built(n.body if isinstance(n, ast.Lambda) else n.value, out)  # type: ignore[arg-type]


def _call(n: ast.Call, names: frozenset[str], out: Uses) -> None:
    f, args = n.func, n.args
    if _is(f, {"Fail"}):
        guard = _str(args[1]) if len(args) > 1 else next((_str(k.value) for k in n.keywords if k.arg == "guard"), None)
        if guard:
            out.fail_guards.add(guard)
        return
    if not isinstance(f, ast.Attribute):
        return
    first = _str(args[0]) if args else None
    if f.attr == "get" and first is not None and (role := _attrs_of(f.value, names)) is not None:
        out.attrs_read.add((role, first))
        return
    if _is(f.value, names):
        if f.attr in CTX_READS and first is not None:
            out.roles_read.add(first)
        elif f.attr == "the" and len(args) > 1 and (role := _str(args[1])) is not None:
            out.roles_read.add(role)
        return
    for attr, read, written in (("bindings", out.roles_read, out.roles_written),
                                ("data", out.data_read, out.data_written)):
        if _field(f.value, names, attr):
            if f.attr in ("get", "pop") and first is not None:
                read.add(first)
            elif f.attr == "setdefault" and first is not None:
                written.add(first)
            elif f.attr == "update":
                written.update(k for a in args for k in _dict_keys(a))
                written.update(k.arg for k in n.keywords if k.arg)
    if _field(f.value, names, "params") and f.attr == "get" and first is not None:
        out.params.add(first)


def _built(t: ast.Tuple, out: Uses) -> None:
    """`(Op.NAME, operands, {"key": ...})`: the attribute keys a build gives a fused op."""
    if len(t.elts) != 3 or not isinstance(t.elts[0], ast.Attribute) or not _is(t.elts[0].value, {"Op"}):
        return
    if isinstance(t.elts[2], ast.Dict) and all(k is not None for k in t.elts[2].keys):
        out.attrs_built.setdefault(t.elts[0].attr, set()).update(_dict_keys(t.elts[2]))


_SCANS: dict[tuple[str, CodeType], Uses | None] = {}
"""(filename, code object) -> `scan`'s answer. A rule factory makes new guard and step functions every time a rule
is built (a what-if's pipeline without one guard builds its rules again), all sharing their code objects: each is
read once. Code objects compare by their content (their name, first line, bytecode and constants), so equal ones
name the same literals. Read-only for callers."""


def scan(fn: Callable[..., Any] | None) -> Uses | None:
    """The literals `fn` names through its first parameter (the context), or None when its source is not at hand
    or it takes no parameter. One reading per code object (`_SCANS`): the `Uses` returned is shared, not to be
    changed."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    key = (code.co_filename, code)
    if key not in _SCANS:
        _SCANS[key] = _scan(fn)
    return _SCANS[key]


def _scan(fn: Callable[..., Any]) -> Uses | None:
    node = _node_of(fn)
    if node is None or not node.args.args:
        return None
    out = Uses()
    body = node.body if isinstance(node, ast.Lambda) else ast.Module(body=node.body, type_ignores=[])
    _walk(body, frozenset({node.args.args[0].arg}), out)
    if isinstance(body, ast.Tuple):  # a lambda build: its body is the returned tuple
        _built(body, out)
    return out


def data_keys(fns: Iterable[Any]) -> tuple[set[str], set[str]]:
    """`(written, read)`: the `c.data` keys written and read anywhere in the modules that define `fns` (a step
    keeps state a helper of its module reads, so the module, not the step, is the unit). The context is
    recognized by name (`CTX_NAMES`)."""
    written: set[str] = set()
    read: set[str] = set()
    files = {fn.__code__.co_filename for fn in fns if hasattr(fn, "__code__")}
    for name in sorted(files):
        u = _module_uses(name)
        if u is not None:
            written |= u.data_written
            read |= u.data_read
    return written, read


_MODULE_USES: dict[str, tuple[str, Uses]] = {}
"""filename -> (source, what its whole tree names through `CTX_NAMES`): a module of many rules is walked once, not
once per rule (47 walks took most of `import rlxviz.passes`)."""


def _module_uses(filename: str) -> Uses | None:
    """What module `filename` names through a context anywhere (`_walk` over its tree), reread when its source
    changes; None when its source is not at hand."""
    got = _parsed(filename)
    if got is None:
        return None
    memo = _MODULE_USES.get(filename)
    if memo is None or memo[0] is not got[0]:
        u = Uses()
        _walk(got[1], CTX_NAMES, u)
        memo = _MODULE_USES[filename] = (got[0], u)
    return memo[1]


def close(word: str, known: Iterable[str]) -> str:
    """`; did you mean 'bias'?` for the nearest of `known` (difflib, cutoff 0.5: two-letter roles too), or empty."""
    near = difflib.get_close_matches(word, sorted(set(known)), n=2, cutoff=0.5)
    return f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""


__all__ = ["CTX_NAMES", "CTX_READS", "Uses", "close", "data_keys", "scan"]
