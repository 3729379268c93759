"""Host nodes at import: a default-domain ONNX node no handler maps (or a form a handler leaves to the host) kept as
an opaque `onnx_op` node (`ir.onnx_op`) when it passes `ir.host_rules`' form rules and ONNX shape inference types
its outputs from the bound input shapes (`_host_op`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...ir import Op
from ...ir.emitter import Ref
from ...ir.host_rules import form_refusal, inferred_types
from .context import Value, _Ctx


def _host_op(ctx: _Ctx, node: Any, ins: list[Value], domain: str) -> list[Ref | None] | None:
    """`onnx_op` nodes for a default-domain ONNX node no handler maps (`ir.onnx_op`): one per output the graph
    names (TopK's values and indices are two nodes, each evaluating the ONNX node and keeping its `output`), no
    subgraph, inputs the IR can hold, and output types ONNX shape inference fixes from the bound input shapes.
    None when any of these fails (the op is then listed as unmapped). Raises nothing."""
    from ...ir.onnx_op import encode

    if domain or form_refusal(node) is not None:  # the form rules lint applies to every `onnx_op` (ir.host_rules)
        return None
    try:
        named = [(name, v) for name, v in zip(node.input, ins, strict=True) if name]
        consts = {name: v for name, v in named if isinstance(v, np.ndarray)}
        typed = {name: (np.dtype(ctx.dtype(v).numpy), ctx.shape(v)) for name, v in named if name not in consts}
    except Exception:  # noqa: BLE001 - an input the IR cannot hold: the op stays unmapped, named in the one error
        return None
    types = inferred_types(node, ctx.opset, consts, typed)
    if isinstance(types, str):  # not inferable: the op stays unmapped, named in the one error
        return None
    operands = [ctx.ref(v) for name, v in zip(node.input, ins, strict=True) if name]
    if not operands:
        return None
    text, several = encode(node), sum(1 for o in node.output if o) > 1 or len(node.output) > 1
    refs: list[Ref | None] = []
    for k, o in enumerate(node.output):
        if not o:
            refs.append(None)
            continue
        dtype, shape = types[o]
        extra = {"output": k} if several else {}
        refs.append(Ref(ctx.b.emit(Op.ONNX_OP, tuple(operands), op_type=node.op_type, name=node.name or "",
                                   node=text, opset=ctx.opset, shape=shape, dtype=dtype.value, **extra)))
    return refs


__all__: list[str] = []
