"""Import an ONNX model (torch.onnx, optimum, ONNX Runtime's optimizer output) into the rlxviz IR.

`load_onnx(path, batch, seq)` reads the file with the `onnx` package and returns a `Model`:

* **Static shapes.** Every symbolic input dimension is bound: a name containing `batch` (or the first
  axis) to `batch`, a name containing `seq`/`sequence`/`len` (or the second axis) to `seq`, unless
  `input_shapes` gives the input's full shape. Everything that then depends only on constants
  (the exporter's shape subgraphs: Shape, Gather, Unsqueeze, Concat, ConstantOfShape, Range, Trilu, ...)
  is folded with ONNX's own reference evaluator (`onnx.reference`), so it never reaches the IR.
* **Params.** Initializers (external data included) become `param` nodes named after them; a folded
  tensor that is used by a computed node becomes a param named after its ONNX value; rank-0 and
  one-element tensors become `const` nodes (so scale factors look like the constants the patterns want).
* **Provenance.** Each IR node's `path` is the exporter's module path: torch.onnx's
  `pkg.torch.onnx.name_scopes` metadata (`encoder.layer.0.attention.self.query`), else a legacy
  exporter's node name `/encoder/layer.0/attention/self/query/MatMul`. `Model.meta["onnx_nodes"]`
  maps each IR node id to `(op_type, node name, doc_string)` of the ONNX node it came from.
* **Ops.** The ones transformer exports use (`SUPPORTED_OPS`), the contrib fused ops ONNX Runtime's
  transformer optimizer emits (Attention, MultiHeadAttention, SkipLayerNormalization,
  SkipSimplifiedLayerNormalization, SimplifiedLayerNormalization, BiasGelu, FastGelu, Gelu), and any
  standard op whose inputs are all constant. Opsets 13-21 of the default domain.
* **Errors.** `OnnxImportError` (a ValueError), one message: unreadable file, an opset outside 13-21,
  an unbound dimension, or every op that cannot be mapped at once, each with its node names and the opset.

Each mapping is exact (the IR computes what the ONNX op computes) under the condition stated in its
handler; a node outside that condition is an error, never an approximation.

The package, one job per module:

* `read`: the file into a `Model` (`load_onnx`): size budget, initializer types, external-data bounds;
* `validate`: the opset, ONNX's strict shape inference and checker (in a bounded child), contrib input schemas;
* `bind`: graph inputs' symbolic dimensions to sizes; `dims`: the user's `--dim`/`--inputs` expressions;
* `fold`: constant folding, bounded before it runs; `host`: unmapped ops kept as opaque host nodes;
* `handlers`: the op handlers, one module per op family, registered into `context.HANDLERS`;
* `context`: what every handler takes (`_Ctx`, `Value`, the errors, shared helpers);
* `driver`: `import_graph`, node by node; `paths`: each node's module path (provenance);
* `weights`, `size`, `slice`: weights left in their file, the file's byte budget, a slice of a model's layers;
* `notes`: what the file had already fused; `export`: the IR back to an `.onnx` file (`export_onnx`).
"""

from __future__ import annotations

from ...ir.host_rules import OPSETS
from .context import OnnxImportError, dtype_name, node_label, onnx_dtype
from .driver import import_graph
from .paths import node_path
from .read import load_onnx

__all__ = ["OPSETS", "OnnxImportError", "dtype_name", "import_graph", "load_onnx", "node_label", "node_path",
           "onnx_dtype"]
