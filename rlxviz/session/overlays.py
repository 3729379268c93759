"""Per-node figures of one graph version for colour overlays: each node's share of the measured time, or each
node's numeric error against the reference evaluation of version 0. One service for every front end: the app's
overlay selector and `rlxviz overlay` call `node_figures`.

* `time`: every compute node of the version evaluated on its own on MLX (`MlxExecutor.eager`, fastest of
  `repeat`), its share of the sum; a node that reads only weights (`runtime.executor.static_ids`: a packed
  weight `concat`) is computed once when a program is prepared, not per call, so it has no share (`note` says
  so). Eager evaluation forgoes MLX's cross-op scheduling: the shares say where the time goes, the sum exceeds a
  lazy run (as `benchmarks/profile_ops.py`, which calls the same executor walk).
* `error`: each node's value in this version on MLX against the float64 oracle (`runtime.reference`) of the
  same node in version 0, matched by identity (`origins`): max |value - reference| in the tensor's own units, and
  its colour and order by that error over the tensor's scale (max |reference|): f32 rounding of a tensor whose
  values run to 40 is 40x that of one whose values stay under 1, and one colour for both told rounding from a
  fault (a last layer's f32 rounding took the overlay's worst bins). A quantized graph's reference is version 0
  on MLX in its own dtype instead (`runtime.precision.judge_of`, as `rlxviz time` judges it: the float64 oracle
  rounds values on a quantization step's boundaries a step away).

Both are bounded: the memory budget (`Limits`) is checked before anything is allocated, and a run past its time
limit stops between nodes and says how far it got (`NodeFigures.note`).

Example:
    >>> figs = node_figures(trace, 3, "error", feeds, weights)   # doctest: +SKIP
    >>> figs.lines()[0]                                            # doctest: +SKIP
    '%41 layer_norm  6e-08 of max |ref| 4 (abs 2.4e-07)'
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..ir import Graph, Op
from ..ir.memory import node_bytes, workload_peak
from ..passes import Trace
from .errors import LimitError, SessionError
from .limits import Limits, human_bytes

KINDS = ("time", "error")
"""What a node overlay shows: its share of the measured time, or its error against version 0's reference."""

UNITS = {"time": "% of the per-node time (each node on its own, fastest of the rounds)",
         "error": "max |value - reference of version 0| / max |reference| (float64 oracle): the error in the "
                  "tensor's own scale; lightest: within the rounding expected for the node (its longest sum of K "
                  "terms x eps, f32 eps 1.2e-07), orange to red: past that rounding, by size"}
"""The legend's unit line per kind."""

EPS = {"f64": 2.0 ** -52, "f32": 2.0 ** -23, "f16": 2.0 ** -10, "bf16": 2.0 ** -7}
"""Machine epsilon per float dtype (`ir.DType` value): the spacing of floats at 1 (f32 1.2e-07, f16 9.8e-04, bf16
7.8e-03)."""

SUMMING = frozenset({Op.MATMUL, Op.FUSED_MATMUL_BIAS_ACT, Op.FUSED_SWIGLU, Op.SOFTMAX, Op.LAYER_NORM, Op.RMS_NORM,
                     Op.FUSED_RESIDUAL_LN, Op.FUSED_RESIDUAL_RMS_NORM, Op.CUMSUM})
"""Ops each of whose output elements sums the last axis of their first operand (a dot product, a softmax's or a
norm's denominator, a running sum): their reduction length is that axis."""

BLOCKS = frozenset({Op.FUSED_ATTENTION_BLOCK, Op.FUSED_TRANSFORMER_LAYER, Op.ONNX_OP})
"""Ops that hold several sums of their own (a whole attention block or layer, a host op): their reduction length is
the longest last axis of any operand (hidden, the FFN width), the longest single sum inside them."""


