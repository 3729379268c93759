"""The verifier, run after every pass in every build.

Checks what RLX's debug-only `verify` checks (docs/rlx.md §1.6) and what it misses (§7.12):
dangling ids, cycles and order, unique output ids, arity, attribute names/types/choices, unique
non-empty input/param names, const payloads, and the shape and dtype of every node, fused ones included.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Set
from typing import Any

import numpy as np

from .dtype import DType
from .graph import Graph, GraphError, toposort
from .host_rules import HostCheck, onnx_op_problems
from .infer import ShapeError, TensorType, infer
from .node import Node
from .ops import SPECS, Op, const_shape
from .printer import format_node, window


def problems(graph: Graph) -> list[tuple[int | None, str]]:
    """Every problem found, as `(node id or None, message)`; empty when the graph is valid."""
    out: list[tuple[int | None, str]] = []
    nodes = {n.id: n for n in graph}
    try:
        toposort(nodes)
    except GraphError as e:
        return [(e.node_id, str(e))]
    pos = {nid: k for k, nid in enumerate(nodes)}
    if not graph.outputs:
        out.append((None, "graph has no outputs"))
    for o in graph.outputs:
        if o not in nodes:
            out.append((None, f"output %{o} does not exist"))
    names: dict[tuple[Op, str], int] = {}
    hosts: list[Node] = []
    for n in graph:
        if not isinstance(n.dtype, DType) or not all(type(d) is int and d >= 0 for d in n.shape):
            out.append((n.id, f"declared type needs a DType and non-negative int dims, got {n.dtype!r} {n.shape!r}"))
            continue
        if msg := _check_type(n):
            out.append((n.id, msg))
            continue
        late = [i for i in n.inputs if pos[i] > pos[n.id]]
        if late:
            out.append((n.id, f"uses %{late[0]}, which is defined after it (not in topological order)"))
            continue
        msg = _check_signature(n)
        if msg:
            out.append((n.id, msg))
            continue
        if n.op in (Op.INPUT, Op.PARAM):
            key = (n.op, n.attrs["name"])
            if not str(key[1]).strip():
                out.append((n.id, f"{n.op.value} name {key[1]!r} is empty; give every input and param a name "
                                  "(inputs are fed and exported by name)"))
                continue
            if key in names:
                out.append((n.id, f"{n.op.value} name {n.attrs['name']!r} already used by %{names[key]}"))
            names[key] = n.id
            continue
        if n.op == Op.CONST:
            msg = _check_const(n)
            if msg:
                out.append((n.id, msg))
            continue
        try:
            t = infer(n.op, n.attrs, [nodes[i].type for i in n.inputs])
        except ShapeError as e:
            out.append((n.id, str(e)))
            continue
        if t != TensorType(n.shape, n.dtype):
            out.append((n.id, f"declared type {n.type} but operands give {t}"))
        elif n.op == Op.GATHER and (msg := _check_gather_consts(nodes, n, {i for i, _ in out})):
            out.append((n.id, msg))
        elif n.op == Op.ONNX_OP:
            hosts.append(n)
    if hosts:  # checked together: one forked child for the nodes not checked before (`host_rules`)
        found = onnx_op_problems([_host_check(nodes, n, graph.values) for n in hosts])
        out.extend((n.id, msg) for n, msg in zip(hosts, found, strict=True) if msg)
        out.sort(key=lambda p: -1 if p[0] is None else pos.get(p[0], -1))  # stable: graph order, as before
    return out


MAX_RANK = 32
"""Highest tensor rank accepted (NumPy 1.x and MLX stop at 32 or 64 dimensions; transformer graphs use at most 5)."""


NO_EMPTY_TENSORS = ("rlxviz does not support empty tensors (a dimension of size 0: MLX hangs or raises on softmax, "
                    "norms and reductions over an empty axis)")
"""Why a graph holds no empty tensor, as a front end says it when a size of 0 is asked for (`--dim NAME=0`)."""


def _check_type(n: Node) -> str | None:
    """Why the declared type of `n` cannot be run, or None: a rank over `MAX_RANK`, or a dimension of size 0
    (an empty tensor: reductions, softmax, norms and gathers over an empty axis have no value, and MLX hangs or
    raises on them; no fusion lesson needs one, so every front end refuses them here)."""
    if len(n.shape) > MAX_RANK:
        return f"type {n.dtype}[...] has rank {len(n.shape)} (at most {MAX_RANK} dimensions are supported)"
    if 0 in n.shape:
        return f"type {n.type} has a dimension of size 0 (empty tensors are not supported)"
    return None


def _check_signature(n: Node) -> str | None:
    spec = SPECS[n.op]
    k = len(n.inputs)
    if spec.arity is None and k < 1:
        return f"{n.op.value} needs at least 1 operand, got 0"
    if spec.arity is not None and k not in spec.arity:
        want = " or ".join(map(str, spec.arity))
        return f"{n.op.value} takes {want} operand(s), got {k}"
    for key in n.attrs:
        if key not in spec.attrs:
            return f"unknown attribute {key!r} for {n.op.value} (allowed: {', '.join(spec.attrs) or 'none'})"
    for key, a in spec.attrs.items():
        if key not in n.attrs:
            if a.required:
                return f"missing attribute {key!r}"
            continue
        v = n.attrs[key]
        if not isinstance(v, a.types) or (isinstance(v, bool) and bool not in a.types):
            names = "/".join("none" if t is type(None) else t.__name__ for t in a.types)
            return f"attribute {key}={v!r} must be {names}"
        if a.choices is not None and v not in a.choices:
            return f"attribute {key}={v!r} must be one of {list(a.choices)}"
        if a.items is not None and isinstance(v, tuple):
            bad = [x for x in v if not isinstance(x, a.items) or (isinstance(x, bool) and bool not in a.items)]
            if bad:
                names = "/".join(t.__name__ for t in a.items)
                return f"attribute {key}={v!r} must hold {names} values, got {bad[0]!r}"
    return None


def _check_const(n: Node) -> str | None:
    want = const_shape(n.attrs["value"])
    if want is None:
        return "const payload is ragged or holds a non-number (needs nested lists of numbers)"
    if n.shape != want:
        return f"const payload has shape {list(want)} but the node declares {list(n.shape)}"
    todo = [n.attrs["value"]]
    while todo:  # every scalar of the (nested) payload
        x = todo.pop()
        if isinstance(x, tuple):
            todo.extend(x)
        elif msg := _const_fits(x, n.dtype):
            return msg
    return None


_EXACT_CAP = 1 << 16
"""Largest index array lint evaluates exactly; past it (e.g. concats of concats) only the set of values is kept."""


def _index_values(nodes: dict[int, Node], root: int, invalid: Set[int | None] = frozenset()
                  ) -> tuple[bool, np.ndarray] | None:
    """The values node `root` is known to hold when it is computed from consts alone by reshape, transpose, narrow,
    expand, concat and int -> i64 casts: `(True, array)` exactly, `(False, values)` when only the set of values
    is known (after an expand, or a concat with a non-const operand: every value listed still reaches the output),
    None when nothing is known. Bounded: exact arrays stay under `_EXACT_CAP` elements (the payloads are in the
    text), expands are never materialized. A node of `invalid` (one lint already refused: an operand missing, an
    attribute of the wrong type) is never read: its value is unknown."""
    memo: dict[int, tuple[bool, np.ndarray] | None] = {}
    order, todo = [], [root]
    while todo:  # post-order without recursion
        k = todo.pop()
        if k in memo:
            continue
        memo[k] = None
        if k in invalid:
            continue
        order.append(k)
        src = nodes[k]
        if src.op in (Op.RESHAPE, Op.TRANSPOSE, Op.NARROW, Op.EXPAND, Op.CONCAT, Op.CAST):
            todo.extend(src.inputs)
    for k in reversed(order):
        src = nodes[k]
        ins = [memo.get(i) for i in src.inputs]
        v: tuple[bool, np.ndarray] | None = None
        if src.op == Op.CONST:
            v = (True, np.array(src.attrs["value"], dtype=object).reshape(src.shape))
        elif src.op == Op.CAST:
            if ins and ins[0] is not None and src.dtype == DType.i64 and nodes[src.inputs[0]].dtype.is_int:
                v = ins[0]
        elif src.op == Op.CONCAT:
            known = [x for x in ins if x is not None]
            if known and len(known) == len(ins) and all(e for e, _ in known) and math.prod(src.shape) <= _EXACT_CAP:
                v = (True, np.concatenate([a for _, a in known], axis=src.attrs["axis"]))
            elif known:
                v = (False, np.unique(np.concatenate([a.ravel() for _, a in known])))
        elif src.op in (Op.RESHAPE, Op.TRANSPOSE, Op.NARROW, Op.EXPAND) and ins[0] is not None:
            exact, a = ins[0]
            if src.op == Op.EXPAND:
                v = (False, np.unique(a.ravel()))
            elif not exact:
                v = None if src.op == Op.NARROW else ins[0]
            elif src.op == Op.RESHAPE:
                v = (True, a.reshape(src.shape))
            elif src.op == Op.TRANSPOSE:
                v = (True, np.transpose(a, src.attrs["perm"]))
            else:  # narrow
                sl = [slice(None)] * a.ndim
                sl[src.attrs["axis"]] = slice(src.attrs["start"], src.attrs["start"] + src.attrs["length"])
                v = (True, a[tuple(sl)])
        memo[k] = v
    return memo[root]


def _host_check(nodes: dict[int, Node], n: Node, values: Mapping[str, Any]) -> HostCheck:
    """What `host_rules.onnx_op_problems` checks of the `onnx_op` node `n` (the importer's rules): its attributes,
    operand types, and the operand values known (const payloads, the params whose value the graph holds)."""
    known: list[np.ndarray | None] = []
    for i in n.inputs:
        src = nodes[i]
        v: Any = None
        if src.op == Op.CONST:
            v = np.array(src.attrs["value"], dtype=src.dtype.numpy).reshape(src.shape)
        elif src.op == Op.PARAM and src.attrs["name"] in values:
            v = np.asarray(values[src.attrs["name"]])
        known.append(v)
    return n.attrs, [(nodes[i].dtype, nodes[i].shape) for i in n.inputs], known


def _check_gather_consts(nodes: dict[int, Node], n: Node, invalid: Set[int | None] = frozenset()) -> str | None:
    """Why a gather's constant indices fall outside its table, or None. Indices computed from consts alone
    (see `_index_values`; the nodes of `invalid` read as unknown) must lie in 0..rows-1 (negative ones wrap in
    NumPy, not in every lowering)."""
    table = nodes[n.inputs[0]]
    if not table.shape:
        return None
    rows = table.shape[0]
    known = _index_values(nodes, n.inputs[1], invalid)
    if known is None:
        return None
    flat = known[1].ravel()
    bad = [x for x in flat if not 0 <= x < rows]
    if not bad:
        return None
    src = next((k for k in _const_sources(nodes, n.inputs[1]) if bad[0] in _flat(nodes[k].attrs["value"])), None)
    where = f" (from %{src})" if src is not None else ""
    return (f"const index {bad[0]!r}{where} is out of range for table {table.type}: "
            f"axis 0 has {rows} rows (valid indices 0..{rows - 1})")


def _const_sources(nodes: dict[int, Node], root: int) -> list[int]:
    out, todo, seen = [], [root], set()
    while todo:
        k = todo.pop()
        if k not in seen:
            seen.add(k)
            if nodes[k].op == Op.CONST:
                out.append(k)
            else:
                todo.extend(nodes[k].inputs)
    return sorted(out)


def _flat(v: object) -> list[object]:
    out, todo = [], [v]
    while todo:
        x = todo.pop()
        if isinstance(x, tuple):
            todo.extend(x)
        else:
            out.append(x)
    return out


_INT_RANGE = {DType.i8: (-128, 127), DType.u8: (0, 255),
              DType.i32: (-(1 << 31), (1 << 31) - 1), DType.i64: (-(1 << 63), (1 << 63) - 1)}
_FLOAT_MAX = {DType.f16: (65504.0, 2.0**4), DType.bf16: ((2 - 2.0**-7) * 2.0**127, 2.0**119),
              DType.f32: ((2 - 2.0**-23) * 2.0**127, 2.0**103), DType.f64: (1.7976931348623157e308, math.inf)}
"""Largest finite value of each float dtype and half its last step: a value at or past `max + half` rounds to inf
(round to nearest, ties to even: the largest finite value has an odd mantissa)."""


def _const_fits(x: object, dtype: DType) -> str | None:
    """Why the payload `x` would change meaning when materialized as `dtype` (a bool const holding 4.0
    becomes True, i.e. 1; an int const holding 2.5 becomes 2), or None. Float payloads round as usual."""
    if dtype == DType.bool:
        if isinstance(x, bool) or x in (0, 1):
            return None
        return f"const value {x!r} is not a bool (true, false, 0 or 1); as bool it would become {bool(x)}"
    if dtype.is_int:
        lo, hi = _INT_RANGE[dtype]
        if isinstance(x, float) and not x.is_integer():
            return f"const value {x!r} is not an integer; as {dtype} it would be truncated"
        if isinstance(x, int | float) and not lo <= x <= hi:
            return f"const value {x!r} is outside the {dtype} range {lo}..{hi}"
    if dtype.is_float and not isinstance(x, bool) and isinstance(x, int | float):
        big, half = _FLOAT_MAX[dtype]
        if math.isfinite(x) and abs(x) >= big + half:  # an explicit inf/-inf/nan literal stays what it says
            return f"const value {x!r} is not finite in {dtype} (largest {big:.8g}); as {dtype} it would become " \
                   f"{'-' if x < 0 else ''}inf"
    return None


_LINE_BREAKS = re.compile("[\x00-\x1f\x7f\u2028\u2029]")


def _one_line(text: str) -> str:
    """`text` with its control characters and line breaks written as escapes (`\\n`), so a node path or name
    holding a line break cannot cut the reason off where a front end keeps a message's first line."""
    return _LINE_BREAKS.sub(lambda m: repr(m.group())[1:-1], text)


def lint(graph: Graph, stage: str = "") -> Graph:
    """Verify `graph`; returns it unchanged when valid.

    Raises:
        GraphError: for the first problem, naming the node (op, model path) and quoting the IR
            lines around it; the message ends with a count of further problems.
    """
    found = problems(graph)
    if not found:
        return graph
    nid, msg = found[0]
    msg = _one_line(msg)
    where = f" after {stage}" if stage else ""
    head = f"lint{where}: graph {graph.name!r}: "
    reason = msg
    if nid is not None and nid in graph:
        n = graph[nid]
        reason = _one_line(f"%{nid} ({n.op.value}{' @' + n.path if n.path else ''}): {msg}")
        head += f"{reason}\n{window(graph, nid)}"
    else:
        head += msg
    if len(found) > 1:
        head += f"\n(+{len(found) - 1} more problem(s))"
    raise GraphError(head, nid, reason)


__all__ = ["MAX_RANK", "lint", "problems", "format_node"]
