"""The import's driver: `import_graph` maps an `onnx.ModelProto` (validated, its inputs bound) node by node to the IR,
folding what depends only on constants (`fold`), mapping each node with its op's handler (`handlers`), keeping a
default-domain op no handler maps as an opaque host node (`host._host_op`), and naming the bound shape an export's fixed
tensor cannot take (`_misfit`). The package docstring (`rlxviz.models.onnx`) states what the import guarantees.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...ir import Builder, Graph, lint
from ...ir.bounded import Deadline
from ...ir.emitter import Ref
from ...ir.graph import SMALL_VALUE
from ...ir.lint import problems
from ..module_calls import number_calls
from . import handlers  # noqa: F401 - each family's handlers register into HANDLERS
from .bind import _bind_input, _same_symbols
from .context import HANDLERS, OnnxImportError, UnsupportedForm, Value, _Ctx, _onnx, node_label, onnx_dtype
from .fold import FOLDABLE, FoldError, _shape_op, check_fold, fold, node_attrs
from .handlers.contrib import place_opening_norms
from .handlers.quant import quant_paths
from .host import _host_op
from .paths import agreed_paths, node_path
from .validate import _contrib_inputs, default_opset, validate
from .weights import ExternalTensor, LazyWeights, bind_external, read_on_demand, transposed_view

MAX_IMPORT_SECONDS = 120.0
"""CPU time one import may take (an export of a 7B model maps in seconds); past it, or past `bounded.WALL_FACTOR`
times it in wall time (a stopped or starved process), the import stops, naming the node it reached, so no upload
holds a server's worker for long. CPU time, not wall time: a busy machine does not refuse a good file."""


def _misfit(ctx: _Ctx, node: Any, ins: list[Value]) -> str | None:
    """Why the bound shapes do not fit what the export fixed, in one sentence naming the limit, or None: a Gather
    whose constant indices run past a table (a position table of N rows: `seq 65 is over the 64 positions of the
    export's position table 'wpe.weight'`), or an Expand of a fixed-shape tensor to a shape it cannot broadcast
    to (a buffer traced at one sequence length). Checked before the node is folded or mapped, so the user reads
    the limit, not NumPy's IndexError/broadcast message. Raises nothing."""
    if node.domain not in ("", "ai.onnx") or len(ins) < 2 or ins[0] is None or ins[1] is None:
        return None
    where = f"({node_label(node)})"
    if node.op_type == "Gather" and isinstance(ins[1], np.ndarray) and ins[1].size:
        shape = ctx.shape(ins[0])
        if not shape:
            return None
        axis = int(node_attrs(node).get("axis", 0)) % len(shape)
        rows, hi, lo = shape[axis], int(ins[1].max()), int(ins[1].min())
        if lo >= -rows and hi < rows:
            return None
        table = ctx.value_names.get(ins[0], node.input[0])
        if ctx.seq is not None and hi + 1 == ctx.seq and lo >= 0:
            return f"seq {ctx.seq} is over the {rows} positions of the export's position table {table!r} {where}"
        bad = hi if hi >= rows else lo
        return f"index {bad} is outside the {rows} rows of {table!r} (axis {axis}) {where}"
    if node.op_type == "Expand" and isinstance(ins[1], np.ndarray):
        s, t = ctx.shape(ins[0]), tuple(int(d) for d in ins[1].reshape(-1))
        if (neg := next((d for d in t if d < 0), None)) is not None:  # Expand has no -1 (Reshape's "infer")
            return f"Expand's shape {list(t)} holds the negative dimension {neg} {where}"
        try:
            np.broadcast_shapes(s, t)
            return None
        except ValueError:
            pass
        n = max(len(s), len(t))
        s1, t1 = (1,) * (n - len(s)) + tuple(s), (1,) * (n - len(t)) + t
        axis = next((i for i in range(n) if s1[i] != 1 and t1[i] != 1 and s1[i] != t1[i]), None)
        if axis is None:
            return f"{list(s)} cannot expand to {list(t)} {where}"
        name = ctx.value_names.get(ins[0], node.input[0])
        fixed = f"the export's fixed-shape tensor {name!r} {list(s)}"
        if ctx.seq is not None and t1[axis] == ctx.seq:
            return (f"seq {ctx.seq} is over the {s1[axis]} positions of {fixed} (it cannot expand to {list(t)}) "
                    f"{where}")
        return f"{fixed} cannot expand to {list(t)}: axis {axis - (n - len(s))} holds {s1[axis]} {where}"
    return None