def reduction_length(g: Graph, node_id: int) -> int:
    """How many terms one output element of node `node_id` of `g` sums (K of an f32 sum of K products, 1 for an
    element-wise op): the last axis of the first operand for `SUMMING` ops, the reduced elements for `reduce_*`,
    the head dimension plus the key length for `attention`, the longest operand axis for `BLOCKS`."""
    n = g[node_id]
    ins = [g[i] for i in n.inputs if i in g]
    if not ins or not ins[0].shape:
        return 1
    if n.op == Op.ATTENTION and len(ins) >= 2 and ins[1].shape:
        return int(ins[0].shape[-1]) + int(ins[1].shape[-2] if len(ins[1].shape) >= 2 else 1)
    if n.op in (Op.REDUCE_SUM, Op.REDUCE_MEAN):
        return max(1, int(np.prod(ins[0].shape)) // max(1, int(np.prod(n.shape))))
    if n.op in SUMMING:
        return max(1, int(ins[0].shape[-1]))
    if n.op in BLOCKS:
        return max(1, *(int(m.shape[-1]) for m in ins if m.shape))
    return 1


def expected_rounding(g: Graph, cap: float | None = None) -> dict[int, float]:
    """Node id -> the relative error (over the tensor's scale, as `NodeFigures.relative`) that rounding in `g`'s
    dtype is expected to leave in that node's value against the float64 oracle: `K x eps`, eps the dtype's (`EPS`)
    and K the longest sum (`reduction_length`) on any path into the node, the node's own included: the worst case
    of one f32 sum of K products (sqrt(K) x eps is typical), inherited by the element-wise ops after it (a bias add
    after a matmul rounds like the matmul). Capped at `cap`: the relative tolerance of the product's own "same
    numbers" check (`runtime.precision.TABLE`'s vs-oracle rtol for the graph's dtype: f32 1e-3), so no error
    `rlxviz time` would fail is ever drawn as rounding. Sums across layers are not added (a value through six
    layers may round past one sum's worst case: it shows as the first bin past the rounding)."""
    from ..runtime.precision import graph_dtype

    eps = EPS.get(graph_dtype(g).value, EPS["f32"])
    longest: dict[int, int] = {}
    for n in g:
        own = reduction_length(g, n.id) if n.op not in (Op.INPUT, Op.PARAM, Op.CONST) else 1
        longest[n.id] = max([own, *(longest.get(i, 1) for i in n.inputs)])
    return {i: min(k * eps, cap) if cap is not None else k * eps for i, k in longest.items()}


DEFAULT_TIME_LIMIT_S = 60.0
"""Wall time one overlay run may take; past it the run stops between nodes and keeps what it measured."""


@dataclass(frozen=True)
class NodeFigures:
    """One figure per node of one version.

    Attributes:
        kind: `time` or `error` (`KINDS`).
        version: index into `trace.versions()`; label: its label (`after fuse_sdpa`).
        values: node id -> figure: for `time` the node's ms, for `error` its max abs error (nan: not finite
            where the reference is, or the other way round).
        total_ms: `time` only: the sum of the nodes' ms.
        scales: `error` only: node id -> max |reference| of its counterpart in version 0 (the tensor's scale).
        unmatched: `error` only: compute nodes with no counterpart in version 0 (no figure).
        note: why the figures are partial (time limit), '' when complete.
        against: `error` only: what version 0's values were computed with (`float64 oracle`, or `version 0 on MLX
            in f32` for a quantized graph).
        expected: `error` only: node id -> the relative error its dtype's rounding is expected to leave there
            (`expected_rounding`, of its counterpart in version 0); a node at or under it is drawn as rounding
            (`viz.heat`'s lightest fill), whatever its bin.
    """

    kind: str
    version: int
    label: str
    values: dict[int, float] = field(default_factory=dict)
    total_ms: float = 0.0
    unmatched: tuple[int, ...] = ()
    note: str = ""
    scales: dict[int, float] = field(default_factory=dict)
    against: str = "float64 oracle"
    expected: dict[int, float] = field(default_factory=dict)

    @property
    def unit(self) -> str:
        return UNITS[self.kind].replace("float64 oracle", self.against)

    def share(self, node_id: int) -> float:
        """`time`: the node's fraction of `total_ms` (0..1)."""
        return self.values.get(node_id, 0.0) / self.total_ms if self.total_ms > 0 else 0.0

    def relative(self, node_id: int) -> float:
        """`error`: the node's max abs error over its scale (`scales`); an all-zero reference keeps the error as it
        is (over a scale of 1: a tensor that should be zeros reads as far off as it is); nan where not finite."""
        v, scale = self.values[node_id], self.scales.get(node_id, 0.0)
        return v / scale if scale > 0 else v

    def shown(self, node_id: int) -> float:
        """The figure a colour bin and the order read: the time share, or the relative error."""
        return self.share(node_id) if self.kind == "time" else self.relative(node_id)

    def figure(self, node_id: int) -> str:
        """The node's figure in words ('' for a node without one): `12.3% (0.41 ms)`, or the relative error with
        the scale and the error in the tensor's units: `6e-08 of max |ref| 4 (abs 2.4e-07)`."""
        if node_id not in self.values:
            return ""
        v = self.values[node_id]
        if self.kind == "time":
            return f"{self.share(node_id):.1%} ({v:.3g} ms)"
        if v != v:
            return "not finite"
        if v == 0:
            return "0 (exact)"
        text = f"{self.relative(node_id):.2g} of max |ref| {self.scales.get(node_id, 0.0):.2g} (abs {v:.2g})"
        if node_id in self.expected:
            within = "within" if self.rounding(node_id) else "past"
            text += f"; {within} the rounding expected there ({self.expected[node_id]:.2g})"
        return text

    def rounding(self, node_id: int) -> bool:
        """`error`: the node's relative error is at or under the rounding expected for it (`expected`); False
        without an expectation or for a non-finite error."""
        x = self.relative(node_id)
        return node_id in self.expected and x == x and x <= self.expected[node_id]

    def lines(self, graph: Graph | None = None, top: int | None = None) -> list[str]:
        """One line per node with a figure, largest first (`%41 layer_norm  6e-08 of max |ref| 4 (abs 2.4e-07)`)."""
        def key(i: int) -> tuple[float, int]:
            x = self.shown(i)
            return (-(x if x == x else float("inf")), i)

        order = sorted(self.values, key=key)
        out = []
        for i in order[:top]:
            op = f" {graph[i].op.value}" if graph is not None and i in graph else ""
            out.append(f"%{i}{op}  {self.figure(i)}")
        return out

    def render(self, graph: Graph | None = None, top: int = 20) -> str:
        """The CLI's text: a heading with the unit, then the `top` largest figures."""
        head = f"{self.kind} per node, {self.label}: {self.unit}"
        if self.kind == "time":
            head += f"; sum {self.total_ms:.3g} ms"
        if self.unmatched:
            head += f"; {len(self.unmatched)} node(s) without a counterpart in version 0"
        body = self.lines(graph, top)
        more = len(self.values) - len(body)
        tail = [f"... {more} more"] if more > 0 else []
        return "\n".join([head, *([self.note] if self.note else []), *body, *tail])


def origins(trace: Trace, version: int) -> dict[int, int]:
    """Node id in version `version` -> the id in version 0 whose value it stands for.

    A node a pass kept has the same id before and after it (the same value). A node a pass made stands for the
    node whose readers it took over: a reader kept by the pass reads it where it read that node before (at the
    same operand position), or it is the graph output at the position that node held; else (its readers were made
    by the same pass: chained fusions) the one node it absorbed, of its type, that something outside the absorbed
    set reads (the engine's `absorbed_escape` guard lets only the result escape). The types must agree. Followed
    pass by pass; a node with no such counterpart (several candidates: a multi-output rewrite's narrows) is left
    out.
    """
    steps = trace.steps[:version]
    now = {n.id: n.id for n in trace.input}
    for s in steps:
        before, after = s.before, s.after
        nxt = {i: now[i] for i in now if i in after and i in before}
        for n in after:
            if n.id in before or n.op in (Op.INPUT, Op.PARAM, Op.CONST):
                continue
            was = _replaced(before, after, n.id)
            if was is not None and was in now and before[was].type == n.type:
                nxt[n.id] = now[was]
        now = nxt
    return now


def _replaced(before: Graph, after: Graph, new: int) -> int | None:
    """The id in `before` that node `new` of `after` replaced (see `origins`), or None."""
    for u in after.users(new):
        if u.id in before and len(before[u.id].inputs) == len(u.inputs):
            for k, j in enumerate(u.inputs):
                if j == new and before[u.id].inputs[k] not in after:
                    return before[u.id].inputs[k]
    for k, j in enumerate(after.outputs):
        if j == new and k < len(before.outputs) and before.outputs[k] not in after:
            return before.outputs[k]
    absorbed = {int(i) for i in after[new].absorbed} & {n.id for n in before}
    escaping = [a for a in absorbed if before[a].type == after[new].type
                and (a in before.outputs or any(u.id not in absorbed for u in before.users(a)))]
    return escaping[0] if len(escaping) == 1 else None


def node_figures(trace: Trace, version: int, kind: str, feeds: Mapping[str, np.ndarray],
                 weights: Mapping[str, np.ndarray], *, repeat: int = 3, device: str | None = "cpu",
                 limits: Limits | None = None, time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> NodeFigures:
    """The figure of every compute node of version `version` of `trace` (see the module docstring).

    Args:
        trace: the pipeline run.
        version: index into `trace.versions()` (0: the input).
        kind: `time` or `error`.
        feeds / weights: NumPy arrays by name (the session's inputs).
        repeat: `time`: evaluations per node (the fastest counts).
        device: MLX device (`cpu`, `gpu`, None: MLX's default).
        limits: the memory budget (default `Limits.resolve()`).
        time_limit_s: wall time after which the run stops between nodes (partial figures, `note` says so).

    Raises:
        SessionError: an unknown kind or version.
        LimitError: the run would hold more than the memory budget (checked before anything is allocated).
    """
    from ..runtime.executor import MlxExecutor
    from ..runtime.precision import graph_dtype, judge_of
    from ..runtime.reference import reference_values

    versions = trace.versions()
    if kind not in KINDS:
        raise SessionError(f"unknown overlay {kind!r}; one of {', '.join(KINDS)}")
    if not 0 <= version < len(versions):
        raise SessionError(f"version {version} is not in this run (0..{len(versions) - 1})")
    label, g = versions[version]
    limits = limits or Limits.resolve()
    deadline = time.perf_counter() + time_limit_s
    ex = MlxExecutor(device=device)
    if kind == "time":
        from ..runtime.executor import static_ids

        limits.check(g, label, "run-mlx")
        once = static_ids(g)  # weights only: computed when the program is prepared, not per call
        values, done = {}, 0
        for n, _v, s in ex.eager(g, feeds, weights, repeat):
            done += 1
            if n.id not in once:
                values[n.id] = s * 1e3
            if time.perf_counter() > deadline:
                break
        notes = [_stopped(g, done, time_limit_s), _once_note(g, once)]
        return NodeFigures(kind, version, label, values, sum(values.values()), note="; ".join(x for x in notes if x))
    match = origins(trace, version)
    ref_graph = trace.input
    wanted = {match[n.id] for n in g.compute_nodes() if n.id in match}
    _check_error_memory(ref_graph, g, wanted, limits, label)
    who = judge_of(ref_graph)
    if who.oracle:
        ref, against = reference_values(ref_graph, feeds, weights, wanted, np.float64), "float64 oracle"
    else:  # a quantized graph: version 0 on the same backend in its dtype judges (`judge_of`)
        ref = {n.id: np.asarray(v) for n, v, _s in ex.eager(ref_graph, feeds, weights) if n.id in wanted}
        against = f"version 0 on MLX in {graph_dtype(ref_graph)}: a quantized graph"
    from ..runtime.precision import precision_policy

    cap = precision_policy(ref_graph, ex.device).oracle.rtol if who.oracle else None
    rounding = expected_rounding(ref_graph, cap)  # of version 0's nodes: each value's own history of sums
    values, scales, done = {}, {}, 0
    for n, v, _s in ex.eager(g, feeds, weights):
        done += 1
        if n.id in match and match[n.id] in ref:
            values[n.id] = _max_abs(v, ref[match[n.id]])
            scales[n.id] = _scale(ref[match[n.id]])
        if time.perf_counter() > deadline:
            break
    unmatched = tuple(n.id for n in g.compute_nodes() if n.id not in match)
    expected = {i: rounding[match[i]] for i in values if who.oracle and match[i] in rounding}
    return NodeFigures(kind, version, label, values, unmatched=unmatched, note=_stopped(g, done, time_limit_s),
                       against=against, scales=scales, expected=expected)


def heat(figs: NodeFigures) -> tuple[tuple[int, str, str], ...]:
    """The drawing's node fills for `figs` (`viz.heat` bins; `render.Heat`): (node id, fill, tooltip line)."""
    from ..viz.heat import heat_colors

    # an error within its node's expected rounding takes the lightest fill, not a warm one (`NodeFigures.rounding`)
    rounding = {i for i in figs.values if figs.rounding(i)} if figs.kind == "error" else set()
    fills = heat_colors(figs.kind, {i: figs.shown(i) for i in figs.values}, rounding)
    what = "time" if figs.kind == "time" else "error vs version 0's reference"
    return tuple((i, fills[i], f"{what}: {figs.figure(i)}") for i in sorted(fills))


def heat_before(figs: NodeFigures, trace: Trace) -> tuple[tuple[int, str, str], ...]:
    """The node fills for the graph before `figs`' version's pass (the "before" pane): a node the pass kept (same
    id, op and type in both graphs: the same value, computed the same way) takes its figure from `figs`, in the
    same colour bins; a node the pass replaced has no figure (it was not run), so it keeps its op colour. Empty for
    the input (no pass before it). The overlay coloured the "after" pane only."""
    if not 0 < figs.version < len(trace.steps) + 1:
        return ()
    step = trace.steps[figs.version - 1]
    before, after = step.before, step.after
    kept = {i for i in figs.values if i in before and i in after and before[i].op == after[i].op
            and before[i].type == after[i].type}
    note = f" (measured {figs.label}: the pass kept this node)"
    return tuple((i, fill, tip + note) for i, fill, tip in heat(figs) if i in kept)


def _max_abs(got: object, want: np.ndarray) -> float:
    """Max |got - want| in float64 (nan where one side is not finite and the other is, or they differ there)."""
    from ..kernels.mlx_backend import mx
    from ..runtime.compare import max_abs

    a = np.array(got.astype(mx.float32) if got.dtype == mx.bfloat16 else got)  # type: ignore[union-attr]
    return max_abs([a], [want], same_nonfinite=True)


def _scale(want: np.ndarray) -> float:
    """Max |reference| over its finite entries (0.0 for none): the tensor's scale."""
    a = np.abs(np.asarray(want, np.float64))
    finite = a[np.isfinite(a)]
    return float(finite.max()) if finite.size else 0.0


def _once_note(g: Graph, once: set[int]) -> str:
    """Says which compute nodes the time shares leave out: those a program computes once from the weights
    (`runtime.executor.static_ids`: the packed Q/K/V `concat` of `fuse_shared_input_matmul`), not on every call."""
    nodes = [n for n in g.compute_nodes() if n.id in once]
    ops = sorted({n.op.value for n in nodes})
    return "" if not nodes else (f"{len(nodes)} node(s) that read only weights ({', '.join(ops)}) are computed once "
                                 "when the program is prepared, not per call: no share")


def _stopped(g: Graph, done: int, limit_s: float) -> str:
    total = len(g.compute_nodes())
    return "" if done >= total else (f"stopped after {done} of {total} nodes: the time limit of {limit_s:g} s "
                                     "was reached (the figures shown are those measured)")


def _check_error_memory(ref_graph: Graph, g: Graph, kept: set[int], limits: Limits, label: str) -> None:
    """Refuse an error overlay whose kept reference values (float64) plus both runs exceed the budget."""
    keep = sum(node_bytes(ref_graph[i], 8) for i in kept)
    need = workload_peak(ref_graph, "run")[0] + workload_peak(g, "run-mlx")[0] + keep
    if need > limits.max_bytes:
        raise LimitError(f"{label}: the error overlay needs {human_bytes(need)} (both runs and "
                         f"{human_bytes(keep)} of float64 reference values kept for {len(kept)} nodes), over the "
                         f"limit of {human_bytes(limits.max_bytes)} ({limits.source}); use smaller shapes or raise "
                         "RLXVIZ_MAX_MEMORY_MB", need, limits.max_bytes)


__all__ = ["BLOCKS", "DEFAULT_TIME_LIMIT_S", "EPS", "KINDS", "SUMMING", "UNITS", "NodeFigures", "expected_rounding",
           "heat", "heat_before", "node_figures", "origins", "reduction_length"]
