"""`onnx_op`: an ONNX node the IR has no op for, kept as it is and evaluated on the host.

No valid model is refused for an op: an ONNX node of the default domain that no importer handler maps (and that
keeps the rules of `ir.host_rules`: not control flow, a string, sequence or random op, no subgraph, a type ONNX
infers; lint checks every `onnx_op` against the same rules, whatever made it) becomes one `onnx_op` node holding
the ONNX node itself (serialized, base64), the opset it was written for, and the output type ONNX shape
inference gave it. It is drawn, printed and exported as that node; the passes match nothing through it (so it
blocks a fusion it sits in, and `explain` names it); the NumPy reference and the MLX runtime evaluate it on the
host with ONNX Runtime (`evaluate`; `onnx.reference` where ONNX Runtime has no kernel), and every report names
the nodes that ran there (`host_nodes`).
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .graph import Graph, Node
from .identity import IdentityMap
from .ops import Op


def encode(node_proto: Any) -> str:
    """The ONNX NodeProto as the `node` attribute's text (base64 of its serialized bytes)."""
    return base64.b64encode(node_proto.SerializeToString()).decode("ascii")


def decode(attrs: dict[str, Any]) -> Any:
    """The ONNX NodeProto held by an `onnx_op` node's attributes."""
    from onnx import NodeProto

    n = NodeProto()
    n.ParseFromString(base64.b64decode(attrs["node"]))
    return n


def evaluate(attrs: dict[str, Any], arrays: Sequence[Any]) -> np.ndarray:
    """Run the held ONNX node on `arrays` (its non-empty inputs, in order; NumPy or MLX arrays): with ONNX Runtime
    (the engine the import check compares with; `onnx.reference` computes some ops wrongly, e.g. LpNormalization
    p=1 on negative inputs), else (not installed, or no kernel for these dtypes: the float64 oracle) with
    `onnx.reference`; the output numbered `attrs["output"]` (0 when absent: TopK's indices are output 1), cast to
    the declared dtype (an output of another shape than the declared one is refused: the memory budget counted
    that one). ONNX Runtime's run is stopped at `HOST_SECONDS`. Inside `host_run()` the node runs once per run:
    its other outputs (TopK's values and indices are two IR nodes) are read from that run's cache, keyed by the
    node and its input arrays' identity. Raises ValueError naming the op when the engine fails or times out."""
    from .dtype import DType

    cache = _RUN.get()
    outs = cache.get(attrs, arrays) if cache is not None else None
    if outs is None:
        outs = _evaluate_all(attrs, [np.asarray(a) for a in arrays])
        if cache is not None:
            cache.put(attrs, arrays, outs)
    k = int(attrs.get("output", 0))
    got = tuple(np.shape(outs[k])) if 0 <= k < len(outs) else None
    if got != tuple(attrs["shape"]):  # lint made the declared type ONNX's inferred one: a difference is refused
        raise ValueError(f"onnx_op {attrs['op_type']}: the host evaluation gave shape {list(got or ())} where the "
                         f"node declares {list(attrs['shape'])}")
    return np.asarray(outs[k]).astype(DType(attrs["dtype"]).numpy, copy=False)


