"""Run any graph version on MLX.

A graph is turned once into a `Program`: its leaves in a fixed order (inputs, then params, by
node order; constants are baked in) and a function that walks the nodes in topological order
building lazy MLX arrays, dropping each value after its last use. Programs are cached by graph
version (a hash of the graph's IR text) and `LoweringOptions`; with `compile_graph=True` the walk is
wrapped in `mx.compile` (MLX then caches one trace per input shape). An executor belongs to one
session: it holds its device (`cpu` / `gpu`, default the GPU when present), its resolved lowering
options and its `MlxEmitter`; every program it builds runs on that device. Nothing is process-wide
except `default_executor()`, a convenience for scripts. Weights are converted to
`mx.array` once per source array and reused across versions and calls; nodes computed from weights
alone (e.g. the Q|K|V weight `concat` that `fuse_shared_input_matmul` leaves) are evaluated once
per weight set, not on every call.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir import Graph, Node, Op, format_node
from ..ir.onnx_op import host_run
from ..kernels.mlx_backend import mx
from .devices import mx_device, resolve_device
from .lowering import MX_DTYPES, LoweringError, LoweringOptions, MlxEmitter, lower_node
from .precision import precision_policy
from .static_share import SharedStatics, cone_keys


@dataclass
class Program:
    """A graph prepared for MLX.

    Nodes that depend only on params and constants (e.g. a Q|K|V weight `concat` left by
    `fuse_shared_input_matmul`) form the *static* part: `prepare(*params)` computes the values the
    rest of the graph reads from it, once per set of weights. `fn(*inputs, *static)` is the
    per-call part.

    Attributes:
        key: the graph's `Graph.digest`.
        inputs: input names, the leading arguments of `fn`.
        params: param names, the arguments of `prepare`.
        prepare: `prepare(*params) -> list[mx.array]` (the static values `fn` needs).
        fn: `fn(*inputs, *static) -> list[mx.array]` (the graph outputs, lazy).
        compiled: whether `fn` is `mx.compile`d.
        options: the resolved lowering options it was built with.
        n_static: number of compute nodes folded into `prepare`.
        device: `cpu` or `gpu`; `prepare` and `fn` run there.
    """

    key: str
    graph: Graph
    inputs: list[str]
    params: list[str]
    prepare: Callable[..., list[mx.array]]
    fn: Callable[..., list[mx.array]]
    compiled: bool
    options: LoweringOptions = field(default_factory=LoweringOptions)
    n_static: int = 0
    device: str = "cpu"
    static_keys: list[tuple[str, tuple[str, ...]] | None] = field(default_factory=list)
    """Per static value `prepare` returns: its cone key and param names (`static_share.cone_keys`), None for a leaf."""


def _const(node: Node) -> mx.array:
    with np.errstate(all="ignore"):  # a value its dtype cannot hold becomes inf, as the reference's cast: no warning
        return mx.array(np.asarray(node.attrs["value"], dtype=node.dtype.numpy)).astype(MX_DTYPES[node.dtype])


def check_gather_indices(graph: Graph, feeds: Mapping[str, Any], weights: Mapping[str, Any] | None = None) -> None:
    """Refuse a run whose `gather` indices fall outside their table (`-rows..rows-1`: negatives count from the end,
    in NumPy and MLX alike): MLX's `take` does not check them and reads outside the table (a segfault, or
    garbage). An index that is a graph input or a const is checked directly;
    one computed from them (e.g. `add(ids, const)`) is computed by the NumPy reference on the same feeds first.

    Raises:
        ValueError: one line naming the gather, the index values and the table's rows.
    """
    gathers = [n for n in graph if n.op == Op.GATHER and len(n.inputs) == 2]
    if not gathers:
        return
    values: dict[int, np.ndarray] = {}
    computed: list[int] = []
    for n in gathers:
        idx = graph[n.inputs[1]]
        if idx.op == Op.INPUT and idx.attrs.get("name") in feeds:
            values[idx.id] = np.asarray(feeds[idx.attrs["name"]])
        elif idx.op == Op.CONST:
            values[idx.id] = np.asarray(idx.attrs.get("value"))
        elif idx.op != Op.PARAM:
            computed.append(idx.id)
    if computed:
        from .reference import run_reference

        need: set[int] = set()
        stack = list(computed)
        while stack:
            i = stack.pop()
            if i not in need:
                need.add(i)
                stack.extend(graph[i].inputs)
        sub = Graph([n for n in graph if n.id in need], computed, graph.name)
        names = {n.attrs.get("name") for n in sub if n.op in (Op.INPUT, Op.PARAM)}
        arrays = {k: np.asarray(v) for k, v in {**(weights or {}), **feeds}.items() if k in names}
        outs = run_reference(sub, arrays, arrays)  # a gather among the index's own operands: its own ValueError
        values.update(zip(computed, outs, strict=True))
    from .reference import gather_out_of_range

    for n in gathers:
        v = values.get(n.inputs[1])
        if v is not None and (why := gather_out_of_range(graph, n, v)):
            raise ValueError(why)


def _eval_nodes(nodes: list[Node], env: dict[int, mx.array], frees: list[list[int]], e: MlxEmitter) -> None:
    with host_run():  # a multi-output host node (TopK) runs once per call, not once per output
        _eval_each(nodes, env, frees, e)


def _eval_each(nodes: list[Node], env: dict[int, mx.array], frees: list[list[int]], e: MlxEmitter) -> None:
    for n, done in zip(nodes, frees, strict=True):
        try:
            env[n.id] = lower_node(e, n, [env[i] for i in n.inputs])
        except LoweringError:
            raise
        except Exception as err:  # name the node whose lowering failed
            raise LoweringError(f"MLX lowering of %{n.id} failed: {err}\n  {format_node(n)}") from err
        for i in done:
            env.pop(i, None)


def _frees(nodes: list[Node], remaining: dict[int, int]) -> list[list[int]]:
    """For each node, the ids whose last use it is (graph outputs are never freed)."""
    out = []
    for n in nodes:
        done = []
        for i in dict.fromkeys(n.inputs):
            if i in remaining:
                remaining[i] -= 1
                if remaining[i] == 0:
                    done.append(i)
        out.append(done)
    return out


def _compiled_walk(walk: Callable[..., list[mx.array]], n_inputs: int, emitter: MlxEmitter
                   ) -> Callable[..., list[mx.array]]:
    """`walk(*inputs, *static)` with `walk` traced by `mx.compile` over the inputs only: the static values
    (weights, and what the program computed from them once) are captured as the trace's constants, one trace
    per set of static arrays (by identity; a new set, e.g. new weights, traces anew and drops the old one).
    Before tracing, the walk is built once untraced and the emitter's once-per-weight values made from it (the
    GEMM's panel layout: `PackedWeights.with_evaluated`) are evaluated, so the trace reads them as constants.

    Why: an array made inside a trace is a step of the trace, and a traced argument is a placeholder, so with
    the weights traced as arguments or packed during tracing the packing would rerun on every call. Measured
    2026-12-03, MiniLM B=1 fused, 2-core AMD EPYC (Zen 5): 12.7-16.4 ms per call so, 9.1-9.4 with the packed
    weights as constants, 9.5-10.7 not compiled."""
    held: list[tuple[tuple[mx.array, ...], Callable[..., list[mx.array]]]] = []

    def run(*args: mx.array) -> list[mx.array]:
        static = args[n_inputs:]
        same = held and len(held[0][0]) == len(static) and all(map(operator.is_, held[0][0], static))
        if not same:
            emitter.packing.with_evaluated(lambda: walk(*args))  # untraced; only the packed weights are evaluated
            held[:] = [(static, mx.compile(lambda *xs: walk(*xs, *static)))]
        return held[0][1](*args[:n_inputs])

    return run


def static_ids(graph: Graph) -> set[int]:
    """The ids of the nodes a program computes once, when it is prepared, not per call: params, consts and every
    node that reads only those (a `concat` of packed Q/K/V weights, a transposed weight). `build_program` splits on
    it; the time overlay leaves these nodes out of the per-call shares."""
    leaves = {Op.INPUT, Op.PARAM, Op.CONST}
    static: set[int] = set()
    for n in graph:
        if n.op in (Op.PARAM, Op.CONST) or (n.op not in leaves and n.inputs and all(i in static for i in n.inputs)):
            static.add(n.id)
    return static


def build_program(graph: Graph, emitter: MlxEmitter, compile_graph: bool, key: str | None = None) -> Program:
    """Split `graph` into its static (params/consts only, `static_ids`) and per-call parts and wrap both; both run
    on `emitter.device` with `emitter.options`."""
    static = static_ids(graph)
    inputs = [n for n in graph if n.op == Op.INPUT]
    params = [n for n in graph if n.op == Op.PARAM]
    dynamic = [n for n in graph.compute_nodes() if n.id not in static]
    static_nodes = [n for n in graph.compute_nodes() if n.id in static]
    # static values the per-call part reads (or that are graph outputs), in a fixed order
    frontier = list(dict.fromkeys([i for n in dynamic for i in n.inputs if i in static]
                                  + [o for o in graph.outputs if o in static]))
    consts = {n.id: _const(n) for n in graph if n.op == Op.CONST}
    uses = {n.id: graph.use_count(n) for n in graph}
    s_remaining = {i: sum(1 for n in static_nodes for j in dict.fromkeys(n.inputs) if j == i) for i in static}
    for i in frontier:
        s_remaining[i] = s_remaining.get(i, 0) + 1  # keep frontier values alive
    s_frees = _frees(static_nodes, s_remaining)
    d_frees = _frees(dynamic, {i: c for i, c in uses.items() if i not in static} | {i: 1 << 30 for i in frontier})

    device = mx_device(emitter.device)

    def prepare(*args: mx.array, reuse: Sequence[mx.array | None] = ()) -> list[mx.array]:
        """The static values; `reuse[j]`, when given, is taken as frontier value j (made by another program from
        the same params: `static_share`) and only the nodes the others need are evaluated."""
        env: dict[int, mx.array] = dict(consts)
        env.update({n.id: a for n, a in zip(params, args, strict=True)})
        known = {i: v for i, v in zip(frontier, reuse, strict=False) if v is not None}
        nodes, frees = static_nodes, s_frees
        if known:
            env.update(known)
            need, stack = set(), [i for i in frontier if i not in known]
            while stack:
                i = stack.pop()
                if i not in need and i not in known:
                    need.add(i)
                    stack.extend(graph[i].inputs)
            nodes = [n for n in static_nodes if n.id in need]
            left = {i: sum(1 for n in nodes for j in dict.fromkeys(n.inputs) if j == i) for i in need}
            frees = _frees(nodes, left | {i: left.get(i, 0) + 1 for i in frontier if i in need})
        with mx.stream(device):
            _eval_nodes(nodes, env, frees, emitter)
        return [env[i] for i in frontier]

    def walk(*args: mx.array) -> list[mx.array]:
        env: dict[int, mx.array] = {n.id: a for n, a in zip(inputs, args[:len(inputs)], strict=True)}
        env.update(zip(frontier, args[len(inputs):], strict=True))
        _eval_nodes(dynamic, env, d_frees, emitter)
        return [env[o] for o in graph.outputs]

    on_host = any(n.op == Op.ONNX_OP for n in dynamic)  # host nodes read values: no tracing through them
    inner = _compiled_walk(walk, len(inputs), emitter) if compile_graph and not on_host else walk

    def run(*args: mx.array) -> list[mx.array]:
        with mx.stream(device):
            return inner(*args)

    return Program(key or graph.digest, graph, [n.attrs["name"] for n in inputs], [n.attrs["name"] for n in params],
                   prepare, run, compile_graph, emitter.options, len(static_nodes), emitter.device,
                   cone_keys(graph, frontier, static))


class MlxExecutor:
    """Executes graph versions on MLX with cached programs and cached weights.

    Args:
        options: lowering options (fast math, attention kernel, compiling fused ops); fields left
            None take the device's choice (`lowering.DEVICE_LOWERING`).
        compile_graph: wrap each whole graph in `mx.compile`.
        device: `cpu`, `gpu`, or None / `auto` for the GPU when present.

    Raises:
        DeviceError: an unknown device, or `gpu` where MLX has none.

    Example:
        >>> ex = MlxExecutor(device="cpu")
        >>> outs = ex.run(graph, {"input_ids": ids, "attention_mask": m}, weights)  # doctest: +SKIP
    """

    def __init__(self, options: LoweringOptions | None = None, compile_graph: bool = False,
                 device: str | None = None) -> None:
        self.device = resolve_device(device)
        self.emitter = MlxEmitter(options, self.device)
        self.options = self.emitter.options
        self.precision = precision_policy(device=self.device)
        self.compile_graph = compile_graph
        self._programs: dict[tuple[str, LoweringOptions, bool], Program] = {}
        self._weights: dict[str, tuple[Any, mx.array]] = {}
        self._static: dict[tuple[str, LoweringOptions], tuple[tuple[mx.array, ...], list[mx.array]]] = {}
        self._shared = SharedStatics()  # static values versions share (`static_share`)

    # -- caches --------------------------------------------------------------------------------
    def key_of(self, graph: Graph) -> str:
        """The key of `graph`'s program: its content digest (`Graph.digest`, made once per graph)."""
        return graph.digest

    def program(self, graph: Graph) -> Program:
        """The cached `Program` for this graph version (built on first use)."""
        key = (self.key_of(graph), self.options, self.compile_graph)
        prog = self._programs.get(key)
        if prog is None:
            prog = self._programs[key] = build_program(graph, self.emitter, self.compile_graph, key[0])
        return prog

    def weight(self, name: str, value: Any, dtype: Any = None) -> mx.array:
        """`value` as an `mx.array` in MLX dtype `dtype` (default: float64 -> float32, others as
        given), converted once per source object and dtype."""
        key = name if dtype is None else f"{name}\0{dtype}"
        hit = self._weights.get(key)
        if hit is not None and hit[0] is value:
            return hit[1]
        arr = value if isinstance(value, mx.array) else mx.array(_f32(np.asarray(value)))
        if dtype is not None and arr.dtype != dtype:
            arr = arr.astype(dtype)
        mx.eval(arr)
        if hit is not None:  # a new array for this name: what was computed from the old one goes with it
            self._shared.forget([hit[1]])
        self._weights[key] = (value, arr)
        return arr

    def _host_view(self, weights: Mapping[str, Any], name: str, value: Any, dtype: Any) -> None:
        """On the CPU, let a weights mapping that can (`share_host`: `models.onnx.weights.LazyWeights`, weights read
        from an external-data file) hold a NumPy view of the MLX copy instead of its own array: one copy in memory.
        The cache entry then names the view, so the next bind finds it."""
        share = getattr(weights, "share_host", None)
        key = f"{name}\0{dtype}"
        hit = self._weights.get(key)
        if share is None or self.device != "cpu" or hit is None or hit[0] is not value or hit[1].dtype == mx.bfloat16:
            return
        try:
            view = np.asarray(hit[1])
        except (TypeError, ValueError, RuntimeError):  # no host view of this array
            return
        if share(name, value, view):
            self._weights[key] = (view, hit[1])

    def clear(self) -> None:
        """Drop cached programs and weights."""
        self._programs.clear()
        self._weights.clear()
        self._static.clear()
        self._shared.clear()
        self.emitter.packing.clear()

    # -- running ---------------------------------------------------------------------------------
    def bind(self, graph: Graph, feeds: Mapping[str, Any], weights: Mapping[str, Any] | None = None
             ) -> tuple[Program, list[mx.array]]:
        """The program and its positional arguments (feeds converted, weights from the cache).

        Raises:
            KeyError: a missing input or param (named).
            ValueError: a shape differs from the graph's, or a gather index is outside its table
                (`check_gather_indices`).
        """
        prog = self.program(graph)
        weights = weights or {}
        check_gather_indices(graph, feeds, weights)
        args: list[mx.array] = []
        shapes = {n.attrs["name"]: n for n in graph if n.op in (Op.INPUT, Op.PARAM)}
        for name in prog.inputs:
            if name not in feeds:
                raise KeyError(f"no value for input {name!r} (expected {shapes[name].type})")
            v = feeds[name]
            a = v if isinstance(v, mx.array) else mx.array(_f32(np.asarray(v)))
            want = MX_DTYPES[shapes[name].dtype]
            args.append(a if a.dtype == want else a.astype(want))  # each graph runs in its own dtype
        for name in prog.params:
            if name not in weights:
                raise KeyError(f"no value for param {name!r} (expected {shapes[name].type})")
            value, dtype = weights[name], MX_DTYPES[shapes[name].dtype]
            args.append(self.weight(name, value, dtype))
            self._host_view(weights, name, value, dtype)
        for name, a in zip(prog.inputs + prog.params, args, strict=True):
            if tuple(a.shape) != shapes[name].shape:
                raise ValueError(f"{name!r}: expected shape {list(shapes[name].shape)}, got {list(a.shape)}")
        n_in = len(prog.inputs)
        return prog, args[:n_in] + self.static_values(prog, args[n_in:])

    def static_values(self, prog: Program, params: list[mx.array]) -> list[mx.array]:
        """The program's static values for these param arrays, computed once (evaluated) and cached."""
        key = (prog.key, prog.options)
        hit = self._static.get(key)
        if hit is not None and len(hit[0]) == len(params) and all(a is b for a, b in zip(hit[0], params, strict=True)):
            return hit[1]
        if hit is not None:  # new weights for this program: the old ones' packed layouts go with them
            self.emitter.packing.drop(hit[1])
        by_name = dict(zip(prog.params, params, strict=True))
        shared = [None if k is None else ((k[0], prog.options), [by_name[n] for n in k[1]]) for k in prog.static_keys]
        reuse = [None if s is None else self._shared.get(*s) for s in shared]
        values = prog.prepare(*params, reuse=reuse)
        mx.eval(values)
        for s, v in zip(shared, values, strict=False):
            if s is not None:
                self._shared.put(s[0], s[1], v)
        self._static[key] = (tuple(params), values)
        return values

    def run_mx(self, graph: Graph, feeds: Mapping[str, Any], weights: Mapping[str, Any] | None = None
               ) -> list[mx.array]:
        """Run `graph` and return its outputs as evaluated `mx.array`s."""
        prog, args = self.bind(graph, feeds, weights)
        outs = prog.fn(*args)
        mx.eval(outs)
        return outs  # in the graph's dtypes (inputs and params are cast to their nodes' dtypes in `bind`)

    def run(self, graph: Graph, feeds: Mapping[str, Any], weights: Mapping[str, Any] | None = None
            ) -> list[np.ndarray]:
        """Run `graph` on MLX; returns the outputs as NumPy arrays (same order as `graph.outputs`;
        bfloat16 outputs come back as float32, NumPy having no bfloat16)."""
        return [np.array(o.astype(mx.float32) if o.dtype == mx.bfloat16 else o)
                for o in self.run_mx(graph, feeds, weights)]

    def eager(self, graph: Graph, feeds: Mapping[str, Any], weights: Mapping[str, Any] | None = None,
              repeat: int = 1) -> Iterator[tuple[Node, mx.array, float]]:
        """Evaluate `graph` node by node (eager: each compute node on its own, `mx.eval` after it), in
        topological order; yields `(node, value, seconds)` per compute node, `seconds` the fastest of
        `repeat` evaluations. A value is dropped after its last use (and once the caller moves on), so
        at most the live values of the schedule are held, as in a lazy run.

        Raises:
            KeyError / ValueError: as `bind` (names, shapes, gather indices).
        """
        self.bind(graph, feeds, weights)  # validates names and shapes
        weights = weights or {}
        remaining = {n.id: graph.use_count(n) for n in graph}
        keep = set(graph.outputs)
        env: dict[int, mx.array] = {}
        with mx.stream(mx_device(self.device)):
            for n in graph:
                if n.op == Op.INPUT:
                    v = feeds[n.attrs["name"]]
                    env[n.id] = v if isinstance(v, mx.array) else mx.array(_f32(np.asarray(v)))
                    continue
                if n.op == Op.PARAM:
                    env[n.id] = self.weight(n.attrs["name"], weights[n.attrs["name"]])
                    continue
                if n.op == Op.CONST:
                    env[n.id] = _const(n)
                    mx.eval(env[n.id])
                    continue
                operands = [env[i] for i in n.inputs]
                best = float("inf")
                for _ in range(max(1, repeat)):
                    t = time.perf_counter()
                    out = lower_node(self.emitter, n, operands)
                    mx.eval(out)
                    best = min(best, time.perf_counter() - t)
                env[n.id] = out
                for i in set(n.inputs):
                    remaining[i] -= 1
                    if remaining[i] == 0 and i not in keep:
                        del env[i]
                yield n, out, best
                if remaining[n.id] == 0 and n.id not in keep:
                    env.pop(n.id, None)

    def profile(self, graph: Graph, feeds: Mapping[str, Any], weights: Mapping[str, Any] | None = None,
                repeat: int = 3) -> list[dict[str, Any]]:
        """Per-op wall time of an eager run (each node evaluated on its own, best of `repeat`; `eager`).

        Returns:
            One dict per compute node: `id`, `op`, `path`, `ms` (fastest of `repeat` runs).
            Eager evaluation forgoes MLX's cross-op scheduling, so the sum exceeds a lazy run.
        """
        return [{"id": n.id, "op": n.op.value, "path": n.path, "ms": s * 1e3}
                for n, _v, s in self.eager(graph, feeds, weights, repeat)]


def _f32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32) if a.dtype == np.float64 else a


_DEFAULT: MlxExecutor | None = None


def default_executor() -> MlxExecutor:
    """A process-wide executor for scripts (default device and its lowering, no whole-graph compile).
    Sessions create their own `MlxExecutor(device=...)`."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = MlxExecutor()
    return _DEFAULT


def run_mlx(graph: Graph, feeds: Mapping[str, Any], weights: Mapping[str, Any] | None = None,
            executor: MlxExecutor | None = None) -> list[np.ndarray]:
    """Run `graph` on MLX with `executor` (default: `default_executor()`); outputs as NumPy arrays."""
    return (executor or default_executor()).run(graph, feeds, weights)


__all__: Sequence[str] = ["MlxExecutor", "Program", "default_executor", "run_mlx", "static_ids"]
