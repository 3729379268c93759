"""The ONNX importer's op handlers, one module per op family; importing this package registers every handler into
`context.HANDLERS` (`@handles(op, domain=...)`):

* `elementwise`: numpy-broadcast binary and unary ops, Clip, CumSum, ArgMax, Where, logic, Cast, Identity;
* `linear`: MatMul, Gemm, Conv, LayerNormalization, Softmax, the reductions;
* `movement`: Reshape, Flatten, (Un)squeeze, Transpose, Concat, Split, Slice, Pad, the Gathers, Expand;
* `contrib`: ONNX Runtime's contrib fused ops (domain `com.microsoft`);
* `quant`: the quantized ops (QDQ and `quantize_dynamic` output).
"""

from . import contrib, elementwise, linear, movement, quant

__all__ = ["contrib", "elementwise", "linear", "movement", "quant"]