def _evaluate_all(attrs: dict[str, Any], arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Every output of the held ONNX node on `arrays`, in order (ONNX Runtime's run under `HOST_SECONDS`).
    Raises ValueError naming the op (the engine's error, or the time limit)."""
    node = decode(attrs)
    names = [i for i in node.input if i]
    feeds = dict(zip(names, arrays, strict=True))
    try:
        try:
            sess = _ort_session(attrs["node"], int(attrs["opset"]),
                                tuple((n, str(a.dtype), a.shape) for n, a in feeds.items()))
        except Exception:  # noqa: BLE001 - no kernel for these types (e.g. Hardmax in float64, the oracle's)
            sess = None
        outs = _run_bounded(sess, feeds) if sess is not None else _reference_bounded(node, int(attrs["opset"]), feeds)
    except HostTimeout:
        raise ValueError(f"onnx_op {attrs['op_type']}: the host evaluation took over {HOST_SECONDS:g} s; "
                         f"stopped") from None
    except Exception as e:  # noqa: BLE001 - the engine's own error, named
        raise ValueError(f"onnx_op {attrs['op_type']}: the host evaluation failed ({type(e).__name__}: "
                         f"{_first_line(e)})") from None
    return list(outs)


HOST_SECONDS = 30.0
"""Wall time one host evaluation of an ONNX node may take: in ONNX Runtime, past it the run's terminate flag is
set (`RunOptions.terminate`) and the run refused in one line; in onnx.reference (no kernel in ONNX Runtime for
these types) the caller stops waiting (`_reference_bounded`). ONNX Runtime reads the flag between kernels, so a
kernel already running finishes first: what bounds one kernel's work is what lint lets onto the host
(`ir.host_rules`: no control flow, no subgraph, the declared type equal to ONNX's inferred one, so the operands
and the output are the sizes the memory budget counted)."""


class HostTimeout(Exception):
    """A host evaluation stopped at `HOST_SECONDS`."""


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


def _run_bounded(sess: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """`sess.run(None, feeds)`, stopped at `HOST_SECONDS` (a timer sets the run's terminate flag; ONNX Runtime
    checks it between kernels). Raises HostTimeout when stopped, else the run's own error."""
    import threading

    import onnxruntime as ort

    ro = ort.RunOptions()
    ro.log_severity_level = QUIET
    stopped = threading.Event()

    def stop() -> None:
        stopped.set()
        ro.terminate = True

    timer = threading.Timer(HOST_SECONDS, stop)
    timer.daemon = True
    timer.start()
    try:
        return list(sess.run(None, feeds, ro))
    except Exception:
        if stopped.is_set():
            raise HostTimeout from None
        raise
    finally:
        timer.cancel()


QUIET = 4
"""ONNX Runtime's log severity for every session rlxviz makes (4: fatal only; its errors are raised as exceptions
and said in one line): its warnings and errors are raw log lines with terminal escape codes."""


def quiet_ort() -> Any:
    """`onnxruntime`, its default logger set to `QUIET`, or None when it is not installed. Raises nothing."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    ort.set_default_logger_severity(QUIET)
    return ort


def ort_options() -> Any:
    """New `onnxruntime.SessionOptions` that log nothing below `QUIET` (the default logger quieted too).
    Raises ImportError without ONNX Runtime."""
    ort = quiet_ort()
    if ort is None:
        raise ImportError("onnxruntime is not installed")
    opts = ort.SessionOptions()
    opts.log_severity_level = QUIET
    return opts


class HostRunCache:
    """The outputs of each host-evaluated ONNX node within one run, keyed by the node (its serialized text and
    opset) and the identity of its input arrays (`IdentityMap`, never `id()`: the arrays are held while the run
    lasts, so no freed array's address can match). A hit needs every input to be the very same array object."""

    __slots__ = ("_by_first",)

    def __init__(self) -> None:
        self._by_first: IdentityMap[Any, list[tuple[str, int, tuple[Any, ...], list[np.ndarray]]]] = IdentityMap()

    def get(self, attrs: dict[str, Any], arrays: Sequence[Any]) -> list[np.ndarray] | None:
        if not arrays:
            return None
        for text, opset, held, outs in self._by_first.get(arrays[0]) or ():
            if text == attrs["node"] and opset == int(attrs["opset"]) and len(held) == len(arrays) \
                    and all(a is b for a, b in zip(held, arrays, strict=True)):
                return outs
        return None

    def put(self, attrs: dict[str, Any], arrays: Sequence[Any], outs: list[np.ndarray]) -> None:
        if arrays:
            self._by_first.setdefault(arrays[0], []).append((attrs["node"], int(attrs["opset"]), tuple(arrays), outs))


_RUN: contextvars.ContextVar[HostRunCache | None] = contextvars.ContextVar("rlxviz_host_run", default=None)


@contextlib.contextmanager
def host_run() -> Iterator[HostRunCache]:
    """One run of a graph (the reference interpreter's, one MLX program call): host nodes evaluated inside it share
    one `HostRunCache`, so a multi-output ONNX node (TopK) runs once, not once per output. Nested: the outer run's
    cache is kept."""
    outer = _RUN.get()
    if outer is not None:
        yield outer
        return
    cache = HostRunCache()
    token = _RUN.set(cache)
    try:
        yield cache
    finally:
        _RUN.reset(token)


def _reference_bounded(node: Any, opset: int, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """`_reference` in a daemon thread the caller waits for at most `HOST_SECONDS` (onnx.reference is Python and
    NumPy, which no flag stops): past it the caller gets HostTimeout and goes on, while the thread finishes its
    work or ends with the process. Raises HostTimeout, else `_reference`'s own error."""
    import threading

    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["out"] = _reference(node, opset, feeds)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box["err"] = e

    t = threading.Thread(target=work, name="rlxviz-host-reference", daemon=True)
    t.start()
    t.join(HOST_SECONDS)
    if t.is_alive():
        raise HostTimeout
    if "err" in box:
        raise box["err"]
    return box["out"]


def _reference(node: Any, opset: int, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(node, opsets={"": opset}).run(None, feeds)


@functools.lru_cache(maxsize=64)
def _ort_session(node_text: str, opset: int, inputs: tuple[tuple[str, str, tuple[int, ...]], ...]) -> Any:
    """An ONNX Runtime session over the one node (cached by node and input types), or None without ONNX Runtime."""
    ort = quiet_ort()
    if ort is None:
        return None
    from onnx import helper

    node = decode({"node": node_text})
    ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), list(shape))
           for n, dt, shape in inputs]
    node.output[:] = [o or f"unused_{k}" for k, o in enumerate(node.output)]  # every output, in order
    outs = [helper.make_empty_tensor_value_info(o) for o in node.output]
    graph = helper.make_graph([node], "host", ins, outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(model.ir_version, 9)
    opts = ort_options()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def host_nodes(graph: Graph) -> list[Node]:
    """The `onnx_op` nodes of `graph`: what runs on the host, outside MLX (one IR node per output of an ONNX node:
    TopK's values and indices are two; `host_groups` counts ONNX nodes)."""
    return [n for n in graph if n.op == Op.ONNX_OP]


def host_groups(graph: Graph) -> list[tuple[Node, ...]]:
    """The ONNX nodes that run on the host, each as the `onnx_op` nodes of its outputs (one per output read, in
    graph order; keyed by the serialized node they hold), in the order of their first output: a TopK read for values
    and indices is one group of two."""
    groups: dict[str, list[Node]] = {}
    for n in host_nodes(graph):
        groups.setdefault(str(n.attrs.get("node", f"%{n.id}")), []).append(n)
    return [tuple(g) for g in groups.values()]


def describe_host(graph: Graph) -> str | None:
    """One line naming the ONNX nodes that run on the host (None when there are none), each once however many of
    its outputs the IR reads (`host_groups`):
    `2 node(s) the IR has no op for ran on the host (ONNX Runtime): %12 Hardmax 'hm', %20 Hardmax 'hm2'`;
    a two-output TopK is `%106 TopK 'topk' (outputs %106, %107)`."""
    groups = host_groups(graph)
    if not groups:
        return None

    def one(g: tuple[Node, ...]) -> str:
        outs = f" (outputs {', '.join(f'%{n.id}' for n in g)})" if len(g) > 1 else ""
        return f"%{g[0].id} {g[0].attrs['op_type']} {g[0].attrs.get('name', '')!r}{outs}"

    listed = ", ".join(one(g) for g in groups[:6])
    more = f", and {len(groups) - 6} more" if len(groups) > 6 else ""
    return f"{len(groups)} node(s) the IR has no op for ran on the host ({_engine()}): {listed}{more}"


def host_words(n: Node) -> str | None:
    """Where node `n` runs when it runs on the host (an `onnx_op`), in `describe_host`'s words: `This node runs on
    the host (ONNX Runtime), outside MLX: the IR has no op for Conv`; None for any other node. The op type is the
    file's text (data, not markup: a front end escapes it)."""
    if n.op != Op.ONNX_OP:
        return None
    return f"This node runs on the host ({_engine()}), outside MLX: the IR has no op for {n.attrs['op_type']}"


def _engine() -> str:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return "onnx.reference"
    return "ONNX Runtime"


__all__ = ["HOST_SECONDS", "HostRunCache", "decode", "describe_host", "encode", "evaluate", "host_groups", "host_nodes",
           "host_run", "host_words", "ort_options", "quiet_ort"]
