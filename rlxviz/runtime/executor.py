"""Run any graph version on MLX.

A graph is turned once into a `Program`: its leaves in a fixed order (inputs, then params, by
node order; constants are baked in) and a function that walks the nodes in topological order
building lazy MLX arrays, dropping each value after its last use. Programs are cached by graph
version (a hash of the graph's IR text) and `LoweringOptions`; with `compile_graph=True` the walk is
wrapped in `mx.compile` (MLX then caches one trace per input shape). Weights are converted to
`mx.array` once per source array and reused across versions and calls.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir import Graph, Node, Op, format_graph, format_node
from .lowering import MX_DTYPES, LoweringError, LoweringOptions, lower_node, using
from .mlx_backend import mx


def graph_key(graph: Graph) -> str:
    """A fingerprint of a graph version: sha1 of its IR text (ids, ops, attrs, types, outputs)."""
    text = format_graph(graph) + "\noutputs " + ",".join(map(str, graph.outputs))
    return hashlib.sha1(text.encode()).hexdigest()


@dataclass
class Program:
    """A graph prepared for MLX: leaf order, the node walk, and (optionally) its `mx.compile`d form.

    Attributes:
        key: `graph_key` of the graph.
        inputs: input names in the order the function takes them.
        params: param names, after the inputs.
        fn: `fn(*inputs, *params) -> list[mx.array]` (the graph outputs, lazy).
        compiled: whether `fn` is `mx.compile`d.
    """

    key: str
    graph: Graph
    inputs: list[str]
    params: list[str]
    fn: Callable[..., list[mx.array]]
    compiled: bool
    options: LoweringOptions = field(default_factory=LoweringOptions)


def _const(node: Node) -> mx.array:
    return mx.array(np.asarray(node.attrs["value"], dtype=node.dtype.numpy)).astype(MX_DTYPES[node.dtype])


def _walker(graph: Graph, options: LoweringOptions) -> tuple[list[str], list[str], Callable[..., list[mx.array]]]:
    leaves = [n for n in graph if n.op in (Op.INPUT, Op.PARAM)]
    inputs = [n for n in leaves if n.op == Op.INPUT]
    params = [n for n in leaves if n.op == Op.PARAM]
    order = inputs + params
    consts = {n.id: _const(n) for n in graph if n.op == Op.CONST}
    compute = graph.compute_nodes()
    uses = {n.id: graph.use_count(n) for n in graph}
    # ids whose value can be dropped right after node k ran
    frees: list[list[int]] = []
    remaining = dict(uses)
    for n in compute:
        done = []
        for i in dict.fromkeys(n.inputs):
            remaining[i] -= 1
            if remaining[i] == 0:
                done.append(i)
        frees.append(done)

    def run(*args: mx.array) -> list[mx.array]:
        env: dict[int, mx.array] = dict(consts)
        for n, a in zip(order, args, strict=True):
            env[n.id] = a
        with using(options):
            for n, done in zip(compute, frees, strict=True):
                try:
                    env[n.id] = lower_node(n, [env[i] for i in n.inputs])
                except LoweringError:
                    raise
                except Exception as e:  # name the node whose lowering failed
                    raise LoweringError(f"MLX lowering of %{n.id} failed: {e}\n  {format_node(n)}") from e
                for i in done:
                    env.pop(i, None)
        return [env[o] for o in graph.outputs]

    return [n.attrs["name"] for n in inputs], [n.attrs["name"] for n in params], run


class MlxExecutor:
    """Executes graph versions on MLX with cached programs and cached weights.

    Args:
        options: lowering options (fast math, attention kernel, compiling fused ops).
        compile_graph: wrap each whole graph in `mx.compile`.

    Example:
        >>> ex = MlxExecutor()
        >>> outs = ex.run(graph, {"input_ids": ids, "attention_mask": m}, weights)  # doctest: +SKIP
    """

    def __init__(self, options: LoweringOptions | None = None, compile_graph: bool = False) -> None:
        self.options = options or LoweringOptions()
        self.compile_graph = compile_graph
        self._programs: dict[tuple[str, LoweringOptions, bool], Program] = {}
        self._keys: dict[int, tuple[Graph, str]] = {}
        self._weights: dict[str, tuple[Any, mx.array]] = {}

    # -- caches --------------------------------------------------------------------------------
    def key_of(self, graph: Graph) -> str:
        hit = self._keys.get(id(graph))
        if hit is not None and hit[0] is graph:
            return hit[1]
        k = graph_key(graph)
        self._keys[id(graph)] = (graph, k)  # holding the graph keeps its id from being reused
        return k

    def program(self, graph: Graph) -> Program:
        """The cached `Program` for this graph version (built on first use)."""
        key = (self.key_of(graph), self.options, self.compile_graph)
        prog = self._programs.get(key)
        if prog is None:
            inputs, params, run = _walker(graph, self.options)
            fn = mx.compile(run) if self.compile_graph else run
            prog = self._programs[key] = Program(key[0], graph, inputs, params, fn, self.compile_graph, self.options)
        return prog

    def weight(self, name: str, value: Any) -> mx.array:
        """`value` as an `mx.array`, converted once per source object (float64 -> float32)."""
        hit = self._weights.get(name)
        if hit is not None and hit[0] is value:
            return hit[1]
        arr = value if isinstance(value, mx.array) else mx.array(_f32(np.asarray(value)))
        mx.eval(arr)
        self._weights[name] = (value, arr)
        return arr

    def clear(self) -> None:
        """Drop cached programs and weights."""
        self._programs.clear()
        self._keys.clear()
        self._weights.clear()

    # -- running ---------------------------------------------------------------------------------
    def bind(self, graph: Graph, feeds: Mapping[str, Any], weights: Mapping[str, Any] | None = None
             ) -> tuple[Program, list[mx.array]]:
        """The program and its positional arguments (feeds converted, weights from the cache).

        Raises:
            KeyError: a missing input or param (named).
            ValueError: a shape differs from the graph's.
        """
        prog = self.program(graph)
        weights = weights or {}
        args: list[mx.array] = []
        shapes = {n.attrs["name"]: n for n in graph if n.op in (Op.INPUT, Op.PARAM)}
        for name in prog.inputs:
            if name not in feeds:
                raise KeyError(f"no value for input {name!r} (expected {shapes[name].type})")
            v = feeds[name]
            args.append(v if isinstance(v, mx.array) else mx.array(_f32(np.asarray(v))))
        for name in prog.params:
            if name not in weights:
                raise KeyError(f"no value for param {name!r} (expected {shapes[name].type})")
            args.append(self.weight(name, weights[name]))
        for name, a in zip(prog.inputs + prog.params, args, strict=True):
            if tuple(a.shape) != shapes[name].shape:
                raise ValueError(f"{name!r}: expected shape {list(shapes[name].shape)}, got {list(a.shape)}")
        return prog, args

    def run_mx(self, graph: Graph, feeds: Mapping[str, Any], weights: Mapping[str, Any] | None = None
               ) -> list[mx.array]:
        """Run `graph` and return its outputs as evaluated `mx.array`s."""
        prog, args = self.bind(graph, feeds, weights)
        outs = prog.fn(*args)
        mx.eval(outs)
        return outs

    def run(self, graph: Graph, feeds: Mapping[str, Any], weights: Mapping[str, Any] | None = None
            ) -> list[np.ndarray]:
        """Run `graph` on MLX; returns the outputs as NumPy arrays (same order as `graph.outputs`)."""
        return [np.array(o) for o in self.run_mx(graph, feeds, weights)]

    def profile(self, graph: Graph, feeds: Mapping[str, Any], weights: Mapping[str, Any] | None = None,
                repeat: int = 3) -> list[dict[str, Any]]:
        """Per-op wall time of an eager run (each node evaluated on its own, best of `repeat`).

        Returns:
            One dict per compute node: `id`, `op`, `path`, `ms` (fastest of `repeat` runs).
            Eager evaluation forgoes MLX's cross-op scheduling, so the sum exceeds a lazy run.
        """
        _, args = self.bind(graph, feeds, weights)
        env: dict[int, mx.array] = {}
        leaves = [n for n in graph if n.op in (Op.INPUT, Op.PARAM)]
        for n, a in zip([n for n in leaves if n.op == Op.INPUT] + [n for n in leaves if n.op == Op.PARAM], args,
                        strict=True):
            env[n.id] = a
        rows = []
        with using(self.options):
            for n in graph:
                if n.op == Op.CONST:
                    env[n.id] = _const(n)
                    mx.eval(env[n.id])
                if n.op in (Op.INPUT, Op.PARAM, Op.CONST):
                    continue
                operands = [env[i] for i in n.inputs]
                best = float("inf")
                for _ in range(max(1, repeat)):
                    t = time.perf_counter()
                    out = lower_node(n, operands)
                    mx.eval(out)
                    best = min(best, time.perf_counter() - t)
                env[n.id] = out
                rows.append({"id": n.id, "op": n.op.value, "path": n.path, "ms": best * 1e3})
        return rows


def _f32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32) if a.dtype == np.float64 else a


_DEFAULT: MlxExecutor | None = None


def default_executor() -> MlxExecutor:
    """A process-wide executor (fast math, composed attention on CPU, no whole-graph compile)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = MlxExecutor()
    return _DEFAULT


def run_mlx(graph: Graph, feeds: Mapping[str, Any], weights: Mapping[str, Any] | None = None,
            executor: MlxExecutor | None = None) -> list[np.ndarray]:
    """Run `graph` on MLX with `executor` (default: `default_executor()`); outputs as NumPy arrays."""
    return (executor or default_executor()).run(graph, feeds, weights)


__all__: Sequence[str] = ["MlxExecutor", "Program", "default_executor", "graph_key", "run_mlx"]
