"""ONNX handlers of data movement: Reshape, Flatten, (Un)squeeze, Transpose, Concat, Split, Slice, Pad, the Gathers
and Expand. Each maps exactly under the condition its docstring states."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ....ir import DType, Op
from ....ir.emitter import Ref
from ....ir.ops import PAD_MODES
from ..context import Value, _axis, _Ctx, _ints, handles

# -- data movement ---------------------------------------------------------------------------------------

def _reshape_source(ctx: _Ctx, v: Value) -> Value:
    """The tensor a reshape node reads (reshape of a reshape is one reshape of the source)."""
    while isinstance(v, Ref) and (n := ctx.b.lookup(v)).op == Op.RESHAPE:
        v = Ref(n.inputs[0])
    return v


def _reshape_to(ctx: _Ctx, v: Value, shape: Sequence[int]) -> Value:
    """`v` reshaped to `shape`; chained reshapes collapse (exact: a reshape only relabels the row-major
    order), so a flatten-then-restore pair leaves the source itself."""
    shape = tuple(int(d) for d in shape)
    if isinstance(v, np.ndarray):
        out = v.reshape(shape)
        if (name := ctx.value_names.get(v)) is not None:  # a reshaped constant keeps its ONNX name in messages
            ctx.value_names.setdefault(out, name)
        return out
    v = _reshape_source(ctx, v)
    return v if ctx.shape(v) == shape else ctx.b.reshape(v, shape)


@handles("Reshape")
def _reshape(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """Target from a constant shape: 0 copies the input's dim (unless allowzero), one -1 is inferred."""
    src = ctx.shape(x[0])
    target = _ints(ctx, x[1], "the target shape")
    if not a.get("allowzero", 0):
        target = [src[i] if d == 0 else d for i, d in enumerate(target)]
    if -1 in target:
        known = math.prod(d for d in target if d != -1)
        target[target.index(-1)] = math.prod(src) // known if known else 0
    return [_reshape_to(ctx, x[0], target)]


