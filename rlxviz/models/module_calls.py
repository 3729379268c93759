"""Calls of one module numbered as layers: ALBERT runs its one layer module N times, and the exporter gives every
call the same module path (dynamo: `...albert_layers.0` each time; TorchScript: `...albert_layers.0.attention`,
then `...albert_layers.0.attention_1`), so no path names a layer and `explain` has nothing to answer per layer.

`number_calls` reads the ONNX nodes' paths in graph order and, only when none of them names a layer
(`passes.trace.layer_of`), finds the outermost module called more than once and writes the k-th call's paths as
`M@k` (`model.encoder.albert_layer_groups.0.albert_layers.0@1.attention.query`), which `layer_of` reads as layer k.
A new call of M begins where a direct child of M that the current call already left is entered again (the calls
are sequential: call k ends before call k+1 begins); TorchScript's `name_k` scope suffixes are read as that
scope's k-th call first. Paths that name a layer, or with no repeated module, are returned as given.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..passes.trace import layer_of

_TS_CALL = re.compile(r"^(.*)_(\d+)$")
CALL_MARK = "@"
"""The separator of a module path and its call number (`...albert_layers.0@1`)."""


def _strip_ts_calls(paths: Sequence[str]) -> list[str]:
    """TorchScript's repeated-scope suffixes removed: segment `name_k` -> `name` where `name` is a module of the
    same parent elsewhere in the graph (`attention_1` beside `attention`); other names are kept."""
    prefixes = {".".join(p.split(".")[:i]) for p in paths if p for i in range(1, p.count(".") + 2)}
    out = []
    for p in paths:
        segs = p.split(".") if p else []
        for i, s in enumerate(segs):
            m = _TS_CALL.match(s)
            if m and ".".join([*segs[:i], m.group(1)]) in prefixes:
                segs[i] = m.group(1)
        out.append(".".join(segs))
    return out


def _calls(paths: Sequence[str], module: str) -> list[int | None]:
    """For each path: the call of `module` it belongs to (0, 1, ...), None outside `module`."""
    under, cut = module + ".", len(module) + 1
    calls: list[int | None] = []
    k, current, left = 0, None, set()
    started = False
    for p in paths:
        if p != module and not p.startswith(under):
            calls.append(None)
            continue
        child = p[cut:].split(".", 1)[0] if p != module else None
        if child is not None and child != current:
            if child in left:  # a child this call already left is entered again: the next call
                k, left, current = k + 1, set(), None
            if current is not None:
                left.add(current)
            current = child
        started = True
        calls.append(k)
    return calls if started else [None] * len(paths)


def number_calls(paths: Sequence[str]) -> list[str]:
    """The node paths with the calls of the outermost repeated module numbered (`M@k`), when no path names a layer.

    Args:
        paths: the ONNX nodes' module paths (`onnx.paths.node_path`), in graph order; '' for none.

    Returns:
        A list of the same length: `paths` unchanged when one of them names a layer or no module is called twice,
        else each path inside the k-th call of the repeated module M as `M@k` plus the rest of the path, and the
        other paths as they were read (TorchScript's `_k` suffixes removed inside M only).

    Example:
        >>> number_calls(["enc.blk.attn", "enc.blk.ffn", "enc.blk.attn", "enc.blk.ffn"])
        ['enc.blk@0.attn', 'enc.blk@0.ffn', 'enc.blk@1.attn', 'enc.blk@1.ffn']
    """
    if any(layer_of(p) is not None for p in paths):
        return list(paths)
    base = _strip_ts_calls(paths)
    modules = sorted({".".join(p.split(".")[:i]) for p in base if p for i in range(1, p.count(".") + 1)},
                     key=lambda m: (m.count("."), -sum(1 for p in base if p.startswith(m + ".")), m))
    for module in modules:  # the outermost first; at one depth, the one holding the most nodes
        calls = _calls(base, module)
        if max((c for c in calls if c is not None), default=0) >= 1:
            cut = len(module)
            return [f"{module}{CALL_MARK}{c}{b[cut:]}" if c is not None else p
                    for p, b, c in zip(paths, base, calls, strict=True)]
    return list(paths)


__all__ = ["CALL_MARK", "number_calls"]