def import_graph(proto: Any, batch: int = 1, seq: int = 128, input_shapes: Mapping[str, Sequence[int]] | None = None,
                 name: str | None = None, max_bytes: int | None = None,
                 external: Mapping[str, ExternalTensor] | None = None,
                 ) -> tuple[Graph, Mapping[str, np.ndarray], dict[int, tuple[str, str, str]]]:
    """An IR graph, its weights and per-node ONNX provenance from an `onnx.ModelProto` (external data loaded, except
    the initializers in `external`: `weights.split_external`, left in their file, each a param at its first use).

    Returns:
        (graph, weights: param name -> array (an `weights.LazyWeights` when `external` names a used
        initializer), provenance: IR node id -> (op_type, node name, doc_string)).

    Raises:
        OnnxImportError: unsupported opset, dtype, unbound or non-positive dimension, a node reading a value
            nothing produced, a folded constant over `max_bytes` (with the constants already held), or
            unmappable ops (all listed at once).
    """
    from onnx import numpy_helper

    opset = default_opset(proto)
    validate(proto)
    g = proto.graph
    shapes = dict(input_shapes or {})
    b = Builder(name or g.name or "onnx")
    weights: dict[str, np.ndarray] = {}
    ctx = _Ctx(b, opset, weights, seq=seq, max_bytes=max_bytes)
    env: dict[str, Value] = {}
    pending = dict(external or {})
    lazy: dict[str, ExternalTensor] = {}

    def lazy_param(t: ExternalTensor) -> Ref:  # named and placed as `_Ctx.ref` names and places an initializer
        base = t.name if "." in t.name or not b.path else f"{b.path}.{t.name}"
        lazy[pname := ctx._unique(base)] = t
        return b.param(pname, t.shape, onnx_dtype(t.data_type))

    for init in g.initializer:
        if init.name in pending:
            continue
        arr = numpy_helper.to_array(init)
        env[init.name] = arr
        ctx.held_bytes += arr.nbytes
        ctx.value_names[arr] = init.name
    bound: dict[str, tuple[int, str]] = {}  # symbolic dimension -> (size, the input that bound it)
    for vi in g.input:
        if vi.name in env or vi.name in pending:
            continue
        shape, dtype = _bind_input(vi, batch, seq, shapes)
        if vi.name in shapes and (why := _same_symbols(vi, shape, bound)):
            raise OnnxImportError(why)
        if vi.name in shapes and len(shape) >= 2:
            ctx.seq = int(shape[1])  # shapes from the caller's arrays: their seq is the one bound
        env[vi.name] = b.input(vi.name, shape, dtype)
        ctx.names.add(vi.name)
    provenance: dict[int, tuple[str, str, str]] = {}
    unmapped: dict[str, list[str]] = {}
    errors: list[str] = []
    poisoned: set[str] = set()
    deadline = Deadline(MAX_IMPORT_SECONDS)
    given = number_calls([node_path(node) for node in g.node])  # one layer module called N times: N layers
    paths = quant_paths(g.node, given)  # a quantizer's Q/DQ nodes: the path of the value they quantize
    paths = agreed_paths(g.node, paths, given)  # other inserted nodes (MatMulInteger): the layer the exporter's
    # nodes next to them agree on (a Q/DQ node's lent path casts no vote)
    for node, path in zip(g.node, paths, strict=True):
        if late := deadline.exceeded():  # every step is bounded; this bounds their sum (a graph of 10^6 nodes)
            ctx.node = node
            raise OnnxImportError(str(ctx.fail(f"the import has {late}; stopped here (a graph of {len(g.node):,} "
                                               f"nodes)")))
        if any(i in poisoned for i in node.input if i):
            poisoned.update(node.output)
            continue
        if pending:
            if transposed_view(pending, node, env):  # a Transpose of a weight in its file: read transposed
                continue
            if (table := read_on_demand(pending, node, env)) is not None:  # a table selected by constants
                ctx.held_bytes += table.nbytes
                ctx.value_names[table] = node.input[0]
            b.path = path
            bind_external(pending, node.input, env, lazy_param)
        if (missing := next((i for i in node.input if i and i not in env), None)) is not None:
            ctx.node = node
            raise OnnxImportError(str(ctx.fail(f"reads {missing!r}, which no earlier node or input produces "
                                               f"(a cycle or a dangling input)")))
        ins: list[Value] = [env[i] if i else None for i in node.input]
        attrs = node_attrs(node)
        ctx.node = node
        b.path = path  # before anything emits: a handler's nodes and a host node carry this node's path
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        try:
            if (misfit := _misfit(ctx, node, ins)) is not None:
                raise OnnxImportError(misfit)
            if domain == "" and node.op_type in ("Shape", "Size"):
                outs: list[Value] = [_shape_op(ctx, node, ins, attrs)]
            elif domain == "" and node.op_type in FOLDABLE and all(isinstance(v, np.ndarray) or v is None
                                                                  for v in ins):
                try:
                    check_fold(node, ins, opset, ctx.held_bytes, ctx.max_bytes)  # type: ignore[arg-type]
                except FoldError as e:
                    raise ctx.fail(str(e)) from None
                outs = fold(node, ins, opset)  # type: ignore[arg-type]
                ctx.held_bytes += sum(o.nbytes for o in outs if isinstance(o, np.ndarray))
            elif (domain, node.op_type) in HANDLERS:
                if (domain or not _onnx().defs.has(node.op_type)) and (why := _contrib_inputs(node, domain)):
                    raise ctx.fail(why)
                first = b._next
                try:
                    outs = HANDLERS[(domain, node.op_type)](ctx, node, ins, attrs)
                except UnsupportedForm:
                    # a valid form the handler does not map (GatherND with computed indices): an opaque host node
                    # when it refused before emitting anything and the host can type it; else its error
                    if b._next != first or (hosts := _host_op(ctx, node, ins, domain)) is None:
                        raise
                    outs = hosts  # type: ignore[assignment]
                for i in range(first, b._next):
                    provenance[i] = (node.op_type, node.name, node.doc_string)
            elif (hosts := _host_op(ctx, node, ins, domain)) is not None:
                for host in hosts:
                    if host is not None:
                        provenance[int(host)] = (node.op_type, node.name, node.doc_string)
                outs = hosts  # type: ignore[assignment]
            else:
                key = node.op_type if domain == "" else f"{domain}.{node.op_type}"
                unmapped.setdefault(key, []).append(node.name or "(unnamed)")
                poisoned.update(node.output)
                continue
        except OnnxImportError as e:
            errors.append(str(e))
            poisoned.update(node.output)
            continue
        except Exception as e:  # noqa: BLE001 - a shape/type error in one node becomes a named error
            said = " ".join(str(e).split())
            errors.append(f"{node_label(node)} (opset {opset}): {type(e).__name__}"
                          f"{': ' + said if said else ' (with no message: a step of its import found no value)'}")
            poisoned.update(node.output)
            continue
        for out_name, v in zip(node.output, outs, strict=False):
            if out_name:
                env[out_name] = v
                if isinstance(v, np.ndarray):
                    ctx.value_names.setdefault(v, out_name)
    if unmapped:
        listing = "; ".join(f"{op} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                            for op, names in sorted(unmapped.items()))
        raise OnnxImportError(f"{len(unmapped)} op(s) cannot be mapped to the IR (opset {opset}): {listing}")
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise OnnxImportError(errors[0] + more)
    b.path = ""
    bind_external(pending, [o.name for o in g.output], env, lazy_param)
    outs = []
    for o in g.output:
        v = env.get(o.name)
        if v is None:
            raise OnnxImportError(f"graph output {o.name!r} is not produced by any node")
        outs.append(ctx.ref(v))
    b.output(*outs)
    place_opening_norms(b, getattr(ctx, "opening_norms", ()))  # ORT's split norms: the layer they open
    from ...passes.pipeline import run_pass

    # the small weights' values go with the graph before lint: an `onnx_op` whose output shape ONNX infers from a
    # constant input (Resize's sizes) is checked with that value, as `_host_op` typed it (`ir.host_rules`)
    built = b.build().with_values({k: v for k, v in weights.items() if v.size <= SMALL_VALUE})
    if bad := problems(built):  # a rank, dtype or attribute the IR cannot hold: named by the ONNX node it came from
        nid, msg = bad[0]
        made = provenance.get(nid) if nid is not None else None
        where = (f"{made[0]} node {made[1]!r}" if made else
                 f"{built[nid].op.value} {built[nid].attrs.get('name')!r}" if nid is not None else "the graph")
        raise OnnxImportError(f"{where} (opset {opset}): {msg}")
    graph = lint(run_pass(built, "dead_code_elimination"), "onnx import")
    used = {n.name for n in graph.params}
    weights = {k: v for k, v in weights.items() if k in used}
    small = {k: v for k, v in weights.items() if v.size <= SMALL_VALUE}  # what guards on constant tables read
    lazy = {k: t for k, t in lazy.items() if k in used}
    return graph.with_values(small), LazyWeights(weights, lazy) if lazy else weights, provenance


__all__ = ["MAX_IMPORT_SECONDS", "import_graph"]
