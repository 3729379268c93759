"""Is a version's difference a quantization step moved by rounding? (`quantization_flip`, read by `compare`).

A quantized graph rounds a float tensor to integers at run time (`QuantizeLinear`, `DynamicQuantizeLinear`: a cast
to u8/i8 of `round(x / scale) + zero_point`). A version that computes `x` with a rounding-level difference (a fused
attention summing in another order) moves an element that lay next to a rounding boundary by one step, and
everything downstream by up to a step's worth: far over the same-dtype tolerance, though no pass changed the math.

`quantization_flip` runs both graphs on the backend under test with their quantized tensors (float -> u8/i8 casts
present in both) as outputs and finds the first one, in graph order, that differs. The difference is called a flip
when every element of that tensor moved by at most one step and the value it rounds (the `x / scale` division of
the quantizer) agrees within the same-dtype tolerance in both graphs. Downstream of that first flip any difference
is its consequence, so no later tensor is read; a version that differs before any quantizer, or by more than one
step, is not a flip (the caller keeps its verdict).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from ..ir import Graph, Node, Op
from .precision import Tolerance, quantizers

MAX_WALK = 16
"""How far up a quantizer's chain (cast <- clamp <- round <- ...) its `x / scale` division is looked for."""


def _division(g: Graph, n: Node) -> int | None:
    """The `x / scale` node a quantizer cast rounds: the first float `div` up its chain, or None."""
    seen, todo = {n.id}, [n.id]
    for _ in range(MAX_WALK):
        nxt = []
        for i in todo:
            for j in g[i].inputs:
                if j in seen:
                    continue
                seen.add(j)
                if g[j].op == Op.DIV and g[j].dtype.is_float and g[j].shape == n.shape:
                    return j
                nxt.append(j)
        todo = nxt
    return None


def quantization_flip(version: Graph, unfused: Graph, feeds: Mapping[str, np.ndarray],
                      weights: Mapping[str, np.ndarray], tol: Tolerance,
                      run: Callable[[Graph, Mapping[str, np.ndarray], Mapping[str, np.ndarray]], list[np.ndarray]],
                      ) -> str:
    """Why `version` differs from `unfused` by a quantization step moved by rounding (one line), or '' when it does
    not (see the module doc). `tol`: the same-dtype tolerance. Raises nothing: a run that fails gives ''."""
    quant = [n for n in quantizers(unfused)
             if n.id in version and version[n.id].op == Op.CAST and version[n.id].dtype == n.dtype
             and version[n.id].shape == n.shape]
    pairs = [(n, d) for n in quant if (d := _division(unfused, n)) is not None and d in version
             and version[d].op == Op.DIV and version[d].shape == unfused[d].shape]
    if not pairs:
        return ""
    ids = [i for n, d in pairs for i in (n.id, d)]
    try:
        with np.errstate(all="ignore"):
            a = run(unfused.with_outputs(ids), feeds, weights)
            b = run(version.with_outputs(ids), feeds, weights)
    except Exception:  # noqa: BLE001 - a probe, never a verdict of its own
        return ""
    for k, (n, d) in enumerate(pairs):
        qa, qb = np.asarray(a[2 * k]).astype(np.int64), np.asarray(b[2 * k]).astype(np.int64)
        if np.array_equal(qa, qb):
            continue
        moved = np.abs(qa - qb)
        xa, xb = np.asarray(a[2 * k + 1], np.float64), np.asarray(b[2 * k + 1], np.float64)
        if moved.max() > 1 or not np.all(np.abs(xa - xb) <= tol.atol + tol.rtol * np.abs(xa)):
            return ""
        where = f"%{n.id}" + (f" ({n.path})" if n.path else "")
        return (f"{int((moved > 0).sum())} of {moved.size} value(s) of the quantized tensor {where} moved by one "
                f"step: what they round (%{d}, x / scale) differs only at rounding level")
    return ""


__all__ = ["MAX_WALK", "quantization_flip", "quantizers"]