@handles("Flatten")
def _flatten(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    s = ctx.shape(x[0])
    k = _axis(ctx, int(a.get("axis", 1)), len(s) + 1)
    return [_reshape_to(ctx, x[0], (math.prod(s[:k]), math.prod(s[k:])))]


@handles("Unsqueeze")
def _unsqueeze(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    s = list(ctx.shape(x[0]))
    new = _ints(ctx, x[1], "axes")
    axes = sorted(_axis(ctx, v, len(s) + len(new), "unsqueeze axis") for v in new)
    if len(set(axes)) != len(axes):
        raise ctx.fail(f"unsqueeze axes {new} repeat an axis")
    for ax in axes:
        s.insert(ax, 1)
    return [_reshape_to(ctx, x[0], s)]


@handles("Squeeze")
def _squeeze(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    s = ctx.shape(x[0])
    if len(x) > 1 and x[1] is not None:
        axes = {_axis(ctx, v, len(s), "squeeze axis") for v in _ints(ctx, x[1], "axes")}
        if wide := [i for i in sorted(axes) if s[i] != 1]:
            raise ctx.fail(f"squeeze of axis {wide[0]}, which holds {s[wide[0]]} (only size-1 axes can be squeezed)")
    else:
        axes = {i for i, d in enumerate(s) if d == 1}
    return [_reshape_to(ctx, x[0], [d for i, d in enumerate(s) if i not in axes])]


@handles("Transpose")
def _transpose(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    r = len(ctx.shape(x[0]))
    perm = tuple(int(p) for p in a.get("perm", range(r - 1, -1, -1)))
    if perm == tuple(range(r)):
        return [x[0]]
    if perm == (0, 2, 3, 1):
        # onnxscript merges the head split (0, 2, 1, 3) and the key transpose (0, 1, 3, 2) into one; written
        # back as the two (same result: (0, 2, 1, 3) composed with (0, 1, 3, 2) is (0, 2, 3, 1)), the form
        # attention patterns match
        return [ctx.b.transpose(ctx.b.transpose(ctx.ref(x[0]), (0, 2, 1, 3)), (0, 1, 3, 2))]
    return [ctx.b.transpose(ctx.ref(x[0]), perm)]


@handles("Concat")
def _concat(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    parts = [v for v in x if v is not None and 0 not in ctx.shape(v)]
    if len(parts) == 1:
        return [parts[0]]
    return [ctx.b.concat([ctx.ref(v) for v in parts], int(a["axis"]))]


def _narrow(ctx: _Ctx, v: Value, axis: int, start: int, length: int) -> Value:
    if start == 0 and length == ctx.shape(v)[axis]:
        return v
    return ctx.b.narrow(ctx.ref(v), axis, start, length)


@handles("Split")
def _split(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """Sizes from the second input, the `split` attribute, or equal parts (`num_outputs` / output count)."""
    s = ctx.shape(x[0])
    axis = _axis(ctx, int(a.get("axis", 0)), len(s))
    if len(x) > 1 and x[1] is not None:
        sizes = _ints(ctx, x[1], "split")
    elif "split" in a:
        sizes = [int(v) for v in a["split"]]
    else:
        k = len(n.output)
        step = -(-s[axis] // k)
        sizes = [min(step, s[axis] - i * step) for i in range(k)]
    if sum(sizes) != s[axis] or any(size < 0 for size in sizes) or len(sizes) != len(n.output):
        raise ctx.fail(f"split sizes {sizes} into {len(n.output)} output(s) do not cover axis {axis} of "
                       f"{list(s)} (the sizes must be non-negative, one per output, and add up to {s[axis]})")
    outs, start = [], 0
    for size in sizes:
        outs.append(_narrow(ctx, x[0], axis, start, size))
        start += size
    return outs


@handles("Slice")
def _slice(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """Constant starts/ends/axes with step 1 -> one narrow per sliced axis (bounds clamped as ONNX does)."""
    s = ctx.shape(x[0])
    starts, ends = _ints(ctx, x[1], "starts"), _ints(ctx, x[2], "ends")
    axes = _ints(ctx, x[3], "axes") if len(x) > 3 and x[3] is not None else list(range(len(starts)))
    steps = _ints(ctx, x[4], "steps") if len(x) > 4 and x[4] is not None else [1] * len(starts)
    if len(steps) != len(starts) or len(ends) != len(starts) or len(axes) != len(starts) or 0 in steps:
        raise ctx.fail(f"starts {starts}, ends {ends}, axes {axes}, steps {steps}: one of each per sliced axis, "
                       f"steps not 0")
    v = x[0]
    for st, en, ax, step in zip(starts, ends, axes, steps, strict=True):
        ax = _axis(ctx, ax, len(s), "slice axis")
        d = s[ax]
        if step == 1:
            st = max(0, min(d, st + d if st < 0 else st))
            en = max(0, min(d, en + d if en < 0 else en))
            v = _narrow(ctx, v, ax, st, max(0, en - st))
            continue
        # a strided slice is a gather of the indices Python's slice picks (ONNX clamps as slice.indices does)
        picked = np.arange(d, dtype=np.int64)[slice(st, en, step)].copy()
        if picked.size == 0:
            raise ctx.fail(f"the slice {st}:{en}:{step} of axis {ax} is empty (empty tensors are not supported)")
        v = _gather_axis(ctx, v, ax, picked)
    return [v]


@handles("Pad")
def _pad(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """Pad(data, pads[, constant_value[, axes]]) (opset 13+) with constant pads, an optional constant fill value
    and `axes` (opset 18) -> `pad` (constant, reflect, edge); a negative pad (a crop) of constant mode is a narrow
    first (crop and fill on one axis commute in constant mode). `wrap`, computed pads or fill, and a negative
    pad in reflect/edge mode are valid forms left to the host (`UnsupportedForm`)."""
    s = ctx.shape(x[0])
    r = len(s)
    mode = a.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in PAD_MODES:
        raise ctx.unsupported(f"mode {mode!r} is not an IR pad mode ({', '.join(PAD_MODES)})")
    if not isinstance(x[1], np.ndarray):
        raise ctx.unsupported("the pads are computed from a model input (the IR's pad takes constant pads)")
    pads = _ints(ctx, x[1], "pads")
    fill = x[2] if len(x) > 2 else None
    if fill is not None and not isinstance(fill, np.ndarray):
        raise ctx.unsupported("the constant value is computed (the IR's pad takes a constant fill)")
    value = np.asarray(fill).reshape(-1)[0].item() if fill is not None and np.asarray(fill).size else 0.0
    if len(x) > 3 and x[3] is not None:  # axes: pads for those axes only, the others 0
        axes = [_axis(ctx, ax, r, "pad axis") for ax in _ints(ctx, x[3], "axes")]
        if len(pads) != 2 * len(axes) or len(set(axes)) != len(axes):
            raise ctx.fail(f"pads {pads} needs 2 values per axis of {axes}, each axis once")
        full = [0] * (2 * r)
        for k, ax in enumerate(axes):
            full[ax], full[r + ax] = pads[k], pads[len(axes) + k]
        pads = full
    if len(pads) != 2 * r:
        raise ctx.fail(f"pads {pads} needs {2 * r} values (begins, then ends) for a rank-{r} input")
    v = x[0]
    if any(p < 0 for p in pads):
        if mode != "constant":
            raise ctx.unsupported(f"a negative pad in {mode} mode (pads {pads})")
        for ax in range(r):
            lo, hi = max(0, -pads[ax]), max(0, -pads[r + ax])
            if lo or hi:
                if lo + hi >= s[ax]:
                    raise ctx.fail(f"pads {pads} crop axis {ax} of size {s[ax]} to nothing (empty tensors are not "
                                   f"supported)")
                v = _narrow(ctx, v, ax, lo, s[ax] - lo - hi)
        pads = [max(0, p) for p in pads]
    if mode == "reflect" and any(max(pads[i], pads[r + i]) >= ctx.shape(v)[i] for i in range(r)):
        raise ctx.fail(f"reflect pads {pads} reach past the edge of {list(ctx.shape(v))} (each pad < its axis)")
    if not any(pads):
        return [v]
    dtype = ctx.dtype(x[0])
    fill_value = bool(value) if dtype == DType.bool else int(value) if not dtype.is_float else float(value)
    return [ctx.b.pad(ctx.ref(v), pads, mode=mode, value=fill_value)]


@handles("Gather")
def _gather(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """Embedding lookups (axis 0, computed indices) map to `gather`; constant indices on any axis map to
    narrow (+ reshape for a scalar index) when they are one contiguous run, else to `gather` on axis 0."""
    data, idx = x
    s = ctx.shape(data)
    axis = _axis(ctx, int(a.get("axis", 0)), len(s))
    if isinstance(idx, np.ndarray):
        ids = np.where(idx < 0, idx + s[axis], idx).astype(np.int64)
        flat = ids.reshape(-1)
        if flat.size and np.array_equal(flat, np.arange(flat[0], flat[0] + flat.size)):
            out = _narrow(ctx, data, axis, int(flat[0]), int(flat.size))
            return [_reshape_to(ctx, out, (*s[:axis], *ids.shape, *s[axis + 1:]))]
        idx = ids
    return [_gather_axis(ctx, data, axis, idx)]


@handles("GatherElements")
def _gather_elements(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """GatherElements with computed indices (constant ones are folded): `out[i] = data[i with i[axis] =
    idx[i]]` as one axis-0 gather from the flattened data, at flat index `offsets + idx' * stride[axis]` with
    `offsets` the constant row-major offset of every other coordinate and `idx' = where(idx < 0, idx + d, idx)`.
    Exact for indices in [-d, d - 1] (ONNX's domain; the runtime checks gather indices before running).
    RoBERTa's token-type buffer read at the position ids is this form."""
    data, idx = x
    s, t = ctx.shape(data), ctx.shape(idx)
    if len(s) != len(t) or any(ti > si for k, (ti, si) in enumerate(zip(t, s, strict=True)) if k != a.get("axis", 0)):
        raise ctx.fail(f"indices {list(t)} do not fit data {list(s)} (same rank, no larger on the other axes)")
    ax = _axis(ctx, int(a.get("axis", 0)), len(s))
    b = ctx.b
    strides = [math.prod(s[k + 1:]) for k in range(len(s))]
    grid = np.indices(t, dtype=np.int64)
    offsets = sum(grid[k] * strides[k] for k in range(len(s)) if k != ax)
    i = ctx.ref(idx)
    if ctx.dtype(idx) != DType.i64:
        i = b.cast(i, DType.i64)
    d = ctx.ref(np.asarray(s[ax], dtype=np.int64))
    i = b.where(b.lt(i, ctx.ref(np.asarray(0, dtype=np.int64))), b.add(i, d), i)
    if strides[ax] != 1:
        i = b.mul(i, ctx.ref(np.asarray(strides[ax], dtype=np.int64)))
    if np.any(offsets):
        i = b.add(i, ctx.ref(np.asarray(offsets, dtype=np.int64)))
    table = _reshape_to(ctx, data, (math.prod(s), 1))
    return [_reshape_to(ctx, b.gather(ctx.ref(table), i), t)]


def _gather_axis(ctx: _Ctx, data: Value, axis: int, idx: Value) -> Ref:
    """`take(data, idx, axis)` as the IR's axis-0 gather: the axis moved to the front and back (exact)."""
    b, s = ctx.b, ctx.shape(data)
    if axis == 0:
        return b.gather(ctx.ref(data), ctx.ref(idx))
    perm = (axis, *[i for i in range(len(s)) if i != axis])
    g = b.gather(b.transpose(ctx.ref(data), perm), ctx.ref(idx))
    r = len(ctx.shape(idx))
    return b.transpose(g, (*range(r, r + axis), *range(r), *range(r + axis, r + len(s) - 1)))


def _broadcast_view(flat: np.ndarray, dims: tuple[int, ...]) -> tuple[int, ...] | None:
    """If flat indices `flat` into an array of leading shape `dims` just repeat it along new axes (a
    broadcast of a reshape), the shape to reshape it to before expanding; else None."""
    keep = tuple(i for i in range(flat.ndim) if flat.shape[i] > 1 and np.ptp(flat, axis=i).any())
    reduced = flat[tuple(slice(None) if i in keep else slice(0, 1) for i in range(flat.ndim))]
    ok = (reduced.size == math.prod(dims) and np.array_equal(reduced.reshape(-1), np.arange(reduced.size))
          and [d for d in reduced.shape if d > 1] == [d for d in dims if d > 1])
    return reduced.shape if ok else None


@handles("GatherND")
def _gather_nd(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    """Constant indices (batch_dims 0) only. When they read the data in order along new axes (how
    torch.onnx exports `mask[batch_idx, kv_idx]`), the result is reshape + expand; otherwise
    flatten + gather with the flattened indices."""
    data, idx = x
    if int(a.get("batch_dims", 0)) != 0 or not isinstance(idx, np.ndarray):
        raise ctx.unsupported("only constant indices with batch_dims 0 are supported")
    s = ctx.shape(data)
    k = idx.shape[-1]
    lead, rest = s[:k], s[k:]
    ids = np.where(idx < 0, idx + np.asarray(lead), idx)
    flat = np.ravel_multi_index(tuple(np.moveaxis(ids, -1, 0)), lead) if k else np.zeros(idx.shape[:-1], np.int64)
    out_shape = (*flat.shape, *rest)
    view = _broadcast_view(np.asarray(flat), tuple(lead))
    b = ctx.b
    if view is not None:
        r = _reshape_to(ctx, data, (*view, *rest))
        rr = ctx.ref(r)
        return [rr if ctx.shape(rr) == out_shape else b.expand(rr, out_shape)]
    table = _reshape_to(ctx, data, (math.prod(lead), *rest))
    return [b.gather(ctx.ref(table), ctx.ref(np.asarray(flat, dtype=np.int64)))]


@handles("Expand")
def _expand(ctx: _Ctx, n: Any, x: list[Value], a: dict[str, Any]) -> list[Value]:
    target = tuple(np.broadcast_shapes(ctx.shape(x[0]), tuple(_ints(ctx, x[1], "the target shape"))))
    if target == ctx.shape(x[0]):
        return [x[0]]
    s = ctx.shape(x[0])
    r = ctx.ref(x[0])
    if len(s) < len(target):
        r = ctx.b.reshape(r, (1,) * (len(target) - len(s)) + tuple(s))
    return [ctx.b.expand(r, target)]

